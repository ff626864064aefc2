"""Similarity scores calibrated against their permutation null (Gröger, Wen and
Brbić 2026, "Revisiting the Platonic Representation Hypothesis: An Aristotelian
View"), as the authors' package `calibrated-similarity` computes them
(mlbio-epfl/Aristotelian; calibrated_similarity/calibration.py, version 0.1.1).

A similarity of two representations of the same n images is compared with the
similarities left when the images of the second are shuffled (its rows
permuted), which keep each representation's size and spectrum but break the
correspondence: the threshold is the (1 - alpha) order statistic of the
observed score and the K null scores together, the p-value the add-one
permutation p-value, and the calibrated score the observed score's excess over
the threshold, rescaled so that the attainable maximum stays 1 (`calibrate`,
Algorithm 1). A layer-by-layer comparison is calibrated as one statistic, the
maximum or the mean of its matrix, each null matrix taken under one
permutation of every layer of the second model (`calibrate_layers`, Algorithm 2).
"""
import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

# The authors' defaults (calibration.py:101-103, 211-213): 200 permutations, a 5% level,
# scores bounded by 1.
PERMUTATIONS = 200
ALPHA = 0.05
SMAX = 1.0
# calibration.py:21: the smallest denominator of the rescaling.
_EPSILON = 1e-12

Similarity = Callable[[np.ndarray, np.ndarray], float]


@dataclasses.dataclass(frozen=True)
class Calibrated:
  """A score beside its null: the raw score, the calibrated one (0 where the raw
  one does not exceed the null's threshold), the add-one p-value and the threshold."""
  raw: float
  score: float
  p_value: float
  threshold: float


def row_permutations(n: int, count: int = PERMUTATIONS, seed: int = 0) -> np.ndarray:
  """`count` random permutations of n rows, each drawn independently (as the
  authors' `torch.randperm` per permutation, calibration.py:172-177).

  Args:
    n: the images.
    count: the permutations, K.
    seed: the draws' seed.

  Returns:
    (count, n) row indices.
  """
  rng = np.random.default_rng(seed)
  return np.stack([rng.permutation(n) for _ in range(count)]) if count else np.zeros((0, n), int)


def check_null(n: int, count: int, alpha: float = ALPHA) -> None:
  """Refuses a null that cannot be estimated: fewer than two images (no
  permutation changes anything), or too few permutations for any p-value to fall
  below `alpha` (the smallest, 1 / (K + 1), must).

  Args:
    n: the images.
    count: the permutations, K.
    alpha: the level.

  Raises:
    ValueError: saying what to change.
  """
  if not 0 < alpha < 1:
    raise ValueError(f'The level is {alpha}; it must lie strictly between 0 and 1.')
  if n < 2:
    raise ValueError(f'A permutation null needs at least 2 images; {n} were given.')
  if count + 1 < math.ceil(1 / alpha):
    raise ValueError(f'{count} permutations cannot give a p-value below {alpha} (the '
                     f'smallest is 1/{count + 1}); use at least {math.ceil(1 / alpha) - 1}.')


def calibrated(observed: float, null: Sequence[float], alpha: float = ALPHA,
               smax: float = SMAX) -> Calibrated:
  """An observed score calibrated against K null scores: the threshold tau, the
  ceil((1 - alpha)(K + 1))-th smallest of the observed and null scores together
  (calibration.py:183-188); the p-value (1 + #{null >= observed}) / (K + 1)
  (:191); the score clip((observed - tau) / max(smax - tau, 1e-12), 0, 1)
  (:196-199), or relu(observed - tau) with `smax` None (:194-195).

  Args:
    observed: the score.
    null: the K scores under the permutations.
    alpha: the level.
    smax: the attainable maximum of the score; None for an unbounded one.

  Returns:
    The calibrated score.
  """
  null = np.asarray(null, np.float64)
  count = len(null)
  check_null(2, count, alpha)
  combined = np.sort(np.concatenate([[observed], null]))
  tau = float(combined[min(max(math.ceil((1 - alpha) * (count + 1)) - 1, 0), count)])
  p_value = (1 + np.sum(null >= observed)) / (count + 1)
  if smax is None:
    score = max(observed - tau, 0.)
  else:
    score = float(np.clip((observed - tau) / max(smax - tau, _EPSILON), 0., 1.))
  return Calibrated(float(observed), score, float(p_value), tau)


def calibrate(x: np.ndarray, y: np.ndarray, similarity: Similarity,
              permutations: np.ndarray, alpha: float = ALPHA,
              smax: float = SMAX) -> Calibrated:
  """`similarity(x, y)` calibrated against `similarity(x, y[pi])` for each
  permutation pi of the images (Algorithm 1, `calibrate`).

  Args:
    x: (n, ...) the first representation.
    y: (n, ...) the second, of the same images in the same order.
    similarity: the measure, a score of two representations.
    permutations: (K, n) row permutations (`row_permutations`).
    alpha: the level.
    smax: the measure's attainable maximum; None for an unbounded one.

  Returns:
    The calibrated score.
  """
  x, y, permutations = np.asarray(x), np.asarray(y), np.asarray(permutations)
  _check(len(x), [y], permutations, alpha)
  null = [similarity(x, y[pi]) for pi in permutations]
  return calibrated(float(similarity(x, y)), null, alpha, smax)


def calibrate_layers(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray],
                     similarity: Similarity, permutations: np.ndarray,
                     aggregate: str = 'max', alpha: float = ALPHA,
                     smax: float = SMAX) -> Calibrated:
  """The maximum or mean of the layer-by-layer matrix S[i, j] = similarity(xs[i],
  ys[j]), calibrated against the same aggregate of the matrices in which every
  layer of `ys` has its images permuted by one permutation (Algorithm 2,
  `calibrate_layers`, calibration.py:300-322): the best-matching pair is searched
  in the null too, so the search inflates nothing.

  Args:
    xs: the first model's layers, (n, ...) each.
    ys: the second model's layers, of the same images.
    similarity: the measure.
    permutations: (K, n) row permutations.
    aggregate: 'max' (the authors' default) or 'mean'.
    alpha: the level.
    smax: the measure's attainable maximum; None for an unbounded one.

  Returns:
    The calibrated aggregate.
  """
  reduce = {'max': np.max, 'mean': np.mean}.get(aggregate)
  if reduce is None:
    raise ValueError(f"The aggregate is {aggregate!r}; use 'max' or 'mean'.")
  xs, ys = [np.asarray(x) for x in xs], [np.asarray(y) for y in ys]
  if not xs or not ys:
    raise ValueError('Each model needs at least one layer to compare.')
  permutations = np.asarray(permutations)
  _check(len(xs[0]), xs[1:] + ys, permutations, alpha)
  matrix = lambda order: reduce([[similarity(x, y[order]) for y in ys] for x in xs])
  null = [matrix(pi) for pi in permutations]
  return calibrated(float(matrix(np.arange(len(xs[0])))), null, alpha, smax)


def _check(n: int, others: Sequence[np.ndarray], permutations: np.ndarray,
           alpha: float) -> None:
  if any(len(o) != n for o in others):
    raise ValueError(f'The representations hold {sorted({n, *(len(o) for o in others)})} '
                     'images: give each the same images, in the same order.')
  if permutations.ndim != 2 or permutations.shape[1] != n or not np.all(
      np.sort(permutations, axis=1) == np.arange(n)):
    raise ValueError(f'The permutations must be a (K, {n}) array, each row a permutation of '
                     f'the {n} images (row_permutations makes them).')
  check_null(n, len(permutations), alpha)
