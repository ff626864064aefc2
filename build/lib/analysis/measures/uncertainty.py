"""Standard errors of the analysis numbers: binomial ones for accuracies, and the
spread of a per-batch quantity over the batches it is averaged from."""
from typing import Any, Callable, Sequence, Tuple

import numpy as np


def binomial_stderr(accuracy: Any, count: int) -> np.ndarray:
  """The standard error sqrt(p (1 - p) / n) of accuracies p measured on n images.

  Args:
    accuracy: one accuracy or an array of them.
    count: n, the images each was measured on.

  Returns:
    The standard errors, the shape of `accuracy`.
  """
  accuracy = np.asarray(accuracy, np.float64)
  return np.sqrt(accuracy * (1 - accuracy) / count)


def weighted_mean_stderr(values: Sequence[np.ndarray], weights: Sequence[float]
                         ) -> np.ndarray:
  """Standard error of the weighted mean sum_b w_b x_b of per-batch values x_b
  (weights normalised to sum 1): sqrt(B / (B - 1) sum_b w_b^2 (x_b - mean)^2), which
  for equal weights is the familiar std(x, ddof=1) / sqrt(B). NaN from one batch.

  Args:
    values: B per-batch values (arrays of one shape).
    weights: B weights (batch sizes).

  Returns:
    The standard error, the shape of one value.
  """
  x = np.asarray(values, np.float64)
  w = np.asarray(weights, np.float64) / np.sum(weights)
  w = w.reshape((-1,) + (1,) * (x.ndim - 1))
  if len(x) < 2:
    return np.full(x.shape[1:], np.nan)
  mean = np.sum(w * x, axis=0)
  return np.sqrt(len(x) / (len(x) - 1) * np.sum(w**2 * (x - mean) ** 2, axis=0))


def paired_drops(correct: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """The accuracy each edited model loses against the intact one on the same
  images, and the standard error of that paired difference over the images.

  Args:
    correct: (1 + edits, N) 1 where a model classified an image right, the intact
      model first.

  Returns:
    (the (edits,) drops, their standard errors: NaN with one image).
  """
  difference = correct[:1] - correct[1:]
  n = correct.shape[1]
  stderr = (difference.std(axis=1, ddof=1) / np.sqrt(n) if n > 1
            else np.full(len(difference), np.nan))
  return difference.mean(axis=1), stderr


def ratio_of_means(numerators: np.ndarray, denominators: np.ndarray
                   ) -> Tuple[np.ndarray, np.ndarray]:
  """R = mean(a) / mean(b) over paired samples, and its delta-method standard error
  sqrt(var(a - R b) / n) / |mean(b)|: a share whose parts come from the same images.

  Args:
    numerators: (..., N) samples a_i (a leading axis holds several ratios).
    denominators: (N,) samples b_i, shared by every ratio.

  Returns:
    (the ratios, their standard errors: NaN with one sample).
  """
  a = np.asarray(numerators, np.float64)
  b = np.asarray(denominators, np.float64)
  ratio = a.mean(-1) / b.mean()
  n = b.shape[-1]
  if n < 2:
    return ratio, np.full(np.shape(ratio), np.nan)
  residual = a - ratio[..., None] * b
  return ratio, residual.std(-1, ddof=1) / np.sqrt(n) / abs(b.mean())


def bootstrap_stderr(statistic: Callable[[np.ndarray], Any], n: int, resamples: int = 200,
                     seed: int = 0) -> np.ndarray:
  """The standard error of a statistic of n samples that is no mean over them (so
  has no closed-form one): the spread of `statistic` over `resamples` resamplings
  of the samples with replacement.

  Args:
    statistic: the samples' indices (n,) -> a number or an array of them.
    n: the number of samples.
    resamples: the bootstrap resamplings.
    seed: their randomness.

  Returns:
    The standard errors, the shape of `statistic`'s value.
  """
  rng = np.random.RandomState(seed)
  values = [np.asarray(statistic(rng.randint(0, n, n)), np.float64) for _ in range(resamples)]
  return np.std(values, axis=0, ddof=1)
