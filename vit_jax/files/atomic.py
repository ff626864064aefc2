"""Files written whole or not at all: written beside their target and renamed over
it, so a kill or a full disk never leaves half a file under the target's name."""
import contextlib
import errno
import io
import os
import shutil
from typing import IO, Iterator

from etils import epath

from vit_jax.errors import WorkdirError


@contextlib.contextmanager
def atomic_write(path: str, mode: str = 'w') -> Iterator[IO]:
  """Opens a temporary file beside `path` ('w' text, 'wb' bytes); when the block
  ends without an error it is synced and renamed over `path`, otherwise removed.
  Paths of other filesystems (gs://) are written through `etils.epath`.

  Args:
    path: the file to write.
    mode: 'w' or 'wb'.

  Yields:
    The open temporary file.

  Raises:
    WorkdirError: the disk is full (or the user's quota spent), the target left as
      it was.
  """
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / f'.{path.name}.tmp-{os.getpid()}'
  if '://' in os.fspath(path):
    buffer = io.BytesIO() if 'b' in mode else io.StringIO()
    yield buffer
    (tmp.write_bytes if 'b' in mode else tmp.write_text)(buffer.getvalue())
    tmp.rename(path)
    return
  try:
    with open(tmp, mode) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
      raise
    raise WorkdirError(f'No space left to write {path} ({shutil.disk_usage(path.parent).free} '
                       'bytes free): free space or write it elsewhere; it was left as it '
                       'was.') from e
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
