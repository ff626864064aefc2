"""A Python interpreter that starts warm, for the commands the tests run whole.

Each command of a documented page (`python -m analysis cka ...`, `python -m
vit_jax.sweep ...`) spends 2-4 s importing JAX, Flax, grain, matplotlib and the
project before it does anything: about 45% of a tiny analysis command. A server
imports them once; each command is a fork of it, which then runs as
`python` would: its arguments, working directory, environment, standard streams
and exit status are the command's own. The server never starts JAX's backend, so
each fork starts its own devices under its own XLA_FLAGS.

A command whose environment differs from the server's in a variable read at
import (`READ_AT_IMPORT`: JAX's configuration, matplotlib's, the BLAS threads,
Python's own; not XLA_FLAGS, read when the fork starts its backend), whose
PYTHONPATH shadows a loaded module, or whose arguments are not `-m module`,
`-c code` or a script, runs in a new interpreter, as before.

The comparisons with PyTorch's libraries (timm, `transformers`) run their side
in an interpreter of their own, which spends 4-6 s importing torch, torchvision,
timm and `transformers`' model classes: `TORCH_SIDE` is what a server for them
imports instead.

`start(env, preload)` starts a server and returns it; its `python` is an
executable file taking python's arguments. `python tests/warm_python.py serve
SOCKET MODULE...` is the server; `python -S -E tests/warm_python.py SOCKET ARGS...`
the client, which imports the standard library only.
"""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

# What the server of the project's commands imports: their heavy dependencies and
# the project's modules below the commands, every module of the packages named; none that
# defines an absl flag as it is imported (`vit_jax.entry`, the data's grain and TFDS,
# orbax, which the training loop imports once the flags are read, `analysis.tools`,
# the commands) beyond those every command
# defines (`FLAGS_OF_EVERY_COMMAND`): a command sees the flags its own imports define,
# and re-running a command's module as __main__ would define its flags twice.
# A name ending in '.*' stands for every module of that package.
PROJECT = ('jax', 'jax.numpy', 'flax.linen', 'optax', 'ml_collections',
           'matplotlib.pyplot', 'scipy.stats', 'vit_jax.models',
           'analysis.tool', 'analysis.tool_options', 'analysis.measures.*',
           'analysis.reporting.*', 'analysis.runtime.*')
# The other side of the comparisons with timm and `transformers`: torch, timm (and the
# torchvision it imports), and the modelling modules of the `transformers` model types
# the tests build (tests/test_transformers_files.py), which `transformers` otherwise
# imports at a class's first use.
TORCH_SIDE = ('numpy', 'torch', 'timm', 'safetensors.torch', 'transformers.modeling_utils',
              *(f'transformers.models.{kind}.modeling_{kind}'
                for kind in ('vit', 'dinov2', 'dinov2_with_registers', 'clip', 'siglip', 'siglip2',
                             'vit_mae', 'bit')),
              'transformers.models.siglip2.image_processing_siglip2')
FLAGS_OF_EVERY_COMMAND = frozenset({'absl.app', 'absl.logging'})
# The variables a preloaded module or the interpreter reads as it starts (JAX's
# configuration, matplotlib's, the BLAS threads, Python's own): a command whose
# value differs needs a new interpreter. Any other variable (what TensorFlow, cv2
# or the shell set) is the command's own, set in the fork before it runs.
READ_AT_IMPORT = ('JAX_', 'XLA_PYTHON_CLIENT_', 'MPL', 'OMP_', 'OPENBLAS_', 'MKL_', 'PYTHON')
# Read after the fork.
LATE = frozenset({'XLA_FLAGS', 'PYTHONPATH', 'WARM_PYTHON_VERBOSE'})


def _send(conn: socket.socket, message: dict) -> None:
  data = json.dumps(message).encode()
  conn.sendall(struct.pack('!I', len(data)) + data)


def _receive(conn: socket.socket) -> Optional[dict]:
  """The next message, or None once the other side has closed."""
  head = _read_exactly(conn, 4)
  if head is None:
    return None
  body = _read_exactly(conn, struct.unpack('!I', head)[0])
  return None if body is None else json.loads(body)


def _read_exactly(conn: socket.socket, size: int) -> Optional[bytes]:
  data = b''
  while len(data) < size:
    chunk = conn.recv(size - len(data))
    if not chunk:
      return None
    data += chunk
  return data


# The client: the standard library only, started with -S -E.

def _supported(args: List[str]) -> bool:
  """`-m module ...`, `-c code ...` or `script ...`, optionally after -u or -B."""
  while args and args[0] in ('-u', '-B'):
    args = args[1:]
  if not args:
    return False
  if args[0] in ('-m', '-c'):
    return len(args) >= 2
  return not args[0].startswith('-')


def client(socket_path: str, python: str, args: List[str]) -> None:
  """Runs `python args` through the server at `socket_path`, or as a new process
  where the server cannot; exits as the command did."""
  if not _supported(args):
    os.execv(python, [python, *args])
  conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  try:
    conn.connect(socket_path)
    socket.send_fds(conn, [b'r'], [0, 1, 2])
    _send(conn, {'args': args, 'cwd': os.getcwd(), 'env': dict(os.environ)})
    answer = _receive(conn)
  except OSError:
    answer = None
  if answer is None or 'pid' not in answer:
    conn.close()
    if answer is not None and os.environ.get('WARM_PYTHON_VERBOSE'):
      print(f'warm_python: a new interpreter: {answer["fallback"]}', file=sys.stderr)
    os.execv(python, [python, *args])
  pid = answer['pid']

  def forward(number, _):
    try:
      os.kill(pid, number)
    except ProcessLookupError:
      pass

  for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(number, forward)
  ended = _receive(conn)
  if ended is None:
    sys.exit(1)
  if ended['signal']:
    signal.signal(ended['signal'], signal.SIG_DFL)
    os.kill(os.getpid(), ended['signal'])
  sys.exit(ended['code'])


# The server.

def _incompatible(env: Dict[str, str], cwd: str) -> Optional[str]:
  """Why a command of this environment may not be a fork of this server, or None."""
  # What the imports set, a command sets as it imports them, unless it has it already.
  own = {**_STARTED_WITH, **_SET_BY_IMPORTS}
  differ = sorted(k for k in set(own) | set(env)
                  if k.startswith(READ_AT_IMPORT) and k not in LATE and own.get(k) != env.get(k)
                  and not (k in _SET_BY_IMPORTS and k not in env))
  if differ:
    return 'the environment differs in ' + ', '.join(differ)
  loaded = {name.split('.')[0] for name in sys.modules}
  for entry in [cwd] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]:
    folder = os.path.join(cwd, entry)
    if not os.path.isdir(folder):
      continue
    for name in os.listdir(folder):
      top = name[:-3] if name.endswith('.py') else name
      if top in loaded and not _same_module(sys.modules.get(top), os.path.join(folder, name)):
        return f'{os.path.join(folder, name)} shadows the loaded {top}'
  return None


def _same_module(module, path: str) -> bool:
  """Whether `path` (a package folder or a .py file) is where `module` was loaded from."""
  where = getattr(module, '__file__', None)
  if where is None:
    return True  # a namespace or built-in module: nothing of it is shadowed
  if os.path.basename(where) == '__init__.py':
    where = os.path.dirname(where)
  return os.path.realpath(where) == os.path.realpath(path)


# The server's environment before it imported anything, and what the imports set.
_STARTED_WITH: Dict[str, str] = {}
_SET_BY_IMPORTS: Dict[str, str] = {}


def _run_command(args: List[str], cwd: str, env: Dict[str, str]) -> int:
  """In the fork: becomes the command and returns its exit code."""
  import atexit
  import runpy
  import threading
  import traceback
  while args[0] in ('-u', '-B'):
    args = args[1:]
  os.chdir(cwd)
  os.environ.clear()
  os.environ.update({**_SET_BY_IMPORTS, **env})
  extra = [os.path.join(cwd, p) for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]
  base = [p for p in sys.path[1:] if p not in extra]
  try:
    if args[0] == '-m':
      sys.argv = [args[1], *args[2:]]
      sys.path[:] = [cwd, *extra, *base]
      runpy.run_module(args[1], run_name='__main__', alter_sys=True)
    elif args[0] == '-c':
      sys.argv = ['-c', *args[2:]]
      sys.path[:] = ['', *extra, *base]
      exec(compile(args[1], '<string>', 'exec'), {'__name__': '__main__'})
    else:
      sys.argv = list(args)
      sys.path[:] = [os.path.dirname(os.path.abspath(args[0])), *extra, *base]
      runpy.run_path(args[0], run_name='__main__')
    code = 0
  except SystemExit as stop:
    if stop.code is None:
      code = 0
    elif isinstance(stop.code, int):
      code = stop.code
    else:
      print(stop.code, file=sys.stderr)
      code = 1
  except BaseException as error:  # pylint: disable=broad-except
    traceback.print_exc()
    code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
  threading._shutdown()  # pylint: disable=protected-access  (as the interpreter's exit does)
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  if code < 0:  # an uncaught KeyboardInterrupt ends the interpreter by the signal itself
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
  return code


def serve(socket_path: str, preload: List[str]) -> None:
  """Imports the modules `preload` names, then forks a command for each client until
  its parent ends."""
  import importlib
  import selectors
  import pkgutil
  from absl import flags
  _STARTED_WITH.update(os.environ)
  for name in preload:
    if name.endswith('.*'):
      package = importlib.import_module(name[:-2])
      for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f'{package.__name__}.{module.name}')
    else:
      importlib.import_module(name)
  _SET_BY_IMPORTS.update({k: v for k, v in os.environ.items() if _STARTED_WITH.get(k) != v})
  more = set(flags.FLAGS.flags_by_module_dict()) - FLAGS_OF_EVERY_COMMAND
  assert not more, f'{sorted(more)} defined flags while preloading: a command would see them'
  if 'jax' in sys.modules:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    started = xla_bridge._backends  # pylint: disable=protected-access
    assert not started, 'a backend started while preloading'
  parent = os.getppid()
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(socket_path + '.new')
  listener.listen(16)
  os.rename(socket_path + '.new', socket_path)  # ready
  selector = selectors.DefaultSelector()
  selector.register(listener, selectors.EVENT_READ)
  running: Dict[int, socket.socket] = {}
  while os.getppid() == parent:
    for key, _ in selector.select(timeout=0.05):
      if key.fileobj is listener:
        conn, _ = listener.accept()
        pid = _start(conn, listener, selector, running)
        if pid is None:
          conn.close()
        else:
          running[pid] = conn
          selector.register(conn, selectors.EVENT_READ, pid)
      else:  # a client went away before its command ended
        pid = key.data
        selector.unregister(key.fileobj)
        key.fileobj.close()
        _kill(pid)
    while running:
      try:
        pid, status = os.waitpid(-1, os.WNOHANG)
      except ChildProcessError:
        break
      if pid == 0:
        break
      conn = running.pop(pid, None)
      if conn is not None:
        selector.unregister(conn)
        try:
          _send(conn, {'code': os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1,
                       'signal': os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0})
        except OSError:
          pass
        conn.close()
  for pid in running:
    _kill(pid)


def _kill(pid: int) -> None:
  try:
    os.killpg(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def _start(conn: socket.socket, listener: socket.socket, selector, running) -> Optional[int]:
  """Forks the command a client sends; None (the client runs it itself) where it
  may not be a fork of this server."""
  try:
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    request = _receive(conn)
  except OSError:
    return None
  why = 'an incomplete request' if request is None or len(fds) != 3 else _incompatible(
      request['env'], request['cwd'])
  if why is not None:
    for fd in fds:
      os.close(fd)
    if request is not None:
      _send(conn, {'fallback': why})
    return None
  pid = os.fork()
  if pid == 0:
    code = 1
    try:
      os.setpgid(0, 0)
      selector.close()
      listener.close()
      conn.close()
      for other in running.values():
        other.close()
      for number, fd in enumerate(fds):
        os.dup2(fd, number)
        os.close(fd)
      code = _run_command(request['args'], request['cwd'], request['env'])
    finally:
      os._exit(code)  # pylint: disable=protected-access
  for fd in fds:
    os.close(fd)
  _send(conn, {'pid': pid})
  return pid


class Server:
  """A running server; `python` is the path of its client executable."""

  def __init__(self, env: Dict[str, str], preload: Sequence[str]):
    self.folder = tempfile.mkdtemp(prefix='warm_python_')
    socket_path = os.path.join(self.folder, 'socket')
    self.process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), 'serve', socket_path, *preload],
        env=env, stdin=subprocess.DEVNULL)
    self.python = os.path.join(self.folder, 'python')
    with open(self.python, 'w') as f:
      f.write(f'#!/bin/sh\nexec {sys.executable} -S -E {os.path.abspath(__file__)} '
              f'{socket_path} {sys.executable} "$@"\n')
    os.chmod(self.python, 0o755)
    deadline = time.time() + 120
    while not os.path.exists(socket_path):
      if self.process.poll() is not None or time.time() > deadline:
        raise RuntimeError(f'The warm Python server did not start (exit {self.process.poll()}).')
      time.sleep(0.05)

  def close(self) -> None:
    self.process.terminate()
    self.process.wait(timeout=30)
    import shutil
    shutil.rmtree(self.folder, ignore_errors=True)


def start(env: Dict[str, str], preload: Sequence[str] = PROJECT) -> Server:
  """A server whose commands run with `env` (a command with another environment
  runs in a new interpreter).

  Args:
    env: the environment of the commands.
    preload: the modules the server imports ('package.*': all of a package's).

  Returns:
    The running server; `close()` ends it.
  """
  return Server(env, preload)


if __name__ == '__main__':
  if sys.argv[1] == 'serve':
    serve(sys.argv[2], sys.argv[3:])
  else:
    client(sys.argv[1], sys.argv[2], sys.argv[3:])
