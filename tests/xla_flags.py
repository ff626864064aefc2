"""The XLA flags every test process runs under (tests/conftest.py sets them before
JAX starts, and the commands and notebooks the tests start inherit or take them).

The tests are dominated by XLA:CPU compile time. The lowest backend optimisation
level halves it, and XLA's older elemental emitters for fusions in place of its
fusion emitters take 30-50% off what is left (a tiny ViT's, Mixer's and BiT's
forward, gradient and Hessian-vector product programs on a 2-core Xeon), at a
slower run of the tiny programs. Both change how the program is generated, not
what it computes.
"""
FAST_COMPILE = '--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false'


def with_devices(count: int) -> str:
  """XLA_FLAGS for a process that simulates `count` CPU devices, compiled as the
  tests' own processes are."""
  return f'{FAST_COMPILE} --xla_force_host_platform_device_count={count}'
