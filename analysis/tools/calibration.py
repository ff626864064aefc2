"""Calibration on the evaluation split with Park & Kim's metrics: accuracy, NLL,
Brier score, expected calibration error and a reliability diagram."""
import os
from typing import Dict, List, Mapping

import jax
import numpy as np

from analysis.measures import reliability, uncertainty
from analysis.reporting import plots
from analysis.runtime.estimate import Work
from analysis.tool import Batches, Subject, Tool, each_model, figure_path, per_model, register


def measure(subject: Subject, batches: Batches) -> Dict:
  """Softmax predictions on the evaluation split: accuracy (± binomial standard
  error), NLL and Brier score (± standard error of their means over images), the
  ECE and signed ECE over the authors' 10 confidence bins (± bootstrap standard
  error, `reliability.bootstrap_stderr`), the bins themselves and the reliability
  diagram.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  confidence, correct, nll, brier = [], [], [], []
  for images, labels in batches('eval'):
    probabilities = np.asarray(jax.nn.softmax(subject.logits(images).astype(np.float32)),
                               np.float64)
    labels = np.asarray(labels)
    confidence.append(probabilities.max(axis=1))
    correct.append(probabilities.argmax(axis=1) == labels)
    nll.append(-np.log(np.maximum(probabilities[np.arange(len(labels)), labels], 1e-300)))
    brier.append(reliability.brier(probabilities, labels))
  confidence, correct, nll, brier = map(np.concatenate, (confidence, correct, nll, brier))
  n = len(confidence)
  binned = reliability.bins(confidence, correct)
  spread = reliability.bootstrap_stderr(confidence, correct)
  accuracy = float(correct.mean())
  mean_stderr = lambda x: float(np.std(x, ddof=1) / np.sqrt(n)) if n > 1 else float('nan')
  return {'accuracy': accuracy,
          'accuracy_stderr': float(uncertainty.binomial_stderr(accuracy, n)),
          'nll': float(nll.mean()), 'nll_stderr': mean_stderr(nll),
          'brier': float(brier.mean()), 'brier_stderr': mean_stderr(brier),
          'ece': reliability.ece(binned), 'ece_stderr': spread['ece'],
          'signed_ece': reliability.ece(binned, signed=True),
          'signed_ece_stderr': spread['signed_ece'],
          'bin_edges': reliability.EDGES.tolist(), 'bin_count': binned['count'].tolist(),
          'bin_accuracy': binned['accuracy'].tolist(),
          'bin_confidence': binned['confidence'].tolist(), 'num_images': n}


def draw(result: Mapping, subject: Subject, out: str) -> List[str]:
  """The figure of the tool's numbers (`measure`): the reliability diagram of its bins.

  See `analysis.tool.Draw`.
  """
  return [plots.reliability(np.asarray(result['bin_count']), np.asarray(result['bin_accuracy']),
                            np.asarray(result['bin_edges']),
                            figure_path(out, 'calibration', subject),
                            f'Calibration: {subject.label}',
                            plots.KIND_COLOURS[subject.layers.architecture])]


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """Every model's reliability curve (accuracy per confidence bin) in one frame.

  Args:
    result: the tool's JSON.
    colour_of: each model label's colour.
    out: the directory the figures go to.

  Returns:
    The figures' paths.
  """
  by_model = per_model(result)
  centres = {label: (np.array(r['bin_edges'][:-1]) + np.array(r['bin_edges'][1:])) / 2
             for label, r in by_model.items()}
  # Empty bins have no accuracy: left out, not drawn at 0.
  series = {label: np.where(np.array(r['bin_count']) > 0, r['bin_accuracy'], np.nan)
            for label, r in by_model.items()}
  return [plots.curves(series, os.path.join(out, 'joint_calibration.png'),
                       'Reliability: accuracy per confidence bin', 'confidence', 'accuracy',
                       x=centres, colours_of=dict(colour_of))]


TOOL = register(Tool(
    name='calibration', importance=16, title='Calibration',
    quantity='On the evaluation split: accuracy, NLL and Brier score (squared distance of the '
             'predicted distribution to the one-hot label, summed over classes), and the '
             'expected calibration error over 10 equal-width bins of the top-class confidence, '
             'binned as Park & Kim\'s code does; ± standard errors (binomial, over images, '
             'bootstrap for the ECE).',
    paper='Park & Kim\'s code (ops/tests.py) reports NLL, Brier and ECE beside accuracy for '
          'every model; the paper argues from NLL that ViTs underfit small training sets '
          'rather than overfit them.',
    reads_logits=True,
    run=measure, draw=draw, joint=joint,
    findings=each_model(lambda label, r, q: [
        f'{label}: accuracy ', q('accuracy'), ', NLL ', q('nll'), ' ± ', q('nll_stderr'),
        ', Brier ', q('brier'), ', ECE ', q('ece'), ' ± ', q('ece_stderr'), ' (signed ',
        q('signed_ece'), ')']),
    scalars=lambda result, label: ({'calibration/ece': [result[label]['ece']],
                                    'calibration/nll': [result[label]['nll']],
                                    'calibration/brier': [result[label]['brier']]}
                                   if label in result else {}),
    work=lambda subject, options, amounts: Work({'forward': amounts.batches}, {'forward': 1})))
