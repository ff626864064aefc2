"""Export to timm: our state_dict equals what timm's own `.npz` loader makes of our
saved file, and timm then computes our logits. Import from timm: the inverse, exact,
from a state dict or a `.safetensors`/`.pth` file; a model timm initialised gives
timm's logits here. torch and timm stay out of the required dependencies; the
test command installs them (requirements-timm.txt), and the comparisons with timm
skip where they are missing.

timm runs in a subprocess, a fork of the `torch_python` fixture's warm
interpreter: torchvision (which timm imports) crashes a process that imported
TensorFlow first, as the test helpers do.
"""
import importlib.util
import json
import os
import subprocess

import chex
import jax
import numpy as np
import pytest

from helpers import TINY_VIT, apply, images, init, perturbed, tiny_bit, tiny_vit
from vit_jax import checkpoint, models
from vit_jax.files import fit, timm_files
from vit_jax.models.family import CheckpointError

needs_torch = pytest.mark.skipif(importlib.util.find_spec('torch') is None,
                                 reason='torch is not installed (optional: pip install torch)')
needs_timm = pytest.mark.skipif(
    importlib.util.find_spec('torch') is None or importlib.util.find_spec('timm') is None,
    reason='torch and timm are not installed (optional: pip install torch timm)')

# Loads our saved .npz with timm's own loader into a tiny timm model, writes its
# state_dict and its logits on the given images.
TIMM_SIDE = r'''
import functools, json, sys
import numpy as np
import torch, timm
from timm.layers import GroupNormAct, StdConv2d
from timm.models.resnetv2 import ResNetV2
from timm.models.vision_transformer import VisionTransformer

spec = json.loads(sys.argv[1])
if spec['family'] == 'vit':
  pool = {'token': dict(global_pool='token'),
          'gap': dict(global_pool='avg', class_token=False, fc_norm=False),
          'map': dict(global_pool='map', class_token=False),
          'token_gap': dict(global_pool='avg')}[spec['classifier']]  # timm's fc_norm
  module = VisionTransformer(img_size=32, act_layer='gelu_tanh', num_classes=3,
                             **spec['size'], **pool)
elif spec['family'] == 'hybrid':
  from timm.models.vision_transformer_hybrid import HybridEmbed, _resnetv2
  embed = functools.partial(HybridEmbed, backbone=_resnetv2(layers=tuple(spec['layers'])))
  module = VisionTransformer(img_size=32, act_layer='gelu_tanh', num_classes=3,
                             embed_layer=embed, global_pool='token', **spec['size'])
else:
  module = ResNetV2(layers=(1, 1), channels=(256, 512), num_classes=3, stem_type='fixed',
                    conv_layer=functools.partial(StdConv2d, eps=1e-8),
                    norm_layer=functools.partial(GroupNormAct, num_groups=32))
module.load_pretrained(spec['npz'])
np.savez(spec['state'], **{k: v.numpy() for k, v in module.state_dict().items()})
ours = dict(np.load(spec['ours']))
module.load_state_dict({k: torch.from_numpy(v) for k, v in ours.items()}, strict=False)
x = torch.from_numpy(np.load(spec['images']).transpose(0, 3, 1, 2))
with torch.no_grad():
  np.save(spec['logits'], module.eval()(x).numpy())
'''


def run_timm(python, tmp_path, params, ours, **spec):
  files = {name: str(tmp_path / f'{name}.npy' if name in ('images', 'logits') else
                     tmp_path / f'{name}.npz')
           for name in ('npz', 'state', 'ours', 'images', 'logits')}
  checkpoint.save(files['npz'], params)
  np.savez(files['ours'], **ours)
  np.save(files['images'], images(2, 32))
  subprocess.run([python, '-c', TIMM_SIDE, json.dumps({**spec, **files})], check=True,
                 env={**os.environ, 'CUDA_VISIBLE_DEVICES': ''}, timeout=600)
  return dict(np.load(files['state'])), np.load(files['logits'])


def timm_size(patch_size):
  """The tiny ViT's size in timm's arguments."""
  return dict(patch_size=patch_size, embed_dim=TINY_VIT['hidden_size'],
              depth=TINY_VIT['num_layers'], num_heads=TINY_VIT['num_heads'],
              mlp_ratio=TINY_VIT['mlp_dim'] / TINY_VIT['hidden_size'])


def assert_same_state(ours, expected):
  """Every tensor of timm's state_dict equal to ours (its num_batches_tracked counters aside)."""
  assert set(ours) == {k for k in expected if not k.endswith('num_batches_tracked')}
  for key in ours:
    np.testing.assert_array_equal(ours[key], expected[key], err_msg=key)


@needs_timm
@pytest.mark.parametrize('classifier', ['token', 'gap', 'map', 'token_gap'])
def test_vit_exports_as_timm_loads_it(tmp_path, classifier, torch_python):
  """timm loads our .npz into the same state dict as `to_timm`, and computes our
  logits from it. 'token_gap' with pooled_norm is timm's average pooling with a
  class token and its default fc_norm, which timm's .npz reader leaves at its
  initialisation (it reads the final LayerNorm into `norm` only): there the state
  dict written here is compared with timm's by its names, its values through the
  logits and read back here."""
  fields = dict(classifier=classifier, pooled_norm=classifier == 'token_gap')
  model = tiny_vit(num_classes=3, **fields)
  params = perturbed(init(model, 32))['params']
  config = models.get_config('ViT-Ti_16', num_classes=3, **TINY_VIT, **fields)
  ours = timm_files.to_timm(params, config)
  chex.assert_trees_all_equal(timm_files.from_timm(ours, 'ViT-Ti_16', **TINY_VIT),
                              jax.tree.map(np.asarray, dict(params)))
  expected, logits = run_timm(torch_python, tmp_path, params, ours, family='vit',
                              classifier=classifier, size=timm_size(TINY_VIT['patch_size']))
  if classifier == 'token_gap':
    assert set(ours) == set(expected)
  else:
    assert_same_state(ours, expected)
  # The same function (tanh GELU on both sides) up to float32 summation order.
  np.testing.assert_allclose(logits, apply(model, {'params': params}, images(2, 32)),
                             rtol=1e-4, atol=1e-5)


@needs_timm
def test_hybrid_exports_as_timm_loads_it(tmp_path, torch_python):
  model = tiny_vit(num_classes=3, resnet_layers=(1,), patch_size=1)
  params = perturbed(init(model, 32))['params']
  ours = timm_files.to_timm(params, 'R50+ViT-B_16')
  expected, logits = run_timm(torch_python, tmp_path, params, ours, family='hybrid', layers=[1],
                              size=timm_size(1))
  assert_same_state(ours, expected)
  # timm pads its 'same' convolutions as TensorFlow does, as our ResNet does.
  np.testing.assert_allclose(logits, apply(model, {'params': params}, images(2, 32)),
                             rtol=1e-3, atol=1e-4)


@needs_timm
def test_bit_exports_as_timm_loads_it(tmp_path, torch_python):
  params = perturbed(init(tiny_bit(num_classes=3), 32))['params']
  ours = timm_files.to_timm(params, 'BiT-M-R50x1')
  expected, _ = run_timm(torch_python, tmp_path, params, ours, family='bit')
  assert_same_state(ours, expected)


def test_what_timm_cannot_hold_is_refused():
  params = init(tiny_vit(num_classes=3, representation_size=16), 32)['params']
  with pytest.raises(ValueError, match='no pre_logits'):
    timm_files.to_timm(params, 'ViT-Ti_16')
  for posemb in ('sincos2d', 'learn2d', 'none'):
    params = init(tiny_vit(num_classes=3, posemb=posemb), 32)['params']
    with pytest.raises(ValueError, match='one learned 1-D position embedding'):
      timm_files.to_timm(params, 'ViT-Ti_16')
  with pytest.raises(ValueError, match='timm layouts cover the ViT, hybrid and BiT'):
    timm_files.to_timm(params, 'Mixer-B_16')
  aimv2 = dict(normalization='rms', patch_norm=True, attention_bias='none',
               projection_bias=False, activation='swiglu')
  for fields, says in ((dict(aimv2, classifier='attention_pool'), 'no AIMv2 attention pooling'),
                       (dict(attention_bias='qv'), "on all of the query, key and value or on "
                        'none'),
                       (dict(aimv2, rope='eva02', classifier='token'), "Eva here has LayerNorms")):
    config = models.get_config('ViT-Ti_16', **{**TINY_VIT, 'num_classes': 3, **fields})
    params = init(models.build_model(config), 32)['params']
    with pytest.raises(ValueError, match=says):
      timm_files.to_timm(params, config)


# The tiny models' fields besides what a state dict fixes (head, classes, image size).
TINY_VIT_FIELDS = {k: v for k, v in TINY_VIT.items()}
TINY_HYBRID_FIELDS = dict(TINY_VIT, resnet_layers=(1,), patch_size=1)


@pytest.mark.parametrize('model_name, model, fields', [
    ('ViT-Ti_16', lambda: tiny_vit(num_classes=3), TINY_VIT_FIELDS),
    ('ViT-Ti_16', lambda: tiny_vit(num_classes=0, classifier='gap'), TINY_VIT_FIELDS),
    ('ViT-Ti_16', lambda: tiny_vit(num_classes=5, classifier='map'), TINY_VIT_FIELDS),
    ('ViT-Ti_16', lambda: tiny_vit(num_classes=3, layer_scale_init=0.1), TINY_VIT_FIELDS),
    ('ViT-Ti_16', lambda: tiny_vit(num_classes=3, num_registers=4), TINY_VIT_FIELDS),
    ('ViT-Ti_16', lambda: tiny_vit(num_classes=3, classifier='gap', num_registers=2),
     TINY_VIT_FIELDS),
    ('R50+ViT-B_16', lambda: tiny_vit(num_classes=3, resnet_layers=(1,), patch_size=1),
     TINY_HYBRID_FIELDS),
    ('BiT-M-R50x1', lambda: tiny_bit(num_classes=3), dict(num_layers=(1, 1))),
])
def test_from_timm_is_the_exact_inverse_of_to_timm(model_name, model, fields):
  """At 48 px (a 6x6 grid for the ViT), the head, classes and size read from the dict."""
  params = perturbed(init(model(), 48))['params']
  state = timm_files.to_timm(params, model_name)
  back = timm_files.from_timm(state, model_name, **fields)
  chex.assert_trees_all_equal(back, jax.tree_util.tree_map(np.asarray, params))


def test_a_vit_without_qkv_biases_loads_them_as_zeros():
  """timm's qkv_bias=False, as Park & Kim's CIFAR ViT-Ti."""
  params = init(tiny_vit(num_classes=3), 32)['params']
  state = {k: v for k, v in timm_files.to_timm(params, 'ViT-Ti_16').items()
           if not k.endswith('qkv.bias')}
  back = timm_files.from_timm(state, 'ViT-Ti_16', **TINY_VIT)
  attention = back['Transformer']['encoderblock_0']['MultiHeadDotProductAttention_1']
  for name in ('query', 'key', 'value'):
    chex.assert_trees_all_equal(attention[name]['bias'], np.zeros((4, 8), np.float32))


def test_a_state_dict_of_another_model_is_named_key_by_key():
  state = timm_files.to_timm(init(tiny_vit(num_classes=3), 32)['params'], 'ViT-Ti_16')
  with pytest.raises(CheckpointError, match=r'state dict of ViT-Ti_16 \(12 blocks.*\n.*missing: '
                     r'blocks\.10\..*\n.*wrongly shaped: blocks\.0\.attn'):
    timm_files.from_timm(state, 'ViT-Ti_16')
  map_state = timm_files.to_timm(init(tiny_vit(num_classes=3, classifier='map'), 32)['params'],
                                 'ViT-Ti_16')
  with pytest.raises(CheckpointError, match=r'fc_norm after attn_pool'):
    timm_files.from_timm({**map_state, 'fc_norm.weight': np.ones(32), 'fc_norm.bias':
                          np.zeros(32)}, 'ViT-Ti_16', **TINY_VIT)
  # Registers with position embeddings of their own (timm's no_embed_class=False).
  with pytest.raises(CheckpointError, match='no_embed_class=True'):
    timm_files.from_timm({**state, 'reg_token': np.zeros((1, 4, 32), np.float32),
                          'pos_embed': np.zeros((1, 1 + 4 + 64, 32), np.float32)},
                         'ViT-Ti_16', **TINY_VIT)
  with pytest.raises(ValueError, match='timm layouts cover'):
    timm_files.from_timm(state, 'Mixer-B_16')


def test_load_reads_a_safetensors_file_and_asks_for_the_model(tmp_path):
  from safetensors.numpy import save_file
  params = perturbed(init(tiny_vit(num_classes=3), 32))['params']
  path = str(tmp_path / 'vit.safetensors')
  save_file(timm_files.to_timm(params, 'ViT-Ti_16'), path)
  chex.assert_trees_all_equal(checkpoint.load(path, 'ViT-Ti_16', **TINY_VIT),
                              jax.tree_util.tree_map(np.asarray, params))
  # The model's config whole reads the same tree as its name and fields.
  config = models.get_config('ViT-Ti_16', **TINY_VIT)
  chex.assert_trees_all_equal(checkpoint.load(path, config),
                              jax.tree_util.tree_map(np.asarray, params))
  chex.assert_trees_all_equal(timm_files.to_timm(params, config),
                              timm_files.to_timm(params, 'ViT-Ti_16'))
  with pytest.raises(CheckpointError, match="name the model it holds, "
                     "checkpoint.load\\(path, model_name='ViT-B_16'\\)"):
    checkpoint.load(path)
  (tmp_path / 'bad.safetensors').write_bytes(b'not a safetensors file')
  with pytest.raises(CheckpointError, match='not a readable .safetensors file'):
    checkpoint.load(str(tmp_path / 'bad.safetensors'), 'ViT-Ti_16')


def test_fine_tuning_starts_from_a_timm_file(tmp_path):
  """A 32 px, 3-class timm ViT fitted to a 48 px, 5-class model: the body kept, the
  position embeddings resized, the head new."""
  from safetensors.numpy import save_file
  params = perturbed(init(tiny_vit(num_classes=3), 32))['params']
  path = str(tmp_path / 'vit.safetensors')
  save_file(timm_files.to_timm(params, 'ViT-Ti_16'), path)
  config = models.get_config('ViT-Ti_16', num_classes=5, **TINY_VIT)
  fresh = init(models.build_model(config), 48)['params']
  fitted = fit.load_pretrained(path, fresh, config)
  chex.assert_trees_all_equal(fitted['Transformer']['encoderblock_1'],
                              jax.tree_util.tree_map(np.asarray,
                                                     params['Transformer']['encoderblock_1']))
  chex.assert_shape(fitted['Transformer']['posembed_input']['pos_embedding'], (1, 37, 32))
  chex.assert_trees_all_equal(fitted['head'], jax.tree_util.tree_map(np.asarray, fresh['head']))


def test_fine_tuning_starts_from_an_eva02_file_at_another_grid(tmp_path):
  """A headless EVA-02 file at 2 x 2 patches fitted to a 4 x 4, 5-class model: the
  blocks (rotary embeddings have no parameters) and the pooled LayerNorm kept, the
  table resized around its class-token row, the head new; the fitted model runs."""
  from safetensors.numpy import save_file
  small = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2)
  source = models.get_config('EVA02-B_14', num_classes=0, **small)
  params = perturbed(init(models.build_model(source), 28))['params']
  path = str(tmp_path / 'eva02.safetensors')
  save_file(timm_files.to_timm(params, source), path)
  config = models.get_config('EVA02-B_14', num_classes=5, **small)
  model = models.build_model(config)
  fresh = init(model, 56)['params']
  fitted = fit.load_pretrained(path, fresh, config)
  for kept in ('encoderblock_1', 'encoder_norm'):
    chex.assert_trees_all_equal(fitted['Transformer'][kept], jax.tree_util.tree_map(
        np.asarray, params['Transformer'][kept]))
  table = fitted['Transformer']['posembed_input']['pos_embedding']
  chex.assert_shape(table, (1, 17, 32))
  np.testing.assert_array_equal(table[:, 0], params['Transformer']['posembed_input'][
      'pos_embedding'][:, 0])
  chex.assert_trees_all_equal(fitted['head'], jax.tree_util.tree_map(np.asarray, fresh['head']))
  assert np.isfinite(apply(model, {'params': fitted}, images(2, 56))).all()


def test_fine_tuning_starts_from_a_headless_dinov2_file_with_registers(tmp_path):
  """DINOv2 with registers at a small width, its file without a head at 28 px
  (a 2x2 grid): fitted to a 56 px, 5-class model, the registers and blocks kept,
  the position table (patches only) resized to 4x4, the head new."""
  from safetensors.numpy import save_file
  small = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2)
  trained = models.get_config('DINOv2-S_14-reg4', num_classes=0, **small)
  params = perturbed(init(models.build_model(trained), 28))['params']
  path = str(tmp_path / 'dinov2.safetensors')
  save_file(timm_files.to_timm(params, 'DINOv2-S_14-reg4'), path)
  config = models.get_config('DINOv2-S_14-reg4', num_classes=5, **small)
  fresh = init(models.build_model(config), 56)['params']
  fitted = fit.load_pretrained(path, fresh, config)
  for key in ('registers', 'cls'):
    np.testing.assert_array_equal(fitted[key], params[key])
  chex.assert_trees_all_equal(fitted['Transformer']['encoderblock_1'],
                              jax.tree_util.tree_map(np.asarray,
                                                     params['Transformer']['encoderblock_1']))
  chex.assert_shape(fitted['Transformer']['posembed_input']['pos_embedding'], (1, 16, 32))
  chex.assert_trees_all_equal(fitted['head'], jax.tree_util.tree_map(np.asarray, fresh['head']))


def test_a_damaged_pth_file_is_refused_in_one_sentence_with_or_without_torch(tmp_path):
  """`.pth` files are read without torch (`torch_save`), so a damaged one is refused
  the same way whether torch is installed or not."""
  (tmp_path / 'vit.pth').write_bytes(b'PK')
  with pytest.raises(CheckpointError, match='cannot be read as a torch.save file: it is not a '
                     'zip archive'):
    checkpoint.load(str(tmp_path / 'vit.pth'), 'ViT-Ti_16')


@needs_torch
def test_load_reads_a_pth_file(tmp_path, torch_python):
  program = ('import sys, numpy as np, torch; state = dict(np.load(sys.argv[1])); '
             'torch.save({"state_dict": {k: torch.from_numpy(v) for k, v in state.items()}, '
             '"epoch": 3}, sys.argv[2])')
  params = perturbed(init(tiny_vit(num_classes=3), 32))['params']
  np.savez(tmp_path / 'state.npz', **timm_files.to_timm(params, 'ViT-Ti_16'))
  subprocess.run([torch_python, '-c', program, str(tmp_path / 'state.npz'),
                  str(tmp_path / 'vit.pth.tar')], check=True, timeout=300)
  chex.assert_trees_all_equal(
      checkpoint.load(str(tmp_path / 'vit.pth.tar'), 'ViT-Ti_16', **TINY_VIT),
      jax.tree_util.tree_map(np.asarray, params))


# A model timm initialises (random weights, qkv biases as asked) at 32 px, 3 classes:
# its state_dict and its logits on the given images.
TIMM_MODEL = r'''
import functools, json, sys
import numpy as np
import torch, timm
from timm.layers import GroupNormAct, StdConv2d
from timm.models.resnetv2 import ResNetV2
from timm.models.vision_transformer import VisionTransformer

spec = json.loads(sys.argv[1])
torch.manual_seed(0)
if spec['family'] == 'vit':
  module = VisionTransformer(img_size=32, act_layer='gelu_tanh', num_classes=3,
                             qkv_bias=spec['qkv_bias'], init_values=spec['init_values'],
                             reg_tokens=spec['registers'],
                             no_embed_class=spec['registers'] > 0, **spec['size'])
  for name, p in module.named_parameters():
    # timm zero-initialises biases and the head, and starts its tokens near 0.
    if p.dim() == 1 or name in ('cls_token', 'reg_token'):
      torch.nn.init.normal_(p, std=0.1)
else:
  module = ResNetV2(layers=(1, 1), channels=(256, 512), num_classes=3, stem_type='fixed',
                    conv_layer=functools.partial(StdConv2d, eps=1e-8),
                    norm_layer=functools.partial(GroupNormAct, num_groups=32))
np.savez(spec['state'], **{k: v.numpy() for k, v in module.state_dict().items()})
x = torch.from_numpy(np.load(spec['images']).transpose(0, 3, 1, 2))
with torch.no_grad():
  np.save(spec['logits'], module.eval()(x).numpy())
'''


@needs_timm
@pytest.mark.parametrize('family, qkv_bias, init_values, registers', [
    ('vit', True, None, 0), ('vit', False, None, 0), ('vit', True, 1e-5, 0), ('vit', True, 1e-5, 4),
    ('bit', None, None, 0)])
def test_a_model_timm_made_gives_timms_logits_here(tmp_path, family, qkv_bias, init_values,
                                                    registers, torch_python):
  """`init_values`: LayerScale, its scales drawn at random (as the biases);
  `registers`: timm's `reg_token` with `no_embed_class`, as DINOv2 with registers."""
  files = {'state': str(tmp_path / 'state.npz'), 'images': str(tmp_path / 'images.npy'),
           'logits': str(tmp_path / 'logits.npy')}
  np.save(files['images'], images(2, 32))
  subprocess.run([torch_python, '-c', TIMM_MODEL,
                  json.dumps({**files, 'family': family, 'qkv_bias': qkv_bias,
                              'init_values': init_values, 'registers': registers,
                              'size': timm_size(TINY_VIT['patch_size'])})],
                 check=True, env={**os.environ, 'CUDA_VISIBLE_DEVICES': ''}, timeout=600)
  state = dict(np.load(files['state']))
  if family == 'vit':
    params = timm_files.from_timm(state, 'ViT-Ti_16', **TINY_VIT)
    model = tiny_vit(num_classes=3, layer_scale_init=1e-5 if init_values else 0.,
                     num_registers=registers)
  else:
    params = timm_files.from_timm(state, 'BiT-M-R50x1', num_layers=(1, 1))
    model = tiny_bit(num_classes=3)
  np.testing.assert_allclose(apply(model, {'params': params}, images(2, 32)),
                             np.load(files['logits']), rtol=1e-3, atol=1e-4)


TIMM_RESAMPLE = r'''
import json, sys
import numpy as np
import torch
from timm.layers import resample_patch_embed
spec = json.loads(sys.argv[1])
kernel = torch.from_numpy(np.load(spec['kernel']).transpose(3, 2, 0, 1))  # (D, C, h, w)
out = resample_patch_embed(kernel, spec['size'], interpolation='bilinear', antialias=False)
np.save(spec['out'], out.numpy().transpose(2, 3, 1, 0))
'''


@needs_timm
@pytest.mark.parametrize('old,new', [(4, 8), (8, 6)])
def test_the_patch_kernel_resize_is_timms_resample_patch_embed(tmp_path, old, new, torch_python):
  """timm's bilinear, unantialiased resize: the same pseudo-inverse."""
  from vit_jax.models.vit import resize_patch_kernel
  kernel = np.random.RandomState(0).normal(size=(old, old, 3, 5)).astype(np.float32)
  np.save(tmp_path / 'kernel.npy', kernel)
  subprocess.run([torch_python, '-c', TIMM_RESAMPLE, json.dumps(
      {'kernel': str(tmp_path / 'kernel.npy'), 'out': str(tmp_path / 'out.npy'),
       'size': [new, new]})], check=True, env={**os.environ, 'CUDA_VISIBLE_DEVICES': ''},
      timeout=600)
  np.testing.assert_allclose(resize_patch_kernel(kernel, (new, new)),
                             np.load(tmp_path / 'out.npy'), rtol=1e-4, atol=1e-4)


# Every named model of today's ViTs, built by timm under its own name at a small
# width and depth (random weights, biases and scales drawn at random): its
# state_dict and its logits on images normalised as the model was trained.
TIMM_NAMED = r'''
import json, sys
import numpy as np
import torch, timm
spec = json.loads(sys.argv[1])
torch.manual_seed(0)
for name, (timm_name, size, kwargs) in spec['models'].items():
  module = timm.create_model(timm_name, pretrained=False, img_size=size, num_classes=3,
                             embed_dim=64, num_heads=4, depth=2, **kwargs)
  for key, p in module.named_parameters():
    if p.dim() == 1 or key in ('cls_token', 'reg_token'):
      torch.nn.init.normal_(p, std=0.1)
  np.savez(f"{spec['out']}/{name}.npz", **{k: v.numpy() for k, v in module.state_dict().items()})
  cfg = module.pretrained_cfg
  x = (np.load(spec['images'])[:, :size, :size] + 1) / 2  # [-1, 1] -> [0, 1]
  x = (x - np.array(cfg['mean'])) / np.array(cfg['std'])
  with torch.no_grad():
    np.save(f"{spec['out']}/{name}.npy", module.eval()(
        torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float32))).numpy())
'''


@needs_timm
def test_todays_vits_read_from_timm_give_timms_logits(tmp_path, torch_python):
  """Each name of `TIMM_VARIANTS` holds the architecture and preprocessing of
  timm's model: the pixel statistics timm's pretrained config declares, the
  activation, LayerNorm epsilon, CLIP's norm_pre, DINOv2's LayerScale and
  registers, DINOv2-g's SwiGLU MLP, SigLIP's attention pooling, TIPSv2's register
  and unnormalised pixels, DINOv3's rotary
  position embeddings, registers, biases and SwiGLU MLPs, EVA-02's rotary embeddings
  beside its table, its MLP's LayerNorm, separate projections and pooled LayerNorm,
  Perception Encoder's rotary embeddings and attention pooling, AIMv2's RMSNorms
  (the patch embeddings' among them), bias-free projections and split SwiGLU
  layers. timm's SigLIP uses
  the exact GELU where big_vision's (and ours) is tanh-approximated: it is built with
  gelu_tanh here."""
  from vit_jax.models.vit import TIMM_VARIANTS
  small = dict(hidden_size=64, mlp_dim=256, num_heads=4, num_layers=2)
  np.save(tmp_path / 'images.npy', images(2, 32))
  # DINOv2-g's SwiGLUPacked first layer is mlp_ratio * width wide, twice mlp_dim; timm's
  # DINOv3 pools the patches' mean unless told to pool the class token, as DINOv3 does,
  # and its 7B's MLP is twice the width (mlp_ratio 2) where the small models' is four times.
  # TIPSv2's So400m MLP is 4304 / 1152 times the width, EVA-02's 8 / 3, AIMv2's 2.75 or
  # 2.6667, where the small models' is four.
  kwargs = lambda name: ({'act_layer': 'gelu_tanh'} if name.startswith('SigLIP') else
                         {'mlp_ratio': 8.} if name.startswith(('DINOv2-g', 'TIPSv2-g')) else
                         {'mlp_ratio': 4.} if name.startswith(('TIPSv2-So400m', 'EVA02', 'PE',
                                                               'AIMv2'))
                         else
                         {'global_pool': 'token', 'mlp_ratio': 4.} if name.startswith('DINOv3')
                         else {})
  spec = {name: (v.timm_name, 2 * v.patch, kwargs(name)) for name, v in TIMM_VARIANTS.items()}
  subprocess.run([torch_python, '-c', TIMM_NAMED, json.dumps(
      {'models': spec, 'images': str(tmp_path / 'images.npy'), 'out': str(tmp_path)})],
      check=True, env={**os.environ, 'CUDA_VISIBLE_DEVICES': ''}, timeout=600)
  for name, (_, size, _) in spec.items():
    state = dict(np.load(tmp_path / f'{name}.npz'))
    # Perception Encoder's attention pooling: 4 times the width, as timm is told.
    fields = dict(small, **({'map_mlp_dim': 256} if name.startswith('PE') else {}))
    params = timm_files.from_timm(state, name, **fields)
    model = models.build_model(models.get_config(name, num_classes=3, **fields))
    np.testing.assert_allclose(apply(model, {'params': params}, images(2, 32)[:, :size, :size]),
                               np.load(tmp_path / f'{name}.npy'), rtol=1e-3, atol=1e-4,
                               err_msg=name)
    back = timm_files.to_timm(params, name)
    assert set(back) == set(state), name
    for key, value in state.items():
      np.testing.assert_array_equal(back[key], value, err_msg=f'{name}: {key}')


# RoPE ViTs built by timm at a 4 x 4 grid, every parameter drawn at random (std 0.3):
# attention that is far from uniform, so that the rotary embeddings shape the logits.
TIMM_ROTARY = r"""
import json, sys
import numpy as np
import torch, timm
spec = json.loads(sys.argv[1])
torch.manual_seed(0)
for name, (timm_name, patch, kwargs) in spec['models'].items():
  module = timm.create_model(timm_name, pretrained=False, img_size=4 * patch, num_classes=3,
                             embed_dim=64, num_heads=4, depth=2, mlp_ratio=4., **kwargs)
  for p in module.parameters():
    torch.nn.init.normal_(p, std=0.3)
  np.savez(f"{spec['out']}/{name}.npz", **{k: v.numpy() for k, v in module.state_dict().items()})
  x = torch.from_numpy(np.load(spec['images'])[:, :4 * patch, :4 * patch].transpose(0, 3, 1, 2))
  with torch.no_grad():
    np.save(f"{spec['out']}/{name}.npy", module.eval()(x).numpy())
"""


@needs_timm
def test_rotary_vits_give_timms_logits_with_attention_their_rotary_embeddings_shape(
    tmp_path, torch_python):
  """DINOv3, EVA-02 and Perception Encoder at a 4 x 4 grid, EVA-02's and PE's
  rotary coordinates scaled to their pretraining grids, with weights large enough
  that attention depends on position: DINOv3's S with query and value biases and
  S+ (SwiGLU, no biases), both with registers and LayerScale and no position
  table; EVA-02's fused T and unfused B (separate q/k/v projections,
  LayerNorm in the MLP), Perception Encoder's B (class token, offset coordinates,
  attention pooling of its own heads and width) and G (neither class token nor
  offset) give timm's logits, and the same weights without the rotation do not."""
  small = dict(hidden_size=64, mlp_dim=256, num_heads=4, num_layers=2)
  pool = dict(attn_pool_num_heads=2, attn_pool_mlp_ratio=3.)  # ours: map_heads, map_mlp_dim
  # timm's DINOv3 pools the patches' mean unless told to pool the class token, as DINOv3 does.
  token = dict(global_pool='token')
  names = {'DINOv3-S_16-qkvb': ('vit_small_patch16_dinov3_qkvb', 16, token),
           'DINOv3-S+_16': ('vit_small_plus_patch16_dinov3', 16, token),
           'EVA02-Ti_14-in1k': ('eva02_tiny_patch14_336', 14, {}),
           'EVA02-B_14-in22k-in1k': ('eva02_base_patch14_448', 14, {}),
           'PE-Core-B_16': ('vit_pe_core_base_patch16_224', 16, pool),
           'PE-Core-G_14': ('vit_pe_core_gigantic_patch14_448', 14, pool)}
  x = images(2, 64)
  np.save(tmp_path / 'images.npy', x)
  subprocess.run([torch_python, '-c', TIMM_ROTARY, json.dumps(
      {'models': names, 'images': str(tmp_path / 'images.npy'), 'out': str(tmp_path)})],
      check=True, env={**os.environ, 'CUDA_VISIBLE_DEVICES': ''}, timeout=600)
  for name, (_, patch, kwargs) in names.items():
    fields = dict(small, **(dict(map_heads=2, map_mlp_dim=192) if kwargs is pool else {}))
    state = dict(np.load(tmp_path / f'{name}.npz'))
    params = timm_files.from_timm(state, name, **fields)
    expected, crop = np.load(tmp_path / f'{name}.npy'), x[:, :4 * patch, :4 * patch]
    # timm's models take the images as given here: no pixel statistics.
    plain = dict(fields, num_classes=3, pixel_mean=None, pixel_std=None)
    logits = apply(models.build_model(models.get_config(name, **plain)), {'params': params},
                   crop)
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max(),
                               err_msg=name)
    unrotated = apply(models.build_model(models.get_config(
        name, **plain, rope='none', rope_grid=None, rope_offset=0.)), {'params': params}, crop)
    error, without = np.abs(logits - expected).max(), np.abs(unrotated - expected).max()
    assert without > max(1e-3 * np.abs(expected).max(), 100 * error), (name, error, without)
    back = timm_files.to_timm(params, name)
    assert set(back) == set(state), name
    for key, value in state.items():
      np.testing.assert_array_equal(back[key], value, err_msg=f'{name}: {key}')


def test_a_distilled_deit_is_refused_with_the_reason():
  state = timm_files.to_timm(init(tiny_vit(num_classes=3), 32)['params'], 'ViT-Ti_16')
  with pytest.raises(CheckpointError, match=r'distilled DeiT \(dist_token\).*deit_\*_patch16_224'):
    timm_files.from_timm({**state, 'dist_token': np.zeros((1, 1, 32), np.float32)}, 'DeiT-Ti_16',
                         **TINY_VIT)
