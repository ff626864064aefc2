"""Sparse autoencoders written by saev and ViT-Prisma, generated here in their file
layouts, read with the forward pass their code runs (written out in numpy from
that code below), and measured by the SAE tool."""
import dataclasses
import json
import pickle
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

from analysis.runtime import sae_files
from analysis.measures import sparse_autoencoder as sae
from helpers import write_saev_file

torch = pytest.importorskip('torch', reason='the files are written by torch (test-only: '
                            'requirements-timm.txt)')

D, M = 6, 16


def _state(seed=0, d=D, m=M):
  rng = np.random.RandomState(seed)
  return {'W_enc': rng.normal(size=(d, m)).astype(np.float32),
          'b_enc': rng.normal(size=m).astype(np.float32) * 0.1,
          'W_dec': rng.normal(size=(m, d)).astype(np.float32),
          'b_dec': rng.normal(size=d).astype(np.float32)}


def _torch(state):
  return {k: torch.from_numpy(np.asarray(v)) for k, v in state.items()}


def _saev_header(cls, top_k=4):
  params = {'key': {'TopK': 'top-k', 'BatchTopK': 'batch-top-k', 'Relu': 'relu'}[cls]}
  if cls != 'Relu':
    params['top_k'] = top_k
  return {'schema': 5, 'cfg': {'d_model': D, 'd_sae': M, 'activation': {'cls': cls,
                                                                         'params': params}},
          'commit': 'abc', 'lib': '1.0'}


def _saev_forward(x, p, cls, top_k, threshold):
  """saev's SparseAutoencoder.encode (h = x W_enc + b_enc, no b_dec subtracted) with
  TopKActivation (the k largest kept as they are), BatchTopKActivation in eval mode
  (x where x > threshold, or where x > 0 while the threshold is not above 0) or
  ReluActivation, and decode's full prefix (f W_dec + b_dec)."""
  h = x @ p['W_enc'] + p['b_enc']
  if cls == 'TopK':
    idx = np.argsort(-h, axis=1)[:, :top_k]
    f = np.zeros_like(h)
    np.put_along_axis(f, idx, np.take_along_axis(h, idx, axis=1), axis=1)
  elif cls == 'BatchTopK':
    f = np.where(h > threshold, h, 0.) if threshold > 0 else np.where(h > 0, h, 0.)
  else:
    f = np.maximum(h, 0.)
  return f, f @ p['W_dec'] + p['b_dec']


@pytest.mark.parametrize('cls, threshold', [('TopK', None), ('BatchTopK', 0.3),
                                            ('BatchTopK', 0.), ('Relu', None)])
def test_saev_files_encode_as_saev_does(tmp_path, cls, threshold):
  state = _state()
  path = str(tmp_path / 'sae.pt')
  top_k = M - 3  # a TopK this wide keeps negative pre-activations, which saev does not ReLU
  write_saev_file(path, state, _saev_header(cls, top_k), threshold)
  params, spec, about = sae_files.read(path)
  assert (spec.encoder, about['source'], spec.width) == ('saev', 'saev', M)
  x = np.random.RandomState(3).normal(size=(9, D)).astype(np.float32)
  latents, recon = _saev_forward(x.astype(np.float64), state, cls, top_k, threshold or 0.)
  got, got_latents = sae.reconstruct(params, jnp.asarray(x), spec)
  np.testing.assert_allclose(got_latents, latents, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got, recon, rtol=1e-5, atol=1e-4)
  if cls == 'TopK':
    assert (np.asarray(got_latents) < 0).any()


def test_the_first_saev_files_are_relu_saes(tmp_path):
  path = str(tmp_path / 'old.pt')
  write_saev_file(path, _state(m=2 * D), {'d_vit': D, 'exp_factor': 2, 'l1_coeff': 4e-4})
  _, spec, about = sae_files.read(path)
  assert (spec.architecture, spec.encoder, about['schema']) == ('relu_l1', 'saev_pre_bias', '0')


def _saev_forward_before_e7ca004(x, p):
  """saev's SparseAutoencoder.forward before commit e7ca004 (src/saev/nn/modeling.py,
  lines 87-93 at 4f87ac7): h_pre = (x - b_dec) W_enc + b_enc, "Remove encoder bias as
  per Anthropic", then its ReLU; decode f W_dec + b_dec."""
  f = np.maximum((x - p['b_dec']) @ p['W_enc'] + p['b_enc'], 0.)
  return f, f @ p['W_dec'] + p['b_dec']


@pytest.mark.parametrize('header, pre_bias', [
    ({'d_vit': D, 'exp_factor': 2}, True),  # no schema: the first files
    ({'schema': 1, 'cls': 'Relu', 'cfg': {'d_vit': D, 'exp_factor': 2},
      'commit': '4f87ac7b0e4ed1a7c4b2ad3cd5b1e5e4b4ac0d10'}, True),  # before e7ca004
    ({'schema': 1, 'cls': 'Relu', 'cfg': {'d_vit': D, 'exp_factor': 2},
      'commit': 'unknown'}, True),
    ({'schema': 1, 'cls': 'Relu', 'cfg': {'d_vit': D, 'exp_factor': 2},
      'commit': 'e7ca004660a3ab414da7002fcecfc157d5b786aa'}, False),
    ({'schema': 1, 'cls': 'Relu', 'cfg': {'d_vit': D, 'exp_factor': 2},
      'commit': '65c5a2b'}, False),
    ({'schema': 5, 'cfg': {'d_model': D, 'd_sae': 2 * D, 'activation': {'cls': 'Relu',
                                                                    'params': {}}}}, False)])
def test_saev_files_encode_with_the_bias_handling_of_the_code_that_wrote_them(
    tmp_path, header, pre_bias):
  state = _state(m=2 * D)
  path = str(tmp_path / 'sae.pt')
  write_saev_file(path, state, header)
  params, spec, about = sae_files.read(path)
  x = np.random.RandomState(1).normal(size=(7, D))
  want, _ = (_saev_forward_before_e7ca004(x, state) if pre_bias
             else _saev_forward(x, state, 'Relu', None, 0.))
  got = np.asarray(sae.encode(params, jnp.asarray(x, jnp.float32), spec)[0])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert about['encoder'] == ('saev_pre_bias' if pre_bias else 'saev')


def _prisma_config(**changes):
  cfg = {'d_in': D, 'd_sae': M, 'architecture': 'standard', 'activation_fn_str': 'topk',
         'activation_fn_kwargs': {'k': 5}, 'normalize_activations': 'layer_norm',
         'hook_point': 'blocks.1.hook_resid_post', 'model_name': 'open-clip:laion/tiny'}
  cfg.update(changes)
  return cfg


def _prisma_forward(x, p, cfg):
  """ViT-Prisma's SparseAutoencoder.forward for the standard architecture: the
  run-time normalisation in (layer_norm: (x - mu) / (std + 1e-5), torch's unbiased
  std; constant_norm_rescale: x sqrt(d_in) / |x|), sae_in - b_dec, W_enc and b_enc,
  TopK (torch.topk, then ReLU of the values kept) or ReLU, W_dec and b_dec, and the
  normalisation out (x std + mu, or x / the coefficient)."""
  norm = cfg['normalize_activations']
  if norm == 'layer_norm':
    mu = x.mean(-1, keepdims=True)
    std = (x - mu).std(-1, ddof=1, keepdims=True)
    sae_in = (x - mu) / (std + 1e-5)
    back = lambda y: y * std + mu
  elif norm == 'constant_norm_rescale':
    coeff = np.sqrt(x.shape[-1]) / np.linalg.norm(x, axis=-1, keepdims=True)
    sae_in, back = x * coeff, lambda y: y / coeff
  else:
    sae_in, back = x, lambda y: y
  pre = (sae_in - p['b_dec']) @ p['W_enc'] + p['b_enc']
  if cfg['activation_fn_str'] == 'topk':
    k = cfg['activation_fn_kwargs']['k']
    idx = np.argsort(-pre, axis=1)[:, :k]
    f = np.zeros_like(pre)
    np.put_along_axis(f, idx, np.maximum(np.take_along_axis(pre, idx, axis=1), 0.), axis=1)
  else:
    f = np.maximum(pre, 0.)
  return f, back(f @ p['W_dec'] + p['b_dec'])


@pytest.mark.parametrize('changes', [{}, {'normalize_activations': 'constant_norm_rescale'},
                                     {'normalize_activations': 'none',
                                      'activation_fn_str': 'relu', 'activation_fn_kwargs': {}}])
def test_vit_prisma_files_encode_as_vit_prisma_does(tmp_path, changes):
  state, cfg = _state(1), _prisma_config(**changes)
  torch.save(_torch(state), tmp_path / 'weights.pt')
  (tmp_path / 'config.json').write_text(json.dumps(cfg))
  params, spec, about = sae_files.read(str(tmp_path / 'weights.pt'))
  assert about['site'] == 'block1/+mlp' and about['hook_point'] == cfg['hook_point']
  assert spec.normalisation == cfg['normalize_activations']
  x = np.random.RandomState(4).normal(size=(7, D)) * 3 + 1
  latents, recon = _prisma_forward(x, state, cfg)
  got, got_latents = sae.reconstruct(params, jnp.asarray(x, jnp.float32), spec)
  np.testing.assert_allclose(got_latents, latents, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got, recon, rtol=1e-4, atol=1e-3)
  # Steering in the activations' space: scaling one latent by 2 moves the activation
  # by the change of the reconstruction when that latent alone is doubled.
  j = int(np.argmax(latents.sum(0)))
  doubled = latents.copy()
  doubled[:, j] *= 2
  moved = sae.steered(jnp.asarray(x, jnp.float32), got_latents, params, j, 2., spec)
  expected = x + (_back(x, cfg, doubled @ state['W_dec']) - _back(x, cfg, latents @ state['W_dec']))
  np.testing.assert_allclose(moved, expected, rtol=1e-4, atol=1e-3)


def _back(x, cfg, y):
  """ViT-Prisma's normalisation out applied to y (the bias-free part of a decode)."""
  norm = cfg['normalize_activations']
  if norm == 'layer_norm':
    return y * (x - x.mean(-1, keepdims=True)).std(-1, ddof=1, keepdims=True)
  if norm == 'constant_norm_rescale':
    return y * np.linalg.norm(x, axis=-1, keepdims=True) / np.sqrt(x.shape[-1])
  return y


def test_older_vit_prisma_files_are_read_without_the_package(tmp_path, monkeypatch):
  """{'cfg': the config object, 'state_dict': ...}, pickled with ViT-Prisma's config
  class: read with the class absent, its fields kept."""
  module = types.ModuleType('vit_prisma.sae.config')

  @dataclasses.dataclass
  class VisionModelSAERunnerConfig:
    d_in: int
    activation_fn_str: str
    activation_fn_kwargs: dict
    normalize_activations: str
    hook_point: str
    architecture: str = 'standard'
  VisionModelSAERunnerConfig.__module__ = module.__name__
  VisionModelSAERunnerConfig.__qualname__ = 'VisionModelSAERunnerConfig'
  module.VisionModelSAERunnerConfig = VisionModelSAERunnerConfig
  for name in ('vit_prisma', 'vit_prisma.sae', 'vit_prisma.sae.config'):
    monkeypatch.setitem(sys.modules, name, module)
  cfg = VisionModelSAERunnerConfig(D, 'topk', {'k': 3}, 'none', 'blocks.0.hook_resid_pre')
  path = str(tmp_path / 'legacy.pt')
  torch.save({'cfg': cfg, 'state_dict': _torch(_state(2))}, path)
  for name in ('vit_prisma', 'vit_prisma.sae', 'vit_prisma.sae.config'):
    monkeypatch.delitem(sys.modules, name)
  _, spec, about = sae_files.read(path)
  assert (spec.architecture, spec.k, about['site']) == ('topk', 3, 'embedding')


@pytest.mark.parametrize('zipped', [True, False])
def test_a_file_that_pickles_code_is_refused_unrun(tmp_path, zipped):
  """torch.save's zip file and a plain pickle (torch.load's legacy path), each
  holding a call of os.system that would create a file."""
  import os
  path, witness = str(tmp_path / 'evil.pt'), tmp_path / 'ran'

  class Runs:
    def __reduce__(self):
      return (os.system, (f'touch {witness}',))
  payload = {'cfg': Runs(), 'state_dict': {}}
  if zipped:
    torch.save(payload, path)
  else:
    with open(path, 'wb') as f:
      pickle.dump(payload, f)
  with pytest.raises(ValueError, match=r'names (posix|os)\.system' if zipped else 'plain pickle'):
    sae_files.read(path)
  assert not witness.exists()


@pytest.mark.parametrize('write, says', [
    (lambda p: p.write_bytes(b'plain text'), 'is neither this project'),
    (lambda p: p.write_text('{"schema": 5, "cfg": {"activation": {"cls": "JumpRelu"}}}\n'),
     "saev activation 'JumpRelu' is not one of Relu, TopK, BatchTopK"),
    (lambda p: torch.save(_torch(_state()), p.with_suffix('.pt')), 'no config.json is beside')])
def test_files_none_of_them_wrote_are_named(tmp_path, write, says):
  path = tmp_path / 'sae.bin'
  write(path)
  target = path.with_suffix('.pt') if 'config.json' in says else path
  with pytest.raises(Exception, match=says):
    sae_files.read(str(target))


def test_the_tool_measures_a_loaded_saev_file_that_reconstructs_exactly(subjects, tmp_path):
  """A saev ReLU SAE with W_enc = [I, -I], W_dec its transpose, no biases:
  relu(x) - relu(-x) = x at every token, so splicing it in changes no loss; and
  ablating a latent that never fires changes no logit."""
  from analysis.tools import sae as tool
  from helpers import batches
  from vit_jax.errors import ConfigError
  subject = subjects['vit']
  site = subject.layers.labels[1]
  width = tool._tokens(subject, subject.layers.stream[1], next(batches('eval'))[0])[0].shape[1]
  eye = np.eye(width, dtype=np.float32)
  # Latent 2 * width never fires (no weights, bias -1) and decodes to a direction of
  # its own: ablating it changes nothing.
  state = {'W_enc': np.concatenate([eye, -eye, np.zeros((width, 1), np.float32)], 1),
           'b_enc': np.concatenate([np.zeros(2 * width), [-1.]]).astype(np.float32),
           'W_dec': np.concatenate([eye, -eye, np.ones((1, width), np.float32)], 0),
           'b_dec': np.zeros(width, np.float32)}
  path = str(tmp_path / 'identity.pt')
  write_saev_file(path, state, {'schema': 5, 'cfg': {'activation': {'cls': 'Relu', 'params': {}}}})
  options = tool.Options(sae_load=path, sae_site=site, sae_features=1)
  result = tool.TOOL.run_one(subject, batches, str(tmp_path), options)
  assert result['source'] == 'saev' and result['steps'] == 0 and result['site'] == site
  assert result['fve'] == pytest.approx(1., abs=1e-5)
  assert result['loss']['spliced'] == pytest.approx(result['loss']['clean'], rel=1e-5)
  params, spec, _ = sae_files.read(path)
  images = next(batches('eval'))[0]
  tokens, value = tool._tokens(subject, subject.layers.stream[1], images)
  latents = sae.encode(params, jnp.asarray(tokens), spec)[0]
  assert not np.asarray(latents[:, 2 * width]).any()
  ablated = sae.steered(jnp.asarray(tokens), latents, params, 2 * width, 0., spec)
  edits = tool._edits(subject.layers.stream[1], **tool._spliced(
      value, np.asarray(ablated), subject.has_cls, subject.registers))
  np.testing.assert_allclose(subject.edited_logits(images, edits), subject.logits(images),
                             rtol=1e-5, atol=1e-6)
  with pytest.raises(ConfigError, match='no such file'):
    tool.Options(sae_load=str(tmp_path / 'missing.pt'))
  wider = str(tmp_path / 'wider.pt')
  write_saev_file(wider, _state(d=width + 1, m=M), _saev_header('Relu'))
  with pytest.raises(ConfigError, match=f'reads activations {width + 1} wide'):
    tool.TOOL.run(subject, batches, tool.Options(sae_load=wider))


@pytest.mark.parametrize('name, data, says', [
    ('zero.npz', b'', 'zero.npz is not a readable SAE dictionary \\(EOFError'),
    ('text.safetensors', b'hello', 'text.safetensors is not a readable SAE dictionary '
                                   '\\(SafetensorError')])
def test_an_empty_or_text_dictionary_file_is_named(tmp_path, name, data, says):
  (tmp_path / name).write_bytes(data)
  with pytest.raises(ValueError, match=says):
    sae_files.read(str(tmp_path / name))
