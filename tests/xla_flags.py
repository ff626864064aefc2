"""The XLA flags every test process runs under: tests/conftest.py sets them before
JAX starts, the commands the tests start inherit them, and the notebooks and the
commands that set XLA_FLAGS of their own take them from here.

The tests are dominated by XLA:CPU compile time, which the lowest backend
optimisation level halves; it changes how programs are generated, not what they
compute. (XLA's elemental emitters for fusions, `--xla_cpu_use_fusion_emitters=false`,
would take a further third off at that level, but there they compute a tiny
BiT's linearised Hessian-vector product wrong by 8e-4 of its scale in float64,
which tests/test_hessian_lanczos.py catches.)
"""
FAST_COMPILE = '--xla_backend_optimization_level=0'


def with_devices(count: int) -> str:
  """XLA_FLAGS for a process that simulates `count` CPU devices, compiled as the
  tests' own processes are.

  Args:
    count: the CPU devices.

  Returns:
    The flags.
  """
  return f'{FAST_COMPILE} --xla_force_host_platform_device_count={count}'


def optimised(count: int = 1) -> str:
  """XLA_FLAGS for a process that simulates `count` CPU devices at XLA's default
  optimisation level: for a command that runs longer than it compiles (the Hessian
  tool's few hundred Hessian-vector products ran 29 s of the paper-scale
  command's 55 s at the lowest level, and the whole command took 36 s at the
  default, on a 2-core Xeon).

  Args:
    count: the CPU devices.

  Returns:
    The flags.
  """
  return f'--xla_force_host_platform_device_count={count}'
