"""`scan_layers=True`: the ViT's blocks as one `nn.scan` over stacked parameters
compute what the unrolled blocks compute, with and without remat, save and load
through the published per-block names, and compile one block whatever the depth."""
import functools

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import TINY_VIT, assert_close_at_scale, images, init, perturbed, tiny_vit
from vit_jax import checkpoint, models
from vit_jax.files import fit, timm_files
from vit_jax.models import vit_layouts

NAME = 'ViT-Ti_16'


def _flat(tree):
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(tree), sep='/')


def _stacked(params, **fields):
  """Unrolled parameters in the tree of the scanned model of `fields`."""
  config = models.get_config(NAME, **{**TINY_VIT, **fields}, scan_layers=True)
  return flax.traverse_util.unflatten_dict(
      vit_layouts.module_layout(_flat(params), config), sep='/')


def _loss(model, params, x, **kwargs):
  return jnp.mean(model.apply({'params': params}, x, **kwargs) ** 2)


@pytest.mark.parametrize('fields', [dict(), dict(classifier='gap', remat='full'),
                                    dict(remat='dots', representation_size=16),
                                    dict(layer_scale_init=0.1), dict(num_registers=2),
                                    dict(posemb='none', rope='dinov3', attention_bias='qv',
                                         num_registers=2, activation='swiglu'),
                                    dict(rope='eva02', rope_theta=10000., rope_grid=(16, 16),
                                         attention_bias='qv', activation='swiglu',
                                         mlp_norm=True, classifier='token_gap',
                                         pooled_norm=True),
                                    dict(rope='pe', rope_theta=10000., rope_offset=1.,
                                         rope_grid=(24, 24), pre_norm=True, patch_bias=False,
                                         classifier='token_map', map_heads=2, map_mlp_dim=48),
                                    dict(normalization='rms', patch_norm=True, attention_bias='none',
                                         projection_bias=False, activation='swiglu',
                                         classifier='attention_pool')],
                         ids=['token', 'gap-remat', 'dots-prelogits', 'layerscale', 'registers',
                              'dinov3', 'eva02', 'pe', 'aimv2'])
def test_a_scanned_vit_computes_what_the_unrolled_one_computes(fields):
  unrolled, scanned = tiny_vit(**fields), tiny_vit(**fields, scan_layers=True)
  params = perturbed(init(unrolled))['params']
  stacked = _stacked(params, **fields)
  # The scanned model's own initialisation has the stacked tree.
  chex.assert_trees_all_equal_shapes(init(scanned)['params'], stacked)
  x = images(4)
  out = jax.jit(unrolled.apply)({'params': params}, x)
  chex.assert_trees_all_close(jax.jit(scanned.apply)({'params': stacked}, x), out,
                              rtol=1e-5, atol=1e-6)
  grads = jax.jit(jax.grad(lambda p: _loss(unrolled, p, x)))(params)
  scanned_grads = jax.jit(jax.grad(lambda p: _loss(scanned, p, x)))(stacked)
  assert_close_at_scale(scanned_grads, _stacked(grads, **fields), rtol=1e-4)


def test_each_scanned_block_gets_its_own_stochastic_depth_rate():
  """Rates grow 0 -> 1 over two blocks: in training the first block always runs
  and the second never does, in both forms, so their outputs agree exactly; with
  the rates reversed they would not."""
  fields = dict(stochastic_depth=1.)
  unrolled, scanned = tiny_vit(**fields), tiny_vit(**fields, scan_layers=True)
  params = perturbed(init(unrolled))['params']
  x, rngs = images(4), {'dropout': jax.random.PRNGKey(3)}
  train = lambda model, p: jax.jit(functools.partial(model.apply, train=True))(
      {'params': p}, x, rngs=rngs)
  out = train(unrolled, params)
  chex.assert_trees_all_close(train(scanned, _stacked(params, **fields)), out,
                              rtol=1e-5, atol=1e-6)
  # Not the evaluation output: the second block does change the stream.
  assert np.max(np.abs(out - jax.jit(unrolled.apply)({'params': params}, x))) > 1e-3


@pytest.mark.parametrize('fields, names', [
    (dict(skip_removed=((1, 'mlp'),)), 'skip_removed'),
    (dict(posemb='relative'), "posemb 'relative'"),
    (dict(posemb_where='every_layer'), "posemb_where 'every_layer'"),
])
def test_blocks_that_differ_are_not_scanned(fields, names):
  with pytest.raises(ValueError, match=f'scan_layers needs identical blocks, but {names}'):
    init(tiny_vit(**fields, scan_layers=True))


def test_checkpoints_keep_the_published_per_block_names(tmp_path):
  """Saved from the scanned tree: the unrolled model's file, name for name and
  value for value; loaded for the scanned model: stacked again; fine-tuned into
  a scanned model at a new resolution: the unrolled fine-tuning, stacked."""
  unrolled = tiny_vit()
  params = perturbed(init(unrolled))['params']
  checkpoint.save(str(tmp_path / 'unrolled.npz'), params)
  checkpoint.save(str(tmp_path / 'scanned.npz'), _stacked(params))
  with np.load(tmp_path / 'unrolled.npz') as a, np.load(tmp_path / 'scanned.npz') as b:
    assert sorted(a.files) == sorted(b.files)
    assert 'Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel' in a.files
    for key in a.files:
      np.testing.assert_array_equal(a[key], b[key])
  loaded = checkpoint.load(str(tmp_path / 'scanned.npz'), NAME, **TINY_VIT, num_classes=10,
                           scan_layers=True)
  chex.assert_trees_all_equal(loaded, jax.device_get(_stacked(params)))
  chex.assert_trees_all_equal(checkpoint.load(str(tmp_path / 'scanned.npz')),
                              jax.device_get(params))

  def fine_tuned(scan):
    config = models.get_config(NAME, **TINY_VIT, num_classes=5, scan_layers=scan)
    fresh = init(models.build_model(config), image_size=48)['params']
    return fit.load_pretrained(str(tmp_path / 'unrolled.npz'), fresh, config)

  chex.assert_trees_all_close(fine_tuned(True),
                              jax.device_get(_stacked(fine_tuned(False))), rtol=1e-6)


def test_a_big_vision_scanned_file_loads_into_either_form(tmp_path):
  params = jax.device_get(perturbed(init(tiny_vit(classifier='gap')))['params'])
  stacked = _flat(_stacked(params, classifier='gap'))
  # big_vision's layout: under 'params/', current-Flax child names, scanned blocks.
  current = {'MultiHeadDotProductAttention_1': 'MultiHeadDotProductAttention_0',
             'LayerNorm_2': 'LayerNorm_1', 'MlpBlock_3': 'MlpBlock_0'}
  written = {}
  for key, value in stacked.items():
    parts = key.split('/')
    if parts[:2] == ['Transformer', 'encoderblock']:
      parts[2] = current.get(parts[2], parts[2])
    written['params/' + '/'.join(parts)] = value
  np.savez(tmp_path / 'big_vision.npz', **written)
  path = str(tmp_path / 'big_vision.npz')
  chex.assert_trees_all_equal(checkpoint.load(path), params)
  chex.assert_trees_all_equal(
      checkpoint.load(path, NAME, **TINY_VIT, classifier='gap', scan_layers=True),
      jax.device_get(_stacked(params, classifier='gap')))


def test_a_checkpoint_with_other_blocks_is_named():
  two_blocks = _flat(init(tiny_vit())['params'])
  config = models.get_config(NAME, **{**TINY_VIT, 'num_layers': 3}, scan_layers=True)
  with pytest.raises(checkpoint.CheckpointError, match='no Transformer/encoderblock_2/'):
    vit_layouts.module_layout(two_blocks, config)
  config = models.get_config(NAME, **{**TINY_VIT, 'num_layers': 1}, scan_layers=True)
  with pytest.raises(checkpoint.CheckpointError, match="holds 2 blocks, more than the model's 1"):
    vit_layouts.module_layout(two_blocks, config)


def _program_lines(num_layers, scan):
  model = tiny_vit(num_layers=num_layers, scan_layers=scan)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))
  grad = jax.jit(jax.grad(lambda p, x: _loss(model, p['params'], x)))
  return len(grad.lower(params, jnp.zeros((2, 32, 32, 3))).as_text().splitlines())


def test_the_scanned_program_does_not_grow_with_depth():
  """What XLA compiles (the gradient's program) is one block at any depth: its size
  for 24 blocks is that for 4 (the compile times are `benchmarks/sharding.py`'s)."""
  assert _program_lines(24, True) == _program_lines(4, True)
  assert _program_lines(24, False) > 3 * _program_lines(4, False)


def test_timm_state_dicts_go_to_and_from_the_scanned_tree(tmp_path):
  from safetensors.numpy import save_file
  params = jax.device_get(perturbed(init(tiny_vit()))['params'])
  state = timm_files.to_timm(_stacked(params), NAME)
  chex.assert_trees_all_equal(state, timm_files.to_timm(params, NAME))
  save_file(state, str(tmp_path / 'vit.safetensors'))
  loaded = checkpoint.load(str(tmp_path / 'vit.safetensors'), NAME, **TINY_VIT,
                           scan_layers=True)
  chex.assert_trees_all_equal(loaded, jax.device_get(_stacked(params)))
