"""A workdir belongs to one run: a lock while a trainer holds it, and the run's
settings recorded in it, so that a rerun which would change what its files mean
is refused, naming the fields that differ.

    with workdir.claim(DIR, config):
      ...  # train

The lock (`LOCK`) holds the holder's host and process id; a lock whose process
is gone (same host) is stale and taken over. The record (`RECORD`) is the
recipe's fields; fields that only say how often to log, evaluate or save, or
where the data lives, may change between runs (`FREE_FIELDS`).
"""
import contextlib
import json
import logging
import os
import socket
import time
from typing import Any, Dict, Iterator, List

import ml_collections

from vit_jax.atomic import atomic_write
from vit_jax.errors import WorkdirError

LOCK = 'lock.json'
RECORD = 'config.json'
# Fields a resumed run may change without changing what its checkpoints mean.
FREE_FIELDS = ('log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints',
               'eval_batch_size', 'data_dir', 'augreg_dir')


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


def _take_lock(path: str) -> None:
  """Creates the lock file, or raises a WorkdirError naming its live holder; a
  stale lock (its process gone from this host) is taken over."""
  me = {'host': socket.gethostname(), 'pid': os.getpid(),
        'since': time.strftime('%Y-%m-%d %H:%M:%S')}
  for _ in range(2):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
      try:
        with open(path) as f:
          holder = json.load(f)
      except (OSError, ValueError):
        holder = {}
      if holder.get('host') == me['host'] and not _alive(int(holder.get('pid', -1))):
        logging.warning('Taking over the stale lock %s of process %s, which has ended.', path,
                        holder.get('pid'))
        os.remove(path)
        continue
      raise WorkdirError(
          f'{os.path.dirname(path)} is in use by the trainer of process {holder.get("pid")} '
          f'on {holder.get("host")} (since {holder.get("since")}): wait for it to end, or train '
          f'into another workdir. If no such run is alive, delete {path}.')
    with os.fdopen(fd, 'w') as f:
      json.dump(me, f)
    return
  raise WorkdirError(f'Could not take the lock {path}; delete it if no run holds it.')


def settings_of(config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """The recipe as plain JSON values (tuples as lists)."""
  return json.loads(config.to_json_best_effort())


def differences(recorded: Dict[str, Any], new: Dict[str, Any]) -> List[str]:
  """'field: old -> new' for every field that differs, free fields left out."""
  return [f'{k}: {recorded.get(k)!r} -> {new.get(k)!r}'
          for k in sorted(set(recorded) | set(new))
          if k not in FREE_FIELDS and recorded.get(k) != new.get(k)]


def has_results(workdir: str) -> bool:
  """Whether a run left checkpoints or parameters in `workdir`."""
  checkpoints = os.path.join(workdir, 'checkpoints')
  return (os.path.exists(os.path.join(workdir, 'params.npz'))
          or (os.path.isdir(checkpoints) and any(os.scandir(checkpoints))))


def check_record(workdir: str, config: ml_collections.ConfigDict, reconfigure: bool) -> None:
  """Records the run's settings in a fresh workdir; in one whose run left results,
  refuses settings that differ (unless `reconfigure`, which records the new ones)."""
  path = os.path.join(workdir, RECORD)
  new = settings_of(config)
  if os.path.exists(path):
    try:
      with open(path) as f:
        recorded = json.load(f)
    except ValueError as e:
      raise WorkdirError(f'{path} is not readable JSON ({e}); restore it, or delete it to '
                         'record the current settings.') from e
    changed = differences(recorded, new)
    if changed and not reconfigure and has_results(workdir):
      raise WorkdirError(
          f'{workdir} holds a run with other settings ({"; ".join(changed)}). Train into a new '
          'workdir, or rerun with --reconfigure to go on from its checkpoint with the new '
          'settings.')
    if not changed:
      return
    logging.warning('Settings recorded in %s changed: %s', workdir, '; '.join(changed))
  with atomic_write(path) as f:
    json.dump(new, f, indent=1)


@contextlib.contextmanager
def claim(workdir: str, config: ml_collections.ConfigDict, reconfigure: bool = False,
          primary: bool = True) -> Iterator[None]:
  """Holds `workdir` for one run: locked, its settings checked against (or written
  to) the record. Only the `primary` process (0) locks and records; workdirs on
  other filesystems (gs://) are not locked."""
  if not primary:
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  lock = os.path.join(workdir, LOCK)
  local = '://' not in workdir
  if local:
    _take_lock(lock)
  try:
    check_record(workdir, config, reconfigure)
    yield
  finally:
    if local and os.path.exists(lock):
      os.remove(lock)
