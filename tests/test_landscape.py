"""Loss landscapes: Park & Kim's filter normalisation written out in numpy in
PyTorch's layout, the landscape of a quadratic along an eigenvector, the batched
grid against a loop, and the tool on a tiny ViT."""
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from analysis.measures import curvature, loss_surface
from analysis.runtime import objectives
from analysis.tools import TOOLS
from analysis.tools import landscape as landscape_tool


def authors_normalise(d, w):
  """`normalize_filter` on PyTorch tensors: norms over dim 0, keepdim; then
  `ignore_bn`: tensors of fewer than two dims get zeros."""
  if w.ndim < 2:
    return np.zeros_like(w)
  return np.linalg.norm(w, axis=0, keepdims=True) / (
      np.linalg.norm(d, axis=0, keepdims=True) + 1e-7) * d


def authors_bases(direction, weights, kws=('pos_embed', 'relative_position')):
  """`create_bases` after its random draw, on PyTorch state dicts: `normalize_filter`
  (norms over dim 0, keepdim), `ignore_bn` (tensors of fewer than two dims get
  zeros), `ignore_kw` with the landscape notebook's keywords (matching names get
  zeros)."""
  out = {}
  for k, w in weights.items():
    d = direction[k]
    if w.ndim >= 2:
      d = np.linalg.norm(w, axis=0, keepdims=True) / (
          np.linalg.norm(d, axis=0, keepdims=True) + 1e-7) * d
    if w.ndim < 2 or any(re.search(kw, k) for kw in kws):
      d = np.zeros_like(w)
    out[k] = d
  return out


@pytest.mark.numerics
def test_filter_normalisation_is_the_authors_in_timms_layout():
  """A ViT's direction mapped to timm's state dict (fused qkv, 1-D qkv bias,
  pos_embed), normalised there as the authors' code does, and mapped back."""
  from helpers import TINY_VIT, init, tiny_vit
  from vit_jax.files import timm_files
  params = init(tiny_vit(5), 16)['params']
  rng = np.random.RandomState(0)
  params = jax.tree_util.tree_map(lambda x: x + rng.randn(*x.shape).astype(np.float32), params)
  direction = jax.tree_util.tree_map(lambda x: rng.randn(*x.shape).astype(np.float32), params)
  ours = loss_surface.filter_normalised(direction, params)
  theirs = timm_files.from_timm(
      authors_bases(timm_files.to_timm(direction, 'ViT-Ti_16'),
                    timm_files.to_timm(params, 'ViT-Ti_16')), 'ViT-Ti_16', **TINY_VIT)
  flat = lambda t: {'/'.join(str(getattr(k, 'key', k)) for k in path): np.asarray(leaf)
                    for path, leaf in jax.tree_util.tree_leaves_with_path(t)}
  ours, theirs = flat(ours), flat(theirs)
  assert set(ours) == set(theirs)
  for key in ours:
    np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-6, err_msg=key)
  # Held still: the position embedding and the q/k/v biases.
  held = [k for k in ours if not np.any(ours[k])]
  assert 'Transformer/posembed_input/pos_embedding' in held
  assert 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/bias' in held
  assert not np.any(ours['Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/bias'])


def test_per_array_normalisation_is_each_array_alone():
  """The departure: every array of two or more axes normalised over its output axes
  by its own norm, position embeddings and q/k/v biases included."""
  rng = np.random.RandomState(1)
  params = {'Transformer': {'posembed_input': {'pos_embedding': rng.randn(1, 5, 8)}},
            'MultiHeadDotProductAttention_1': {'query': {'kernel': rng.randn(8, 2, 4),
                                                         'bias': rng.randn(2, 4)},
                                               'key': {'kernel': 3 * rng.randn(8, 2, 4)}},
            'LayerNorm_0': {'scale': rng.randn(8)}}
  direction = jax.tree_util.tree_map(lambda x: rng.randn(*x.shape), params)
  ours = loss_surface.filter_normalised(direction, params, 'per_array')

  def alone(d, w, axes):
    return (np.sqrt(np.sum(w ** 2, axis=axes, keepdims=True))
            / (np.sqrt(np.sum(d ** 2, axis=axes, keepdims=True)) + 1e-7) * d)
  attention, d_attention = params['MultiHeadDotProductAttention_1'], direction[
      'MultiHeadDotProductAttention_1']
  for name in ('query', 'key'):
    np.testing.assert_allclose(
        ours['MultiHeadDotProductAttention_1'][name]['kernel'],
        alone(d_attention[name]['kernel'], attention[name]['kernel'], (1, 2)), rtol=1e-5)
  np.testing.assert_allclose(ours['MultiHeadDotProductAttention_1']['query']['bias'],
                             alone(d_attention['query']['bias'], attention['query']['bias'], 0),
                             rtol=1e-5)
  pos = params['Transformer']['posembed_input']['pos_embedding']
  np.testing.assert_allclose(ours['Transformer']['posembed_input']['pos_embedding'],
                             alone(direction['Transformer']['posembed_input']['pos_embedding'],
                                   pos, 0), rtol=1e-5)
  assert not np.any(ours['LayerNorm_0']['scale'])


@pytest.mark.numerics
def test_alternets_fused_key_value_and_relative_bias():
  """AlterNet in the authors' code: `to_q` alone, `to_kv` one tensor for key and
  value, the relative position bias (their `pos_embedding`) held still."""
  rng = np.random.RandomState(2)
  attention = {'query': {'kernel': rng.randn(6, 2, 3)}, 'key': {'kernel': rng.randn(6, 2, 3)},
               'value': {'kernel': 5 * rng.randn(6, 2, 3)},
               'relative_position_bias': rng.randn(7, 7)}
  params = {'stage2_unit2': {'attention': attention}}
  direction = jax.tree_util.tree_map(lambda x: rng.randn(*x.shape), params)
  ours = loss_surface.filter_normalised(direction, params)['stage2_unit2']['attention']
  d = direction['stage2_unit2']['attention']
  to_torch = lambda x: x.reshape(6, 6).T  # (in, heads, dim) -> (out, in)
  kv = authors_bases({'to_kv': np.concatenate([to_torch(d['key']['kernel']),
                                               to_torch(d['value']['kernel'])])},
                     {'to_kv': np.concatenate([to_torch(attention['key']['kernel']),
                                               to_torch(attention['value']['kernel'])])})['to_kv']
  q = authors_bases({'to_q': to_torch(d['query']['kernel'])},
                    {'to_q': to_torch(attention['query']['kernel'])})['to_q']
  back = lambda x: x.T.reshape(6, 2, 3)
  np.testing.assert_allclose(ours['key']['kernel'], back(kv[:6]), rtol=1e-5)
  np.testing.assert_allclose(ours['value']['kernel'], back(kv[6:]), rtol=1e-5)
  np.testing.assert_allclose(ours['query']['kernel'], back(q), rtol=1e-5)
  assert not np.any(ours['relative_position_bias'])


@pytest.mark.numerics
def test_the_l2_term_is_the_authors():
  """`ops/norm.py` `l2`: the sum over parameter tensors of torch.norm (Frobenius,
  unsquared); the notebook adds weight_decay times it."""
  rng = np.random.RandomState(3)
  params = {'a': {'kernel': rng.randn(4, 5, 6)}, 'b': rng.randn(7), 'c': rng.randn(2, 3)}
  expected = sum(np.sqrt(np.sum(np.asarray(x, np.float64) ** 2))
                 for x in jax.tree_util.tree_leaves(params))
  assert float(loss_surface.authors_l2(params)) == pytest.approx(expected, rel=1e-6)
  from analysis.tools.landscape import l2_penalty
  assert float(l2_penalty('authors', 0.05)(params)) == pytest.approx(0.05 * expected, rel=1e-6)
  kernels = 0.5 * 0.05 * np.sum(params['a']['kernel'] ** 2)
  assert float(l2_penalty('objective', 0.05)(params)) == pytest.approx(kernels, rel=1e-5)


def test_a_quadratic_along_an_eigenvector_is_half_lambda_t_squared():
  """L(p) = p^T A p / 2 around its minimum 0: along a unit eigenvector v of A,
  L(t v) = lambda t^2 / 2; the Lanczos directions are the top two eigenvectors."""
  rng = np.random.RandomState(1)
  q, _ = np.linalg.qr(rng.randn(12, 12))
  eigenvalues = np.array([9., 4.] + list(np.linspace(-1, 1, 10)))
  a = (q * eigenvalues) @ q.T
  params = {'w': jnp.zeros(12)}
  loss = lambda p: 0.5 * p['w'] @ (jnp.asarray(a, jnp.float32) @ p['w'])
  directions = loss_surface.hessian_directions(lambda v: jnp.asarray(a, jnp.float32) @ v, params, 12)
  for direction, value in zip(directions, eigenvalues[:2]):
    np.testing.assert_allclose(abs(np.asarray(direction['w']) @ q[:, list(eigenvalues).index(
        value)]), 1., rtol=1e-4)
  t = np.linspace(-1, 1, 7)
  along = loss_surface.grid(loss, params, directions[:1], t[:, None], chunk=3)
  np.testing.assert_allclose(along, 0.5 * 9. * t ** 2, rtol=1e-4, atol=1e-6)


def test_the_batched_grid_is_the_loop_over_points():
  rng = np.random.RandomState(2)
  params = {'a': jnp.asarray(rng.randn(3, 4), jnp.float32), 'b': jnp.asarray(rng.randn(4))}
  loss = lambda p: jnp.sum(jnp.tanh(p['a'] @ p['b'])) + jnp.sum(p['b'] ** 2)
  directions = loss_surface.random_directions(params, jax.random.PRNGKey(0))
  points = np.stack(np.meshgrid(np.linspace(-1, 1, 5), np.linspace(-1, 1, 5)), -1).reshape(-1, 2)
  calls = []
  batched = loss_surface.grid(loss, params, directions, points, chunk=4, on_points=calls.append)
  assert calls == [4] * 6 + [1]  # the last chunk padded, its padding not counted
  looped = [float(loss(jax.tree_util.tree_map(lambda p, d1, d2: p + x * d1 + y * d2, params,
                                              *directions))) for x, y in points]
  np.testing.assert_allclose(batched, looped, rtol=1e-5, atol=1e-6)
  calls.clear()
  hosted = loss_surface.grid(loss, params, directions, points, host_loop=True,
                             on_points=calls.append)
  np.testing.assert_allclose(hosted, looped, rtol=1e-5, atol=1e-6)
  assert calls == [1] * 25
  np.testing.assert_allclose(loss_surface.grid(loss, params, directions, points, chunk=100),
                             looped, rtol=1e-5, atol=1e-6)  # a chunk larger than the grid


@pytest.mark.parametrize('directions,l2_term', [('random', 'authors'), ('hessian', 'objective')])
def test_the_landscape_tool(directions, l2_term, tmp_path):
  from helpers import TINY_VIT, batches, subject
  s = subject('ViT-Ti_16', 'vit', **TINY_VIT)
  result = TOOLS['landscape'].run_one(s, batches, str(tmp_path), landscape_tool.Options(
      landscape_points=5, landscape_batches=2, landscape_directions=directions,
      lanczos_steps=4, landscape_l2=l2_term))
  json.dumps(result)
  total, nll, l2 = (np.array(result[k]) for k in ('loss', 'nll', 'l2'))
  assert total.shape == (5, 5) and result['num_images'] == 24
  assert result['objective']['l2_term'] == l2_term
  np.testing.assert_allclose(total, nll + l2, rtol=1e-6)
  # The centre: the recipe's NLL plus the L2 term at the trained parameters.
  from analysis.tools.common import fixed_batches
  from analysis.runtime import features
  fixed = fixed_batches(batches, features.TRAIN_AUGMENTED, 2, 3)
  coefficient = s.recipe.weight_decay / s.recipe.lr
  if l2_term == 'authors':
    nll_loss = objectives.training_loss(s.model, 0., s.recipe.loss, s.recipe.label_smoothing)
    centre = float(nll_loss(s.params, fixed)) + coefficient * sum(
        np.linalg.norm(np.asarray(x, np.float64)) for x in jax.tree_util.tree_leaves(s.params))
  else:  # the Hessian's objective with this project's decay mask
    loss, _ = objectives.recipe_objective(s.model, s.recipe, l2_on='kernels')
    centre = float(loss(s.params, fixed))
  assert result['centre_loss'] == pytest.approx(centre, rel=1e-4)
  assert all(os.path.exists(f) for f in result['figures']) and len(result['figures']) == 3


def test_the_landscape_of_a_model_the_host_loops_over(subjects, tmp_path):
  """The smallest tiny model whose batches, Lanczos steps and grid points the host
  drives (a ResNet or a hybrid): Hessian directions from linearised products, the
  grid point by point, and the centre is the objective at the parameters."""
  from helpers import batches
  from analysis.tools.common import fixed_batches
  from analysis.runtime import features
  s = min((s for s in subjects.values() if curvature.loops_on_host(s.layers.architecture)),
          key=lambda s: curvature.dimension(s.params))
  result = TOOLS['landscape'].run_one(s, batches, str(tmp_path), landscape_tool.Options(
      landscape_points=3, landscape_batches=2, landscape_directions='hessian', lanczos_steps=3,
      landscape_l2='objective'))
  loss, _ = objectives.recipe_objective(s.model, s.recipe, l2_on='kernels')
  fixed = fixed_batches(batches, features.TRAIN_AUGMENTED, 2, 3)
  assert result['centre_loss'] == pytest.approx(float(loss(s.params, fixed)), rel=1e-4)
  assert np.isfinite(result['loss']).all()
