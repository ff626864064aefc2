"""Mutual k-nearest-neighbour alignment of two representations (Huh et al. 2024,
"The Platonic Representation Hypothesis")."""
import numpy as np


def clip_outliers(x: np.ndarray, quantile: float = 0.95) -> np.ndarray:
  """Every entry clipped to the `quantile` of the absolute entries, as
  platonic-rep's `remove_outliers` (metrics.py) with `exact=True` (the sorted
  absolute values at index int(quantile * size)), which `prepare_features` applies
  before measuring (platonic/alignment.py).

  Args:
    x: any array.
    quantile: the share of absolute entries left unclipped; 1 leaves `x` as it is.

  Returns:
    The clipped array.
  """
  if quantile == 1:
    return x
  bound = np.sort(np.abs(x).reshape(-1))[int(quantile * x.size)]
  return np.clip(x, -bound, bound)


def mutual_knn(x: np.ndarray, y: np.ndarray, k: int = 10, quantile: float = 0.95) -> float:
  """The mean share of each example's k nearest neighbours that the two
  representations agree on, as platonic-rep computes it: outliers clipped
  (`clip_outliers`), each example L2-normalised (`compute_score`'s F.normalize,
  measure_alignment.py), neighbours by inner product without the example itself
  (`compute_nearest_neighbors`, metrics.py), and |N_x(i) & N_y(i)| / k averaged
  over the examples (`AlignmentMetrics.mutual_knn`). 1 for representations with
  the same neighbourhoods; about k / (n - 1) for unrelated ones.

  Args:
    x: (n, ...) the first representation, n examples.
    y: (n, ...) the second.
    k: neighbours per example (platonic-rep's `topk`, 10 in their scripts).
    quantile: `clip_outliers`' quantile (0.95, theirs); 1 clips nothing.

  Returns:
    The alignment, in [0, 1].

  Raises:
    ValueError: k not below the number of examples.
  """
  n = len(x)
  if not 0 < k < n:
    raise ValueError(f'mutual_knn needs 0 < k < the {n} examples; got k={k}.')
  sets = []
  for v in (x, y):
    v = clip_outliers(np.asarray(v, np.float64).reshape(n, -1), quantile)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    similarity = v @ v.T
    np.fill_diagonal(similarity, -1e8)
    sets.append(np.argsort(-similarity, axis=1)[:, :k])
  return float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(*sets)]))
