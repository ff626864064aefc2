"""ResNets: one BiT unit against numpy, weight standardisation, shapes."""
import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from helpers import (apply, apply_with_intermediates, assert_close_at_scale, images, init,
                     perturbed, tiny_bit)
from vit_jax.models import resnet

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


@pytest.mark.parametrize('stride,in_channels', [(2, 64), (1, 128)])
def test_bit_unit_matches_numpy_reference(stride, in_channels):
  unit = resnet.BottleneckV2(features=32, strides=stride)
  x = np.random.RandomState(0).randn(2, 8, 8, in_channels).astype(np.float32)
  variables = perturbed(jax.jit(unit.init)(jax.random.PRNGKey(0), x), scale=0.3)
  params = flax.traverse_util.flatten_dict(variables['params'], sep='/')
  assert ('a/proj/standardized_conv2d/kernel' in params) == (stride == 2 or in_channels != 128)
  out = jax.jit(unit.apply)(variables, x)
  expected = reference.bit_unit(x.astype(np.float64), params, stride)
  chex.assert_shape(out, (2, 8 // stride, 8 // stride, 128))
  # Three float32 convs of depth <= 9*32 and two GroupNorms: ~1e-5 relative.
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('names', [('gamma', 'beta'), ('scale', 'bias')])
def test_group_norm_matches_numpy_reference(names):
  norm = resnet.GroupNorm(32, 1e-5, scale_name=names[0], bias_name=names[1])
  rng = np.random.RandomState(0)
  # An offset of 3 std: E[x^2] - E[x]^2 in float32 keeps ~6 significant digits.
  x = (rng.randn(2, 5, 5, 64) * 2 + 6).astype(np.float32)
  params = {names[0]: rng.randn(64).astype(np.float32), names[1]: rng.randn(64).astype(np.float32)}
  assert jax.tree.map(np.shape, norm.init(jax.random.PRNGKey(0), x)['params']) == {
      names[0]: (64,), names[1]: (64,)}
  expected = reference.group_norm(x.astype(np.float64), params[names[0]], params[names[1]])
  np.testing.assert_allclose(norm.apply({'params': params}, x), expected, rtol=1e-4, atol=1e-4)
  bf16 = resnet.GroupNorm(32, 1e-5, jnp.bfloat16, *names).apply({'params': params}, x)
  assert bf16.dtype == jnp.bfloat16
  # bfloat16 output of a float32 computation: 8 significant bits.
  np.testing.assert_allclose(bf16.astype(np.float32), expected, rtol=2e-2, atol=2e-2)


def test_group_norm_gradient_matches_finite_differences():
  norm = resnet.GroupNorm(4, 1e-5)
  rng = np.random.RandomState(1)
  with jax.enable_x64(True):
    x = jnp.asarray(rng.randn(2, 3, 3, 8))
    params = {'gamma': jnp.asarray(rng.randn(8)), 'beta': jnp.asarray(rng.randn(8))}
    jax.test_util.check_grads(lambda x, p: norm.apply({'params': p}, x), (x, params), order=1,
                              modes=['rev'])


@pytest.mark.parametrize('inside_sqrt,eps', [(True, 1e-10), (False, 1e-5)])
def test_std_conv_kernel_is_standardised(inside_sqrt, eps):
  conv = resnet.StdConv(8, (3, 3), use_bias=False, ws_eps=eps, eps_inside_sqrt=inside_sqrt)
  x = np.random.RandomState(0).randn(1, 5, 5, 4).astype(np.float32)
  variables = conv.init(jax.random.PRNGKey(0), x)
  w = np.asarray(variables['params']['kernel'], np.float64) * 3 + 1
  out = conv.apply({'params': {'kernel': w}}, x)
  centred, var = w - w.mean((0, 1, 2)), w.var((0, 1, 2))
  # BiT: (w - mean) / sqrt(var + 1e-10); ResNet v1: (w - mean) / (std + 1e-5).
  w_std = centred / (np.sqrt(var + eps) if inside_sqrt else np.sqrt(var) + eps)
  assert np.abs(w_std.std((0, 1, 2)) - 1).max() < 1e-4
  expected = jax.lax.conv_general_dilated(x, w_std.astype(np.float32), (1, 1), 'SAME',
                                          dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_bit_root_pools_over_zero_padding():
  root = resnet.RootBlock(width=32)
  x = np.random.RandomState(0).randn(1, 16, 16, 3).astype(np.float32)
  variables = root.init(jax.random.PRNGKey(0), x)
  out = root.apply(variables, x)
  conv = resnet._bit_conv(32, 7, 2)
  y = conv.apply({'params': variables['params']['standardized_conv2d']}, x)
  chex.assert_shape(out, (1, 4, 4, 32))
  # The corner window covers one padded zero row/column and 2x2 conv outputs.
  np.testing.assert_allclose(out[0, 0, 0], np.maximum(y[0, :2, :2].max((0, 1)), 0), rtol=1e-6)


def test_bit_root_without_pool_is_the_strided_conv():
  root = resnet.RootBlock(width=32, pool=False)
  x = np.random.RandomState(0).randn(1, 16, 16, 3).astype(np.float32)
  variables = root.init(jax.random.PRNGKey(0), x)
  y = resnet._bit_conv(32, 7, 2).apply({'params': variables['params']['standardized_conv2d']}, x)
  chex.assert_shape(y, (1, 8, 8, 32))
  chex.assert_trees_all_close(root.apply(variables, x), y)


@pytest.mark.parametrize('kernel,strides', [(7, 2), (3, 1), (3, 2), (1, 2)])
def test_bit_conv_pads_half_its_kernel_on_every_side(kernel, strides):
  """BiT's convs see the input zero-padded by kernel // 2 on each side, also at
  stride 2 where 'SAME' would pad less before than after."""
  conv = resnet._bit_conv(8, kernel, strides)
  x = np.random.RandomState(0).randn(2, 10, 10, 4).astype(np.float32)
  variables = conv.init(jax.random.PRNGKey(0), x)
  w = np.asarray(variables['params']['kernel'], np.float64)
  w = (w - w.mean((0, 1, 2))) / np.sqrt(w.var((0, 1, 2)) + 1e-10)
  p = kernel // 2
  expected = jax.lax.conv_general_dilated(
      np.pad(x, ((0, 0), (p, p), (p, p), (0, 0))), w.astype(np.float32), (strides, strides),
      'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  # float32 sums of up to 7 * 7 * 4 products of unit-scale terms.
  np.testing.assert_allclose(conv.apply(variables, x), expected, rtol=1e-5, atol=1e-5)


def test_bit_half_width_unpooled_root_shapes():
  model = tiny_bit(width_factor=0.5, root_pool=False)
  variables = init(model, 28)
  shapes = flax.traverse_util.flatten_dict(variables['params'], sep='/')
  assert shapes['resnet/root_block/standardized_conv2d/kernel'].shape == (7, 7, 3, 32)
  assert shapes['resnet/head/conv2d/kernel'].shape == (1, 1, 256, 10)
  _, inter = apply_with_intermediates(model, variables, images(2, 28))
  chex.assert_shape(inter['resnet/root'], (2, 14, 14, 32))
  chex.assert_shape(inter['resnet/block1/output'], (2, 14, 14, 128))
  chex.assert_shape(inter['resnet/block2/output'], (2, 7, 7, 256))


def test_bit_width_must_give_whole_groups():
  with pytest.raises(ValueError, match='multiple of 0.5'):
    init(tiny_bit(width_factor=0.75), 32)


def test_bit_forward_and_intermediates():
  model = tiny_bit(num_classes=7)
  variables = init(model, 64)
  out, inter = apply_with_intermediates(model, perturbed(variables), images(2, 64))
  chex.assert_shape(out, (2, 7))
  chex.assert_tree_all_finite(out)
  chex.assert_shape(inter['resnet/root'], (2, 16, 16, 64))
  chex.assert_shape(inter['resnet/block1/unit01/output'], (2, 16, 16, 256))
  chex.assert_shape(inter['resnet/block2/output'], (2, 8, 8, 512))
  chex.assert_shape(inter['resnet/pre_logits'], (2, 512))
  # The first unit projects its shortcut; the unit adds the two branches.
  unit = 'resnet/block1/unit01/'
  chex.assert_shape(inter[unit + 'shortcut'], (2, 16, 16, 256))
  chex.assert_trees_all_close(inter[unit + 'shortcut'] + inter[unit + 'residual'],
                              inter[unit + 'output'])
  # The zero-initialised head gives zero logits before training.
  chex.assert_trees_all_close(apply(model, variables, images(2, 64)), jnp.zeros((2, 7)))
  features = apply(tiny_bit(num_classes=0), variables, images(2, 64))
  chex.assert_shape(features, (2, 512))


def test_bit_bfloat16_close_to_float32():
  variables = perturbed(init(tiny_bit(num_classes=0), 32))
  x = images(2, 32)
  f32 = apply(tiny_bit(num_classes=0), variables, x)
  bf16 = apply(tiny_bit(num_classes=0, dtype='bfloat16'), variables, x)
  # 8 significant bits through six convs and GroupNorms.
  assert np.linalg.norm(bf16 - f32) / np.linalg.norm(f32) < 3e-2


def test_fixed_variables_hold_each_std_conv_kernel_standardised_once():
  """Every weight-standardised conv of BiT and of the hybrid ViT's ResNet v1, and
  only those, is in the `standardised` collection, standardised as in float64."""
  from vit_jax import models
  x = images(2, 32)
  for model in (tiny_bit(), models.get_model('R26+ViT-S_32', 5, num_layers=1,
                                             resnet_layers=(1, 1))):
    params = perturbed(init(model), scale=0.3)['params']
    fixed = models.fixed_variables(model, params, 32)
    kernels = flax.traverse_util.flatten_dict(fixed[resnet.STANDARDISED], sep='/')
    flat = flax.traverse_util.flatten_dict(params, sep='/')
    # Every conv kernel but the classifier's (BiT's head conv) and the ViT's patch embedding.
    assert set(kernels) == {k for k, v in flat.items()
                            if v.ndim == 4 and not k.startswith(('resnet/head', 'embedding'))}
    bit = 'resnet/root_block/standardized_conv2d/kernel' in kernels
    for path, kernel in kernels.items():
      w = np.asarray(flat[path], np.float64)
      centred, var = w - w.mean((0, 1, 2)), w.var((0, 1, 2))
      expected = centred / (np.sqrt(var + 1e-10) if bit else np.sqrt(var) + 1e-5)
      np.testing.assert_allclose(kernel, expected, rtol=1e-5, atol=1e-5)
    # Standardised in a program of their own, the kernels may differ by float32 rounding.
    assert_close_at_scale(apply(model, fixed, x), apply(model, {'params': params}, x),
                          rtol=1e-5, ulps=16)


def test_fixed_variables_give_every_familys_outputs(family_name):
  from helpers import tiny_family_config
  from vit_jax import models
  model = models.build_model(tiny_family_config(family_name))
  params = perturbed(init(model))['params']
  fixed = models.fixed_variables(model, params, 32)
  assert fixed['params'] is params
  x = images(2, 32)
  out, inter = apply_with_intermediates(model, fixed, x)
  assert_close_at_scale((out, inter), apply_with_intermediates(model, {'params': params}, x),
                        rtol=1e-5, ulps=16)


@pytest.mark.parametrize('shape', [(1, 1, 24, 16), (3, 3, 4, 16), (1, 3, 8, 16)])
def test_standardisation_and_its_gradient_match_float64_closed_forms(shape):
  """BiT's standardisation k = (w - mean) / sqrt(var + eps) over the input axes
  (1x1 kernels reduced without their unit axes) and its gradient
  r * (g - mean(g) - k * mean(g * k)), r = 1 / sqrt(var + eps), in float64."""
  conv = resnet.StdConv(shape[-1], shape[:2], use_bias=False, eps_inside_sqrt=True,
                        ws_eps=1e-10)
  x = np.zeros((1, 4, 4, shape[2]), np.float32)
  rng = np.random.RandomState(0)
  w = (rng.randn(*shape) * 0.2 + 0.05).astype(np.float32)
  g = rng.randn(*shape).astype(np.float32)

  def standardised(kernel):
    _, made = conv.apply({'params': {'kernel': kernel}}, x, mutable=[resnet.STANDARDISED])
    return made[resnet.STANDARDISED]['kernel']

  kernel, vjp = jax.vjp(standardised, jnp.asarray(w))
  w64, g64 = w.astype(np.float64), g.astype(np.float64)
  mean = lambda a: a.mean((0, 1, 2), keepdims=True)
  r = 1. / np.sqrt(mean(np.square(w64 - mean(w64))) + 1e-10)
  k = (w64 - mean(w64)) * r
  np.testing.assert_allclose(kernel, k, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(vjp(jnp.asarray(g))[0], r * (g64 - mean(g64) - k * mean(g64 * k)),
                             rtol=1e-4, atol=1e-4)


def test_init_keeps_no_standardised_kernels():
  """Kernels kept at `init` would be read in place of the trained parameters' own."""
  variables = init(tiny_bit())
  assert set(variables) == {'params'}
