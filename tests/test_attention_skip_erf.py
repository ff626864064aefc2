"""Attention distance and rollout, norm ratios and receptive fields against closed forms."""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from analysis.measures import attention, receptive_field, skip
from analysis.runtime import features
from helpers import TINY_VIT, images, init, perturbed
from vit_jax import models


def one_hot_attention(targets, n, batch=2, heads=3):
  """(batch, heads, n, n) attention with each query's weight all on targets[query]."""
  weights = np.eye(n)[np.asarray(targets)]
  return jnp.asarray(np.broadcast_to(weights, (batch, heads, n, n)))


def test_identity_attention_has_distance_zero():
  distances = attention.mean_attention_distance(one_hot_attention(range(16), 16), (4, 4), 8.,
                                                has_cls=False)
  chex.assert_trees_all_close(distances, jnp.zeros(3))


def test_fixed_offset_gives_that_offset_in_pixels():
  # Every query attends to the patch one row down (the last row wraps to the
  # first, 3 rows up): mean distance (3 * 1 + 1 * 3) / 4 rows of 8 px.
  targets = [(i + 4) % 16 for i in range(16)]
  distances = attention.mean_attention_distance(one_hot_attention(targets, 16), (4, 4), 8.,
                                                has_cls=False)
  chex.assert_trees_all_close(distances, jnp.full(3, (3 * 8. + 1 * 24.) / 4))


def test_uniform_attention_gives_mean_pairwise_distance():
  # On a 2x2 grid each patch is 1 patch from two others and sqrt(2) from one.
  uniform = jnp.full((1, 2, 5, 5), 0.2)  # with a class token: 1 + 4 tokens
  distances = attention.mean_attention_distance(uniform, (2, 2), 16., has_cls=True)
  chex.assert_trees_all_close(distances, jnp.full(2, 16. * (2 + np.sqrt(2)) / 4), rtol=1e-6)


def test_class_token_weight_is_renormalised_away_or_kept_at_distance_zero():
  # Half of every query's weight on the class token, half on the patch to its right.
  n = 1 + 9
  weights = np.zeros((1, 1, n, n))
  for q in range(1, n):
    weights[0, 0, q, 0] = 0.5
    weights[0, 0, q, 1 + (q - 1) // 3 * 3 + ((q - 1) % 3 + 1) % 3] = 0.5
  distances = attention.mean_attention_distance(jnp.asarray(weights), (3, 3), 1., has_cls=True)
  chex.assert_trees_all_close(distances, jnp.array([(2 * 1 + 1 * 2) / 3]), rtol=1e-6)
  kept = attention.mean_attention_distance(jnp.asarray(weights), (3, 3), 1., has_cls=True,
                                           keep_class_key=True)
  # Half the weight at the neighbour's distance (1 or 2 px), half at 0.
  chex.assert_trees_all_close(kept, jnp.array([0.5 * (2 * 1 + 1 * 2) / 3]), rtol=1e-6)


def test_rollout_of_identity_is_identity_and_rows_sum_to_one():
  n = 5
  eye = jnp.broadcast_to(jnp.eye(n), (2, 4, n, n))
  chex.assert_trees_all_close(attention.attention_rollout([eye, eye]),
                              jnp.broadcast_to(jnp.eye(n), (2, n, n)))
  rng = np.random.RandomState(0)
  layers = [jax.nn.softmax(jnp.asarray(rng.randn(2, 4, n, n)), -1) for _ in range(3)]
  rollout = attention.attention_rollout(layers)
  chex.assert_trees_all_close(rollout.sum(-1), jnp.ones((2, n)), rtol=1e-6)
  # Two layers by hand: (0.5 A2 + 0.5 I) (0.5 A1 + 0.5 I).
  mix = lambda a: 0.5 * a.mean(1) + 0.5 * jnp.eye(n)
  chex.assert_trees_all_close(attention.attention_rollout(layers[:2]),
                              mix(layers[1]) @ mix(layers[0]), rtol=1e-6)
  maps = attention.rollout_map(rollout, (2, 2), has_cls=True)
  chex.assert_shape(maps, (2, 2, 2))
  chex.assert_trees_all_close(maps.max(axis=(1, 2)), jnp.ones(2))
  # Registers are neither read nor shown. Of 1 + 2 + 4 tokens (class token, 2
  # registers, 2x2 patches): the class token's row over the patches; without a
  # class token (2 registers, 4 patches), the mean of the patch rows over the patches.
  with_cls = np.asarray(attention.attention_rollout(
      [jax.nn.softmax(jnp.asarray(rng.randn(2, 4, 7, 7)), -1)]))
  without = with_cls[:, 1:, 1:] / with_cls[:, 1:, 1:].sum(-1, keepdims=True)
  for has_cls, x, expected in ((True, with_cls, with_cls[:, 0, 3:]),
                               (False, without, without[:, 2:, 2:].mean(axis=1))):
    np.testing.assert_allclose(
        attention.rollout_map(jnp.asarray(x), (2, 2), has_cls, registers=2),
        (expected / expected.max(-1, keepdims=True)).reshape(2, 2, 2), rtol=1e-6)


def test_norm_ratio_of_scaled_branch_is_inverse_scale():
  z = jnp.asarray(np.random.RandomState(0).randn(3, 1 + 16, 8))
  ratios = skip.token_norm_ratios(z, 4. * z, has_cls=True)
  chex.assert_trees_all_close(ratios, {'cls': 0.25, 'spatial': 0.25}, rtol=1e-6)
  maps = z[:, 1:].reshape(3, 4, 4, 8)
  chex.assert_trees_all_close(skip.token_norm_ratios(maps, -0.5 * maps, has_cls=False),
                              {'spatial': 2.}, rtol=1e-6)


class StackedConvs(nn.Module):
  layers: int

  @nn.compact
  def __call__(self, x):
    for _ in range(self.layers):
      x = nn.Conv(4, (3, 3), padding='SAME', use_bias=False,
                  kernel_init=nn.initializers.uniform(1.))(x)  # positive: no cancellation
    return x


@pytest.mark.parametrize('layers', [1, 2, 3])
def test_erf_of_stacked_3x3_convs_has_support_2l_plus_1_squared(layers):
  model = StackedConvs(layers)
  x = images(2, 17)
  variables = model.init(jax.random.PRNGKey(0), x)
  field = receptive_field.effective_receptive_field(lambda v: model.apply(variables, v), jnp.asarray(x))
  support = np.argwhere(np.asarray(field) > 0)
  assert len(support) == (2 * layers + 1) ** 2
  assert np.all(support.min(0) == 8 - layers) and np.all(support.max(0) == 8 + layers)
  np.testing.assert_allclose(field.max(), 1., rtol=1e-6)


def test_erf_after_patch_embedding_is_exactly_one_patch():
  config = models.get_config('ViT-Ti_16', num_classes=10, **TINY_VIT)
  params = perturbed(init(models.build_model(config), 32))['params']
  subject = features.Subject('tiny', config, params, 32)
  name = 'Transformer/encoderblock_0/input'
  field = receptive_field.effective_receptive_field(
      lambda x: features.spatial_map(subject, subject.intermediates(x, [name])[name]),
      jnp.asarray(images(2, 32)))
  support = np.argwhere(np.asarray(field) > 0)
  # Centre token of the 4x4 grid is (2, 2): pixels 16..23 in each direction.
  assert len(support) == 64
  assert np.all(support.min(0) == 16) and np.all(support.max(0) == 23)


def test_norm_ratio_is_the_mean_of_per_token_ratios():
  # Token 0: ||z|| = 1, ||f(z)|| = 1; token 1: ||z|| = 1, ||f(z)|| = 4.
  z = jnp.array([[[1., 0.], [0., 1.]]])
  fz = jnp.array([[[1., 0.], [4., 0.]]])
  ratios = skip.token_norm_ratios(z, fz, has_cls=False)
  np.testing.assert_allclose(ratios['spatial'], (1 + 0.25) / 2, rtol=1e-6)  # not 1 / 2.5


def test_erf_sums_absolute_gradients_over_colours():
  # The centre feature reads its own pixel as (red - green) and the pixel to its right
  # as (red + green) / 2: sum_c |grad| gives 2 and 1, |sum_c grad| would give 0 and 1.
  def feature_fn(x):
    right = jnp.roll(x, -1, axis=2)
    return (x[..., :1] - x[..., 1:2]) + 0.5 * (right[..., :1] + right[..., 1:2])
  field = receptive_field.effective_receptive_field(feature_fn, jnp.zeros((2, 5, 5, 3)))
  expected = np.zeros((5, 5))
  expected[2, 2], expected[2, 3] = 1., 0.5
  np.testing.assert_allclose(field, expected, atol=1e-7)
