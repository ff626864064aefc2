"""Park & Kim's calibration bins (their `ops/tests.py`): 10 equal-width bins of the
top-class confidence, and the expected calibration error over them.

Their binning is kept as they wrote it: a prediction counts towards a bin's
accuracy and size when its confidence c lies in (start, end], and towards the
bin's summed confidence when c lies in [start, end); a bin's mean confidence is
that sum over its size (+1e-7). The two differ only for a confidence exactly on
an edge, such as a saturated 1.0 in float32, which then adds to the last bin's
size and accuracy but not to its confidence.

`bin_sums` uses array operators and methods only, so that the same code sums
numpy arrays in float64 (the analysis) and traced arrays inside a compiled
evaluation step (training's evaluations, summed over batches and devices).
The authors compare float32 confidences with float64 edges (numpy promotes the
confidence); a compiled step compares in the confidence's dtype, so each edge is
rounded towards the side that keeps every comparison's answer
(`edges_for`): 0.7 in float32 is 0.69999999, and a confidence of exactly that
value lies below the authors' edge, not on it.
"""
from typing import Dict, Mapping, Tuple

import numpy as np

EDGES = np.linspace(0., 1., 11)  # the authors' 10 bins
EPS = 1e-7  # the authors' guard against empty bins


def edges_for(dtype) -> Tuple[np.ndarray, np.ndarray]:
  """`EDGES` in `dtype` rounded down and rounded up: for any x of that dtype,
  x > e and x <= e are x > down and x <= down, and x >= e and x < e are x >= up
  and x < up, exactly as the comparisons with the float64 edges e.

  Args:
    dtype: a floating dtype numpy knows (float16, float32, float64).

  Returns:
    (down, up), two arrays of `dtype` like `EDGES`.
  """
  dtype = np.dtype(dtype)
  near = EDGES.astype(dtype)
  wide = near.astype(np.float64)
  down = np.where(wide > EDGES, np.nextafter(near, dtype.type(-np.inf)), near)
  up = np.where(wide < EDGES, np.nextafter(near, dtype.type(np.inf)), near)
  return down.astype(dtype), up.astype(dtype)


def bin_sums(confidence, correct, weight=1.) -> Dict[str, object]:
  """Per bin: the (weighted) number of predictions, of correct ones, and their
  summed confidence, binned as the authors do (module docstring).

  Args:
    confidence: (examples,) top-class confidences, a numpy or traced array.
    correct: (examples,) whether each prediction was right.
    weight: a weight per example (the evaluation's padding mask), or 1.

  Returns:
    'count', 'correct' and 'confidence', each (10,) sums per bin.
  """
  down, up = edges_for(confidence.dtype)
  counted = (confidence[None] > down[:-1, None]) & (confidence[None] <= down[1:, None])
  summed = (confidence[None] >= up[:-1, None]) & (confidence[None] < up[1:, None])
  return {'count': (counted * weight).sum(axis=1),
          'correct': (counted * correct[None] * weight).sum(axis=1),
          'confidence': (summed * confidence[None] * weight).sum(axis=1)}


def bins(sums: Mapping[str, object]) -> Dict[str, np.ndarray]:
  """Per bin from `bin_sums`: size, accuracy (0 where empty), mean confidence.

  Args:
    sums: `bin_sums`' counts, correct predictions and confidences per bin.

  Returns:
    {'count', 'accuracy', 'confidence'}, each per bin.
  """
  count = np.asarray(sums['count'], np.float64)
  return {'count': count,
          'accuracy': np.divide(np.asarray(sums['correct'], np.float64), count,
                                out=np.zeros_like(count), where=count > 0),
          'confidence': np.asarray(sums['confidence'], np.float64) / (count + EPS)}


def ece(binned: Mapping[str, np.ndarray], signed: bool = False) -> float:
  """sum_b |acc_b - conf_b| n_b / N, or with `signed` sum_b (conf_b - acc_b) n_b / N
  (positive: over-confident), from `bins`.

  Args:
    binned: `bins`' result.
    signed: the signed form.

  Returns:
    The ECE.
  """
  share = binned['count'] / (binned['count'].sum() + EPS)
  gap = binned['confidence'] - binned['accuracy']
  return float(np.sum((gap if signed else np.abs(gap)) * share))
