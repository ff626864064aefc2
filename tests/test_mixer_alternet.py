"""MLP-Mixer and AlterNet: trees, parameter counts, blocks against numpy
references, window attention against a masked global attention, checkpoints."""
import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from helpers import (TINY_ALTERNET, apply, apply_with_intermediates, images, init, param_shapes,
                     perturbed, tiny_alternet, tiny_mixer)
from vit_jax import checkpoint, models
from vit_jax.files import fit
from vit_jax.models import alternet, mixer


def mixer_count(patch, hidden, blocks, tokens_mlp, channels_mlp, image_size=224, classes=1000):
  """Closed form: stem, per block two LayerNorms and two two-layer MLPs, final norm, head."""
  n = (image_size // patch)**2
  block = (4 * hidden + n * tokens_mlp + tokens_mlp + tokens_mlp * n + n
           + hidden * channels_mlp + channels_mlp + channels_mlp * hidden + hidden)
  return patch * patch * 3 * hidden + hidden + blocks * block + 2 * hidden + hidden * classes + classes


def alternet_count(block, stages, msa, heads=(3, 6, 12, 24), classes=1000, head_dim=64, window=7):
  """Closed form of the AlterNet described in the paper, counted block by block."""
  expansion = 4 if block == 'bottleneck' else 1
  total, channels = 7 * 7 * 3 * 64, 64
  for s, (depth, m) in enumerate(zip(stages, msa)):
    width, out = 64 * 2**s, 64 * 2**s * expansion
    kinds = ['conv'] * (depth - 2 * m) + ['conv', 'msa'] * m
    for u, kind in enumerate(kinds):
      stride = 2 if u == 0 and s > 0 else 1
      total += 2 * channels  # norm1
      if stride != 1 or channels != out:
        total += channels * out  # 1x1 projection shortcut
      if kind == 'msa':
        inner, attn = channels // expansion, heads[s] * head_dim
        total += channels * inner + 2 * inner + 3 * inner * attn + attn * out + out
        total += (2 * window - 1)**2
      elif block == 'bottleneck':
        total += channels * width + 2 * width + 9 * width * width + 2 * width + width * out
      else:
        total += 9 * channels * width + 2 * width + 9 * width * out
      channels = out
  return total + 2 * channels + channels * classes + classes


@pytest.mark.parametrize('name', sorted(mixer.FAMILY.variants))
def test_mixer_parameter_count(name):
  fields = mixer.FAMILY.variants[name]
  count = sum(np.prod(s) for s in param_shapes(name).values())
  assert count == mixer_count(fields['patch_size'], fields['hidden_dim'], fields['num_blocks'],
                              fields['tokens_mlp_dim'], fields['channels_mlp_dim'])


@pytest.mark.parametrize('depth', sorted(alternet.VARIANTS))
def test_alternet_parameter_count(depth):
  block, stages, msa = alternet.VARIANTS[depth]
  count = sum(np.prod(s) for s in param_shapes(f'AlterNet-{depth}').values())
  assert count == alternet_count(block, stages, msa)


def test_mixer_tree_is_the_published_one():
  shapes = param_shapes('Mixer-B_16')
  block = {k.split('/', 1)[1]: v for k, v in shapes.items() if k.startswith('MixerBlock_0/')}
  assert block == {
      'LayerNorm_0/scale': (768,), 'LayerNorm_0/bias': (768,),
      'token_mixing/Dense_0/kernel': (196, 384), 'token_mixing/Dense_0/bias': (384,),
      'token_mixing/Dense_1/kernel': (384, 196), 'token_mixing/Dense_1/bias': (196,),
      'LayerNorm_1/scale': (768,), 'LayerNorm_1/bias': (768,),
      'channel_mixing/Dense_0/kernel': (768, 3072), 'channel_mixing/Dense_0/bias': (3072,),
      'channel_mixing/Dense_1/kernel': (3072, 768), 'channel_mixing/Dense_1/bias': (768,)}
  rest = {k: v for k, v in shapes.items() if not k.startswith('MixerBlock_')}
  assert rest == {'stem/kernel': (16, 16, 3, 768), 'stem/bias': (768,),
                  'pre_head_layer_norm/scale': (768,), 'pre_head_layer_norm/bias': (768,),
                  'head/kernel': (768, 1000), 'head/bias': (1000,)}
  assert {k.split('/')[0] for k in shapes if k.startswith('MixerBlock_')} == {
      f'MixerBlock_{i}' for i in range(12)}


def test_alternet_50_layout():
  config = models.get_config('AlterNet-50')
  layers = alternet.layers(config)
  kinds = [b.kind for b in layers.branches]
  # Stages of 3, 4, 6, 4 blocks; MSAs alternate at the ends of stages 2, 3, 4.
  assert ''.join('M' if k == 'attention' else 'C' for k in kinds) == (
      'CCC' 'CCCM' 'CMCMCM' 'CMCM')
  shapes = param_shapes('AlterNet-50')
  # The MSA block narrows the stage width 4x (a 1x1 conv), as the authors' blocks do.
  assert shapes['stage2_unit4/conv1/kernel'] == (1, 1, 512, 128)
  assert shapes['stage2_unit4/attention/query/kernel'] == (128, 6, 64)
  assert shapes['stage3_unit6/attention/out/kernel'] == (12, 64, 1024)
  assert shapes['stage4_unit4/attention/relative_position_bias'] == (13, 13)
  assert shapes['stage4_unit1/proj/kernel'] == (1, 1, 1024, 2048)
  assert shapes['head/kernel'] == (2048, 1000)
  with pytest.raises(ValueError, match='at most 1 MSA'):
    alternet.block_kinds(3, 2)


def test_mixer_block_matches_numpy():
  model = tiny_mixer(num_blocks=1)
  variables = perturbed(init(model, 32))
  x = images(2, 32)
  _, inter = apply_with_intermediates(model, variables, x)
  block = flax.traverse_util.flatten_dict(variables['params']['MixerBlock_0'], sep='/')
  expected = reference.mixer_block(np.asarray(inter['MixerBlock_0/input'], np.float64), block)
  # float32 through two LayerNorms and four matmuls of width <= 64.
  np.testing.assert_allclose(inter['MixerBlock_0/+channel_mlp'], expected, rtol=1e-4,
                             atol=1e-4)


@pytest.mark.parametrize('side,window', [((14, 14), 7), ((8, 8), 7), ((4, 4), 7), ((6, 9), 4)])
def test_window_attention_is_masked_global_attention(side, window):
  layer = alternet.WindowAttention(features=12, num_heads=2, head_dim=4, window=window)
  x = images(2, side)[..., :3] * 2
  x = np.concatenate([x, x[..., ::-1] ** 2], -1)  # 6 channels
  variables = perturbed(jax.jit(layer.init)(jax.random.PRNGKey(0), x), scale=0.5)
  out = jax.jit(layer.apply)(variables, x)
  flat = flax.traverse_util.flatten_dict(variables['params'], sep='/')
  np.testing.assert_allclose(out, reference.window_attention(np.float64(x), flat, window),
                             rtol=1e-4, atol=1e-5)


def test_alternet_msa_block_matches_numpy():
  model = tiny_alternet()
  variables = perturbed(init(model, 32))
  _, inter = apply_with_intermediates(model, variables, images(2, 32))
  block = flax.traverse_util.flatten_dict(variables['params']['stage2_unit2'], sep='/')
  x = np.asarray(inter['stage2_unit1/output'], np.float64)  # (2, 8, 8, 64): windows padded
  expected = reference.alternet_msa_block(x, block, window=7)
  np.testing.assert_allclose(inter['stage2_unit2/output'], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('make,size,maps', [
    (tiny_mixer, 32, None), (tiny_mixer, 224, None),
    (tiny_alternet, 32, [(16, 16), (8, 8), (8, 8)]),
    (tiny_alternet, 224, [(112, 112), (56, 56), (56, 56)]),
    (lambda n: tiny_alternet(n, stem_pool=True), 224, [(56, 56), (28, 28), (28, 28)])])
def test_shapes(make, size, maps):
  model = make(5)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, size, size, 3)))
  out, inter = jax.eval_shape(lambda v, x: models.apply_with_intermediates(model, v, x),
                              variables, jnp.zeros((2, size, size, 3)))
  chex.assert_shape(out, (2, 5))
  if maps is not None:
    units = ['stage1_unit1', 'stage2_unit1', 'stage2_unit2']
    assert [inter[f'{u}/output'].shape[1:3] for u in units] == maps
  else:
    chex.assert_shape(inter['MixerBlock_1/+channel_mlp'], (2, (size // 8)**2, 32))


def test_alternet_trains_with_stochastic_depth():
  model = tiny_alternet(0, stochastic_depth=0.5)  # pre-logits: the head starts at zero
  variables = init(model, 32)
  x = images(4, 32)
  train = apply(model, variables, x, train=True, rngs={'dropout': jax.random.PRNGKey(1)})
  evaluate = apply(model, variables, x)
  assert np.all(np.isfinite(train)) and not np.allclose(train, evaluate)


def test_mixer_published_layout_round_trip_and_fine_tuning(tmp_path):
  model = tiny_mixer(7)
  params = perturbed(init(model, 32))['params']
  path = str(tmp_path / 'Mixer-tiny.npz')
  checkpoint.save(path, params)
  chex.assert_trees_all_equal(checkpoint.load(path), jax.tree_util.tree_map(np.asarray, params))
  with np.load(path) as data:
    assert 'MixerBlock_1/token_mixing/Dense_0/kernel' in data.files
    assert 'pre_head_layer_norm/scale' in data.files

  config = models.get_config('Mixer-B_16', num_classes=3, **{
      k: getattr(model, k) for k in ('patch_size', 'hidden_dim', 'num_blocks', 'tokens_mlp_dim',
                                     'channels_mlp_dim')})
  fresh = init(models.build_model(config), 32)['params']
  fitted = fit.load_pretrained(path, fresh, config)
  chex.assert_trees_all_equal(fitted['MixerBlock_0'], checkpoint.load(path)['MixerBlock_0'])
  chex.assert_shape(fitted['head']['kernel'], (32, 3))
  bigger = init(models.build_model(config), 48)['params']
  with pytest.raises(checkpoint.CheckpointError, match='16 patches and the model has 36'):
    fit.load_pretrained(path, bigger, config)


def test_alternet_fine_tunes_at_another_resolution(tmp_path):
  params = perturbed(init(tiny_alternet(7), 32))['params']
  path = str(tmp_path / 'alternet.npz')
  checkpoint.save(path, params)
  config = models.get_config('AlterNet-18', num_classes=3, **TINY_ALTERNET)
  fitted = fit.load_pretrained(path, init(models.build_model(config), 64)['params'],
                               config)
  chex.assert_trees_all_equal(fitted['stage2_unit2'], checkpoint.load(path)['stage2_unit2'])
  assert np.all(np.asarray(fitted['head']['kernel']) == 0)
