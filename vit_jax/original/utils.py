"""The original vit_jax's training utilities: its learning-rate schedule (with
`linear_end`), gradient accumulation and file logger, each on the project's own
(`steps.learning_rate_schedule`, `steps.accumulate_gradient`)."""
import logging as python_logging
from typing import Any, Callable, Tuple

import jax.numpy as jnp
import ml_collections
from absl import logging
from etils import epath

from vit_jax import training


class GFileHandler(python_logging.StreamHandler):
  """A logging handler appending to a file any filesystem `etils.epath` knows."""

  def __init__(self, filename: str, mode: str = 'a', flush_secs: float = 1.0):
    del flush_secs  # every record is flushed
    super().__init__(epath.Path(filename).open(mode))

  def emit(self, record: python_logging.LogRecord) -> None:
    super().emit(record)
    self.flush()


def add_gfile_logger(workdir: str, *, basename: str = 'train',
                     level: int = python_logging.INFO) -> None:
  """Adds a handler writing the log to `{workdir}/{basename}.log`.

  Args:
    workdir: the directory.
    basename: the file's name without '.log'.
    level: the lowest level written.
  """
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  handler = GFileHandler(f'{workdir}/{basename}.log', 'a')
  handler.setLevel(level)
  handler.setFormatter(logging.PythonFormatter())
  python_logging.getLogger('').addHandler(handler)


def create_learning_rate_schedule(total_steps: int, base: float, decay_type: str,
                                  warmup_steps: int, linear_end: float = 1e-5
                                  ) -> Callable[[Any], jnp.ndarray]:
  """The original's schedule: linear warm-up over `warmup_steps`, then cosine decay
  to 0 or linear decay to `linear_end` at `total_steps`.

  Args:
    total_steps: the steps of the run.
    base: the learning rate after warm-up.
    decay_type: 'cosine' or 'linear'.
    warmup_steps: the warm-up's steps.
    linear_end: where the linear decay ends.

  Returns:
    step -> learning rate (float32).
  """
  if decay_type not in ('cosine', 'linear'):
    raise ValueError(f'Unknown lr type {decay_type}')
  config = ml_collections.ConfigDict(dict(lr=base, warmup_steps=warmup_steps, decay=decay_type,
                                          linear_end=linear_end))
  schedule = training.learning_rate_schedule(config, total_steps)
  return lambda step: jnp.asarray(schedule(jnp.asarray(step, jnp.float32) / total_steps),
                                  jnp.float32)


def accumulate_gradient(loss_and_grad_fn: Callable[[Any, Any, Any], Tuple[Any, Any]],
                        params: Any, images: Any, labels: Any, accum_steps: int
                        ) -> Tuple[Any, Any]:
  """The mean loss and gradient over a batch, in `accum_steps` pieces.

  Args:
    loss_and_grad_fn: (params, images, labels) -> (loss, gradient).
    params: the parameters.
    images: the batch's images.
    labels: its labels.
    accum_steps: the pieces (None or 1: the whole batch at once).

  Returns:
    (loss, gradient).
  """
  return training.accumulate_gradient(
      lambda p, piece, index: loss_and_grad_fn(p, piece['image'], piece['label']),
      params, {'image': images, 'label': labels}, accum_steps or 1)

