"""Test-process set-up that has to happen before JAX initialises its backends.

Every test process sees 8 CPU devices, so multi-device code runs on CPU. The
tests are dominated by XLA compile time, which the lowest backend optimisation
level halves; it changes fusion, not what is computed.
"""
import os

import chex

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_backend_optimization_level=0').strip()
chex.set_n_cpu_devices(8)
