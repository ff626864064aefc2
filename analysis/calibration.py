"""Calibration as Park & Kim measure it (their `ops/tests.py`): accuracy, NLL,
the Brier score, and the expected calibration error over 10 equal-width bins of
the top-class confidence, with its signed form.

Their binning is kept as they wrote it: a prediction counts towards a bin's
accuracy and size when its confidence c lies in (start, end], and towards the
bin's summed confidence when c lies in [start, end); a bin's mean confidence is
that sum over its size (+1e-7). The two differ only for a confidence exactly on
an edge, such as a saturated 1.0 in float32, which then adds to the last bin's
size and accuracy but not to its confidence.
"""
from typing import Dict

import numpy as np

EDGES = np.linspace(0., 1., 11)  # the authors' 10 bins
EPS = 1e-7  # the authors' guard against empty bins


def bins(confidence: np.ndarray, correct: np.ndarray, edges: np.ndarray = EDGES
         ) -> Dict[str, np.ndarray]:
  """Per bin of the top-class `confidence` (one per example, with whether the
  prediction was `correct`): its size, accuracy (0 where empty) and mean
  confidence, binned as the authors do (module docstring)."""
  confidence, correct = np.asarray(confidence, np.float64), np.asarray(correct, bool)
  starts, ends = np.asarray(edges[:-1])[:, None], np.asarray(edges[1:])[:, None]
  counted = (confidence[None] > starts) & (confidence[None] <= ends)  # (bins, examples)
  summed = (confidence[None] >= starts) & (confidence[None] < ends)
  count = counted.sum(axis=1).astype(np.float64)
  accuracy = np.divide((counted & correct[None]).sum(axis=1), count,
                       out=np.zeros_like(count), where=count > 0)
  return {'count': count, 'accuracy': accuracy,
          'confidence': (summed * confidence[None]).sum(axis=1) / (count + EPS)}


def ece(binned: Dict[str, np.ndarray], signed: bool = False) -> float:
  """sum_b |acc_b - conf_b| n_b / N, or with `signed` sum_b (conf_b - acc_b) n_b / N
  (positive: over-confident), from `bins`."""
  share = binned['count'] / (binned['count'].sum() + EPS)
  gap = binned['confidence'] - binned['accuracy']
  return float(np.sum((gap if signed else np.abs(gap)) * share))


def brier(probabilities: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """Per example, the squared distance between the predicted distribution and the
  one-hot label, summed over classes (in [0, 2])."""
  probabilities = np.asarray(probabilities, np.float64)
  return np.sum((np.eye(probabilities.shape[1])[np.asarray(labels)] - probabilities) ** 2, axis=1)


def bootstrap_stderr(confidence: np.ndarray, correct: np.ndarray, resamples: int = 200,
                     seed: int = 0) -> Dict[str, float]:
  """Standard errors of the ECE and the signed ECE over `resamples` resamplings of
  the examples with replacement (the ECE is no mean over examples, so it has no
  closed-form one)."""
  rng = np.random.RandomState(seed)
  confidence, correct = np.asarray(confidence), np.asarray(correct)
  draws = [rng.randint(0, len(confidence), len(confidence)) for _ in range(resamples)]
  binned = [bins(confidence[d], correct[d]) for d in draws]
  return {'ece': float(np.std([ece(b) for b in binned], ddof=1)),
          'signed_ece': float(np.std([ece(b, signed=True) for b in binned], ddof=1))}
