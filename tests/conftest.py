"""Test-process set-up that has to happen before JAX initialises its backends,
and the fixtures the test modules share.

Every test process sees 8 CPU devices, so multi-device code runs on CPU; the
commands, notebooks and doc snippets the tests start see one, as a command on a
busy machine should (docs/reliability.md, "A busy CPU": the two test workers
already hold both cores, and 8 simulated devices waiting for each other at a
collective only slow a command down, or stop it), unless a test asks for more
(`xla_flags.with_devices`). So the 8 are set in JAX's own configuration, which a
child process does not inherit, not in XLA_FLAGS (as `chex.set_n_cpu_devices`
does), which it does. The tests are dominated by XLA compile time, which the flags of tests/xla_flags.py
halve. The test session's processes (pytest-xdist's workers and the commands,
notebooks and doc snippets the tests start) share one persistent compilation
cache, a temporary directory made for the session and removed after it: a
program compiled once (the same tiny models in every command) is read back
elsewhere. Its key holds the XLA flags, so a run under other flags compiles its
own.

The commands a test runs for their output, not for how a process behaves
(signals, locks), take the `warm_python` fixture's interpreter
(tests/warm_python.py): a fork of a server that has imported JAX and the
project once, 2-4 s sooner than a new interpreter; the PyTorch side of the
comparisons with timm and `transformers` takes the `torch_python` fixture's, a
fork of a server that has imported torch and them.

A test that takes a `family_name` argument runs once per registered family of
image classifiers (`models.families(models.CLASSIFY)`, on its `Family.tiny`
model), one that takes `any_family_name` once per registered family of any kind:
a family registered from a plugin (`pytest -p module`) is tested without
editing the suite.
"""
import os
import shutil
import tempfile

from xla_flags import FAST_COMPILE  # a constant: JAX is not imported yet

_USER_ENV = dict(os.environ)  # as the user started pytest, before the settings below
os.environ['XLA_FLAGS'] = ' '.join(
    [f for f in os.environ.get('XLA_FLAGS', '').split()
     if not f.startswith('--xla_force_host_platform_device_count')]
    + [FAST_COMPILE, '--xla_force_host_platform_device_count=1'])
# Set before JAX is imported, and inherited by every process the session starts. A
# cache the environment names is used and kept.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN_CACHE = 'JAX_COMPILATION_CACHE_DIR' not in os.environ
if _OWN_CACHE:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='vit_jax_tests_xla_')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')
# A bounded cache takes a file lock around each read and write: no process reads
# an entry another is still writing.
os.environ.setdefault('JAX_COMPILATION_CACHE_MAX_SIZE', str(8 * 2**30))

_SESSION_ENV = dict(os.environ)  # before any test changes it
# The environment of a command run as users run it: theirs, with the session's
# compilation cache, which changes no result, only how long a program takes to
# compile, and the repository on PYTHONPATH.
USER_ENV = {**_USER_ENV, 'PYTHONPATH': ROOT,
            **{k: v for k, v in _SESSION_ENV.items() if k.startswith('JAX_COMPILATION_CACHE')
               or k == 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'}}

import jax  # noqa: E402  (reads the cache settings above)
import pytest  # noqa: E402

jax.config.update('jax_num_cpu_devices', 8)
_STARTED = pytest.StashKey[tuple]()  # (time, load average)


def pytest_addoption(parser):
  parser.addoption('--record-suite', metavar='PATH', default=None,
                   help="write the session's counts, time and machine to PATH, a record "
                        'the docs quote (scripts/docs_figures.py); give it as '
                        '--record-suite=PATH, which pytest does not take for a test path')


def pytest_sessionstart(session):
  """Starts the clock of `--record-suite`'s record, whose path is checked first."""
  import time
  import doc_snippets
  path = session.config.getoption('--record-suite')
  if path and not hasattr(session.config, 'workerinput'):
    try:
      doc_snippets.docs_figures().check_record_path(path, 'suite')
    except ValueError as error:
      raise pytest.UsageError(f'--record-suite: {error}') from None
  session.config.stash[_STARTED] = time.time(), os.getloadavg()[0]


def pytest_terminal_summary(terminalreporter, config):
  """Writes `--record-suite`'s record, in the process that ran the session."""
  path = config.getoption('--record-suite')
  if not path or hasattr(config, 'workerinput'):
    return
  import datetime
  import platform
  import doc_snippets
  import shlex
  import time
  from vit_jax import cpu_devices
  args = list(config.invocation_params.args)
  for i, arg in enumerate(args):  # the record's own option is not part of the command
    if arg.startswith('--record-suite'):
      del args[i:i + (1 if '=' in arg else 2)]
      break
  count = lambda kind: len(terminalreporter.stats.get(kind, []))
  workers = config.getoption('numprocesses', None)
  record = {'kind': 'suite', 'date': datetime.date.today().isoformat(),
            'command': shlex.join(['pytest', *args]),
            'selection': f'-m "{config.option.markexpr}"' if config.option.markexpr
                         else 'every test',
            'workers': f'{workers} workers' if workers else 'one process',
            'passed': count('passed'), 'skipped': count('skipped'), 'failed': count('failed'),
            'errors': count('error'),
            'seconds': round(time.time() - config.stash[_STARTED][0], 1),
            'load': round(config.stash[_STARTED][1], 2),
            'cpu': f'{cpu_devices.cpu_info()[0]} ({os.cpu_count()} cores)',
            'python': platform.python_version(), 'jax': jax.__version__}
  try:
    doc_snippets.docs_figures().write_record(path, record)
  except ValueError as error:
    terminalreporter.write_line(f'--record-suite: {error}', red=True)
    return
  terminalreporter.write_line(f'recorded the session in {path}')


def pytest_unconfigure(config):
  """Removes the session's compilation cache, in the process that made it."""
  if _OWN_CACHE and not hasattr(config, 'workerinput'):
    shutil.rmtree(os.environ.pop('JAX_COMPILATION_CACHE_DIR'), ignore_errors=True)


def pytest_collection_modifyitems(items):
  """The end-to-end items first, then the other slow ones, each kind in the order
  collected: the longest (a page's commands, a notebook: minutes each) start
  early, and pytest-xdist's work stealing (`--dist worksteal`, pytest.ini) evens
  out the workers' ends with the short ones, rather than one worker finishing a
  long item alone."""
  items.sort(key=lambda item: (item.get_closest_marker('e2e') is None,
                               item.get_closest_marker('slow') is None))


def pytest_generate_tests(metafunc):
  from vit_jax import models
  if 'family_name' in metafunc.fixturenames:
    metafunc.parametrize('family_name', models.families(models.CLASSIFY))
  if 'any_family_name' in metafunc.fixturenames:
    metafunc.parametrize('any_family_name', list(models.FAMILIES))


@pytest.fixture(scope='session')
def subjects():
  """An analysis subject of each family's tiny model, by family name, and 'vit_gap',
  the class-token ViT's twin that pools its tokens."""
  from helpers import subject_of, tiny_family_config
  from vit_jax import models
  made = {name: subject_of(tiny_family_config(name), name)
          for name in models.families(models.CLASSIFY)}
  made['vit_gap'] = subject_of(tiny_family_config('vit', classifier='gap'), 'vit_gap')
  return made


@pytest.fixture(scope='session')
def session_folder(tmp_path_factory, worker_id):
  """The test session's folder, one for every pytest-xdist worker (each worker's
  own temporary folders lie inside it)."""
  root = tmp_path_factory.getbasetemp()
  return root if worker_id == 'master' else root.parent


@pytest.fixture(scope='session')
def made_once(session_folder):
  """`made_once(name, make)`: a folder holding what `make(name, folder)` wrote into
  it (`name`, and any file made beside it): made once per test session, by the first
  of the workers to ask for it (the others wait on its lock, then read it). The
  tests copy what they change."""
  import hashlib
  import filelock

  def made(name: str, make) -> str:
    folder = session_folder / 'made_once' / hashlib.sha1(name.encode()).hexdigest()[:16]
    done = folder.with_name(folder.name + '.made')
    folder.parent.mkdir(exist_ok=True)
    with filelock.FileLock(str(folder) + '.lock'):
      if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)  # a maker that failed part of the way
        folder.mkdir()
        make(name, str(folder))
        done.touch()
    return str(folder)
  return made


@pytest.fixture
def user_env():
  """The environment of a command run as users run it (`USER_ENV`): no device count
  or compiler setting of the tests'."""
  return dict(USER_ENV)


@pytest.fixture(scope='session')
def warm_python():
  """The path of an interpreter whose commands start warm (tests/warm_python.py),
  its server started with this process's environment and the repository on
  PYTHONPATH at the first test that asks, in each test process."""
  import warm_python as warm
  server = warm.start({**_SESSION_ENV, 'PYTHONPATH': ROOT})
  yield server.python
  server.close()


@pytest.fixture(scope='session')
def torch_python():
  """The path of an interpreter for the PyTorch side of the comparisons with timm
  and `transformers`, started warm with torch and those of them installed
  imported (`warm_python.TORCH_SIDE`), in each test process that asks."""
  import importlib.util
  import warm_python as warm
  installed = [name for name in warm.TORCH_SIDE
               if importlib.util.find_spec(name.split('.')[0]) is not None]
  server = warm.start(_SESSION_ENV, installed)
  yield server.python
  server.close()
