"""How a CPU host runs the train command: how many data-parallel devices it is split
into (XLA:CPU runs a train step faster as one program per core than as one program
threaded over the cores), and which work of a gradient's program XLA:CPU hands to
YNNPACK.
"""
import math
import os
import platform
from typing import Dict, FrozenSet, Optional, Tuple

import jax
import jaxlib
import ml_collections


def cpu_device_count(config: ml_collections.ConfigDict, cores: int, processes: int = 1,
                     niceness: int = 0) -> int:
  """Devices to split a CPU host into: one per core, cut to a divisor of every batch;
  one for a process of lowered priority.

  XLA:CPU runs a train step faster as one program per core than as one
  program threaded over the cores (ViT-S/16 at 224 px: 1.3-1.5x on 2 cores). At
  nice 19 beside other work, runs split into two devices stopped at an all-reduce
  for good, one device's thread never arriving (docs/reliability.md); a run of
  one device has no collective to wait at.

  Args:
    config: the recipe (its batch sizes).
    cores: the cores this process may use.
    processes: the run's processes.
    niceness: the process's nice value (`os.nice(0)`); above 0, one device.

  Returns:
    The device count.
  """
  if niceness > 0:
    return 1
  batch = math.gcd(config.batch_size // max(config.accum_steps, 1), config.eval_batch_size)
  per_process = batch // processes if batch % processes == 0 else 1
  return max(n for n in range(1, max(cores, 1) + 1) if per_process % n == 0)


def split_cpu_into_devices(config: ml_collections.ConfigDict, requested: int,
                           processes: int = 1) -> None:
  """Sets JAX's CPU device count before the backend starts, unless the user has.

  `requested` 0 picks `cpu_device_count` over the cores this process may use;
  GPU and TPU runs are unaffected (their devices are not CPU devices).

  Args:
    config: the recipe.
    requested: the devices asked for (0: one per core).
    processes: the run's processes.
  """
  forced = (xla_flags_name('xla_force_host_platform_device_count')
            or 'JAX_NUM_CPU_DEVICES' in os.environ)
  if forced and not requested:
    return
  count = requested or cpu_device_count(config, len(os.sched_getaffinity(0)), processes,
                                        niceness=os.nice(0))
  if count > 1:
    patient_collectives()
  jax.config.update('jax_num_cpu_devices', count)


# XLA:CPU aborts the process when one device's thread reaches a collective 40 s
# after another (a core taken by other work on the machine, a long host step): a
# lost run where the caller only asked for a slower one.
COLLECTIVE_TIMEOUTS = {'xla_cpu_collective_call_terminate_timeout_seconds': 3600,
                       'xla_cpu_collective_timeout_seconds': 3600}


def patient_collectives() -> None:
  """Lets CPU devices wait an hour for each other at a collective (the flags
  `COLLECTIVE_TIMEOUTS`, unless XLA_FLAGS sets them), before the backend starts."""
  extra = [f'--{name}={seconds}' for name, seconds in COLLECTIVE_TIMEOUTS.items()
           if not xla_flags_name(name)]
  if extra:
    os.environ['XLA_FLAGS'] = ' '.join([os.environ.get('XLA_FLAGS', ''), *extra]).strip()


def xla_flags_name(flag: str) -> bool:
  """Whether the user's XLA_FLAGS names `flag` (a setting of theirs to keep).

  Args:
    flag: the flag's name, without dashes.

  Returns:
    True where XLA_FLAGS mentions it.
  """
  return flag in os.environ.get('XLA_FLAGS', '')


def cpu_info() -> Tuple[str, FrozenSet[str]]:
  """The CPU's model name and feature flags ('avx512f', ...) from /proc/cpuinfo
  (its first processor); elsewhere `platform`'s name and no flags."""
  fields = {}
  if os.path.exists('/proc/cpuinfo'):
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        fields.setdefault(key.strip(), value.strip())
  return (fields.get('model name') or platform.processor() or platform.machine(),
          frozenset(fields.get('flags', '').split()))


# The work XLA:CPU hands to YNNPACK in programs that run a model's backward pass (the
# train command's train step, the Hessian tool's linearised products): each dot with
# the elementwise work around it (a GroupNorm's scale and shift, a ReLU, a residual
# add), reductions and convolutions. XLA's default (jaxlib 0.10.2 and 0.12.0.1) hands
# it each dot alone. On a 2-core AMD EPYC the quick-start ResNet's train step ran 1.19x
# faster this way (1,534 against 1,292 images/s; 1.13x with jaxlib 0.12.0.1), its
# Hessian product 1.26x, and the quick-start ViT's step as fast; BiT-M-R50x1's
# inference ran slower with it (2% at batch 8, 16% at batch 32: docs/benchmarks.md). The option is read by the jaxlib
# releases named here, which were measured; others keep XLA's default, as does a run
# whose XLA_FLAGS names the option.
GRADIENT_LIBRARY_FUSIONS = ('DOT', 'REDUCE', 'INDIVIDUAL_CONVOLUTION')
LIBRARY_FUSIONS_MEASURED = ('0.10.2', '0.12.0')


def gradient_compiler_options(backend: str, jaxlib_version: str = jaxlib.__version__
                              ) -> Optional[Dict[str, str]]:
  """XLA options for a compiled program that runs a model's backward pass: on CPU
  devices of a measured jaxlib, the work handed to YNNPACK
  (`GRADIENT_LIBRARY_FUSIONS`), unless XLA_FLAGS chooses it; elsewhere none. JAX
  takes them on a top-level `jax.jit` only.

  Results are those of XLA's default up to float32 summation order.

  Args:
    backend: the devices' platform ('cpu', 'gpu', 'tpu').
    jaxlib_version: the installed jaxlib's version.

  Returns:
    `jax.jit`'s `compiler_options`, or None.
  """
  release = '.'.join(jaxlib_version.split('.')[:3])
  chosen = xla_flags_name('xla_cpu_experimental_ynn_fusion_type')
  if backend != 'cpu' or release not in LIBRARY_FUSIONS_MEASURED or chosen:
    return None
  return {'xla_cpu_experimental_ynn_fusion_type':
          ','.join(f'LIBRARY_FUSION_TYPE_{kind}' for kind in GRADIENT_LIBRARY_FUSIONS)}
