"""Calibration as Park & Kim measure it (their `ops/tests.py`): accuracy, NLL,
the Brier score, and the expected calibration error over 10 equal-width bins of
the top-class confidence (`vit_jax.calibration`, which training's evaluations
use too), with its signed form.
"""
from typing import Dict

import numpy as np

from analysis.measures import uncertainty
from vit_jax import calibration as _bins
from vit_jax.calibration import EDGES, ece

__all__ = ['EDGES', 'bins', 'brier', 'bootstrap_stderr', 'ece']


def bins(confidence: np.ndarray, correct: np.ndarray) -> Dict[str, np.ndarray]:
  """Per bin of the top-class `confidence` (one per example, with whether the
  prediction was `correct`): its size, accuracy (0 where empty) and mean
  confidence, in float64, binned as the authors do.

  Args:
    confidence: (n,) top-class probabilities.
    correct: (n,) whether each prediction was right.

  Returns:
    {'count', 'accuracy', 'confidence'}, each an array over the bins.
  """
  return _bins.bins(_bins.bin_sums(np.asarray(confidence, np.float64),
                                   np.asarray(correct, bool)))


def brier(probabilities: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """Per example, the squared distance between the predicted distribution and the
  one-hot label, summed over classes (in [0, 2]).

  Args:
    probabilities: (n, classes) predicted distributions.
    labels: (n,) integer labels.

  Returns:
    The (n,) Brier scores.
  """
  probabilities = np.asarray(probabilities, np.float64)
  return np.sum((np.eye(probabilities.shape[1])[np.asarray(labels)] - probabilities) ** 2, axis=1)


def bootstrap_stderr(confidence: np.ndarray, correct: np.ndarray, resamples: int = 200,
                     seed: int = 0) -> Dict[str, float]:
  """Standard errors of the ECE and the signed ECE over `resamples` resamplings of
  the examples with replacement (the ECE is no mean over examples, so it has no
  closed-form one; `uncertainty.bootstrap_stderr`).

  Args:
    confidence: (n,) top-class probabilities.
    correct: (n,) whether each prediction was right.
    resamples: the bootstrap resamplings.
    seed: their randomness.

  Returns:
    {'ece': ..., 'signed_ece': ...} standard errors.
  """
  confidence, correct = np.asarray(confidence), np.asarray(correct)

  def both(draw):
    binned = bins(confidence[draw], correct[draw])
    return [ece(binned), ece(binned, signed=True)]

  spread = uncertainty.bootstrap_stderr(both, len(confidence), resamples, seed)
  return {'ece': float(spread[0]), 'signed_ece': float(spread[1])}
