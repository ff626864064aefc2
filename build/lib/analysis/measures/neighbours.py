"""Mutual k-nearest-neighbour alignment of two representations (Huh et al. 2024,
"The Platonic Representation Hypothesis")."""
from typing import Optional, Sequence

import numpy as np


def clip_outliers(x: np.ndarray, quantile: float = 0.95,
                  bound: Optional[float] = None) -> np.ndarray:
  """Every entry clipped to the `quantile` of the absolute entries, as
  platonic-rep's `remove_outliers` (metrics.py line 327) with `exact=True` (the
  sorted absolute values at index int(quantile * size)), which `prepare_features`
  applies before measuring (platonic/alignment.py line 84, measure_alignment.py
  line 103).

  Args:
    x: any array.
    quantile: the share of absolute entries left unclipped; 1 leaves `x` as it is.
    bound: the bound to clip at, where it was found over more than `x`
      (`stacked_bound`); None: `x`'s own.

  Returns:
    The clipped array.
  """
  if quantile == 1:
    return x
  if bound is None:
    bound = stacked_bound([np.abs(x).reshape(-1)], x.size, quantile)
  return np.clip(x, -bound, bound)


def largest_entries(x: np.ndarray, total: int, quantile: float) -> np.ndarray:
  """The absolute entries of `x` that can decide `stacked_bound` of a stack of
  `total` entries holding `x`: its largest total - int(quantile * total).

  Args:
    x: one layer's features.
    total: the entries of the whole stack.
    quantile: as in `clip_outliers`.

  Returns:
    Those absolute entries, in no order.
  """
  flat = np.abs(np.asarray(x)).reshape(-1)
  keep = max(total - int(quantile * total), 1)
  if keep >= flat.size:
    return flat
  return np.partition(flat, flat.size - keep)[flat.size - keep:]


def stacked_bound(parts: Sequence[np.ndarray], total: int, quantile: float) -> float:
  """platonic-rep's clipping bound over a model's layers stacked into one (N, L, D)
  tensor (`prepare_features` on the stacked features, measure_alignment.py line
  103; `remove_outliers`' exact branch, metrics.py line 333): the sorted absolute
  entries of the whole stack at index int(quantile * total).

  Args:
    parts: each layer's absolute entries, or the largest of them
      (`largest_entries`).
    total: the entries of the whole stack.
    quantile: the share left unclipped.

  Returns:
    The bound.
  """
  values = np.concatenate([np.asarray(p).reshape(-1) for p in parts])
  keep = max(total - int(quantile * total), 1)  # the bound is the keep-th largest entry
  return float(np.partition(values, values.size - keep)[values.size - keep])


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
