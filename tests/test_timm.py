"""Export to timm: our state_dict equals what timm's own `.npz` loader makes of our
saved file, and timm then computes our logits. The comparisons are skipped without torch and
timm, which stay out of the required dependencies.

timm runs in a subprocess: torchvision (which timm imports) crashes a process
that imported TensorFlow first, as the test helpers do.
"""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import TINY_VIT, apply, images, init, perturbed, tiny_bit, tiny_vit
from vit_jax import checkpoint

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
          'map': dict(global_pool='map', class_token=False)}[spec['classifier']]
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


def run_timm(tmp_path, params, ours, **spec):
  files = {name: str(tmp_path / f'{name}.npy' if name in ('images', 'logits') else
                     tmp_path / f'{name}.npz')
           for name in ('npz', 'state', 'ours', 'images', 'logits')}
  checkpoint.save(files['npz'], params)
  np.savez(files['ours'], **ours)
  np.save(files['images'], images(2, 32))
  subprocess.run([sys.executable, '-c', TIMM_SIDE, json.dumps({**spec, **files})], check=True,
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
@pytest.mark.parametrize('classifier', ['token', 'gap', 'map'])
def test_vit_exports_as_timm_loads_it(tmp_path, classifier):
  model = tiny_vit(num_classes=3, classifier=classifier)
  params = perturbed(init(model, 32))['params']
  ours = checkpoint.to_timm(params, 'ViT-Ti_16')
  expected, logits = run_timm(tmp_path, params, ours, family='vit', classifier=classifier,
                              size=timm_size(TINY_VIT['patch_size']))
  assert_same_state(ours, expected)
  # The same function (tanh GELU on both sides) up to float32 summation order.
  np.testing.assert_allclose(logits, apply(model, {'params': params}, images(2, 32)),
                             rtol=1e-4, atol=1e-5)


@needs_timm
def test_hybrid_exports_as_timm_loads_it(tmp_path):
  model = tiny_vit(num_classes=3, resnet_layers=(1,), patch_size=1)
  params = perturbed(init(model, 32))['params']
  ours = checkpoint.to_timm(params, 'R50+ViT-B_16')
  expected, logits = run_timm(tmp_path, params, ours, family='hybrid', layers=[1],
                              size=timm_size(1))
  assert_same_state(ours, expected)
  # timm pads its 'same' convolutions as TensorFlow does, as our ResNet does.
  np.testing.assert_allclose(logits, apply(model, {'params': params}, images(2, 32)),
                             rtol=1e-3, atol=1e-4)


@needs_timm
def test_bit_exports_as_timm_loads_it(tmp_path):
  params = perturbed(init(tiny_bit(num_classes=3), 32))['params']
  ours = checkpoint.to_timm(params, 'BiT-M-R50x1')
  expected, _ = run_timm(tmp_path, params, ours, family='bit')
  assert_same_state(ours, expected)


def test_what_timm_cannot_hold_is_refused():
  params = init(tiny_vit(num_classes=3, representation_size=16), 32)['params']
  with pytest.raises(ValueError, match='no pre_logits'):
    checkpoint.to_timm(params, 'ViT-Ti_16')
  for posemb in ('sincos2d', 'learn2d', 'none'):
    params = init(tiny_vit(num_classes=3, posemb=posemb), 32)['params']
    with pytest.raises(ValueError, match='one learned 1-D position embedding'):
      checkpoint.to_timm(params, 'ViT-Ti_16')
  with pytest.raises(ValueError, match='ViT, hybrid and BiT'):
    checkpoint.to_timm(params, 'Mixer-B_16')
