"""A forward pass with the batch sharded over 8 CPU devices equals one device."""
import chex
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from helpers import images, init, perturbed, tiny_bit, tiny_vit


@pytest.mark.parametrize('make', [tiny_vit, tiny_bit])
def test_sharded_forward_equals_single_device(make):
  assert jax.device_count() == 8
  model = make()
  variables = perturbed(init(model))
  x = images(16)
  single = jax.jit(model.apply)(variables, x)

  mesh = Mesh(np.array(jax.devices()), ('data',))
  x_sharded = jax.device_put(x, NamedSharding(mesh, P('data')))
  replicated = jax.device_put(variables, NamedSharding(mesh, P()))
  sharded = jax.jit(model.apply, out_shardings=NamedSharding(mesh, P('data')))(
      replicated, x_sharded)
  assert len(sharded.sharding.device_set) == 8
  chex.assert_shape(sharded.addressable_shards[0].data, (2, 10))
  # Same program per example; only the reduction order of XLA's kernels may differ.
  chex.assert_trees_all_close(np.asarray(sharded), np.asarray(single), rtol=1e-5, atol=1e-6)
