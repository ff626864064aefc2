"""A wall-clock budget for a training run (`--config.time_budget=15m`), kept by the
clock rather than by a step count fixed in advance (budgeted training, Li, Yumer
and Ramanan 2020): a few timed steps and an evaluation fix how many seconds the
training may take, the final evaluation and save set aside; the schedule's
progress is then the larger of steps done over the recipe's steps and the share
of those seconds spent (`Clock`), the learning rate at that progress set into the
optimizer before each step (`steps.set_learning_rate`), so the run ends at its
deadline with the learning rate decayed to its end, whatever load the machine meets on the way,
or earlier when the recipe's steps are done. Such a run depends on the clock, so
it is not bit-reproducible; an unbudgeted run is.
"""
import dataclasses
import re
import time
from typing import Any, Callable, Iterator, Optional

import jax

_UNITS = {'h': 3600., 'm': 60., 's': 1.}
PROBE_STEPS = 8  # timed steps after the compiling one


def parse_duration(text: str) -> float:
  """Seconds of '15m', '90s' or '1h30m'; a number without its unit is refused.

  Args:
    text: the duration as a user writes it.

  Returns:
    Its seconds.

  Raises:
    ValueError: `text` is no such duration.
  """
  text = str(text).strip()
  if re.fullmatch(r'\d+(\.\d*)?', text):
    raise ValueError(f'time_budget {text!r} has no unit: write {text}s, {text}m or {text}h.')
  parts = re.findall(r'(\d+(?:\.\d*)?)([hms])', text)
  if not parts or ''.join(n + u for n, u in parts) != text:
    raise ValueError(f'time_budget {text!r} is not a duration such as 15m, 90s or 1h30m.')
  return sum(float(n) * _UNITS[u] for n, u in parts)


@dataclasses.dataclass(frozen=True)
class Timing:
  compile_seconds: float  # first train and eval step beyond steady ones: compilation, warm-up
  step_seconds: float  # a steady train step
  eval_seconds: float  # a whole evaluation, its compilation left out


def fit_steps(timing: Timing, left_seconds: float, eval_every: int, checkpoint_every: int,
              save_seconds: float, margin_seconds: float) -> int:
  """The most steps whose training, evaluations (every `eval_every` steps and at the
  end), saves and one more compilation fit in `left_seconds` minus the margin.

  Args:
    timing: a step's and an evaluation's measured seconds (`time_steps`).
    left_seconds: the seconds the steps may take.
    eval_every: steps between evaluations.
    checkpoint_every: steps between saves.
    save_seconds: the seconds of a save.
    margin_seconds: seconds kept back for the machine's noise.

  Returns:
    The number of steps.
  """
  per_step = (timing.step_seconds + timing.eval_seconds / eval_every +
              save_seconds / checkpoint_every)
  fixed = timing.compile_seconds + timing.eval_seconds + save_seconds + margin_seconds
  return max(int((left_seconds - fixed) / per_step), 0)


def time_steps(step_fn: Callable, state: Any, batches: Iterator, eval_once: Callable[[], Any],
               eval_batches: int) -> Timing:
  """Times `PROBE_STEPS` + 1 steps from a copy of `state` (the run's own state is
  left as it is) and one evaluation pass; `eval_once` runs the evaluation on one
  batch and `eval_batches` is how many a whole evaluation has.

  Args:
    step_fn: (state, batch) -> (state, metrics), the compiled training step.
    state: the training state to copy.
    batches: the training batches.
    eval_once: runs the evaluation on one batch (its result is not used).
    eval_batches: the batches of a whole evaluation.

  Returns:
    The timing of a step and of an evaluation.
  """
  state = jax.tree_util.tree_map(lambda x: x.copy(), state)  # the step donates its state
  start = time.perf_counter()
  state, metrics = step_fn(state, next(batches))
  jax.block_until_ready(metrics)
  first = time.perf_counter() - start
  start = time.perf_counter()
  for _ in range(PROBE_STEPS):
    state, metrics = step_fn(state, next(batches))
  jax.block_until_ready(metrics)
  step = (time.perf_counter() - start) / PROBE_STEPS
  start = time.perf_counter()
  eval_once()  # compiles
  eval_first = time.perf_counter() - start
  start = time.perf_counter()
  eval_once()
  eval_one = time.perf_counter() - start
  return Timing(compile_seconds=max(first - step, 0.) + max(eval_first - eval_one, 0.),
                step_seconds=step, eval_seconds=eval_one * eval_batches)


def train_seconds(budget_seconds: float, timing: Timing) -> float:
  """The seconds of the budget by which training must end, counted from the start
  of the run, set-up included: the final evaluation, a save and a step set aside,
  and a margin for the machine's noise.

  Args:
    budget_seconds: the run's budget.
    timing: a step's and an evaluation's measured seconds.

  Returns:
    The seconds.
  """
  return budget_seconds - timing.eval_seconds - 2 * timing.step_seconds - 1. - (
      0.01 * budget_seconds + 2.)


class Clock:
  """A run's training progress in [0, 1]: steps done over `total_steps`, or with a
  budget of `seconds`, the larger of that and the share of it spent since `started`
  (the run's start, set-up included), counting `spent` seconds of earlier runs of
  the same workdir (from its checkpoint). `agree` makes every process read one
  clock (process 0's) in a multi-host run."""

  def __init__(self, total_steps: int, seconds: Optional[float] = None, spent: float = 0.,
               started: Optional[float] = None, agree: Callable[[float], float] = float):
    self.total_steps, self.seconds, self.spent, self.agree = total_steps, seconds, spent, agree
    self.started = time.perf_counter() if started is None else started

  @property
  def budgeted(self) -> bool:
    return self.seconds is not None

  def elapsed(self) -> float:
    """Training seconds of this workdir so far, earlier runs included."""
    return self.agree(self.spent + time.perf_counter() - self.started)

  def progress(self, steps_done: int) -> float:
    """The schedule's progress in [0, 1]: steps done over the recipe's, or budgeted
    the larger of that and the share of the budget spent.

    Args:
      steps_done: the steps trained.

    Returns:
      The progress.
    """
    by_steps = steps_done / self.total_steps
    if not self.budgeted:
      return by_steps
    return min(max(by_steps, self.elapsed() / self.seconds), 1.)

  def done(self, steps_done: int) -> bool:
    """Whether the recipe's steps are done or, budgeted, its seconds spent.

    Args:
      steps_done: the steps trained.

    Returns:
      Whether to stop training.
    """
    return steps_done >= self.total_steps or (self.budgeted and self.elapsed() >= self.seconds)
