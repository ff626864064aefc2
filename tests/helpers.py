"""Small models and parameter helpers shared by the tests."""
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models

TINY_VIT = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, patch_size=8)


def tiny_vit(num_classes=10, **overrides):
  return models.get_model('ViT-Ti_16', num_classes, **{**TINY_VIT, **overrides})


def tiny_bit(num_classes=10, **overrides):
  return models.get_model('BiT-M-R50x1', num_classes, **{'num_layers': (1, 1), **overrides})


def init(model, image_size=32, seed=0):
  if isinstance(image_size, int):
    image_size = (image_size, image_size)
  return jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros((1,) + tuple(image_size) + (3,)))


def apply(model, variables, x, **kwargs):
  """`model.apply` compiled once, as training and analysis run it."""
  return jax.jit(model.apply, static_argnames='train')(variables, x, **kwargs)


def apply_with_intermediates(model, variables, x, **kwargs):
  """`models.apply_with_intermediates` compiled once; kwargs are closed over."""
  return jax.jit(lambda v, x: models.apply_with_intermediates(model, v, x, **kwargs))(
      variables, x)


def perturbed(variables, seed=1, scale=0.1):
  """Parameters with noise added, so zero-initialised heads and biases matter."""
  leaves, tree = jax.tree_util.tree_flatten(variables)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree_util.tree_unflatten(
      tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def images(batch=2, size=32, seed=0):
  if isinstance(size, int):
    size = (size, size)
  return np.random.RandomState(seed).uniform(-1, 1, (batch,) + tuple(size) + (3,)).astype(
      np.float32)
