"""The warm interpreter the tests run commands on (tests/warm_python.py) behaves as
`python` does: arguments, working directory, environment, streams, exit status,
signals, and its own JAX devices; the PyTorch side's computes as a new interpreter."""
import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

SHOW = ('import os, sys; print(sys.argv[1:], os.getcwd(), os.environ.get("ASKED"), '
        'sys.stdin.read().strip()); print("to stderr", file=sys.stderr); sys.exit(int(sys.argv[2]))')


def _both(command, **kwargs):
  """The results of `command` (its interpreter first) under the warm interpreter
  and under a new one."""
  return [subprocess.run([python, *command], capture_output=True, text=True, timeout=120, **kwargs)
          for python in (kwargs.pop('warm'), sys.executable)]


def test_a_command_of_a_test_is_a_fork_of_the_server(warm_python, tmp_path):
  """With the test's own environment (pytest's PYTEST_CURRENT_TEST included) and
  in a folder linking to the repository's packages, as the pages' commands run."""
  os.symlink(os.path.join(ROOT, 'vit_jax'), tmp_path / 'vit_jax')
  loaded = 'import sys; print("vit_jax.models" in sys.modules)'
  # What TensorFlow's import sets in the test process, the command may see.
  for env in (os.environ, dict(os.environ, PYTHONPATH=ROOT, TF2_BEHAVIOR='1')):
    done = subprocess.run([warm_python, '-c', loaded], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert done.stdout.strip() == 'True', done.stderr
  assert subprocess.run([sys.executable, '-c', loaded], capture_output=True, text=True,
                        timeout=120).stdout.strip() == 'False'


def test_a_fork_runs_as_python_does(warm_python, tmp_path):
  warm, cold = _both(['-c', SHOW, 'a b', '7'], warm=warm_python, cwd=tmp_path,
                     input='from stdin\n')
  assert warm.returncode == cold.returncode == 7
  assert warm.stdout == cold.stdout == f"['a b', '7'] {tmp_path} None from stdin\n"
  assert warm.stderr == cold.stderr == 'to stderr\n'


def test_modules_scripts_errors_and_exit_messages(warm_python, tmp_path):
  script = tmp_path / 'script.py'
  script.write_text('import sys\nprint(__name__, sys.argv)\nsys.exit("a message")\n')
  warm, cold = _both([str(script), 'x'], warm=warm_python, cwd=tmp_path)
  assert (warm.returncode, warm.stdout, warm.stderr) == (1, f"__main__ ['{script}', 'x']\n",
                                                         'a message\n')
  assert (cold.returncode, cold.stdout, cold.stderr) == (warm.returncode, warm.stdout, warm.stderr)
  warm, cold = _both(['-c', 'raise ValueError("wrong")'], warm=warm_python)
  assert warm.returncode == cold.returncode == 1
  assert warm.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1] == 'ValueError: wrong'
  warm, cold = _both(['-m', 'vit_jax.train', '--helpfull'], warm=warm_python, cwd=ROOT)
  assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout)
  assert '--workdir' in warm.stdout


def test_each_command_starts_its_own_devices_under_its_xla_flags(warm_python):
  count = 'import jax; print(jax.device_count())'
  for devices in (1, 3):
    env = dict(os.environ, XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
    done = subprocess.run([warm_python, '-c', count], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.stdout.strip() == str(devices), done.stderr


def test_an_environment_read_at_import_gets_a_new_interpreter(warm_python):
  """JAX reads JAX_* as it is imported, which the server has done with its own."""
  env = dict(os.environ, JAX_ENABLE_X64='1', WARM_PYTHON_VERBOSE='1')
  done = subprocess.run([warm_python, '-c', 'import jax; print(jax.config.jax_enable_x64)'],
                        capture_output=True, text=True, env=env, timeout=120)
  assert done.stdout.strip() == 'True'
  assert 'a new interpreter: the environment differs in JAX_ENABLE_X64' in done.stderr


@pytest.mark.parametrize('number,code', [(signal.SIGTERM, 5), (signal.SIGINT, 6)])
def test_a_signal_reaches_the_command(warm_python, tmp_path, number, code):
  """The command's own handlers (a test process may ignore SIGINT, which its
  commands inherit)."""
  ready = tmp_path / 'ready'
  program = ('import pathlib, signal, sys, time\n'
             'signal.signal(signal.SIGTERM, lambda *a: sys.exit(5))\n'
             'signal.signal(signal.SIGINT, lambda *a: sys.exit(6))\n'
             f'pathlib.Path({str(ready)!r}).touch()\n'
             'time.sleep(60)\n')
  process = subprocess.Popen([warm_python, '-c', program], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 60
  while not ready.exists() and time.time() < deadline:
    time.sleep(0.05)
  process.send_signal(number)
  process.wait(timeout=60)
  assert process.returncode == code


def test_an_uncaught_keyboard_interrupt_ends_the_command_by_the_signal(warm_python):
  warm, cold = _both(['-c', 'raise KeyboardInterrupt'], warm=warm_python)
  assert warm.returncode == cold.returncode == -signal.SIGINT
  assert 'KeyboardInterrupt' in warm.stderr.splitlines()[-1]


@pytest.mark.skipif(importlib.util.find_spec('torch') is None, reason='torch is not installed')
def test_the_torch_side_is_a_fork_with_torch_imported_computing_as_a_new_interpreter(
    torch_python):
  """A fork of the server that imported torch (without using its threads) runs
  torch's multithreaded kernels as a new interpreter does, to the bit."""
  program = ('import torch; torch.manual_seed(0); '
             'x = torch.randn(64, 256); w = torch.nn.Linear(256, 128); '
             'y = torch.nn.functional.gelu(w(x)).sum(0); '
             'print(torch.get_num_threads(), y.detach().numpy().tobytes().hex())')
  loaded = 'import sys; print("torch" in sys.modules)'
  assert subprocess.run([torch_python, '-c', loaded], capture_output=True, text=True,
                        timeout=120).stdout.strip() == 'True'
  warm, cold = _both(['-c', program], warm=torch_python)
  assert warm.returncode == cold.returncode == 0, warm.stderr
  assert warm.stdout == cold.stdout
