"""Orthogonal Procrustes distance between two representations (Ding, Denain &
Steinhardt 2021, "Grounding Representation Similarity with Statistical Testing")."""
import numpy as np


def procrustes_distance(x: np.ndarray, y: np.ndarray) -> float:
  """The Procrustes distance as js-d/sim_metric computes it: each feature centred
  over the examples and each representation scaled to unit Frobenius norm
  (dists/score_pair.py, `score_local_pair`), then ||A||^2 + ||B||^2 - 2 ||A B^T||_*
  (dists/scoring.py, `procrustes`; A, B their (features, examples) matrices), which
  is 2 - 2 ||X^T Y||_*: the squared distance left after the best rotation of one
  onto the other. 0 for representations equal up to a rotation and a scale, 2 at
  most. The nuclear norm is taken from the two thin SVDs (the singular values of
  S_x U_x^T U_y S_y), so wide layers cost no (features x features) matrix.

  Args:
    x: (n, ...) the first representation, n examples.
    y: (n, ...) the second.

  Returns:
    The distance.
  """
  a, b = (_unit(v) for v in (x, y))
  ua, sa, _ = np.linalg.svd(a, full_matrices=False)
  ub, sb, _ = np.linalg.svd(b, full_matrices=False)
  nuclear = np.linalg.svd((sa[:, None] * (ua.T @ ub)) * sb[None, :], compute_uv=False).sum()
  return float(np.sum(a ** 2) + np.sum(b ** 2) - 2 * nuclear)


def _unit(x: np.ndarray) -> np.ndarray:
  """(n, ...) -> (n, d), each feature centred over the examples, unit Frobenius norm."""
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  x = x - x.mean(axis=0, keepdims=True)
  return x / np.linalg.norm(x)


def unit_root(gram: np.ndarray) -> np.ndarray:
  """The square root of a centred linear Gram matrix scaled to unit trace: what
  `distance_from_grams` takes of one representation (unit trace is the unit
  Frobenius norm of the centred features).

  Args:
    gram: the (n, n) Gram matrix of the representation's centred features.

  Returns:
    The (n, n) symmetric square root of gram / trace(gram).
  """
  w, v = np.linalg.eigh(gram / np.trace(gram))
  return (v * np.sqrt(np.maximum(w, 0.))) @ v.T


def distance_from_grams(root_x: np.ndarray, gram_y: np.ndarray) -> float:
  """`procrustes_distance` from n x n matrices, for layers with more features than
  examples: ||X^T Y||_* of the unit-norm centred features is the sum of the square
  roots of the eigenvalues of K_x^(1/2) K_y K_x^(1/2) (K the unit-trace Gram
  matrices), so the distance is 2 - 2 sum(sqrt(eig)).

  Args:
    root_x: `unit_root` of the first representation's centred Gram matrix.
    gram_y: the second representation's centred Gram matrix.

  Returns:
    The distance.
  """
  product = root_x @ (gram_y / np.trace(gram_y)) @ root_x
  return float(2. - 2. * np.sum(np.sqrt(np.maximum(np.linalg.eigvalsh(product), 0.))))


def distance_from_features(x: np.ndarray, gram_y: np.ndarray) -> float:
  """`procrustes_distance` from one representation's centred features and the
  other's centred Gram matrix, for a first one narrower than the examples are
  many: the squared singular values of X^T Y are the eigenvalues of the (d x d)
  matrix X^T K_y X, each side scaled to unit Frobenius norm.

  Args:
    x: (n, d) the first representation's features, centred over the examples.
    gram_y: the second representation's centred Gram matrix.

  Returns:
    The distance.
  """
  inner = x.T @ gram_y @ x / (np.sum(x ** 2) * np.trace(gram_y))
  return float(2. - 2. * np.sum(np.sqrt(np.maximum(np.linalg.eigvalsh(inner), 0.))))
