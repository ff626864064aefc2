"""Files written whole or not at all: written beside their target and renamed over
it, so a kill or a full disk never leaves half a file under the target's name."""
import contextlib
import io
import os
from typing import IO, Iterator

from etils import epath


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
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
