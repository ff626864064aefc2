"""Calibration metrics against Park & Kim's code written out in numpy
(`ops/tests.py`: `cm`, `gacc`, `ece`, `brier`), and the calibration tool."""
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from analysis.measures import reliability
from analysis.tools import TOOLS
from helpers import init, tiny_vit
from vit_jax.training import steps
from vit_jax import calibration as bins

SOFTMAX = ml_collections.ConfigDict({'loss': 'softmax'})


def authors_ece(probabilities, labels):
  """Their `test`: per bin, a confusion matrix of the predictions with confidence in
  (start, end] gives the count and accuracy, the confidences in [start, end) the
  summed confidence; ECE = sum |acc - conf| count / (N + 1e-7)."""
  num_classes = probabilities.shape[1]
  confidence, predicted = probabilities.max(axis=1), probabilities.argmax(axis=1)
  counts, accs, confs = [], [], []
  for start, end in zip(np.linspace(0, 1, 11), np.linspace(0, 1, 11)[1:]):
    keep = (confidence > start) & (confidence <= end)
    cm = np.bincount(num_classes * labels[keep] + predicted[keep],
                     minlength=num_classes ** 2).reshape(num_classes, num_classes)
    count = cm.sum()
    acc = np.diag(cm).sum() / count if count else 0.
    summed = confidence[(confidence >= start) & (confidence < end)].sum()
    counts.append(count)
    accs.append(acc)
    confs.append(summed / (count + 1e-7))
  counts, accs, confs = map(np.array, (counts, accs, confs))
  freq = np.nan_to_num(counts / (counts.sum() + 1e-7))
  return counts, accs, confs, np.sum(np.abs(accs - confs) * freq), np.sum((confs - accs) * freq)


def _predictions(n=500, classes=4, seed=0):
  rng = np.random.RandomState(seed)
  logits = rng.randn(n, classes) * 3
  probabilities = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
  # Edge cases: a saturated prediction and confidences on the bin edges.
  probabilities[0] = [1., 0., 0., 0.]
  probabilities[1] = [0.5, 0.5, 0., 0.]
  probabilities[2] = [0.7, 0.1, 0.1, 0.1]
  return probabilities, rng.randint(0, classes, n)


def test_bins_and_ece_are_the_authors():
  probabilities, labels = _predictions()
  confidence = probabilities.max(1)
  binned = reliability.bins(confidence, probabilities.argmax(1) == labels)
  counts, accs, confs, ece, signed = authors_ece(probabilities, labels)
  np.testing.assert_array_equal(binned['count'], counts)
  np.testing.assert_allclose(binned['accuracy'], accs, rtol=1e-12)
  np.testing.assert_allclose(binned['confidence'], confs, rtol=1e-12)
  assert reliability.ece(binned) == pytest.approx(ece, rel=1e-12)
  assert reliability.ece(binned, signed=True) == pytest.approx(signed, rel=1e-12)
  # The saturated 1.0 counts in the last bin but adds nothing to its confidence sum.
  assert binned['count'][-1] == np.sum(confidence > 0.9)


def test_a_calibrated_predictor_has_no_calibration_error():
  """Confidence c right with probability c, many examples: ECE near 0, and the
  bootstrap spread of the order of its sampling noise."""
  rng = np.random.RandomState(1)
  confidence = rng.uniform(0.05, 0.95, 20000)
  correct = rng.uniform(size=20000) < confidence
  binned = reliability.bins(confidence, correct)
  assert reliability.ece(binned) < 0.02
  spread = reliability.bootstrap_stderr(confidence, correct, resamples=50)
  assert 0 < spread['ece'] < 0.01
  over = reliability.bins(confidence, rng.uniform(size=20000) < confidence - 0.1)
  assert reliability.ece(over, signed=True) == pytest.approx(0.1, abs=0.02)


def test_brier_is_the_squared_distance_to_the_one_hot_label():
  np.testing.assert_allclose(reliability.brier(np.array([[1., 0., 0.], [0.25, 0.25, 0.5]]),
                                               np.array([0, 2])),
                             [0., 0.25 ** 2 * 2 + 0.5 ** 2])
  probabilities, labels = _predictions()
  expected = [np.sum((np.eye(4)[y] - p) ** 2) for p, y in zip(probabilities, labels)]
  np.testing.assert_allclose(reliability.brier(probabilities, labels), expected, rtol=1e-12)


def test_the_calibration_tool(tmp_path):
  from helpers import TINY_VIT, batches, subject
  s = subject('ViT-Ti_16', 'vit', **TINY_VIT)
  result = TOOLS['calibration'].run_one(s, batches, str(tmp_path))
  json.dumps(result)
  assert result['num_images'] == 36 and sum(result['bin_count']) == 36
  nll = TOOLS['nll'].run_one(s, batches, str(tmp_path))  # the same NLL by optax
  assert result['nll'] == pytest.approx(nll['test_nll'], rel=1e-5)
  assert result['accuracy'] == pytest.approx(1 - nll['test_error'])
  assert 0 <= result['ece'] <= 1 and result['ece_stderr'] > 0
  assert 0 <= result['brier'] <= 2 and result['brier_stderr'] > 0
  assert all(os.path.exists(f) for f in result['figures'])
  joint = TOOLS['calibration'].joint({'a': result, 'b': result}, {}, str(tmp_path))
  assert len(joint) == 1 and os.path.exists(joint[0])


@pytest.mark.numerics
def test_training_evaluations_sum_the_authors_bins_over_masked_batches():
  """The evaluation step's ECE and Brier score (sums over batches, padding masked
  out) equal the authors' on the real examples; float32 logits, so the tolerances
  are float32's."""
  model = tiny_vit(4)
  params = init(model, 8)['params']
  rng = np.random.RandomState(0)
  sums, logits, labels = None, [], []
  for n in (16, 16, 9):  # the last batch padded to 16, as the evaluation pads it
    images = rng.uniform(-1, 1, (16, 8, 8, 3)).astype(np.float32)
    label = rng.randint(0, 4, 16)
    batch = {'image': images, 'label': np.eye(4, dtype=np.float32)[label],
             'mask': (np.arange(16) < n).astype(np.float32)}
    out = jax.jit(lambda p, b: steps.eval_step(p, b, model=model, config=SOFTMAX))(
        params, batch)
    sums = out if sums is None else jax.tree_util.tree_map(jnp.add, sums, out)
    logits.append(np.asarray(model.apply({'params': params}, images, train=False))[:n])
    labels.append(label[:n])
  probabilities = np.asarray(jax.nn.softmax(np.concatenate(logits)), np.float64)
  labels = np.concatenate(labels)
  counts, _, _, ece, _ = authors_ece(probabilities, labels)
  np.testing.assert_array_equal(sums['calibration']['count'], counts)
  assert bins.ece(bins.bins(sums['calibration'])) == pytest.approx(ece, abs=1e-5)
  assert float(sums['brier'] / sums['count']) == pytest.approx(
      reliability.brier(probabilities, labels).mean(), rel=1e-5)


def test_compiled_float32_bins_compare_with_the_authors_float64_edges():
  """The authors' numpy compares float32 confidences with np.linspace's float64
  edges; inside a compiled step the comparison is float32's. Confidences at each
  edge's float32 neighbours (0.7 is 0.69999999 in float32, below the authors' 0.7)
  land in the authors' bins."""
  edges = np.linspace(0., 1., 11)
  near = edges.astype(np.float32)
  confidence = np.unique(np.concatenate([near, np.nextafter(near, np.float32(0)),
                                         np.nextafter(near, np.float32(1))]))
  # XLA:CPU flushes denormals to zero: the float32 neighbour of 0 is left out.
  confidence = confidence[(confidence > 1e-30) & (confidence <= 1)].astype(np.float32)
  correct = np.arange(len(confidence)) % 2 == 0
  compiled = jax.jit(bins.bin_sums)(jnp.asarray(confidence), jnp.asarray(correct))
  wide = confidence.astype(np.float64)  # numpy's promotion in the authors' comparisons
  for i, (start, end) in enumerate(zip(edges, edges[1:])):
    counted = (wide > start) & (wide <= end)
    summed = (wide >= start) & (wide < end)
    assert float(compiled['count'][i]) == counted.sum(), (start, end)
    assert float(compiled['correct'][i]) == (counted & correct).sum(), (start, end)
    assert float(compiled['confidence'][i]) == pytest.approx(wide[summed].sum(), rel=1e-6)
