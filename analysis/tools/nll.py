"""Training NLL against test error (Park & Kim Fig. 3): a model that fits its
augmented training data better also errs less on the test data, where a
classically overfitting one would not.

The authors' training NLL is their logged `train/nll` (how-do-vits-work
`ops/trains.py`, `train_epoch`, lines 135-160): the training loss in train mode
(`model.train()`: dropout and stochastic depth on), SoftTargetCrossEntropy
against timm's Mixup targets built with `label_smoothing` (0.1 in every config),
averaged over the epoch's batches. Their test NLL is plain cross-entropy in eval
mode (`ops/tests.py`, `test`: `nn.CrossEntropyLoss` without smoothing). Smoothed
mixup targets are the smoothed mix of one-hot labels, so the recipe's loss on the
pipeline's mixed labels (`steps.loss_fn`) is theirs.
"""
import os
import dataclasses
from typing import Dict, List, Mapping

import jax
import jax.numpy as jnp
import optax

from analysis.measures import uncertainty
from analysis.reporting import plots
from analysis.runtime import features
from analysis.runtime.estimate import Work
from analysis.tool import (Batches, Subject, Tool, batch_mean, each_model, no_figures, per_model,
                           register, take)
from analysis.tool_options import option
from vit_jax import training

TRAIN_NLLS = ('training', 'plain')


@dataclasses.dataclass(frozen=True)
class Options:
  """The NLL tool's command-line option."""
  nll_train: str = option(
      'training', 'training: the recipe\'s loss with its label smoothing on its (mixup) '
      'targets in train mode, the loss Park & Kim log as train/nll; plain: cross-entropy '
      'without smoothing in evaluation mode.', choices=TRAIN_NLLS)


def nll_and_accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """[mean NLL, accuracy] of a batch: softmax cross-entropy against the labels (a
  label distribution, as mixup draws it, or integer classes), no label smoothing;
  a prediction is correct where it is the labels' most likely class.

  Args:
    logits: (B, classes) logits.
    labels: integer labels or label distributions.

  Returns:
    [NLL, accuracy], means over the batch.
  """
  targets = labels if labels.ndim == 2 else jax.nn.one_hot(labels, logits.shape[-1])
  nll = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)
  correct = jnp.argmax(logits, -1) == jnp.argmax(targets, -1)
  return jnp.stack([nll.mean(), correct.mean()])


def training_loss_and_accuracy(subject: Subject):
  """(images, labels, batch index) -> [mean training loss, accuracy] of a batch as
  the authors log `train/nll` (module docstring): the recipe's loss and label
  smoothing (`steps.loss_fn`) on the batch's label distributions, in train mode
  with a dropout key per batch.

  Args:
    subject: the model.

  Returns:
    (images, labels, batch index) -> [loss, accuracy] in train mode, dropout drawn
    from the index.
  """
  recipe = subject.recipe
  if recipe is None:
    raise ValueError(f'The training NLL of {subject.label} is its recipe\'s loss, which '
                     'needs the recipe that trained it (load_subject(..., recipe=)); or '
                     'measure nll_train="plain".')

  @jax.jit
  def measure(params, images, labels, key):
    logits = subject.model.apply({'params': params}, images, train=True,
                                 rngs={'dropout': key}).astype(jnp.float32)
    targets = labels if labels.ndim == 2 else jax.nn.one_hot(labels, logits.shape[-1])
    loss = training.loss_fn(logits, targets, recipe.loss, recipe.label_smoothing)
    correct = jnp.argmax(logits, -1) == jnp.argmax(targets, -1)
    return jnp.stack([loss.mean(), correct.mean()])
  return lambda images, labels, index: measure(
      subject.params, features.shard_examples(images, mesh=subject.mesh), labels,
      jax.random.fold_in(jax.random.PRNGKey(0), index))


def measure(subject: Subject, batches: Batches, options: Options = Options()) -> Dict:
  """NLL and accuracy on the evaluation split (plain cross-entropy, evaluation mode)
  and on as many training images drawn through the recipe's training pipeline (its
  augmentation and mixup, as the model trained on them), each with its standard
  error over batches (the test error's binomial). `nll_train` 'training' measures
  the training images as the authors do (`training_loss_and_accuracy`), 'plain'
  as the test images.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    options: the tool's options (`nll_train`).

  Returns:
    The model's JSON (the tool draws its figure of every model, `joint`).
  """
  if options.nll_train not in TRAIN_NLLS:
    raise ValueError(f'Unknown training NLL {options.nll_train!r}; use one of '
                     f'{", ".join(TRAIN_NLLS)}.')
  train_measure = (training_loss_and_accuracy(subject) if options.nll_train == 'training'
                   else lambda images, labels, _: nll_and_accuracy(subject.logits(images), labels))

  def counted(seen: List[int], measure):
    def measured(images, labels):
      seen.append(len(images))
      return measure(images, labels, len(seen))
    return measured
  train_seen, test_seen = [], []
  test, test_stderr = batch_mean(batches('eval'), counted(
      test_seen, lambda images, labels, _: nll_and_accuracy(subject.logits(images), labels)))
  # The training pipeline repeats: as many of its images as the evaluation split gave.
  train, train_stderr = batch_mean(take(batches(features.TRAIN_AUGMENTED), sum(test_seen)),
                                   counted(train_seen, train_measure))
  recipe = subject.recipe
  return {'train_nll_kind': options.nll_train,
          'train_loss': ({'loss': recipe.loss, 'label_smoothing': recipe.label_smoothing,
                          'mode': 'train'} if options.nll_train == 'training' else
                         {'loss': 'softmax', 'label_smoothing': 0., 'mode': 'evaluation'}),
          'train_nll': float(train[0]), 'train_nll_stderr': float(train_stderr[0]),
          'train_accuracy': float(train[1]), 'test_nll': float(test[0]),
          'test_nll_stderr': float(test_stderr[0]), 'test_error': float(1 - test[1]),
          'test_error_stderr': float(uncertainty.binomial_stderr(1 - test[1], sum(test_seen))),
          'num_train': sum(train_seen), 'num_test': sum(test_seen)}


def _findings(label, r, q):
  kind = ('the recipe\'s loss in train mode' if r.get('train_nll_kind', 'training') == 'training'
          else 'plain cross-entropy, evaluation mode')
  return [f'{label}: training NLL ', q('train_nll'), ' ± ', q('train_nll_stderr'),
          f' (augmented training batches, {kind}), test error ', q('test_error'), ' ± ',
          q('test_error_stderr'), ', test NLL ', q('test_nll')]


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """Every model's (training NLL, test error) in one frame, as Park & Kim's Fig. 3.

  Args:
    result: the tool's JSON.
    colour_of: each model label's colour.
    out: the directory the figures go to.

  Returns:
    The figures' paths.
  """
  by_model = per_model(result)
  return [plots.scatter({label: ([r['train_nll']], [r['test_error']])
                         for label, r in by_model.items()},
                        os.path.join(out, 'joint_nll.png'),
                        'Training NLL against test error', 'NLL on augmented training batches',
                        'test error')]


TOOL = register(Tool(
    name='nll', importance=13, title='Training NLL against test error',
    quantity='The training NLL as Park & Kim log it (train/nll): the recipe\'s loss with its '
             'label smoothing, in train mode (dropout, stochastic depth), on training batches '
             'drawn through the recipe\'s pipeline (its augmentation and mixup targets); and the '
             'error and plain cross-entropy on the evaluation split; ± standard errors over '
             'batches (binomial for the error).',
    paper='Park & Kim (Fig. 3): models with a lower NLL on their (augmented) training data err '
          'less on the test data: ViTs do not overfit small training sets, they underfit them.',
    reads_logits=True,
    run=measure, draw=no_figures, findings=each_model(_findings), joint=joint,
    options=Options,
    scalars=lambda result, label: ({'nll/train': [result[label]['train_nll']],
                                    'nll/test_error': [result[label]['test_error']]}
                                   if label in result else {}),
    # A pass over the augmented training batches and one over the evaluation split.
    work=lambda subject, options, amounts: Work({'forward': 2 * amounts.batches},
                                                {'forward': 1})))
