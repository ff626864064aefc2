"""Small models, parameters and image folders shared by the tests."""
import os
import shutil

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf

from vit_jax import models

TINY_VIT = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, patch_size=8)
TINY_MIXER = dict(patch_size=8, hidden_dim=32, num_blocks=2, tokens_mlp_dim=8,
                  channels_mlp_dim=64)
# Basic blocks, stages of 1 and 2 blocks, the second ending in an MSA block; no
# max-pool, so 32 px images give 16x16 and 8x8 maps (the 7x7 windows pad the 8x8).
TINY_ALTERNET = dict(block='basic', num_layers=(1, 2), num_msa=(0, 1), num_heads=(1, 2),
                     width=32, head_dim=16, stem_pool=False)


def tiny_vit(num_classes=10, **overrides):
  return models.get_model('ViT-Ti_16', num_classes, **{**TINY_VIT, **overrides})


def tiny_bit(num_classes=10, **overrides):
  return models.get_model('BiT-M-R50x1', num_classes, **{'num_layers': (1, 1), **overrides})


def tiny_mixer(num_classes=10, **overrides):
  return models.get_model('Mixer-B_16', num_classes, **{**TINY_MIXER, **overrides})


def tiny_alternet(num_classes=10, **overrides):
  return models.get_model('AlterNet-18', num_classes, **{**TINY_ALTERNET, **overrides})


def param_shapes(name, image_size=224, num_classes=1000, **overrides):
  """Parameter shapes of a zoo model (1000 classes unless told), without allocating it."""
  model = models.get_model(name, num_classes, **overrides)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                             jnp.zeros((1, image_size, image_size, 3)))
  return {k: v.shape for k, v in flax.traverse_util.flatten_dict(variables['params'],
                                                                   sep='/').items()}


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


def make_folder(root, counts, size=(20, 30)):
  """Random JPEGs (and every third a grey PNG) in root/<split>/class_<i>/; returns
  the `folder:` dataset name. `counts[split][i]` images go to class i."""
  rng = np.random.RandomState(0)
  for split, per_class in counts.items():
    for label, n in enumerate(per_class):
      d = os.path.join(root, split, f'class_{label}')
      os.makedirs(d, exist_ok=True)
      for i in range(n):
        pixels = rng.randint(0, 256, size + (3,), dtype=np.uint8)
        if i % 3 == 1:  # a grey PNG among the colour JPEGs
          data = tf.io.encode_png(pixels[..., :1]).numpy()
          name = f'{i}.png'
        else:
          data = tf.io.encode_jpeg(pixels).numpy()
          name = f'{i}.JPEG'
        with open(os.path.join(d, name), 'wb') as f:
          f.write(data)
  return f'folder:{root}'


def assert_close_at_scale(actual, expected, rtol: float, ulps: float = 64.):
  """Trees equal to `rtol` of each value, and to `ulps` float32 units of the largest
  |value| among all leaves: two summation orders of one float32 computation differ
  by rounding relative to the sizes summed, which a near-zero leaf (a LayerNorm
  bias's gradient) does not have on its own."""
  scale = max(float(np.max(np.abs(np.asarray(leaf)))) for leaf in jax.tree_util.tree_leaves(expected))
  chex.assert_trees_all_close(actual, expected, rtol=rtol,
                              atol=ulps * float(np.finfo(np.float32).eps) * scale)


NO_CHROMIUM = ('No Chromium here: scripts/test.sh installs the Debian package chromium where '
               'apt-get runs as root.')


def chromium():
  """The path of a Chromium-like browser, or None."""
  for name in ('chromium', 'chromium-browser', 'google-chrome'):
    if shutil.which(name):
      return shutil.which(name)
  return None
