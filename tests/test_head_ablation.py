"""Head ablation on constructed models: a head the model does not use costs
nothing, removing the only head it uses leaves a constant prediction, and
mean-ablating a head whose output is the same on every image changes nothing."""
import flax
import numpy as np
import pytest

from analysis.runtime import features
from analysis.tools import TOOLS
from analysis.tools.head_ablation import Options, ablations, mean_head_outputs
from helpers import TINY_VIT, batches, images, init, perturbed, tiny_vit
from vit_jax import models

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


def _subject(flat, **fields):
  """The analysis subject of the tiny ViT with `fields`, of flat parameters `flat`."""
  config = models.get_config('ViT-Ti_16', num_classes=3, **{**TINY_VIT, **fields})
  return features.Subject('constructed', config, flax.traverse_util.unflatten_dict(flat, sep='/'),
                          32)


def _flat(model):
  """The model's perturbed fresh parameters, flat, as numpy arrays to edit."""
  params = perturbed(init(model))['params']
  return {k: np.asarray(v).copy()
          for k, v in flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep='/').items()}


def _labelled_by(subject):
  """Batches of 12 random images labelled with the subject's own predictions."""
  def split_batches(split):
    for x, _ in batches(split):
      yield x, np.asarray(subject.logits(x)).argmax(-1)
  return split_batches


def test_a_head_whose_output_the_model_never_reads_costs_nothing(tmp_path):
  flat = _flat(tiny_vit(num_classes=3))
  # Head 1 of the first block writes nothing into the stream.
  flat['Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/kernel'][1] = 0.
  subject = _subject(flat)
  cases, removed = ablations(subject)
  x = images(4)
  logits = [np.asarray(subject.model.apply({'params': subject.params, **c}, x))
            for c in cases]
  # Intact, the scales change nothing (another compiled program: float sums may differ).
  np.testing.assert_allclose(logits[0], np.asarray(subject.logits(x)), rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(logits[1 + removed.index((0, 1))], logits[0])
  assert np.abs(logits[1 + removed.index((0, 0))] - logits[0]).max() > 1e-4
  result = TOOLS['head_ablation'].run_one(subject, _labelled_by(subject), str(tmp_path))
  assert result['accuracy'] == 1. and result['heads'] == [4, 4]
  assert result['drop'][0][1] == 0. and result['drop_stderr'][0][1] == 0.
  distance = np.asarray(result['distance'])
  assert distance.shape == (2, 4) and np.all((distance > 0) & (distance < 32 * np.sqrt(2)))


def test_removing_the_only_head_a_model_uses_leaves_a_constant_prediction(tmp_path):
  """One block (MLP silenced) of a GAP ViT whose patches fill channels 0-15 and
  whose head reads channels 16-31, which only head 0 writes, through weights
  that cancel the final LayerNorm's mean: without head 0 every image gets the
  same logits, so the accuracy falls to the share of the class they pick."""
  flat = _flat(tiny_vit(num_classes=3, classifier='gap', num_layers=1))
  block = 'Transformer/encoderblock_0/'
  flat['embedding/kernel'][..., 16:] = 0.
  flat['embedding/bias'][16:] = 0.
  flat['Transformer/posembed_input/pos_embedding'][..., 16:] = 0.
  for name in ('MlpBlock_3/Dense_1/kernel', 'MlpBlock_3/Dense_1/bias'):
    flat[block + name][:] = 0.
  attention = block + 'MultiHeadDotProductAttention_1/out/'
  flat[attention + 'kernel'][1:] = 0.
  flat[attention + 'kernel'][0, :, :16] = 0.
  flat[attention + 'bias'][:] = 0.
  head = flat['head/kernel']
  head[:16] = 0.
  head[17::2] = -head[16::2]  # pairs of channels read with opposite signs
  flat['Transformer/encoder_norm/scale'][16:] = 1.
  subject = _subject(flat, classifier='gap', num_layers=1)
  result = TOOLS['head_ablation'].run_one(subject, _labelled_by(subject), str(tmp_path))
  labels = np.concatenate([y for _, y in _labelled_by(subject)('eval')])
  assert len(np.unique(labels)) > 1  # the intact model tells images apart
  cases, removed = ablations(subject)
  x = np.concatenate([x for x, _ in batches('eval')])
  without = np.asarray(subject.model.apply(
      {'params': subject.params, **cases[1 + removed.index((0, 0))]}, x))
  np.testing.assert_allclose(without, np.broadcast_to(without[0], without.shape), atol=1e-5)
  constant = int(without[0].argmax())
  assert result['drop'][0][0] == pytest.approx(1. - np.mean(labels == constant))
  assert result['drop'][0][1:] == [0., 0., 0.]


def test_mean_ablating_a_head_whose_output_never_changes_changes_nothing(tmp_path):
  """With its value kernel zero, head 2 of the first block outputs its value bias
  at every token of every image (attention averages equal values): its mean is
  itself, so mean-ablation keeps every logit, while zero-ablation, removing the
  bias, changes them."""
  flat = _flat(tiny_vit(num_classes=3))
  value = 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/value/'
  flat[value + 'kernel'][:, 2] = 0.
  flat[value + 'bias'][2] = 1.
  subject = _subject(flat)
  means = mean_head_outputs(subject, batches)
  sown = [np.asarray(subject.intermediates(x, subject.layers.head_outputs)[
      subject.layers.head_outputs[0]]) for x, _ in batches('eval')]
  np.testing.assert_allclose(means[0], np.concatenate(sown).mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(means[0][:, 2], 1., rtol=1e-6)
  x = images(4)
  for mode_means, changes in ((means, False), (None, True)):
    cases, removed = ablations(subject, mode_means)
    apply = lambda edits: np.asarray(subject.model.apply({'params': subject.params, **edits}, x))
    difference = np.abs(apply(cases[1 + removed.index((0, 2))]) - apply(cases[0])).max()
    assert (difference > 1e-4) if changes else (difference < 1e-5)
  result = TOOLS['head_ablation'].run_one(subject, _labelled_by(subject), str(tmp_path),
                                      Options(head_ablation='mean'))
  assert result['mode'] == 'mean' and result['drop'][0][2] == 0.
