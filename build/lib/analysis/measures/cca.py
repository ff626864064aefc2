"""Canonical correlation analysis of two representations: SVCCA (Raghu et al. 2017)
and projection-weighted CCA (Morcos et al. 2018), as google/svcca computes them.

Representations are (n, ...) arrays of n examples, flattened to (n, d); google/svcca
takes the transpose, (neurons, datapoints). CCA needs more examples than features
(`cca_core.get_cca_similarity` asserts it); SVCCA first keeps the top singular
directions, which makes any layer fit.
"""
from typing import Dict, Optional, Tuple

import numpy as np


def _neurons(x: np.ndarray) -> np.ndarray:
  """(n, ...) -> google/svcca's (neurons, datapoints) in float64."""
  x = np.asarray(x, np.float64)
  return x.reshape(x.shape[0], -1).T


def canonical_correlations(x: np.ndarray, y: np.ndarray, epsilon: float = 1e-10
                           ) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
  """The canonical correlations of two representations, as
  `cca_core.get_cca_similarity` (google/svcca, cca_core.py) computes them: the
  joint covariance (np.cov), each block scaled by the largest absolute entry of
  its own covariance, neurons whose scaled variance is below `epsilon` dropped
  (`remove_small`), `epsilon` added to the diagonals, and the singular values of
  Sxx^(-1/2) Sxy Syy^(-1/2) (`compute_ccas`; the inverse square roots from the
  pseudo-inverse's eigendecomposition).

  Args:
    x: (n, ...) the first representation, n examples.
    y: (n, ...) the second.
    epsilon: google/svcca's `epsilon` (their tutorial's 1e-10).

  Returns:
    (the correlations, largest first; what PWCCA reads: 'u' the left singular
    vectors, 'x_kept' and 'y_kept' the neurons kept).

  Raises:
    ValueError: fewer examples than features on either side.
  """
  a, b = _neurons(x), _neurons(y)
  for name, acts in (('first', a), ('second', b)):
    if acts.shape[0] >= acts.shape[1]:
      raise ValueError(f'CCA needs more examples than features: the {name} representation has '
                       f'{acts.shape[0]} features and {acts.shape[1]} examples; give more '
                       'examples, or use SVCCA, which keeps fewer directions.')
  numx = a.shape[0]
  covariance = np.cov(a, b)
  sxx, sxy = covariance[:numx, :numx], covariance[:numx, numx:]
  syy = covariance[numx:, numx:]
  xmax, ymax = np.max(np.abs(sxx)), np.max(np.abs(syy))
  sxx, syy, sxy = sxx / xmax, syy / ymax, sxy / np.sqrt(xmax * ymax)
  x_kept, y_kept = np.abs(np.diagonal(sxx)) >= epsilon, np.abs(np.diagonal(syy)) >= epsilon
  sxx, syy, sxy = sxx[x_kept][:, x_kept], syy[y_kept][:, y_kept], sxy[x_kept][:, y_kept]
  sxx = sxx + epsilon * np.eye(len(sxx))
  syy = syy + epsilon * np.eye(len(syy))
  arr = _sqrt_psd(np.linalg.pinv(sxx)) @ sxy @ _sqrt_psd(np.linalg.pinv(syy))
  u, s, _ = np.linalg.svd(arr)
  return np.abs(s), {'u': u, 'x_kept': x_kept, 'y_kept': y_kept}


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
  """The square root of a symmetric matrix through its eigendecomposition
  (`positivedef_matrix_sqrt` in cca_core.py)."""
  w, v = np.linalg.eigh(matrix)
  return (v * np.sqrt(w)) @ v.T


def svcca(x: np.ndarray, y: np.ndarray, dims: Optional[int] = None,
          kept_share: float = 0.99, epsilon: float = 1e-10) -> float:
  """SVCCA (Raghu et al. 2017): each representation centred and reduced to its top
  singular directions (scaled by their singular values), then the mean canonical
  correlation of the two, as google/svcca's tutorial computes it
  (tutorials/001_Introduction.ipynb: `np.dot(s1[:20]*np.eye(20), V1[:20])`, then
  `np.mean(get_cca_similarity(...)["cca_coef1"])`).

  Args:
    x: (n, ...) the first representation.
    y: (n, ...) the second.
    dims: directions kept of each (the tutorial's 20); None: the fewest whose
      singular values sum to `kept_share` of the total (the paper's 99%, the sum as
      the tutorial measures the share).
    kept_share: the share of the singular values' sum kept when `dims` is None.
    epsilon: google/svcca's `epsilon`.

  Returns:
    The mean canonical correlation, in [0, 1].
  """
  reduced = []
  for acts in (_neurons(x), _neurons(y)):
    _, s, v = np.linalg.svd(acts - acts.mean(axis=1, keepdims=True), full_matrices=False)
    reduced.append(top_directions(s, v.T, dims, kept_share))
  correlations, _ = canonical_correlations(*reduced, epsilon=epsilon)
  return float(np.mean(correlations))


def top_directions(singular_values: np.ndarray, directions: np.ndarray,
                   dims: Optional[int] = None, kept_share: float = 0.99) -> np.ndarray:
  """SVCCA's reduction of one representation: its top singular directions over the
  examples, each scaled by its singular value.

  Args:
    singular_values: the centred representation's singular values, largest first.
    directions: (n, r) its singular vectors over the n examples, in that order.
    dims: directions kept (None: by `kept_share`, as `svcca`).
    kept_share: the share of the singular values' sum kept when `dims` is None.

  Returns:
    The (n, kept) reduced representation.
  """
  s = singular_values
  keep = dims or int(np.searchsorted(np.cumsum(s) / np.sum(s), kept_share) + 1)
  keep = min(keep, len(s))
  return directions[:, :keep] * s[:keep]


def reduced_from_gram(gram: np.ndarray, dims: Optional[int] = None,
                      kept_share: float = 0.99) -> np.ndarray:
  """`top_directions` from the centred linear Gram matrix, whose eigenvalues are the
  squared singular values and whose eigenvectors the singular vectors over the
  examples: for layers with more features than examples.

  Args:
    gram: the (n, n) Gram matrix of the centred features.
    dims: directions kept (None: by `kept_share`).
    kept_share: the share of the singular values' sum kept when `dims` is None.

  Returns:
    The (n, kept) reduced representation.
  """
  w, v = np.linalg.eigh(gram)
  order = np.argsort(w)[::-1]
  return top_directions(np.sqrt(np.maximum(w[order], 0.)), v[:, order], dims, kept_share)


def pwcca(x: np.ndarray, y: np.ndarray, epsilon: float = 1e-10) -> float:
  """Projection-weighted CCA (Morcos et al. 2018), as `compute_pwcca` (google/svcca,
  pwcca.py) computes it: the canonical correlations weighted by how much of the
  representation with fewer kept neurons each canonical direction accounts for
  (its directions `coef_x (acts - mean) + mean`, orthonormalised by QR; a
  direction's weight the summed absolute projection of the activations on it).
  Where the second representation keeps fewer neurons, pwcca.py indexes the first
  representation with the second's mask (an error unless the sizes agree); here
  the second is weighed, the two swapped.

  Args:
    x: (n, ...) the first representation.
    y: (n, ...) the second.
    epsilon: google/svcca's `epsilon` (the tutorial's 1e-10).

  Returns:
    The weighted mean canonical correlation, in [0, 1].
  """
  correlations, found = canonical_correlations(x, y, epsilon)
  if found['x_kept'].sum() > found['y_kept'].sum():
    return pwcca(y, x, epsilon)
  acts = _neurons(x)[found['x_kept']]
  means = acts.mean(axis=1, keepdims=True)
  directions = found['u'].T @ (acts - means) + means
  basis, _ = np.linalg.qr(directions.T)
  weights = np.sum(np.abs(basis.T @ acts.T), axis=1)
  weights = weights / np.sum(weights)
  return float(np.sum(weights * correlations))
