"""Test-process set-up that has to happen before JAX initialises its backends,
and the fixtures the test modules share.

Every test process sees 8 CPU devices, so multi-device code runs on CPU. The
tests are dominated by XLA compile time, which the lowest backend optimisation
level halves; it changes fusion, not what is computed.

A test that takes a `family_name` argument runs once per registered model family
(`vit_jax.models.FAMILIES`, on its `Family.tiny` model): a family registered
from a plugin (`pytest -p module`) is tested without editing the suite.
"""
import os

import chex
import pytest

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_backend_optimization_level=0').strip()
chex.set_n_cpu_devices(8)


def pytest_generate_tests(metafunc):
  if 'family_name' in metafunc.fixturenames:
    from vit_jax import models
    metafunc.parametrize('family_name', list(models.FAMILIES))


@pytest.fixture(scope='session')
def subjects():
  """An analysis subject of each family's tiny model, by family name, and 'vit_gap',
  the class-token ViT's twin that pools its tokens."""
  from helpers import subject_of, tiny_family_config
  from vit_jax import models
  made = {name: subject_of(tiny_family_config(name), name) for name in models.FAMILIES}
  made['vit_gap'] = subject_of(tiny_family_config('vit', classifier='gap'), 'vit_gap')
  return made
