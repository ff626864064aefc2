"""The original vit_jax's command line, on the project's loop:

    python -m vit_jax.main --workdir=/tmp/vit \
        --config=$(pwd)/vit_jax/configs/vit.py:b16,cifar10 \
        --config.pretrained_dir=DIR_WITH_ViT-B_16.npz

`config.trainer` 'train' fine-tunes (`vit_jax.train.train_and_evaluate`),
'inference_time' times the model (`vit_jax.inference_time`). The project's own
command is `python -m vit_jax.train --config configs/... --workdir DIR`.
"""
from typing import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from vit_jax import entry
from vit_jax.original import inference_time, train, utils

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The original's flags: --workdir and --config (a config file, locked)."""
  flags.DEFINE_string('workdir', None, 'Directory to store logs and model data.')
  config_flags.DEFINE_config_file('config', None, 'File path to the training configuration.',
                                  lock_config=True)
  flags.mark_flags_as_required(['config', 'workdir'])


def main(argv: Sequence[str]) -> None:
  """Runs `config.trainer` on the config of the flags.

  Args:
    argv: the command line's arguments that are no flags (none).
  """
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')
  utils.add_gfile_logger(FLAGS.workdir)
  logging.info('Config: %s', FLAGS.config)
  trainer = FLAGS.config.get('trainer', 'train')
  if trainer == 'train':
    train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  elif trainer == 'inference_time':
    inference_time.inference_time(FLAGS.config, FLAGS.workdir)
  else:
    raise app.UsageError(f'Unknown trainer: {trainer}; use train or inference_time.')


def run() -> None:
  """The command: its flags, then `main` (the original's config loaded first, its
  fields its own)."""
  define_flags()
  entry.run(main, fields=False)


if __name__ == '__main__':
  run()
