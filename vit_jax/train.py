"""The training command: pretraining from scratch and fine-tuning (`vit_jax.loop`).

    python -m vit_jax.train --config configs/quickstart_vit.py --workdir DIR \
        [--config.batch_size=256 ...]

Also the original vit_jax's `train_and_evaluate` and `make_update_fn`, for its
configs (`vit_jax/configs/`) and data-parallel `pmap` steps (docs/original.md).
"""
import os
from typing import Any, Callable, Sequence

import flax
import jax
import ml_collections
import optax
from absl import flags, logging

from vit_jax import augreg, entry, loop, run_state, settings, steps
from vit_jax.configs import common as original_common
from vit_jax.cpu_devices import split_cpu_into_devices
from vit_jax.errors import ConfigError
from vit_jax.models import original

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command-line flags; defined only when run as a program, so that importing
  this module leaves the flag namespace free."""
  entry.define_recipe_flag('config', 'Recipe file, e.g. configs/quickstart_vit.py.')
  flags.DEFINE_string('workdir', None, 'Where checkpoints, params.npz and logs go.')
  flags.DEFINE_bool('reconfigure', False, 'Go on in a workdir trained with other settings, '
                    'from its checkpoint, with the settings given now.')
  flags.DEFINE_string('coordinator_address', None,
                      'host:port of process 0, for multi-process runs.')
  flags.DEFINE_integer('num_processes', None, 'Number of processes in a multi-process run.')
  flags.DEFINE_integer('process_id', None, 'Index of this process in a multi-process run.')
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
  print(f'Process {jax.process_index()} of {jax.process_count()}, '
        f'{jax.device_count()} devices in all.', flush=True)
  summary = loop.train_and_evaluate(FLAGS.config, FLAGS.workdir, FLAGS.reconfigure)
  print(f'Final {loop.evaluation_line(summary)}; the run\'s files are in {FLAGS.workdir}.')



# ---------------------------------------------------------------------------
# The original vit_jax's training functions.


def make_update_fn(*, apply_fn: Callable[..., Any], accum_steps: int,
                   tx: optax.GradientTransformation) -> Callable[..., Any]:
  """The original's data-parallel update: a `pmap` over the local devices of
  (params, opt_state, batch, rng) -> (params, opt_state, loss, rng), the softmax
  cross-entropy's gradient over the batch (`steps.accumulate_gradient`, in
  `accum_steps` pieces) averaged over the devices. Params are donated.

  Args:
    apply_fn: the model's `apply`.
    accum_steps: the pieces of each device's batch.
    tx: the optimizer.

  Returns:
    The pmapped update.
  """

  def update_fn(params, opt_state, batch, rng):
    _, new_rng = jax.random.split(rng)
    dropout_rng = jax.random.fold_in(rng, jax.lax.axis_index('batch'))

    def loss_and_grad(p, piece, index):
      del index  # one dropout key for the step, as the original
      def loss_of(q):
        logits = apply_fn(dict(params=q), piece['image'], rngs=dict(dropout=dropout_rng),
                          train=True)
        return steps.loss_fn(logits, piece['label'], 'softmax', 0.).mean()
      return jax.value_and_grad(loss_of)(p)

    loss, grads = steps.accumulate_gradient(
        loss_and_grad, params, {'image': batch['image'], 'label': batch['label']},
        accum_steps or 1)
    grads = jax.lax.pmean(grads, axis_name='batch')
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, jax.lax.pmean(loss, axis_name='batch'), new_rng

  return jax.pmap(update_fn, axis_name='batch', donate_argnums=(0,))


def _pretrained_file(config: ml_collections.ConfigDict) -> str:
  """The checkpoint an original config fine-tunes from: `{model_name}.npz`, or the
  AugReg file named (or the best ImageNet-21k one by upstream validation) in
  `pretrained_dir`."""
  name = config.get('model_or_filename')
  if not name:
    return os.path.join(config.pretrained_dir, f'{config.model.model_name}.npz')
  if '-' not in name:
    rows = [row for row in augreg.index(config.pretrained_dir)
            if row['filename'].split('-')[0] == name and row['ds'] == 'i21k']
    if not rows:
      raise ConfigError(f'The AugReg index in {config.pretrained_dir} has no ImageNet-21k '
                        f'checkpoint of {name}; name the file with '
                        '--config=.../augreg.py:<file name without .npz>.')
    name = max(rows, key=lambda row: row['final_val'])['filename']
  return os.path.join(config.pretrained_dir, f'{name}.npz')


def recipe(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The project's recipe (`settings.FIELDS`) of an original fine-tuning config: the
  same model in float32, data, batch sizes, SGD momentum (its dtype `optim_dtype`),
  schedule (with `linear_end` 1e-5), clipping and intervals.

  Args:
    config: an original config (`vit_jax/configs/vit.py`, ...).

  Returns:
    The recipe.
  """
  missing = [k for k in ('dataset', 'model', 'pp', 'total_steps') if not config.get(k)]
  if missing:
    raise ConfigError(f'The config sets no {", ".join(missing)}; set them, e.g. '
                      '--config.dataset=cifar10 (augreg.py needs the dataset).')
  defaults = original_common.get_config()
  ignored = [k for k in ('shuffle_buffer', 'prefetch', 'tfds_manual_dir')
             if config.get(k) not in (None, defaults.get(k))]
  if ignored:
    logging.warning('%s: the project\'s pipeline shuffles and reads ahead by itself, and '
                    'prepares TFDS data from its offline copies; these settings change nothing '
                    'in train_and_evaluate (docs/original.md).', ', '.join(ignored))
  model = original.project_config(config.model)
  fields = {k: v for k, v in model.to_dict().items() if k not in ('family', 'name', 'num_classes')}
  dataset, train_split, eval_split = config.dataset, config.pp['train'], config.pp['test']
  if os.path.isdir(dataset):
    from vit_jax import input_pipeline  # pylint: disable=import-outside-toplevel
    dataset, train_split, eval_split = input_pipeline.FOLDER_PREFIX + dataset, 'train', 'test'
  every = config.eval_every or config.total_steps
  project = settings.base_config()
  project.update(dict(
      model_name=model.name, model=fields, pretrained=_pretrained_file(config),
      dataset=dataset, data_dir=config.get('tfds_data_dir'), train_split=train_split,
      eval_split=eval_split, image_size=config.pp['crop'], batch_size=config.batch,
      eval_batch_size=config.batch_eval, accum_steps=config.accum_steps or 1,
      total_steps=config.total_steps, optimizer='sgd', momentum=0.9,
      momentum_dtype=config.optim_dtype, lr=config.base_lr, warmup_steps=config.warmup_steps,
      decay=config.decay_type, linear_end=1e-5, grad_clip=config.grad_norm_clip,
      log_every=config.progress_every or every, eval_every=every,
      checkpoint_every=every if config.checkpoint_every else config.total_steps))
  return project


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Any:
  """The original's fine-tuning run on the project's loop (`loop.train_and_evaluate`
  with `recipe(config)`), resumable; at the end `workdir/checkpoint_N` holds
  (params, optimizer state, N) as `flax.training.checkpoints` writes them.

  Args:
    config: an original config.
    workdir: the run's directory.

  Returns:
    The trained parameters.
  """
  from flax.training import checkpoints as flax_checkpoints  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  config = recipe(config)
  loop.train_and_evaluate(config, workdir, reconfigure=False)
  from vit_jax import input_pipeline  # pylint: disable=import-outside-toplevel
  source = input_pipeline.get_source(config.dataset, config.train_split, config.data_dir)
  setup = steps.build(config, source.num_classes, config.total_steps)
  manager = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), 'checkpoints'))
  state, _ = run_state.resume(manager, setup.state)
  params, opt_state = jax.device_get((state.params, state.opt_state))
  flax_checkpoints.save_checkpoint(os.path.abspath(workdir), (params, opt_state, int(state.step)),
                                   int(state.step), overwrite=True)
  return flax.core.unfreeze(params)


if __name__ == '__main__':
  define_flags()
  entry.run(main)
