"""A wall-clock budget for a training run (`--config.time_budget=15m`): a few
timed steps and an evaluation fix how many steps fit, evaluations and saving
included, before the schedule is built.
"""
import dataclasses
import re
import time
from typing import Callable, Iterator

import jax

_UNITS = {'h': 3600., 'm': 60., 's': 1.}
PROBE_STEPS = 8  # timed steps after the compiling one


def parse_duration(text: str) -> float:
  """Seconds of '15m', '90s', '1h30m' or a plain number of seconds."""
  text = str(text).strip()
  if re.fullmatch(r'\d+(\.\d*)?', text):
    return float(text)
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
  end), saves and one more compilation fit in `left_seconds` minus the margin."""
  per_step = (timing.step_seconds + timing.eval_seconds / eval_every +
              save_seconds / checkpoint_every)
  fixed = timing.compile_seconds + timing.eval_seconds + save_seconds + margin_seconds
  return max(int((left_seconds - fixed) / per_step), 0)


def time_steps(step_fn: Callable, state, batches: Iterator, eval_once: Callable[[], float],
               eval_batches: int) -> Timing:
  """Times `PROBE_STEPS` + 1 steps from a copy of `state` (the run's own state is
  left as it is) and one evaluation pass; `eval_once` runs the evaluation on one
  batch and `eval_batches` is how many a whole evaluation has."""
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


def deadline(started: float, time_budget: str, timing: Timing) -> float:
  """The clock time past which a budgeted run stops: the budget counted from
  `started`, less room for the final evaluation, a step and the last save. A
  machine that slows after the probe still ends in time, its schedule cut short."""
  return started + parse_duration(time_budget) - timing.eval_seconds - timing.step_seconds - 1.
