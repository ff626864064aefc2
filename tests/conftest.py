"""Test-process set-up that has to happen before JAX initialises its backends,
and the fixtures the test modules share.

Every test process sees 8 CPU devices, so multi-device code runs on CPU. The
tests are dominated by XLA compile time, which the lowest backend optimisation
level halves; it changes fusion, not what is computed.

A test that takes a `family_name` argument runs once per registered family of
image classifiers (`models.families(models.CLASSIFY)`, on its `Family.tiny`
model), one that takes `any_family_name` once per registered family of any kind:
a family registered from a plugin (`pytest -p module`) is tested without
editing the suite.
"""
import os

import chex
import pytest

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_backend_optimization_level=0').strip()
chex.set_n_cpu_devices(8)


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
