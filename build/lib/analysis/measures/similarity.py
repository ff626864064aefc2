"""Centred kernel alignment (Kornblith et al. 2019) and its minibatch form (Nguyen et al. 2021).

Representations are (n, ...) arrays, flattened per example and centred before
Gram matrices are formed. The biased estimator double-centres the Gram matrices;
the unbiased one uses HSIC1 (Song et al. 2012), so CKA of independent features
tends to 0 instead of a positive bias that grows with the feature dimension.
"""
from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def flatten_centred(x: jax.Array) -> jax.Array:
  """(n, ...) -> (n, d) with every feature centred over the n examples.

  Args:
    x: a representation of n examples.

  Returns:
    The (n, d) centred features.
  """
  x = jnp.reshape(x, (x.shape[0], -1))
  return x - jnp.mean(x, axis=0, keepdims=True)


def gram_linear(x: jax.Array) -> jax.Array:
  """Linear-kernel Gram matrix of the flattened, centred examples.

  Args:
    x: a representation of n examples, (n, ...).

  Returns:
    The (n, n) Gram matrix.
  """
  x = flatten_centred(x)
  return x @ x.T


def gram_rbf(x: jax.Array, threshold: float = 1.0) -> jax.Array:
  """RBF Gram matrix, bandwidth `threshold` times the median pairwise distance.

  The median is over all n^2 squared distances, the zero diagonal included, as in
  Kornblith et al.; so the kernel is exp(-d^2 / (2 threshold^2 median(d^2))).

  Args:
    x: a representation of n examples, (n, ...).
    threshold: the bandwidth in units of the median distance.

  Returns:
    The (n, n) Gram matrix.
  """
  dot = gram_linear(x)
  sq_norms = jnp.diag(dot)
  sq_distances = jnp.maximum(sq_norms[:, None] + sq_norms[None, :] - 2 * dot, 0)
  return jnp.exp(-sq_distances / (2 * threshold**2 * jnp.median(sq_distances)))


def center_gram(gram: jax.Array, unbiased: bool = False) -> jax.Array:
  """Centres a symmetric Gram matrix.

  Biased: H K H with H = I - 11^T/n. Unbiased: the matrix whose Frobenius inner
  product with another one so centred is n(n-3) HSIC1, the U-statistic.

  Args:
    gram: an (n, n) symmetric Gram matrix.
    unbiased: centre for HSIC1 instead of the biased HSIC.

  Returns:
    The centred (n, n) matrix.
  """
  n = gram.shape[0]
  if not unbiased:
    gram = gram - jnp.mean(gram, axis=0, keepdims=True)
    return gram - jnp.mean(gram, axis=1, keepdims=True)
  off_diagonal = 1 - jnp.eye(n, dtype=gram.dtype)
  gram = gram * off_diagonal
  means = jnp.sum(gram, axis=0) / (n - 2)
  means = means - jnp.sum(means) / (2 * (n - 1))
  return (gram - means[:, None] - means[None, :]) * off_diagonal


def cka(gram_x: jax.Array, gram_y: jax.Array, unbiased: bool = False) -> jax.Array:
  """CKA of two Gram matrices over the same n examples.

  Args:
    gram_x: the (n, n) Gram matrix of one representation.
    gram_y: that of the other, over the same examples in the same order.
    unbiased: with HSIC1 (Nguyen et al.'s estimator) instead of the biased HSIC.

  Returns:
    The CKA, a scalar.
  """
  return cka_of_centred(center_gram(gram_x, unbiased), center_gram(gram_y, unbiased))


def cka_of_centred(centred_x: jax.Array, centred_y: jax.Array) -> jax.Array:
  """CKA of two Gram matrices already centred by `center_gram` (either way): their
  Frobenius inner product over the product of their norms.

  Args:
    centred_x: the (n, n) centred Gram matrix of one representation.
    centred_y: that of the other, centred the same way.

  Returns:
    The CKA, a scalar.
  """
  hsic = jnp.vdot(centred_x, centred_y)
  return hsic / (jnp.linalg.norm(centred_x) * jnp.linalg.norm(centred_y))


def linear_cka(x: jax.Array, y: jax.Array, unbiased: bool = False) -> jax.Array:
  """Linear CKA from features, without n x n matrices: O(n d^2) instead of O(n^2 d).

  Equal to `cka(gram_linear(x), gram_linear(y), unbiased)`. With centred
  features K1 = 0, so the HSIC1 correction terms reduce to the diagonals
  (squared row norms) of the Gram matrices.

  Args:
    x: one representation of n examples, (n, ...).
    y: another of the same examples, (n, ...).
    unbiased: with HSIC1 instead of the biased HSIC.

  Returns:
    The linear CKA, a scalar.
  """
  x, y = flatten_centred(x), flatten_centred(y)
  n = x.shape[0]

  def similarity(a, b):
    dot = jnp.sum((b.T @ a) ** 2)  # tr(K_a K_b)
    if not unbiased:
      return dot
    rows_a, rows_b = jnp.sum(a**2, axis=1), jnp.sum(b**2, axis=1)
    return (dot - n / (n - 2) * jnp.vdot(rows_a, rows_b)
            + jnp.sum(rows_a) * jnp.sum(rows_b) / ((n - 1) * (n - 2)))

  return similarity(x, y) / jnp.sqrt(similarity(x, x) * similarity(y, y))


def minibatch_hsic(features: Sequence[jax.Array], kernel: str = 'linear',
                   unbiased: bool = True, threshold: float = 1.0) -> jax.Array:
  """(L, L) matrix of n(n-3) HSIC1 (or n^2 biased HSIC) between L representations
  of one batch of n examples: one centred Gram matrix per layer, then one product.

  Args:
    features: L representations of the same n examples, each (n, ...).
    kernel: 'linear' or 'rbf' (`gram_rbf`).
    unbiased: HSIC1 instead of the biased HSIC.
    threshold: the RBF bandwidth in units of the median distance.

  Returns:
    The (L, L) HSIC matrix.
  """
  def centred(x):
    gram = gram_linear(x) if kernel == 'linear' else gram_rbf(x, threshold)
    return center_gram(gram, unbiased).reshape(-1)

  if kernel not in ('linear', 'rbf'):
    raise ValueError(f"kernel must be 'linear' or 'rbf', not {kernel!r}.")
  grams = jnp.stack([centred(x.astype(jnp.float32)) for x in features])
  return grams @ grams.T


def cka_from_hsic(hsic: np.ndarray) -> np.ndarray:
  """CKA matrix from a (summed) HSIC matrix: HSIC_ij / sqrt(HSIC_ii HSIC_jj).

  Args:
    hsic: an (L, L) HSIC matrix, one batch's or summed over batches.

  Returns:
    The (L, L) CKA matrix.
  """
  diagonal = np.sqrt(np.diag(hsic))
  return hsic / np.outer(diagonal, diagonal)


def offdiag_mean(matrix: np.ndarray) -> float:
  """The mean similarity between distinct layers of a square CKA matrix: how
  uniform a model's representations are across depth.

  Args:
    matrix: an (L, L) CKA matrix.

  Returns:
    The mean of its off-diagonal entries.
  """
  matrix = np.asarray(matrix, np.float64)
  return float(matrix[~np.eye(len(matrix), dtype=bool)].mean())


class MinibatchCKA:
  """All-pairs minibatch CKA streamed over batches: the ratio of summed HSIC1 values
  (not a mean of per-batch CKAs), which is unbiased when the batches are. Sums are
  kept in float64 on the host. Each batch's own CKA matrix is kept as well
  (`per_batch`, O(L^2) a batch): their spread is the estimate's uncertainty.
  """

  def __init__(self, kernel: str = 'linear', unbiased: bool = True, threshold: float = 1.0):
    self._hsic_fn = jax.jit(lambda feats: minibatch_hsic(feats, kernel, unbiased, threshold))
    self.hsic_sum: Optional[np.ndarray] = None
    self.num_examples = 0
    self.per_batch: List[np.ndarray] = []

  def update(self, features: Sequence[jax.Array]) -> None:
    """Adds one batch.

    Args:
      features: the L representations of the batch's examples, each (n, ...).
    """
    hsic = np.asarray(self._hsic_fn(list(features)), dtype=np.float64)
    self.hsic_sum = hsic if self.hsic_sum is None else self.hsic_sum + hsic
    self.num_examples += features[0].shape[0]
    self.per_batch.append(cka_from_hsic(hsic))

  def result(self) -> np.ndarray:
    """The (L, L) CKA matrix of every batch added, from the summed HSIC."""
    if self.hsic_sum is None:
      raise ValueError('No batches were added to MinibatchCKA.')
    return cka_from_hsic(self.hsic_sum)
