"""The watchdog that ends a training run stuck at an XLA:CPU collective: when it
fires (no step and no CPU time for `stall.SECONDS`), when it must not (a slow or
starved run, a stopped process), and its place in the training loop."""
import dataclasses
import threading
import time

import pytest

from helpers import make_folder, tiny_config
from vit_jax.training import loop, stall, steps


class Clocks:
  """A monotonic clock and a process CPU clock that the test moves."""

  def __init__(self):
    self.now, self.spent = 100., 7.

  def run(self, seconds: float, cpu_share: float) -> None:
    self.now += seconds
    self.spent += seconds * cpu_share


@pytest.fixture
def clocks():
  return Clocks()


def _watchdog(clocks, saved=300):
  return stall.Watchdog(2, lambda: saved, clock=lambda: clocks.now, cpu=lambda: clocks.spent)


def _looks(watchdog, clocks, seconds, cpu_share):
  """The watchdog's looks over `seconds`, every CHECK_EVERY: the first message."""
  for _ in range(int(seconds / stall.CHECK_EVERY)):
    clocks.run(stall.CHECK_EVERY, cpu_share)
    message = watchdog.stuck(stall.CHECK_EVERY)
    if message:
      return message
  return None


def test_an_idle_run_without_steps_is_stuck_after_its_seconds(clocks):
  watchdog = _watchdog(clocks)
  watchdog.beat(450)
  assert _looks(watchdog, clocks, stall.SECONDS - stall.CHECK_EVERY, 0.) is None
  message = _looks(watchdog, clocks, stall.CHECK_EVERY, 0.)
  assert message == (
      'No training step finished in 10m00s after step 450, and the process spent 0.0 s of CPU '
      'meanwhile: its 2 CPU devices are waiting at a collective for one that will not come (an '
      'XLA:CPU deadlock). Stopping; the checkpoint of step 300 is kept: run the same command '
      'again to resume from it, or train with --cpu_devices=1.')
  assert 'no checkpoint was saved yet' in _looks(_watchdog(clocks, None), clocks,
                                                 stall.SECONDS, 0.)


@pytest.mark.parametrize('cpu_share', [
    0.014,  # a nice-19 process beside two busy ones on two cores: 15 / (1024 + 15) of a core
    1.0])
def test_a_slow_run_that_spends_cpu_is_not_stuck(clocks, cpu_share):
  assert _looks(_watchdog(clocks), clocks, 3 * stall.SECONDS, cpu_share) is None


def test_steps_and_a_stopped_process_start_the_count_again(clocks):
  watchdog = _watchdog(clocks)
  assert _looks(watchdog, clocks, stall.SECONDS - 2 * stall.CHECK_EVERY, 0.) is None
  watchdog.beat(7)
  assert _looks(watchdog, clocks, stall.SECONDS - 2 * stall.CHECK_EVERY, 0.) is None
  # Ctrl-Z for an hour, then fg: the watchdog did not run either; its gap says so.
  clocks.run(3600., 0.)
  assert watchdog.stuck(3600. + stall.CHECK_EVERY) is None
  assert _looks(watchdog, clocks, stall.SECONDS - 2 * stall.CHECK_EVERY, 0.) is None
  assert 'after step 7' in _looks(watchdog, clocks, 2 * stall.CHECK_EVERY, 0.)


def test_the_watchdog_watches_only_several_cpu_devices(monkeypatch):
  monkeypatch.setattr(stall, 'SECONDS', 0.2)
  monkeypatch.setattr(stall, 'CHECK_EVERY', 0.02)
  ended = []
  monkeypatch.setattr(stall, 'end_process', ended.append)
  for devices in (1, 2):
    with stall.Watchdog(devices, lambda: None, cpu=lambda: 0.) as watchdog:
      assert (watchdog._thread is not None) == (devices > 1)
      time.sleep(0.3)
    assert bool(ended) == (devices > 1)
  assert not any(t.name == 'stall-watchdog' for t in threading.enumerate())


def test_a_training_step_stuck_idle_is_named_with_the_last_checkpoint(tmp_path, monkeypatch):
  """A step that waits 2 s without CPU on the test's 8 CPU devices, against a
  watchdog set to 1 s: it names the step before and the checkpoint of step 3."""
  folder = make_folder(str(tmp_path / 'images'), {'train': [12, 12], 'test': [4, 4]},
                       size=(10, 10))
  monkeypatch.setattr(stall, 'SECONDS', 1.)
  monkeypatch.setattr(stall, 'CHECK_EVERY', 0.1)
  # Idle: less than half a core (the test's process keeps threads of its own).
  monkeypatch.setattr(stall, 'IDLE_CPU', 0.5)
  ended = []
  monkeypatch.setattr(stall, 'end_process', ended.append)
  build = steps.build

  def stuck_at_step_5(*args, **kwargs):
    setup = build(*args, **kwargs)
    calls = []

    def train_step(state, batch):
      calls.append(1)
      if len(calls) == 5:
        time.sleep(2.)
      return setup.train_step(state, batch)
    return dataclasses.replace(setup, train_step=train_step)
  monkeypatch.setattr(steps, 'build', stuck_at_step_5)
  loop.train_and_evaluate(tiny_config(folder), str(tmp_path / 'run'))
  assert any('after step 4' in m and 'its 8 CPU devices' in m and 'checkpoint of step 3' in m
             for m in ended), ended


def test_a_stuck_process_ends_with_its_message_and_the_retry_code():
  import subprocess
  import sys
  from doc_snippets import ROOT
  script = ('import time\n'
            'from vit_jax.training import stall\n'
            'stall.SECONDS, stall.CHECK_EVERY = 0.2, 0.05\n'
            'with stall.Watchdog(2, lambda: 12, cpu=lambda: 0.):\n'
            '  time.sleep(30)\n')
  run = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
  assert run.returncode == stall.EXIT_CODE, run.stderr[-2000:]
  assert run.stderr.startswith('Error: No training step finished in 0s after step 0')
  assert 'the checkpoint of step 12 is kept: run the same command again' in run.stderr
