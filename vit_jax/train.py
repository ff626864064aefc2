"""The training command: pretraining from scratch and fine-tuning (`vit_jax.training.loop`).

    python -m vit_jax.train --config configs/quickstart_vit.py --workdir DIR \
        [--config.batch_size=256 ...]

The original vit_jax's `train_and_evaluate` and `make_update_fn`, for its configs
(`vit_jax/configs/`) and data-parallel `pmap` steps, are `vit_jax/original/train.py`'s
(docs/original.md).
"""
import os
from typing import Sequence

import jax
from absl import flags

from vit_jax import entry, export, original, training
from vit_jax.cpu_devices import split_cpu_into_devices

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command-line flags; defined only when run as a program, so that importing
  this module leaves the flag namespace free."""
  entry.define_recipe_flag('config', 'Recipe file, e.g. configs/quickstart_vit.py.')
  flags.DEFINE_string('workdir', None, 'Where checkpoints, params.npz and logs go.')
  flags.DEFINE_bool('reconfigure', False, 'Go on in a workdir trained with other settings '
                    'or data, from its checkpoint, with the settings and data given now (the '
                    'change is recorded).')
  flags.DEFINE_string('coordinator_address', None,
                      'host:port of process 0, for multi-process runs.')
  flags.DEFINE_integer('num_processes', None, 'Number of processes in a multi-process run.')
  flags.DEFINE_integer('process_id', None, 'Index of this process in a multi-process run.')
  flags.DEFINE_string('export_transformers', None,
                      'After training, write the run to this folder as a Hugging Face '
                      'transformers model with a model card (vit_jax.export); a model '
                      'transformers cannot express is refused before training.')
  flags.DEFINE_integer('cpu_devices', 0,
                       'Data-parallel devices a CPU host is split into; 0: one per core, '
                       'fewer if the batch does not divide. No effect on GPU or TPU.')
  flags.mark_flags_as_required(['config', 'workdir'])


def main(argv: Sequence[str]) -> None:
  """Trains the recipe of the flags into --workdir.

  Args:
    argv: the command line's arguments that are no flags (none).
  """
  del argv
  split_cpu_into_devices(FLAGS.config, FLAGS.cpu_devices, FLAGS.num_processes or 1)
  if FLAGS.coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS'):
    # CPU processes need gloo for cross-process collectives; TPUs and GPUs ignore it.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  if FLAGS.export_transformers:  # once the devices are set: the check traces the model
    export.check_recipe(FLAGS.config, FLAGS.workdir, FLAGS.export_transformers)
  print(f'Process {jax.process_index()} of {jax.process_count()}, '
        f'{jax.device_count()} devices in all.', flush=True)
  summary = training.train_and_evaluate(FLAGS.config, FLAGS.workdir, FLAGS.reconfigure)
  print(f'Final {training.evaluation_line(summary)}; the run\'s files are in {FLAGS.workdir}.')
  if FLAGS.export_transformers and jax.process_index() == 0:
    card = export.transformers_folder(FLAGS.workdir, FLAGS.export_transformers)
    print(f'Exported for transformers: {card} and the model beside it.')


__getattr__ = original.forward(__name__)  # the original vit_jax's names (vit_jax/original/)


if __name__ == '__main__':
  define_flags()
  entry.run(main)
