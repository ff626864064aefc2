"""The training loop's actions after a step: the order they run in, declared once
(`periodic.ORDER`), keeps its rules, and each fires when it should."""
import itertools

import pytest

from vit_jax.training import periodic

EVERY = dict(log_every=5, checkpoint_every=20, eval_every=10)


def test_the_order_keeps_its_rules():
  at = {name: periodic.ORDER.index(name) for name in periodic.ORDER}
  assert len(at) == len(periodic.ORDER) == 6
  assert at[periodic.LOG] < at[periodic.SAVE]  # a diverged state is never saved
  assert at[periodic.SAVE] < at[periodic.KEEP_PARAMS] < at[periodic.STOP]  # nothing lost
  assert at[periodic.SAVE] < at[periodic.EVALUATE]  # a failed evaluation loses no training
  assert at[periodic.RESTART_THROUGHPUT] == len(periodic.ORDER) - 1  # after what it skips


@pytest.mark.parametrize('last,stopping', itertools.product([False, True], repeat=2))
def test_every_save_is_checked_first_and_every_stop_saved(last, stopping):
  for step in range(1, 61):
    due = periodic.due(step, last=last, stopping=stopping, kept=(), **EVERY)
    assert set(due) == set(periodic.ORDER)
    if due[periodic.SAVE]:
      assert due[periodic.LOG]
    assert due[periodic.STOP] == stopping
    if stopping or last:
      assert due[periodic.SAVE]
    if last:
      assert due[periodic.EVALUATE]


def test_periods_and_kept_steps():
  def due(step):
    return {name for name, on in periodic.due(step, last=False, stopping=False, kept=(7,),
                                              **EVERY).items() if on}

  assert due(3) == set()
  assert due(5) == {periodic.LOG}
  assert due(7) == {periodic.KEEP_PARAMS}
  assert due(10) == {periodic.LOG, periodic.EVALUATE, periodic.RESTART_THROUGHPUT}
  assert due(20) == {periodic.LOG, periodic.SAVE, periodic.EVALUATE,
                     periodic.RESTART_THROUGHPUT}


def test_run_calls_the_due_actions_in_order():
  calls = []
  actions = {name: (lambda step, name=name: calls.append((name, step)))
             for name in periodic.ORDER}
  dues = dict.fromkeys(periodic.ORDER, True)
  dues[periodic.KEEP_PARAMS] = False
  periodic.run(actions, 4, dues)
  assert calls == [(name, 4) for name in periodic.ORDER if name != periodic.KEEP_PARAMS]
