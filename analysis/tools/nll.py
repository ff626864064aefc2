"""Training NLL against test error (Park & Kim Fig. 3): a model that fits its
augmented training data better also errs less on the test data, where a
classically overfitting one would not."""
import os
from typing import Dict, List, Mapping

import jax
import jax.numpy as jnp
import optax

from analysis import features, plots, uncertainty
from analysis.estimate import Work
from analysis.tool import (Batches, Subject, Tool, batch_mean, each_model, per_model, register,
                           take)


def nll_and_accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """[mean NLL, accuracy] of a batch: softmax cross-entropy against the labels (a
  label distribution, as mixup draws it, or integer classes), no label smoothing;
  a prediction is correct where it is the labels' most likely class."""
  targets = labels if labels.ndim == 2 else jax.nn.one_hot(labels, logits.shape[-1])
  nll = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)
  correct = jnp.argmax(logits, -1) == jnp.argmax(targets, -1)
  return jnp.stack([nll.mean(), correct.mean()])


def run_nll(subject: Subject, batches: Batches, out: str) -> Dict:
  """NLL and accuracy on the evaluation split and on as many training images drawn
  through the recipe's training pipeline (its augmentation, as the model trained
  on them), each with its standard error over batches (the test error's binomial)."""
  def counted(seen: List[int]):
    def measure(images, labels):
      seen.append(len(images))
      return nll_and_accuracy(subject.logits(images), labels)
    return measure
  train_seen, test_seen = [], []
  test, test_stderr = batch_mean(batches('eval'), counted(test_seen))
  # The training pipeline repeats: as many of its images as the evaluation split gave.
  train, train_stderr = batch_mean(take(batches(features.TRAIN_AUGMENTED), sum(test_seen)),
                                   counted(train_seen))
  return {'train_nll': float(train[0]), 'train_nll_stderr': float(train_stderr[0]),
          'train_accuracy': float(train[1]), 'test_nll': float(test[0]),
          'test_nll_stderr': float(test_stderr[0]), 'test_error': float(1 - test[1]),
          'test_error_stderr': float(uncertainty.binomial_stderr(1 - test[1], sum(test_seen))),
          'num_train': sum(train_seen), 'num_test': sum(test_seen), 'figures': []}


def _findings(label, r, q):
  return [f'{label}: training NLL ', q('train_nll'), ' ± ', q('train_nll_stderr'),
          ' (augmented training batches), test error ', q('test_error'), ' ± ',
          q('test_error_stderr'), ', test NLL ', q('test_nll')]


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """Every model's (training NLL, test error) in one frame, as Park & Kim's Fig. 3."""
  by_model = per_model(result)
  if len(by_model) < 2:
    return []
  return [plots.scatter({label: ([r['train_nll']], [r['test_error']])
                         for label, r in by_model.items()},
                        os.path.join(out, 'joint_nll.png'),
                        'Training NLL against test error', 'NLL on augmented training batches',
                        'test error')]


TOOL = register(Tool(
    name='nll', title='Training NLL against test error',
    quantity='Softmax cross-entropy without label smoothing on training batches drawn through '
             'the recipe\'s training pipeline (its augmentation and mixup, as the model trained), '
             'and the error and NLL on the evaluation split; ± standard errors over batches '
             '(binomial for the error).',
    paper='Park & Kim (Fig. 3): models with a lower NLL on their (augmented) training data err '
          'less on the test data: ViTs do not overfit small training sets, they underfit them.',
    run=run_nll, findings=each_model(_findings), joint=joint,
    scalars=lambda result, label: ({'nll/train': [result[label]['train_nll']],
                                    'nll/test_error': [result[label]['test_error']]}
                                   if label in result else {}),
    # A pass over the augmented training batches and one over the evaluation split.
    work=lambda subject, options, amounts: Work({'forward': 2 * amounts.batches},
                                                {'forward': 1})))
