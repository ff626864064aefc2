"""Orbax checkpoints of a training run's state: each saved with a checksum of
every array, and restored newest first past any that is unreadable, altered
since it was written, or not finite. A run whose checkpoints all fail is
refused, never silently restarted from step 0.

A checkpoint whose optimizer state holds the learning rate's bookkeeping in
another layout (one written before the rate became an `optax.inject_hyperparams`
hyperparameter, or by the same run with or without a time budget) is restored
by path and its bookkeeping completed (`migrated`); so is one written before the
recipe kept a moving average of the weights (`ema_decay`, which then starts at
the restored weights) or after it stopped keeping one.
"""
import logging
import os
import re
import zlib
from typing import Any, Dict, Optional, Tuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from vit_jax import files
from vit_jax.models.family import CheckpointError
from vit_jax.training.sharding import path_string

log = logging.getLogger(__name__)

STATE, CHECKSUMS, CLOCK = 'state', 'checksums', 'clock'  # the items of one checkpoint
# The learning rate's bookkeeping in the optimizer state (`steps.learning_rate`):
# what a checkpoint in another layout may lack or hold besides.
BOOKKEEPING = re.compile(r'(^|/)(hyperparams|hyperparams_states)/')
EMA = 'ema_params/'  # the weights' moving average (`steps.TrainState.ema_params`)


def _bytes(leaf) -> bytes:
  """An array's bytes; a scalar's value (the step restores as a Python int)."""
  array = np.asarray(leaf)
  return np.ascontiguousarray(array).tobytes() if array.ndim else repr(array.item()).encode()


def checksums(state: Any) -> Dict[str, int]:
  """CRC-32 of every array of `state` by its key path.

  Args:
    state: a tree of arrays.

  Returns:
    {key path: checksum}.
  """
  return {jax.tree_util.keystr(path): zlib.crc32(_bytes(leaf))
          for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state))}


def save(manager: ocp.CheckpointManager, step: int, state: Any, seconds: float = 0.) -> None:
  """The state at `step`, its checksums, and the `seconds` of training it took
  (`budget.Clock`: a resumed budgeted run goes on from them).

  Args:
    manager: the run's checkpoint manager.
    step: the step.
    state: the training state.
    seconds: the training seconds behind it.
  """
  manager.save(step, args=ocp.args.Composite(**{
      STATE: ocp.args.StandardSave(state), CHECKSUMS: ocp.args.JsonSave(checksums(state)),
      CLOCK: ocp.args.JsonSave({'train_seconds': seconds})}))


def _normal(key: str) -> str:
  """A `jax.tree_util.keystr` as a '/'-joined path (`sharding.path_string`), the
  same for a typed state ('.opt_state[0].count') and the dicts and lists orbax
  restores without a target ("['opt_state'][0]['count']")."""
  return '/'.join(a or b or c for a, b, c in
                  re.findall(r"\['([^']*)'\]|\[(\d+)\]|\.(\w+)", key))


def _paths(tree: Any) -> Dict[str, Any]:
  return {path_string(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def migrated(saved: Any, abstract: Any) -> Any:
  """A state restored without a target (dicts and lists) in the tree of
  `abstract`, leaf by path; the learning rate's bookkeeping it lacks is
  completed: a schedule's step count from the count beside it, the rate itself
  from `abstract` (recomputed, or set from outside, before the next update). A
  moving average of the weights that `abstract` has and `saved` lacks starts at
  the saved weights; one `saved` has and `abstract` lacks is left out.

  Args:
    saved: the restored state.
    abstract: the state's current tree, arrays or their shapes.

  Returns:
    The state in `abstract`'s tree.

  Raises:
    CheckpointError: the trees differ beyond that bookkeeping.
  """
  have, want = _paths(saved), _paths(abstract)
  differ = sorted(p for p in set(have) ^ set(want)
                  if not BOOKKEEPING.search(p) and not p.startswith(EMA))
  if differ:
    raise CheckpointError(f'its state has another tree than this recipe\'s ({len(differ)} '
                          f'paths differ, e.g. {differ[0]})')

  def leaf(path, shape):
    if path in have:
      return have[path]
    if path.startswith(EMA):
      return np.array(have['params/' + path[len(EMA):]])  # a buffer of its own
    if path.endswith('/count'):  # a schedule's steps: those of the node that holds it
      node = path[:BOOKKEEPING.search(path).start()]
      return np.array(have[f'{node}/count' if node else 'count'])  # a buffer of its own
    return np.zeros(shape.shape, shape.dtype)  # the rate: set before it is used
  return jax.tree_util.tree_map_with_path(lambda p, x: leaf(path_string(p), x), abstract)


def _problem(restored, expected: Optional[Dict[str, int]]) -> Optional[str]:
  """Why a restored state cannot be trusted, or None."""
  restored = jax.device_get(restored)
  if expected is not None:
    expected = {_normal(k): v for k, v in expected.items()}
    altered = [k for k, v in checksums(restored).items() if expected.get(_normal(k)) != v]
    if altered:
      return f'{len(altered)} arrays differ from what was saved (e.g. {altered[0]})'
  bad = files.non_finite(restored)
  return f'{len(bad)} arrays hold NaN or infinity (e.g. {bad[0]})' if bad else None


def _restore_step(manager: ocp.CheckpointManager, step: int, abstract):
  """(state, checksums or None, training seconds, whether the state is in another
  tree than `abstract`'s) of one checkpoint; those written before checksums or
  the clock were kept hold the state alone (the clock then 0). A state in
  another tree is restored without a target, as dicts and lists (`migrated`)."""
  directory = os.path.join(os.fspath(manager.directory), str(step))
  if not os.path.isdir(os.path.join(directory, STATE)):
    return manager.restore(step, args=ocp.args.StandardRestore(abstract)), None, 0., False
  saved = ocp.StandardCheckpointHandler().metadata(epath.Path(directory) / STATE).tree
  other = set(_paths(saved)) != set(_paths(abstract))
  items = {STATE: ocp.args.StandardRestore(None if other else abstract),
           CHECKSUMS: ocp.args.JsonRestore()}
  if os.path.isdir(os.path.join(directory, CLOCK)):
    items[CLOCK] = ocp.args.JsonRestore()
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  clock = restored[CLOCK]['train_seconds'] if CLOCK in items else 0.
  return restored[STATE], restored[CHECKSUMS], float(clock), other


def restore_latest(manager: ocp.CheckpointManager, abstract_state: Any) -> Tuple[Any, float]:
  """The newest checkpoint that restores and checks out, and the seconds of training
  it took; the others are reported and skipped. (None, 0.) when there are none; a
  CheckpointError when none of them does.

  Args:
    manager: the run's checkpoint manager.
    abstract_state: the state's shapes and shardings.

  Returns:
    (the state or None, its training seconds).
  """
  steps = sorted(manager.all_steps(), reverse=True)
  problems = []
  for step in steps:
    try:
      state, expected, seconds, other = _restore_step(manager, step, abstract_state)
      problem = _problem(state, expected)
      if problem is None and other:
        state = migrated(state, abstract_state)
        log.info('Checkpoint at step %d holds the learning rate\'s bookkeeping or the '
                 'weights\' moving average in another layout (an earlier version\'s, or a run '
                 'with or without a time budget or ema_decay): restored by path.', step)
    except Exception as e:  # orbax raises many kinds for a damaged checkpoint.
      problem = f'{type(e).__name__}: {" ".join(str(e).split())[:300]}'  # one line
    if problem is None:
      return state, seconds
    log.warning('Checkpoint at step %d in %s cannot be used (%s); trying an earlier one.',
                    step, manager.directory, problem)
    problems.append(f'step {step}: {problem}')
  if steps:
    raise CheckpointError(
        f'No checkpoint in {manager.directory} can be used ({"; ".join(problems)}): they are '
        'damaged or hold another model than this recipe builds. Move them away (or train into '
        'a new workdir) to start from scratch.')
  return None, 0.


def resume(manager: ocp.CheckpointManager, state: Any) -> Tuple[Any, float]:
  """The state of the newest usable checkpoint, placed as `state` is (the run's
  mesh and sharding, whatever the devices that wrote it), or `state` (fresh) where
  the run has none; and the seconds of training behind it.

  Args:
    manager: the run's checkpoint manager.
    state: the fresh state, placed as the run places it.

  Returns:
    (the state, its training seconds).
  """
  restored, seconds = restore_latest(
      manager, jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state))
  if restored is None:
    return state, 0.
  log.info('Resumed from step %d.', int(restored.step))
  return jax.device_put(restored, jax.tree_util.tree_map(lambda x: x.sharding, state)), seconds
