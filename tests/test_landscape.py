"""Loss landscapes: Park & Kim's filter normalisation written out in numpy in
PyTorch's layout, the landscape of a quadratic along an eigenvector, the batched
grid against a loop, and the tool on a tiny ViT."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from analysis import hessian, landscape
from analysis.tools import TOOLS


def authors_normalise(d, w):
  """`normalize_filter` on PyTorch tensors: norms over dim 0, keepdim; then
  `ignore_bn`: tensors of fewer than two dims get zeros."""
  if w.ndim < 2:
    return np.zeros_like(w)
  return np.linalg.norm(w, axis=0, keepdims=True) / (
      np.linalg.norm(d, axis=0, keepdims=True) + 1e-7) * d


def test_filter_normalisation_is_the_authors_in_pytorch_layout():
  rng = np.random.RandomState(0)
  params = {'Dense_0': {'kernel': rng.randn(6, 5), 'bias': rng.randn(5)},
            'conv': {'kernel': rng.randn(3, 3, 4, 8)},
            'MultiHeadDotProductAttention_1': {'query': {'kernel': rng.randn(8, 2, 4)},
                                               'out': {'kernel': rng.randn(2, 4, 8)}},
            'cls': rng.randn(1, 1, 8), 'LayerNorm_0': {'scale': rng.randn(8)}}
  direction = jax.tree_util.tree_map(lambda x: rng.randn(*x.shape), params)
  ours = landscape.filter_normalised(direction, params)
  # To PyTorch's layout (output axis first) and back.
  layouts = {  # ours -> torch, torch -> ours
      ('Dense_0', 'kernel'): (lambda x: x.T, lambda x: x.T),
      ('conv', 'kernel'): (lambda x: x.transpose(3, 2, 0, 1), lambda x: x.transpose(2, 3, 1, 0)),
      ('MultiHeadDotProductAttention_1', 'query', 'kernel'):
          (lambda x: x.reshape(8, 8).T, lambda x: x.T.reshape(8, 2, 4)),
      ('MultiHeadDotProductAttention_1', 'out', 'kernel'):
          (lambda x: x.reshape(8, 8).T, lambda x: x.T.reshape(2, 4, 8))}
  flat = lambda t: {tuple(getattr(k, 'key', k) for k in path): leaf
                    for path, leaf in jax.tree_util.tree_leaves_with_path(t)}
  d, w, got = flat(direction), flat(params), flat(ours)
  for key in w:
    to_torch, back = layouts.get(key, (lambda x: x, lambda x: x))
    expected = back(authors_normalise(to_torch(d[key]), to_torch(w[key])))
    np.testing.assert_allclose(np.asarray(got[key]), expected, rtol=1e-5, atol=1e-7, err_msg=key)


def test_a_quadratic_along_an_eigenvector_is_half_lambda_t_squared():
  """L(p) = p^T A p / 2 around its minimum 0: along a unit eigenvector v of A,
  L(t v) = lambda t^2 / 2; the Lanczos directions are the top two eigenvectors."""
  rng = np.random.RandomState(1)
  q, _ = np.linalg.qr(rng.randn(12, 12))
  eigenvalues = np.array([9., 4.] + list(np.linspace(-1, 1, 10)))
  a = (q * eigenvalues) @ q.T
  params = {'w': jnp.zeros(12)}
  loss = lambda p: 0.5 * p['w'] @ (jnp.asarray(a, jnp.float32) @ p['w'])
  directions = landscape.hessian_directions(lambda v: jnp.asarray(a, jnp.float32) @ v, params, 12)
  for direction, value in zip(directions, eigenvalues[:2]):
    np.testing.assert_allclose(abs(np.asarray(direction['w']) @ q[:, list(eigenvalues).index(
        value)]), 1., rtol=1e-4)
  t = np.linspace(-1, 1, 7)
  along = landscape.grid(loss, params, directions[:1], t[:, None], chunk=3)
  np.testing.assert_allclose(along, 0.5 * 9. * t ** 2, rtol=1e-4, atol=1e-6)


def test_the_batched_grid_is_the_loop_over_points():
  rng = np.random.RandomState(2)
  params = {'a': jnp.asarray(rng.randn(3, 4), jnp.float32), 'b': jnp.asarray(rng.randn(4))}
  loss = lambda p: jnp.sum(jnp.tanh(p['a'] @ p['b'])) + jnp.sum(p['b'] ** 2)
  directions = landscape.random_directions(params, jax.random.PRNGKey(0))
  points = np.stack(np.meshgrid(np.linspace(-1, 1, 5), np.linspace(-1, 1, 5)), -1).reshape(-1, 2)
  batched = landscape.grid(loss, params, directions, points, chunk=4)
  looped = [float(loss(jax.tree_util.tree_map(lambda p, d1, d2: p + x * d1 + y * d2, params,
                                              *directions))) for x, y in points]
  np.testing.assert_allclose(batched, looped, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('directions', ['random', 'hessian'])
def test_the_landscape_tool(directions, tmp_path):
  from test_representation_tools import batches, subject
  from helpers import TINY_VIT
  s = subject('ViT-Ti_16', 'vit', **TINY_VIT)
  result = TOOLS['landscape'].run(s, batches, str(tmp_path), points=5, num_batches=2,
                                  directions=directions, lanczos_steps=4)
  json.dumps(result)
  total, nll, l2 = (np.array(result[k]) for k in ('loss', 'nll', 'l2'))
  assert total.shape == (5, 5) and result['num_images'] == 24
  np.testing.assert_allclose(total, nll + l2, rtol=1e-6)
  # The centre is the recipe's objective at the trained parameters.
  from analysis.tools.hessian import fixed_batches
  from analysis import features
  loss, _ = hessian.recipe_objective(s.model, s.recipe)
  fixed = fixed_batches(batches, features.TRAIN_AUGMENTED, 2, 3)
  assert result['centre_loss'] == pytest.approx(float(loss(s.params, fixed)), rel=1e-4)
  assert all(os.path.exists(f) for f in result['figures']) and len(result['figures']) == 3
