"""A workdir belongs to one run: a lock while a trainer holds it, and the run's
settings recorded in it, so that a rerun which would change what its files mean
is refused, naming the fields that differ.

    with workdir.claim(DIR, config) as record:
      ...  # restore the run's state
      record()
      ...  # train

The lock (`LOCK`) holds the holder's host and process id; a lock whose process
is gone (same host) is stale and taken over. The record (`RECORD`) is the
recipe's fields; fields that only say how often to log, evaluate or save, or
where the data lives, may change between runs (`FREE_FIELDS`).
"""
import contextlib
import errno
import fcntl
import glob
import json
import logging
import os
import shutil
import socket
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import jax
import ml_collections

from vit_jax.errors import WorkdirError
from vit_jax.files import DATA, LOCK, RECORD, atomic_write, has_results

log = logging.getLogger(__name__)

EMA_PARAMS = 'params_ema.npz'  # the weights' moving average, beside params.npz (ema_decay)
WARMUP = 'warmup'  # in a list of steps: the recipe's last warm-up step


def kept_steps(spec: str, warmup_steps: int) -> Tuple[int, ...]:
  """The steps a list such as 'warmup,1000' names, in order ('warmup' is
  `warmup_steps`); a ValueError names a word that is neither.

  Args:
    spec: comma-separated step numbers and 'warmup'.
    warmup_steps: the run's warm-up.

  Returns:
    The steps.
  """
  steps = set()
  for word in filter(None, (w.strip() for w in spec.split(','))):
    if word == WARMUP:
      steps.add(warmup_steps)
    elif word.isdigit() and int(word) >= 1:
      steps.add(int(word))
    else:
      raise ValueError(f'{word!r} is neither {WARMUP!r} nor a step number >= 1')
  return tuple(sorted(steps))


def kept_params_path(workdir: str, step: Union[int, str]) -> str:
  """Where a run keeps the parameters of `step` (recipe field `keep_params_at`).

  Args:
    workdir: the run's workdir.
    step: the step ('*' gives a glob pattern).

  Returns:
    The path.
  """
  return os.path.join(workdir, f'params_{step}.npz')


# Fields a resumed run may change without changing what its checkpoints mean.
FREE_FIELDS = ('tier', 'log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints',
               'keep_params_at', 'eval_batch_size', 'data_dir', 'augreg_dir')
# Fields recorded under an earlier name: the augmentation, now `config.input`.
MOVED_FIELDS = {'inception_crop': 'input.crop', 'crop_padding': 'input.crop_padding',
                'mixup_alpha': 'input.mixup_alpha', 'randaugment': 'input.randaugment'}


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


def take_lock(path: str, who: str = 'the trainer',
              advice: str = 'train into another workdir') -> None:
  """Creates the lock file, or raises a WorkdirError naming its live holder; a
  stale lock (its process gone from this host) is taken over.

  Takers of one directory's lock on a host queue on an `flock` of the directory,
  so two processes finding one stale lock cannot both take it over; the file
  appears whole (written aside, then hard-linked to its name, which fails if it
  exists).

  Args:
    path: the lock file.
    who: what holds such a lock, as the error names it.
    advice: what to do instead of waiting, as the error says it.
  """
  me = {'host': socket.gethostname(), 'pid': os.getpid(),
        'since': time.strftime('%Y-%m-%d %H:%M:%S')}
  folder = os.open(os.path.dirname(path) or '.', os.O_RDONLY)
  try:
    fcntl.flock(folder, fcntl.LOCK_EX)
    for _ in range(2):
      aside = f'{path}.{os.getpid()}'
      with open(aside, 'w') as f:
        json.dump(me, f)
      try:
        os.link(aside, path)
        return
      except FileExistsError:
        pass
      finally:
        os.remove(aside)
      try:
        with open(path) as f:
          holder = json.load(f)
      except (OSError, ValueError):
        holder = {}
      if holder.get('host') == me['host'] and not _alive(int(holder.get('pid', -1))):
        log.warning('Taking over the stale lock %s of process %s, which has ended.', path,
                        holder.get('pid'))
        os.remove(path)
        continue
      raise WorkdirError(
          f'{os.path.dirname(path)} is in use by {who} of process '
          f'{holder.get("pid")} on {holder.get("host")} (since {holder.get("since")}): wait '
          f'for it to end, or {advice}. If no such run is alive, delete {path}.')
  finally:
    os.close(folder)  # releases the flock
  raise WorkdirError(f'Could not take the lock {path}; delete it if no run holds it.')


def settings_of(config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """The recipe as plain JSON values (tuples as lists).

  Args:
    config: the recipe.

  Returns:
    Its fields.
  """
  return json.loads(config.to_json_best_effort())


def flat(settings: Dict[str, Any], prefix: str = '') -> Dict[str, Any]:
  """Nested fields (`model`) as 'model.num_layers'.

  Args:
    settings: the fields, groups as dicts.
    prefix: put before every key.

  Returns:
    The fields by dotted name.
  """
  out = {}
  for key, value in settings.items():
    if isinstance(value, dict):
      out.update(flat(value, f'{prefix}{key}.'))
    else:
      out[prefix + key] = value
  return out


def differences(recorded: Dict[str, Any], new: Dict[str, Any],
                defaults: Optional[Dict[str, Any]] = None) -> List[str]:
  """'field: old -> new' for every field that differs, free fields left out (a
  field recorded under its earlier name compared under its name now; a field
  newer than the record compared as its default, the value the run had).

  Args:
    recorded: the settings a workdir recorded.
    new: the settings given now.
    defaults: each field's default ('input.crop' for a group's).

  Returns:
    One line per differing field.
  """
  recorded = {MOVED_FIELDS.get(k, k): v for k, v in flat(recorded).items()}
  recorded = {**{k: v for k, v in (defaults or {}).items() if k not in recorded}, **recorded}
  new = flat(new)
  return [f'{k}: {recorded.get(k)!r} -> {new.get(k)!r}'
          for k in sorted(set(recorded) | set(new))
          if k not in FREE_FIELDS and recorded.get(k) != new.get(k)]


def recorded_settings(workdir: str) -> Optional[Dict[str, Any]]:
  """The settings a run recorded in `workdir` (`RECORD`), or None where it recorded none.

  Args:
    workdir: the directory.

  Returns:
    The settings, or None.
  """
  path = os.path.join(workdir, RECORD)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except ValueError as e:
    raise WorkdirError(f'{path} is not readable JSON ({e}); restore it, or delete it and rerun '
                       'with --reconfigure to record the current settings.') from e


def recorded_data(workdir: str) -> Optional[Dict[str, Any]]:
  """The data a run recorded in `workdir` (`DATA`: split -> identity), or None.

  Args:
    workdir: the directory.

  Returns:
    The record, or None where there is none.
  """
  path = os.path.join(workdir, DATA)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)['splits']
  except (ValueError, KeyError, TypeError) as e:
    raise WorkdirError(f'{path} is not a record of the run\'s data ({e}); restore it, or '
                       'delete it to record the current data.') from None


def data_changes(recorded: Dict[str, Any], current: Dict[str, Any]) -> List[str]:
  """What differs between the data a run recorded and the data it is given now, in
  words: classes renamed, added, removed or in another order (which changes what
  each label means), images added or removed, files changed; TFDS datasets by
  name, version, split and size.

  Args:
    recorded: split -> identity (`input_pipeline.Source.identity`), as recorded.
    current: the same, now.

  Returns:
    One phrase per change; empty where the data is the run's.
  """
  said = []
  for split in sorted(set(recorded) & set(current)):
    old, new = recorded[split], current[split]
    if old == new:
      continue
    if old.get('kind') != new.get('kind'):
      said.append(f'{split}: a {new.get("kind")} dataset where the run read a '
                  f'{old.get("kind")} one')
      continue
    before, after = old.get('classes', []), new.get('classes', [])
    if before != after:
      added = [c for c in after if c not in before]
      removed = [c for c in before if c not in after]
      if added or removed:
        said.append(f'{split}: classes ' + '; '.join(
            ([f'added {added}'] if added else []) + ([f'gone {removed}'] if removed else [])) +
            f' ({len(before)} classes then, {len(after)} now)')
      else:
        moved = [c for c, d in zip(before, after) if c != d]
        said.append(f'{split}: the classes {moved} changed places ({before} then, {after} '
                    'now), so their labels would swap meaning')
    for field in ('name', 'version', 'split', 'examples'):
      if old.get(field) != new.get(field):
        said.append(f'{split}: {field} {old.get(field)} -> {new.get(field)}')
    if old.get('kind') == 'folder' and before == after:
      count = lambda x: sum(x.get('images_per_class', []))
      if count(old) != count(new):
        said.append(f'{split}: {count(old)} images then, {count(new)} now')
      elif old.get('digest') != new.get('digest'):
        said.append(f'{split}: the same number of images, but files renamed, replaced or '
                    'moved between classes')
  return said


def record_data(workdir: str, current: Dict[str, Any], accepted: Sequence[str] = ()) -> None:
  """Records the data the run trains on (`DATA`), with any change a rerun accepted
  and when.

  Args:
    workdir: the held workdir.
    current: split -> identity.
    accepted: the changes accepted (`data_changes`), kept with those before.
  """
  path = os.path.join(workdir, DATA)
  history = []
  if os.path.exists(path):
    with open(path) as f:
      history = json.load(f).get('accepted', [])
  if accepted:
    history.append({'at': time.strftime('%Y-%m-%dT%H:%M:%S'), 'changes': list(accepted)})
  with atomic_write(path) as f:
    json.dump({'splits': current, 'accepted': history}, f, indent=1)


def check_record(workdir: str, config: ml_collections.ConfigDict, reconfigure: bool,
                 defaults: Optional[Dict[str, Any]] = None
                 ) -> Tuple[Optional[Dict[str, Any]], List[str]]:
  """The settings to record in `workdir` (None where they are recorded already),
  and the recorded fields they change ('field: old -> new'); in a workdir whose
  run left results, settings that differ from the recorded ones are refused
  unless `reconfigure`.

  Args:
    workdir: the run's workdir.
    config: the recipe given now.
    reconfigure: accept settings that differ from the recorded ones.
    defaults: each field's default, the value of a field newer than the record
      (`settings.defaults()`; without them such a field counts as changed).

  Returns:
    (the settings to record or None, the changed fields).
  """
  new = settings_of(config)
  recorded = recorded_settings(workdir)
  if recorded is None:
    if has_results(workdir) and not reconfigure:
      raise WorkdirError(
          f'{workdir} holds checkpoints or parameters but no record of the settings they were '
          f'trained with ({RECORD} is missing): restore it, train into a new workdir, or rerun '
          'with --reconfigure to go on from its checkpoint recording the current settings.')
    return new, []
  changed = differences(recorded, new, defaults)
  if not changed:
    return None, []
  if not reconfigure and has_results(workdir):
    raise WorkdirError(
        f'{workdir} holds a run with other settings ({"; ".join(changed)}). Train into a new '
        'workdir, or rerun with --reconfigure to go on from its checkpoint with the new '
        'settings.')
  log.warning('Settings recorded in %s changed: %s', workdir, '; '.join(changed))
  return new, changed


@contextlib.contextmanager
def claim(workdir: str, config: ml_collections.ConfigDict, reconfigure: bool = False,
          primary: bool = True, defaults: Optional[Dict[str, Any]] = None
          ) -> Iterator[Callable[[], None]]:
  """Holds `workdir` for one run: locked, its settings checked against the record.
  Yields `record()`, which writes the settings once the run has taken on the
  workdir's state (so a run that fails before never changes the record); its
  `changes` lists the recorded fields the new settings change. Only the
  `primary` process (0) locks and records; workdirs on other filesystems (gs://)
  are neither locked nor recorded.

  Args:
    workdir: the run's workdir.
    config: the recipe.
    reconfigure: accept settings that differ from the recorded ones.
    primary: this process locks and records.
    defaults: each field's default, for a record older than a field (`check_record`).

  Yields:
    `record()`.
  """
  if not primary or '://' in workdir:
    def record() -> None:
      pass
    record.changes = []
    yield record
    return
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f'--workdir {workdir} is a file; give a directory for the run.')
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise WorkdirError(f'--workdir {workdir} cannot be created ({e.strerror}); give a directory '
                       'you can write to.') from None
  if not os.access(workdir, os.W_OK | os.X_OK):
    raise WorkdirError(f'--workdir {workdir} is not writable; give a directory you can write to.')
  lock = os.path.join(workdir, LOCK)
  take_lock(lock)
  try:
    settings, changes = check_record(workdir, config, reconfigure, defaults)
    remove_partial_files(workdir)

    def record() -> None:
      if settings is not None:
        with atomic_write(os.path.join(workdir, RECORD)) as f:
          json.dump(settings, f, indent=1)
    # The fields a --reconfigure changes in the record (the run checks that it trains).
    record.changes = changes
    yield record
  finally:
    if os.path.exists(lock):
      os.remove(lock)


def remove_partial_files(workdir: str, settle: float = 0.) -> None:
  """Removes what a killed or failed write left (temporary `.NAME.tmp-PID` files of
  `atomic_write`, orbax's `*.orbax-checkpoint-tmp*` directories); only while the
  workdir is held, so no live writer owns them.

  Args:
    workdir: the held workdir.
    settle: after a write failed in this process, the seconds to wait for what
      its other writers still finish (orbax's save raises the first failure
      while its other threads write on): the removal is repeated until none is
      left for that long, at most 20 times.
  """
  for _ in range(20 if settle else 1):
    paths = (glob.glob(os.path.join(workdir, '.*.tmp-*')) +
             glob.glob(os.path.join(workdir, 'checkpoints', '*.orbax-checkpoint-tmp*')))
    if not paths:
      return
    for path in paths:
      log.warning('Removing %s, left by an interrupted write.', path)
      if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
      elif os.path.exists(path):
        os.remove(path)
    time.sleep(settle)


def size(num_bytes: float) -> str:
  """'3.2 MB', '412 KB': sizes as a person reads them.

  Args:
    num_bytes: a size in bytes.

  Returns:
    The size in words.
  """
  for unit, scale in (('GB', 2 ** 30), ('MB', 2 ** 20), ('KB', 2 ** 10)):
    if num_bytes >= scale:
      return f'{num_bytes / scale:.1f} {unit}'
  return f'{num_bytes:.0f} bytes'


def sizes(state: Any) -> Tuple[int, int]:
  """(bytes of a checkpoint of a train state, bytes of its params.npz): the arrays,
  and for orbax about a kilobyte of metadata per array and a little more.

  Args:
    state: the training state.

  Returns:
    (checkpoint bytes, params.npz bytes).
  """
  nbytes = lambda tree: sum(getattr(x, 'nbytes', 8) for x in jax.tree_util.tree_leaves(tree))
  return (nbytes(state) + 1024 * len(jax.tree_util.tree_leaves(state)) + 2 ** 16,
          nbytes(state.params))


def check_space(workdir: str, checkpoint_bytes: int, params_bytes: int, keep: int) -> None:
  """Refuses a run whose workdir cannot hold the checkpoints it will keep (one more
  while the oldest is replaced) and its params.npz, before any training.

  Args:
    workdir: the run's workdir.
    checkpoint_bytes: one checkpoint's size.
    params_bytes: params.npz's size.
    keep: the checkpoints kept.

  Raises:
    WorkdirError: the space is short.
  """
  if '://' in workdir:
    return
  checkpoints = os.path.join(workdir, 'checkpoints')
  held = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(checkpoints)
             for f in files) if os.path.isdir(checkpoints) else 0
  needed = (keep + 1) * checkpoint_bytes + params_bytes - held
  free = shutil.disk_usage(workdir).free
  if free < needed:
    raise WorkdirError(
        f'{workdir} has {size(free)} free, and this run needs about {size(needed)} more '
        f'({keep + 1} checkpoints of {size(checkpoint_bytes)} and params.npz of '
        f'{size(params_bytes)}): free space, keep fewer checkpoints '
        '(--config.keep_checkpoints), or move the workdir.')


def _no_space(error: BaseException) -> bool:
  while error is not None:
    if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or any(
        text in str(error) for text in ('No space left', 'RESOURCE_EXHAUSTED')):
      return True
    error = error.__cause__ or error.__context__
  return False


@contextlib.contextmanager
def guard_disk(workdir: str, what: str, size_bytes: int,
               last_good: Optional[int]) -> Iterator[None]:
  """A save into `workdir` of `what` (about `size_bytes`): a full disk is said in
  one sentence, with the last good checkpoint, after removing the partial files.

  Args:
    workdir: the run's workdir.
    what: what is saved, in words.
    size_bytes: about how big it is.
    last_good: the step of the last good checkpoint, or None.

  Yields:
    Nothing; the save runs inside.
  """
  try:
    yield
  except Exception as e:  # orbax and numpy raise full disks as several kinds
    if not _no_space(e):
      raise
    remove_partial_files(workdir, settle=0.5)
    last = (f'the last good checkpoint is step {last_good}' if last_good is not None
            else 'no checkpoint was saved yet')
    raise WorkdirError(
        f'No space left under {workdir} (the {what} needs about {size(size_bytes)}, '
        f'{size(shutil.disk_usage(workdir).free)} free): {last}. Free space or move the '
        'workdir, and rerun the same command.') from e
