"""The similarity measures beyond CKA, each against numpy written from its authors'
code or a closed form, and the invariances that define them."""
import numpy as np
import pytest
import scipy.linalg
import scipy.stats

from analysis.measures import cca, neighbours, procrustes, rsa


def _data(n=120, d=12, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)) * np.linspace(0.5, 3., d)
  y = np.tanh(x @ rng.normal(size=(d, d + 3))) + 0.3 * rng.normal(size=(n, d + 3))
  return x, y


def _rotation(d, seed=1):
  q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
  return q


def test_procrustes_is_the_authors():
  """js-d/sim_metric: score_local_pair centres each row of the (features, examples)
  matrix and divides by its Frobenius norm; scoring.procrustes is
  sum(A**2) + sum(B**2) - 2 * norm(A @ B.T, 'nuc')."""
  x, y = _data()
  a, b = x.T, y.T
  a = a - a.mean(axis=1, keepdims=True)
  b = b - b.mean(axis=1, keepdims=True)
  a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
  expected = np.sum(a ** 2) + np.sum(b ** 2) - 2 * np.linalg.norm(a @ b.T, ord='nuc')
  np.testing.assert_allclose(procrustes.procrustes_distance(x, y), expected, rtol=1e-12)
  wide = np.random.default_rng(5).normal(size=(20, 300))  # more features than examples
  a = wide.T - wide.T.mean(axis=1, keepdims=True)
  b = y[:20].T - y[:20].T.mean(axis=1, keepdims=True)
  a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
  np.testing.assert_allclose(procrustes.procrustes_distance(wide, y[:20]),
                             2 - 2 * np.linalg.norm(a @ b.T, ord='nuc'), rtol=1e-10)


def test_procrustes_ignores_rotation_scale_and_the_order_of_examples():
  x, y = _data()
  order = np.random.default_rng(2).permutation(len(x))
  assert abs(procrustes.procrustes_distance(x, 3.7 * x @ _rotation(12))) < 1e-12
  np.testing.assert_allclose(procrustes.procrustes_distance(x[order], y[order]),
                             procrustes.procrustes_distance(x, y), rtol=1e-12)
  assert 0 < procrustes.procrustes_distance(x, y) <= 2


def _platonic_mutual_knn(x, y, k):
  """platonic-rep: prepare_features (remove_outliers, q=0.95, exact: sorted |x| at
  int(q * numel), then clamp), compute_score (F.normalize each row), metrics.py
  compute_nearest_neighbors ((f @ f.T).fill_diagonal_(-1e8).argsort(descending)[:, :k])
  and mutual_knn (row masks multiplied, summed over a row, / k, mean)."""
  masks = []
  for f in (x, y):
    q = np.sort(np.abs(f).reshape(-1))[int(0.95 * f.size)]
    f = np.clip(f, -q, q)
    f = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
    sim = f @ f.T
    np.fill_diagonal(sim, -1e8)
    knn = np.argsort(-sim, axis=1)[:, :k]
    mask = np.zeros((len(f), len(f)))
    mask[np.arange(len(f))[:, None], knn] = 1.
    masks.append(mask)
  return np.mean((masks[0] * masks[1]).sum(axis=1) / k)


def test_mutual_knn_is_the_authors_and_ignores_the_order_of_examples():
  x, y = _data()
  assert neighbours.mutual_knn(x, y, k=10) == pytest.approx(_platonic_mutual_knn(x, y, 10))
  order = np.random.default_rng(3).permutation(len(x))
  assert neighbours.mutual_knn(x[order], y[order]) == pytest.approx(neighbours.mutual_knn(x, y))
  # Unclipped, the neighbourhoods are those of the inner product: rotations keep them.
  assert neighbours.mutual_knn(x, 2 * x @ _rotation(12), quantile=1) == 1.
  unrelated = np.random.default_rng(4).normal(size=x.shape)
  assert neighbours.mutual_knn(x, unrelated, k=10) < 3 * 10 / (len(x) - 1)
  with pytest.raises(ValueError, match='0 < k < the 120 examples'):
    neighbours.mutual_knn(x, y, k=120)


def test_rsa_is_the_spearman_correlation_of_correlation_distances():
  """Kriegeskorte et al. 2008: RDM entries 1 - Pearson r between two stimuli's
  patterns; RDMs compared by Spearman's rank correlation (Pearson r of the ranks)."""
  x, y = _data(n=40)

  def rdm(f):
    f = f - f.mean(axis=1, keepdims=True)
    f = f / np.linalg.norm(f, axis=1, keepdims=True)
    return 1 - f @ f.T

  upper = np.triu_indices(40, k=1)
  ranks = [scipy.stats.rankdata(rdm(f)[upper]) for f in (x, y)]
  expected = np.corrcoef(*ranks)[0, 1]
  assert rsa.rsa(x, y) == pytest.approx(expected, rel=1e-12)
  order = np.random.default_rng(6).permutation(40)
  assert rsa.rsa(x[order], y[order]) == pytest.approx(rsa.rsa(x, y), rel=1e-12)
  assert rsa.rsa(x, 5 * x + 2) == pytest.approx(1.)  # an affine map of every pattern


def _canonical_correlations(x, y):
  """A closed form: the singular values of Qx^T Qy, Q orthonormal bases of the
  centred representations."""
  qx = scipy.linalg.orth(x - x.mean(axis=0))
  qy = scipy.linalg.orth(y - y.mean(axis=0))
  return np.linalg.svd(qx.T @ qy, compute_uv=False)


def test_canonical_correlations_are_those_of_the_closed_form():
  x, y = _data()
  found, _ = cca.canonical_correlations(x, y)
  np.testing.assert_allclose(found, _canonical_correlations(x, y)[:len(found)], atol=1e-6)
  with pytest.raises(ValueError, match='more examples than features'):
    cca.canonical_correlations(x[:10], y[:10])


def test_svcca_is_the_tutorials_and_invariant_to_invertible_maps():
  """google/svcca tutorials/001_Introduction.ipynb: centre each neuron, SVD, keep
  np.dot(s[:k]*np.eye(k), V[:k]) of each, then the mean of get_cca_similarity's
  cca_coef1 (the canonical correlations)."""
  x, y = _data()
  kept = []
  for f in (x, y):
    acts = f.T - f.T.mean(axis=1, keepdims=True)
    _, s, v = np.linalg.svd(acts, full_matrices=False)
    kept.append(np.dot(s[:8] * np.eye(8), v[:8]).T)
  expected = np.mean(_canonical_correlations(*kept))
  assert cca.svcca(x, y, dims=8) == pytest.approx(expected, abs=1e-6)
  mixing = np.random.default_rng(7).normal(size=(12, 12))
  assert cca.svcca(x, x @ mixing, dims=12) == pytest.approx(1., abs=1e-6)
  assert cca.pwcca(x, x @ mixing) == pytest.approx(1., abs=1e-6)
  order = np.random.default_rng(8).permutation(len(x))
  assert cca.svcca(x[order], y[order]) == pytest.approx(cca.svcca(x, y), abs=1e-9)


def test_pwcca_is_the_authors():
  """google/svcca pwcca.compute_pwcca on the first (smaller) side: dirns = coef_x @
  (acts1 - means1) + means1 with coef_x = u.T of cca_core.compute_ccas, P from
  np.linalg.qr(dirns.T), weights = sum(|P.T @ acts1.T|, axis=1) normalised, and
  sum(weights * cca_coef1)."""
  x, y = _data()
  a, b = x.T, y.T
  numx = len(a)
  cov = np.cov(a, b)
  sxx, sxy, syy = cov[:numx, :numx], cov[:numx, numx:], cov[numx:, numx:]
  xmax, ymax = np.abs(sxx).max(), np.abs(syy).max()
  sxx, syy, sxy = sxx / xmax, syy / ymax, sxy / np.sqrt(xmax * ymax)
  eps = 1e-10

  def inv_sqrt(m):
    w, v = np.linalg.eigh(np.linalg.pinv(m + eps * np.eye(len(m))))
    return v @ np.diag(np.sqrt(w)) @ v.T

  u, s, _ = np.linalg.svd(inv_sqrt(sxx) @ sxy @ inv_sqrt(syy))
  means = a.mean(axis=1, keepdims=True)
  dirns = u.T @ (a - means) + means
  p, _ = np.linalg.qr(dirns.T)
  weights = np.abs(p.T @ a.T).sum(axis=1)
  expected = np.sum(weights / weights.sum() * np.abs(s))
  assert cca.pwcca(x, y) == pytest.approx(expected, rel=1e-9)
  assert cca.pwcca(y, x) == pytest.approx(expected, rel=1e-9)  # the smaller side weighs


@pytest.mark.parametrize('measure, identical', [
    (procrustes.procrustes_distance, 0.), (neighbours.mutual_knn, 1.), (rsa.rsa, 1.),
    (cca.svcca, 1.), (cca.pwcca, 1.)])
def test_identical_representations(measure, identical):
  x, _ = _data()
  assert measure(x, x.copy()) == pytest.approx(identical, abs=1e-9)
