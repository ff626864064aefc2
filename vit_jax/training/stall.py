"""A training run whose CPU devices wait for each other forever, noticed and ended.

A process that splits its CPU into several XLA devices (`cpu_devices`) has been
seen, on a machine loaded by other work, to stop at an all-reduce with one
device's thread waiting and the other never arriving, using no CPU at all. The
collective timeouts that keep loaded runs alive (`cpu_devices.COLLECTIVE_TIMEOUTS`,
an hour) would hold it that long, and SIGTERM cannot reach Python while the main
thread waits inside XLA. `Watchdog` ends such a process after `SECONDS` with
neither a finished step nor CPU time spent, naming its last checkpoint, which a
rerun of the same command resumes from. A slow run, however loaded, keeps
spending CPU time and is left alone; so is a process that was stopped (Ctrl-Z)
or a machine that slept, whose clock gap is not counted.
"""
import os
import sys
import threading
import time
from typing import Callable, Optional

from vit_jax import console

SECONDS = 600.  # without a finished step or CPU time spent: stuck
CHECK_EVERY = 15.  # seconds between the watchdog's looks
IDLE_CPU = 0.002  # CPU seconds per second below which the process counts as idle
EXIT_CODE = 75  # EX_TEMPFAIL: the same command, run again, resumes


def end_process(message: str) -> None:
  """Writes `message` as the command line's errors are written ('Error: ...', on
  stderr) and ends the process at once with `EXIT_CODE` (its threads are waiting
  inside XLA, so no orderly exit would return).

  Args:
    message: what happened and what to do.
  """
  print(f'Error: {message}', file=sys.stderr, flush=True)
  os._exit(EXIT_CODE)


class Watchdog:
  """Ends the process (`end_process`) when no step has finished for `SECONDS` and
  the process spent less than `IDLE_CPU` CPU seconds per second meanwhile. Used
  as a context manager around the training steps; `beat` after each step.

  Args:
    devices: the process's CPU devices (the watchdog runs only with more than one:
      with one there is no collective to wait at, and a slow file system may leave a
      process idle while it is not stuck).
    saved: the step of the last good checkpoint, called when the watchdog fires.
    clock: seconds, monotonic (a parameter for tests).
    cpu: the process's CPU seconds (a parameter for tests).
  """

  def __init__(self, devices: int, saved: Callable[[], Optional[int]],
               clock: Callable[[], float] = time.monotonic,
               cpu: Callable[[], float] = time.process_time):
    self.devices, self.saved, self.clock, self.cpu = devices, saved, clock, cpu
    self.step = 0
    self._since = (clock(), cpu())  # the last beat's clock and CPU time
    self._stop = threading.Event()
    self._thread = None

  def beat(self, step: int) -> None:
    """Notes that `step` has been trained.

    Args:
      step: the step.
    """
    self.step, self._since = step, (self.clock(), self.cpu())

  def stuck(self, gap: float) -> Optional[str]:
    """The message to end the process with, or None while it is not stuck.

    Args:
      gap: seconds since the watchdog's last look; a gap longer than a few looks is
        time the process did not run (stopped, or the machine asleep) and starts the
        count again.

    Returns:
      What happened and what to do, or None.
    """
    now, spent = self.clock(), self.cpu()
    if gap > 3 * CHECK_EVERY:
      self._since = (now, spent)
      return None
    waited, used = now - self._since[0], spent - self._since[1]
    if waited < SECONDS or used > IDLE_CPU * waited:
      return None
    self._since = (now, spent)  # a stall is named once
    saved = self.saved()
    resume = (f'the checkpoint of step {saved} is kept: run the same command again to resume '
              'from it' if saved else 'no checkpoint was saved yet: run the same command again '
              'to start over')
    return (f'No training step finished in {console.duration(waited)} after step {self.step}, and '
            f'the process spent {used:.1f} s of CPU meanwhile: its {self.devices} CPU devices are '
            f'waiting at a collective for one that will not come (an XLA:CPU deadlock). '
            f'Stopping; {resume}, or train with --cpu_devices=1.')

  def _watch(self) -> None:
    last = self.clock()
    while not self._stop.wait(CHECK_EVERY):
      now = self.clock()
      message = self.stuck(now - last)
      last = now
      if message:
        end_process(message)

  def __enter__(self) -> 'Watchdog':
    if self.devices > 1:
      self._thread = threading.Thread(target=self._watch, name='stall-watchdog', daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
