"""Published `.npz` layouts: load, save, and preparing fine-tuning."""
import os

import chex
import flax
import jax
import numpy as np
import pytest

from helpers import (AUGREG_ROWS, TINY_VIT, apply, images, init, perturbed,
                     tiny_family_config, tiny_vit, write_augreg_index)
from vit_jax import checkpoint, models
from vit_jax.files import augreg, fit
from vit_jax.models import vit

PUBLISHED_TO_CURRENT = {'LayerNorm_2': 'LayerNorm_1',
                        'MultiHeadDotProductAttention_1': 'MultiHeadDotProductAttention_0',
                        'MlpBlock_3': 'MlpBlock_0'}


def flat(params):
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep='/')


def test_old_flax_names_load_and_reproduce_logits(tmp_path):
  model = tiny_vit(representation_size=16)
  variables = perturbed(init(model))
  current = {'/'.join(PUBLISHED_TO_CURRENT.get(part, part) for part in key.split('/')):
             np.asarray(v) for key, v in flat(variables['params']).items()}
  assert any('MlpBlock_0' in k for k in current)
  np.savez(tmp_path / 'current.npz', **current)
  loaded = checkpoint.load(str(tmp_path / 'current.npz'))
  chex.assert_trees_all_equal(loaded, jax.tree_util.tree_map(np.asarray, variables['params']))
  chex.assert_trees_all_close(apply(model, {'params': loaded}, images()),
                              apply(model, variables, images()), rtol=1e-6)


def test_save_load_round_trip_is_exact(tmp_path, family_name):
  _round_trip(tmp_path, models.build_model(tiny_family_config(family_name)))


def test_save_load_round_trip_of_a_hybrid_is_exact(tmp_path):
  _round_trip(tmp_path, models.get_model('R+ViT-Ti_16', 3, num_layers=1))


def _round_trip(tmp_path, model):
  variables = perturbed(init(model))
  path = str(tmp_path / 'params.npz')
  checkpoint.save(path, variables)  # the {'params': ...} wrapper is accepted too
  with np.load(path) as data:
    assert sorted(data.files) == sorted(flat(variables['params']))
    assert all(data[k].dtype == np.float32 for k in data.files)
  chex.assert_trees_all_equal(checkpoint.load(path),
                              jax.tree_util.tree_map(np.asarray, variables['params']))
  assert os.listdir(tmp_path) == ['params.npz']


def test_save_writes_published_names_and_float32(tmp_path):
  params = {'Transformer': {'encoderblock_0': {
      'MultiHeadDotProductAttention_0': {'out': {'bias': np.ones(3, jax.numpy.bfloat16)}},
      'LayerNorm_1': {'scale': np.ones(3)}}}}
  checkpoint.save(str(tmp_path / 'p.npz'), params)
  with np.load(tmp_path / 'p.npz') as data:
    assert sorted(data.files) == ['Transformer/encoderblock_0/LayerNorm_2/scale',
                                  'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/bias']
    assert {data[k].dtype for k in data.files} == {np.dtype(np.float32)}


def test_interrupted_save_keeps_the_old_file(tmp_path, monkeypatch):
  path = str(tmp_path / 'params.npz')
  checkpoint.save(path, {'a': np.zeros(3)})

  def killed(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(np, 'savez', killed)
  with pytest.raises(KeyboardInterrupt):
    checkpoint.save(path, {'a': np.ones(3)})
  monkeypatch.undo()
  np.testing.assert_array_equal(checkpoint.load(path)['a'], np.zeros(3))
  assert os.listdir(tmp_path) == ['params.npz']  # no partial file left beside it


def bilinear_align_corners(grid, new_shape):
  """Independent reference: output pixel i samples input at i * (g - 1) / (n - 1)."""
  def coords(n, g):
    pos = np.arange(n) * (g - 1) / (n - 1) if n > 1 else np.zeros(1)
    lo = np.minimum(np.floor(pos).astype(int), g - 1)
    hi = np.minimum(lo + 1, g - 1)
    return lo, hi, pos - lo
  (r0, r1, rw), (c0, c1, cw) = coords(new_shape[0], grid.shape[0]), coords(new_shape[1], grid.shape[1])
  top = grid[r0][:, c0] * (1 - cw)[None, :, None] + grid[r0][:, c1] * cw[None, :, None]
  bottom = grid[r1][:, c0] * (1 - cw)[None, :, None] + grid[r1][:, c1] * cw[None, :, None]
  return top * (1 - rw)[:, None, None] + bottom * rw[:, None, None]


@pytest.mark.parametrize('old,new', [((4, 4), (7, 7)), ((6, 6), (3, 5)), ((2, 3), (2, 3))])
def test_interpolate_posembed_is_bilinear(old, new):
  grid = np.random.RandomState(0).randn(*old, 5)
  out = vit.interpolate_posembed(grid.reshape(1, -1, 5), old, new)
  chex.assert_shape(out, (1, new[0] * new[1], 5))
  np.testing.assert_allclose(out.reshape(new + (5,)), bilinear_align_corners(grid, new),
                             rtol=1e-12, atol=1e-12)
  # Bilinear interpolation reproduces a plane exactly.
  r, c = np.meshgrid(np.linspace(0, 1, old[0]), np.linspace(0, 1, old[1]), indexing='ij')
  plane = (2 * r - 3 * c + 1)[..., None]
  nr, nc = np.meshgrid(np.linspace(0, 1, new[0]), np.linspace(0, 1, new[1]), indexing='ij')
  np.testing.assert_allclose(
      vit.interpolate_posembed(plane.reshape(1, -1, 1), old, new).reshape(new),
      2 * nr - 3 * nc + 1, atol=1e-12)


def test_load_pretrained_for_fine_tuning(tmp_path):
  upstream = tiny_vit(num_classes=21, representation_size=32)
  upstream_params = perturbed(init(upstream, 32))['params']
  path = str(tmp_path / 'upstream.npz')
  checkpoint.save(path, upstream_params)

  config = models.get_config('ViT-Ti_16', num_classes=5, **{
      'hidden_size': 32, 'mlp_dim': 64, 'num_heads': 4, 'num_layers': 2, 'patch_size': 8})
  fresh = init(models.build_model(config), 48, seed=7)['params']
  params = fit.load_pretrained(path, fresh, config)
  chex.assert_trees_all_equal_shapes(params, fresh)
  chex.assert_trees_all_equal(params['head'], jax.tree_util.tree_map(np.asarray, fresh['head']))
  assert 'pre_logits' not in params
  block = params['Transformer']['encoderblock_1']['MlpBlock_3']
  chex.assert_trees_all_equal(
      block, jax.tree_util.tree_map(
          np.asarray, upstream_params['Transformer']['encoderblock_1']['MlpBlock_3']))
  old_pe = np.asarray(upstream_params['Transformer']['posembed_input']['pos_embedding'])
  new_pe = params['Transformer']['posembed_input']['pos_embedding']
  chex.assert_shape(new_pe, (1, 1 + 36, 32))
  np.testing.assert_array_equal(new_pe[:, 0], old_pe[:, 0])  # class-token row kept apart
  np.testing.assert_allclose(new_pe[0, 1:].reshape(6, 6, 32),
                             bilinear_align_corners(old_pe[0, 1:].reshape(4, 4, 32), (6, 6)),
                             rtol=1e-5, atol=1e-6)
  logits = apply(models.build_model(config), {'params': params}, images(2, 48))
  chex.assert_shape(logits, (2, 5))

  # A GAP model from a class-token checkpoint drops the token and its row.
  gap_config = config.copy_and_resolve_references()
  gap_config.classifier = 'gap'
  gap_fresh = init(models.build_model(gap_config), 32)['params']
  gap = fit.load_pretrained(path, gap_fresh, gap_config)
  assert 'cls' not in gap
  np.testing.assert_array_equal(gap['Transformer']['posembed_input']['pos_embedding'],
                                old_pe[:, 1:])


def test_load_pretrained_bit_reinitialises_the_head(tmp_path):
  config = models.get_config('BiT-M-R50x1', num_classes=4, num_layers=(1, 1))
  upstream = perturbed(init(models.build_model(config.copy_and_resolve_references()), 32))
  path = str(tmp_path / 'bit.npz')
  checkpoint.save(path, upstream)
  config.num_classes = 3
  fresh = init(models.build_model(config), 32)['params']
  params = fit.load_pretrained(path, fresh, config)
  chex.assert_trees_all_equal(params['resnet']['head'],
                              jax.tree_util.tree_map(np.asarray, fresh['resnet']['head']))
  chex.assert_trees_all_equal(params['resnet']['block2'], jax.tree_util.tree_map(
      np.asarray, upstream['params']['resnet']['block2']))


def test_mismatch_lists_missing_unexpected_and_misshaped_keys(tmp_path):
  config = models.get_config('ViT-Ti_16', num_classes=5, hidden_size=32, mlp_dim=64,
                             num_heads=4, num_layers=2, patch_size=8)
  fresh = init(models.build_model(config), 32)['params']
  broken = dict(flat(fresh))
  del broken['Transformer/encoder_norm/scale']
  broken['Transformer/extra/kernel'] = np.zeros(2)
  broken['embedding/bias'] = np.zeros(7)
  path = str(tmp_path / 'broken.npz')
  np.savez(path, **{k: np.asarray(v) for k, v in broken.items()})
  with pytest.raises(checkpoint.CheckpointError) as e:
    fit.load_pretrained(path, fresh, config)
  message = str(e.value)
  assert '1 missing: Transformer/encoder_norm/scale' in message
  assert '1 unexpected: Transformer/extra/kernel' in message
  assert 'embedding/bias: checkpoint (7,), model (32,)' in message


def test_unreadable_files_are_reported(tmp_path):
  with pytest.raises(checkpoint.CheckpointError, match='gs://vit_models/imagenet21k/'):
    checkpoint.load(str(tmp_path / 'missing.npz'))
  path = tmp_path / 'truncated.npz'
  checkpoint.save(str(path), {'a': np.arange(1000.)})
  path.write_bytes(path.read_bytes()[:300])
  with pytest.raises(checkpoint.CheckpointError, match='truncated or corrupt'):
    checkpoint.load(str(path))
  pickled = tmp_path / 'pickled.npz'
  np.savez(pickled, a=np.array([{'x': 1}], dtype=object))
  with pytest.raises(checkpoint.CheckpointError, match='is not an .npz parameter file'):
    checkpoint.load(str(pickled))


def test_augreg_index_selects_the_recommended_checkpoint(tmp_path):
  write_augreg_index(tmp_path, AUGREG_ROWS)
  index = augreg.index(str(tmp_path))
  assert len(index) == 4 and index[0]['final_val'] == 0.5 and index[0]['adapt_steps'] == 2500
  assert augreg.index(str(tmp_path / 'index.csv')) == index
  assert augreg.select(index, 'Ti/16')['filename'] == 'Ti_16-i21k-best'
  assert augreg.select(index, 'Ti/16@i1k')['filename'] == 'Ti_16-i1k'
  assert augreg.select(index, 'Ti_16-i21k-low')['final_val'] == 0.5
  with pytest.raises(checkpoint.CheckpointError, match=r"'B/16'.*R26\+S/32@i21k, Ti/16@i1k"):
    augreg.select(index, 'B/16')
  assert augreg.resolve('augreg:Ti/16', str(tmp_path)) == f'{tmp_path}/Ti_16-i21k-best.npz'
  assert augreg.resolve('augreg:Ti_16-i1k--cifar100-steps_2k', str(tmp_path)) == (
      f'{tmp_path}/Ti_16-i1k--cifar100-steps_2k.npz')
  assert augreg.resolve('/some/file.npz', str(tmp_path)) == '/some/file.npz'
  assert augreg.model_name('B/16') == 'ViT-B_16'
  assert augreg.model_name('R26+S/32') == 'R26+ViT-S_32'
  assert {augreg.model_name(n) for n in ('Ti/16', 'S/32', 'L/16', 'R26+S/32',
                                                     'R50+L/32')} <= set(models.MODELS)


def test_augreg_index_errors_say_what_to_do(tmp_path):
  with pytest.raises(checkpoint.CheckpointError, match='augreg_dir'):
    augreg.index(str(tmp_path))
  (tmp_path / 'index.csv').write_text('name,filename\nB/16,x\n')
  with pytest.raises(checkpoint.CheckpointError, match="lacks the columns.*'ds'"):
    augreg.index(str(tmp_path))


BV_BLOCK_NAMES = {'LayerNorm_0': 'LayerNorm_0', 'MultiHeadDotProductAttention_1':
                  'MultiHeadDotProductAttention_0', 'LayerNorm_2': 'LayerNorm_1',
                  'MlpBlock_3': 'MlpBlock_0'}


def big_vision_layout(params, scanned=False, prefix='params/'):
  """Our parameters as big_vision writes a ViT: current Flax block names, the
  position embedding at the root without the class-token row, blocks optionally
  scanned into one with the layer axis first, everything under `prefix`."""
  out = {}
  blocks = {}
  for key, value in flat(params).items():
    parts = key.split('/')
    if parts[0] == 'Transformer' and parts[1].startswith('encoderblock_'):
      rest = '/'.join([BV_BLOCK_NAMES[parts[2]]] + parts[3:])
      blocks.setdefault(rest, {})[int(parts[1].split('_')[1])] = np.asarray(value)
      if not scanned:
        out[f'Transformer/encoderblock_{parts[1].split("_")[1]}/{rest}'] = np.asarray(value)
    elif key == 'Transformer/posembed_input/pos_embedding':
      out['pos_embedding'] = np.asarray(value)[:, 1:] if 'cls' in params else np.asarray(value)
    else:
      out[key] = np.asarray(value)
  if scanned:
    out.update({f'Transformer/encoderblock/{rest}': np.stack([v[i] for i in sorted(v)])
                for rest, v in blocks.items()})
  return {prefix + k: v for k, v in out.items()}


@pytest.mark.parametrize('classifier, posemb, scanned', [
    ('token', 'learn', False), ('token', 'learn', True), ('map', 'sincos2d', True),
    ('map', 'learn', False), ('gap', 'learn', False)])
def test_big_vision_files_load_in_our_layout(tmp_path, scanned, classifier, posemb):
  model = tiny_vit(num_classes=3, classifier=classifier, posemb=posemb)
  params = flax.core.unfreeze(perturbed(init(model, 32))['params'])
  if classifier == 'token':  # big_vision adds no position embedding to the class token
    pe = params['Transformer']['posembed_input']['pos_embedding']
    params['Transformer']['posembed_input']['pos_embedding'] = pe.at[:, 0].set(0.)
  path = str(tmp_path / 'big_vision.npz')
  np.savez(path, **big_vision_layout(params, scanned))
  loaded = checkpoint.load(path)
  chex.assert_trees_all_close(loaded, jax.tree_util.tree_map(np.asarray, params), rtol=0,
                              atol=0)
  np.testing.assert_allclose(apply(model, {'params': loaded}, images(2, 32)),
                             apply(model, {'params': params}, images(2, 32)), rtol=1e-6)
  # Written back, a file in our (published) layout.
  checkpoint.save(str(tmp_path / 'ours.npz'), loaded)
  chex.assert_trees_all_equal(checkpoint.load(str(tmp_path / 'ours.npz')), loaded)


def test_a_siglip_image_tower_loads_and_fine_tunes_with_another_head(tmp_path):
  model = tiny_vit(num_classes=0, classifier='map')
  params = perturbed(init(model, 32))['params']
  tower = big_vision_layout(params, scanned=True, prefix='params/img/')
  tower.update({'params/txt/Embed_0/embedding': np.ones((5, 4)), 'params/t': np.ones(1)})
  path = str(tmp_path / 'siglip.npz')
  np.savez(path, **tower)
  chex.assert_trees_all_close(checkpoint.load(path), jax.tree_util.tree_map(np.asarray, params),
                              rtol=0, atol=0)
  # A token-head model takes the body and drops the MAP head; a MAP model keeps it.
  config = models.get_config('ViT-Ti_16', num_classes=4, **{**TINY_VIT, 'classifier': 'token'})
  fresh = init(models.build_model(config), 32)['params']
  token = fit.load_pretrained(path, fresh, config)
  assert 'MAPHead_0' not in token and 'cls' in token
  config.classifier = 'map'
  kept = fit.load_pretrained(path, init(models.build_model(config), 32)['params'], config)
  chex.assert_trees_all_close(kept['MAPHead_0'], jax.tree_util.tree_map(
      np.asarray, params['MAPHead_0']), rtol=0, atol=0)


def test_a_familys_tree_is_read_by_itself_alone(family_name):
  """At most one family owns a tiny model's tree, and only its own family; `published`
  gives the tree back as it is."""
  from vit_jax.files import layout
  model = models.build_model(tiny_family_config(family_name))
  tree = layout.flatten(jax.eval_shape(lambda: init(model)))
  owners = [name for name, family in models.FAMILIES.items() if family.owns(tree)]
  assert owners in ([], [family_name])
  assert layout.published(tree) == tree


@pytest.mark.parametrize('keys, owner', [
    (('t', 'img/Transformer/encoder_norm/scale', 'txt/Embed_0/embedding'), 'lit'),
    (('params/t', 'params/img/Transformer/encoder_norm/scale', 'params/txt/Embed_0/embedding'),
     'vit'),  # big_vision's two-tower file: its image tower is a ViT
    (('Transformer/encoderblock/LayerNorm_0/scale', 'pos_embedding'), 'vit')])
def test_two_tower_and_big_vision_files_have_one_owner(keys, owner):
  tree = dict.fromkeys(keys, np.zeros(1))
  assert [name for name, family in models.FAMILIES.items() if family.owns(tree)] == [owner]


def test_a_remote_checkpoint_that_cannot_be_reached_is_one_sentence(monkeypatch):
  """gs:// without a network: TensorFlow's error (FailedPreconditionError, raised
  by the filesystem's exists) becomes the project's sentence."""
  from etils import epath

  class FailedPreconditionError(Exception):
    pass

  def unreachable(self):
    raise FailedPreconditionError('Could not resolve host: www.googleapis.com')
  monkeypatch.setattr(type(epath.Path('gs://vit_models/x.npz')), 'exists', unreachable)
  with pytest.raises(checkpoint.CheckpointError, match=r'gs://vit_models/x.npz cannot be reached '
                     r'\(FailedPreconditionError: Could not resolve host.*give its local path'):
    checkpoint.load('gs://vit_models/x.npz')
