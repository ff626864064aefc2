"""What the commands print: the project's own lines, one per event and without a
logging prefix beyond the time; the libraries' notes (orbax's lines per
checkpoint, TFDS's construction notes, JAX's backend probing) only when absl's
`--verbosity` asks for them:

  not given, or -1  the project's lines and the libraries' warnings and errors;
   0                the libraries' INFO notes as well (absl's format);
   1 or more        their DEBUG notes too.

The libraries log through absl's logger or Python's root logger; the project logs
through the `vit_jax` and `analysis` loggers, which write to stderr themselves.
"""
import logging
import os
import sys

PROJECT_LOGGERS = ('vit_jax', 'analysis')
_LIBRARY_NOTES = ('tensorflow_datasets',)  # their warnings are construction notes too


def configure(verbosity: int) -> None:
  """Sets what the command prints (see the module's docstring).

  Args:
    verbosity: absl's --verbosity, -1 where it was not given.
  """
  libraries = logging.WARNING if verbosity < 0 else (logging.INFO if verbosity == 0 else
                                                     logging.DEBUG)
  logging.getLogger().setLevel(libraries)
  logging.getLogger('absl').setLevel(logging.NOTSET)  # as the root logger
  if verbosity < 0:
    for handler in logging.getLogger().handlers:
      handler.addFilter(_drop_library_notes)
    sys.unraisablehook = _quiet_unraisable
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter('%(asctime)s %(message)s', datefmt='%H:%M:%S'))
  for name in PROJECT_LOGGERS:
    logger = logging.getLogger(name)
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO)


def _drop_library_notes(record: logging.LogRecord) -> bool:
  """False for a warning of a library whose warnings are notes (TFDS's on its
  cache folders), and for asyncio's "exception was never retrieved": orbax reads
  and writes an array per task and raises the first failure, which the project
  reports in its own line, while the same failure of its sibling tasks is logged
  again as they are collected. Other errors always pass."""
  if record.name == 'asyncio' and 'exception was never retrieved' in record.getMessage():
    return False
  return record.levelno >= logging.ERROR or not any(
      f'{os.sep}{name}{os.sep}' in record.pathname for name in _LIBRARY_NOTES)


def _quiet_unraisable(unraisable) -> None:
  """Leaves out the RuntimeError('Event loop is closed') that TensorStore's
  callbacks raise after orbax has closed its event loop (dozens of tracebacks
  once a damaged checkpoint failed to restore); anything else as Python says it."""
  if (isinstance(unraisable.exc_value, RuntimeError) and
      str(unraisable.exc_value) == 'Event loop is closed'):
    return
  sys.__unraisablehook__(unraisable)


def duration(seconds: float) -> str:
  """Seconds as `--config.time_budget` and `--time_budget` are written.

  Args:
    seconds: a duration.

  Returns:
    '42s', '3m05s' or '1h02m05s', rounded to the second
    (`budget.parse_duration` reads it back).
  """
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  if hours:
    return f'{hours}h{rest // 60:02d}m{rest % 60:02d}s'
  return f'{rest // 60}m{rest % 60:02d}s' if rest >= 60 else f'{rest}s'


def training_line(step: int, total_steps: int, progress: float, metrics: dict,
                  images_per_second: float, left_seconds: float, budgeted: bool) -> str:
  """A progress line of training: the step of the recipe's steps, the schedule's
  progress (ahead of the steps under a time budget), the loss, the learning rate,
  the images per second and the time left, against the budget where there is one.

  Args:
    step: the step just trained.
    total_steps: the recipe's steps.
    progress: the schedule's progress in [0, 1] (`budget.Clock.progress`).
    metrics: the step's metrics as floats, with 'loss' and 'learning_rate'.
    images_per_second: the training rate over all devices since the last line;
      0 when not measured yet.
    left_seconds: the time left: of the budget, or at this rate.
    budgeted: whether the run has a time budget.

  Returns:
    One line, e.g. 'step 400/6084 (schedule 14.1%): loss 1.2345, lr 1.20e-03,
    480 images/s, 12m30s of the budget left'.
  """
  rate = f', {images_per_second:.0f} images/s' if images_per_second else ''
  left_seconds = max(left_seconds, 0.)  # a budget spent during the last step
  left = (f'{duration(left_seconds)} of the budget left' if budgeted else
          f'about {duration(left_seconds)} left' if images_per_second else '')
  return (f'step {step}/{total_steps} (schedule {100 * progress:.1f}%): loss '
          f'{metrics["loss"]:.4f}, lr {metrics["learning_rate"]:.2e}{rate}' +
          (f', {left}' if left else ''))

