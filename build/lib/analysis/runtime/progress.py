"""Progress of a long analysis computation, printed at most every REPORT_EVERY
seconds with the time spent and an estimate of the time left, so that a tool that
runs for minutes (the Hessian of a ResNet on a CPU) is seen to be working. Each
unit done is a point where a noted SIGTERM or Ctrl-C stops the analysis
(`stopping.check`)."""
import time
from typing import Any, Callable, Optional

import jax

from analysis.runtime import stopping
from vit_jax.console import duration

REPORT_EVERY = 30.  # seconds


class Progress:
  """Counts units of work (Lanczos steps, batches) towards `total`; `advance`
  prints '<what>: 12/148 <unit>, 3m10s so far, about 28m left' when REPORT_EVERY
  seconds have passed since the last line. Work dispatched asynchronously is
  waited for (`wait_for`) before the clock is read for a line."""

  def __init__(self, what: str, total: int, unit: str, every: Optional[float] = None,
               out: Callable[[str], Any] = lambda line: print(line, flush=True)):
    self.what, self.total, self.unit, self.out = what, total, unit, out
    self.every = REPORT_EVERY if every is None else every
    self.done = 0
    self.started = self.last = time.perf_counter()

  def advance(self, units: int = 1, wait_for: Optional[Any] = None) -> None:
    """Counts `units` done, and prints a line when `every` seconds have passed;
    raises `stopping.Stopped` if a signal was noted.

    Args:
      units: the units just done.
      wait_for: arrays to wait for before timing (JAX runs asynchronously).
    """
    stopping.check()
    self.done += units
    if time.perf_counter() - self.last < self.every or self.done >= self.total:
      return
    if wait_for is not None:
      jax.block_until_ready(wait_for)
    self.last = time.perf_counter()
    spent = self.last - self.started
    left = spent / self.done * (self.total - self.done)
    self.out(f'{self.what}: {self.done}/{self.total} {self.unit}, {duration(spent)} so far, '
             f'about {duration(left)} left')
