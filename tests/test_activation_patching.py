"""Activation patching on every family: patching nothing gives the corrupted run,
patching the embedding and every branch gives the clean run, every head of a
layer together is its attention branch, and the shares follow the formula."""
import json
import os

import numpy as np
import pytest

from analysis.measures import uncertainty
from analysis.tools import TOOLS
from analysis.tools import activation_patching as patching
from helpers import batches, images
from vit_jax import models

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


@pytest.mark.parametrize('label', models.families(models.CLASSIFY))
def test_patching_nothing_and_everything(subjects, label):
  subject = subjects[label]
  clean, corrupted = images(4, seed=0), images(4, seed=1)
  branches = [s for s in patching.sites(subject) if s.kind != 'head']
  embedding = patching.Site(subject.layers.stream[0], 'embedding', 'embedding')
  nothing, everything = patching.patched_logits(subject, clean, corrupted,
                                                [[], [embedding] + branches])
  np.testing.assert_allclose(nothing, np.asarray(subject.logits(corrupted)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(everything, np.asarray(subject.logits(clean)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('label, restores', [('vit', True), ('vit_gap', False)])
def test_every_branch_restores_a_class_token_but_not_pooled_patches(subjects, label, restores):
  """The class token enters every image alike, so with every branch's clean output
  added to it, it is the clean run's; the patch tokens start from the corrupted
  embedding, so a head that pools them is not restored."""
  subject = subjects[label]
  clean, corrupted = images(4, seed=0), images(4, seed=1)
  branches = [s for s in patching.sites(subject) if s.kind != 'head']
  alone, = patching.patched_logits(subject, clean, corrupted, [branches])
  difference = np.abs(alone - np.asarray(subject.logits(clean))).max()
  assert difference < 1e-5 if restores else difference > 1e-4


def test_every_head_of_a_layer_together_is_its_attention_branch(subjects):
  subject = subjects['vit']
  every = patching.sites(subject)
  branch = next(s for s in every if s.kind == 'attention')
  heads = [s for s in every if s.kind == 'head' and s.label.startswith(branch.label + ' ')]
  assert len(heads) == 4
  clean, corrupted = images(4, seed=0), images(4, seed=1)
  by_heads, by_branch, one = patching.patched_logits(subject, clean, corrupted,
                                                     [heads, [branch], heads[:1]])
  np.testing.assert_allclose(by_heads, by_branch, rtol=1e-4, atol=1e-5)
  assert np.abs(one - by_branch).max() > 1e-4


def test_the_tools_shares_follow_the_formula(subjects, monkeypatch, tmp_path):
  """A model labelled by its own clean predictions, 'corrupted' by swapping the
  batch's images, so that most pairs flip: each share is sum(m_patched - m_corrupted)
  / sum(m_clean - m_corrupted) over those pairs, recomputed here from the logits."""
  subject = subjects['vit']
  monkeypatch.setattr(patching.corruptions, 'corrupt',
                      lambda x, name, severity, seed, parameters: x[::-1].copy())
  def labelled(split):
    for x, _ in batches(split):
      yield x, np.asarray(subject.logits(x)).argmax(-1)
  result = TOOLS['activation_patching'].run_one(subject, labelled, str(tmp_path))
  json.dumps(result)
  assert all(os.path.exists(f) for f in result['figures'])
  every = patching.sites(subject)
  numerators, denominators = [], []
  for x, y in labelled('eval'):
    swapped = x[::-1]
    clean_logits, corrupted_logits = (np.asarray(subject.logits(v)) for v in (x, swapped))
    pairs = corrupted_logits.argmax(-1) != y
    other = corrupted_logits.argmax(-1)[pairs]
    m = lambda z: z[np.arange(len(z)), y[pairs]] - z[np.arange(len(z)), other]
    patched = patching.patched_logits(subject, x[pairs], swapped[pairs], [[s] for s in every])
    numerators.append([m(z) - m(corrupted_logits[pairs]) for z in patched])
    denominators.append(m(clean_logits[pairs]) - m(corrupted_logits[pairs]))
  a, b = np.concatenate(numerators, axis=1), np.concatenate(denominators)
  assert result['pairs'] == len(b) > 2
  np.testing.assert_allclose(result['restored'], a.sum(1) / b.sum(), rtol=1e-4, atol=1e-6)


def test_ratio_of_means_standard_error():
  """With a constant denominator c, the ratio is mean(a) / c and its standard
  error std(a) / (sqrt(n) c), the standard error of a mean."""
  rng = np.random.RandomState(0)
  a = rng.randn(3, 50)
  ratio, stderr = uncertainty.ratio_of_means(a, np.full(50, 2.))
  np.testing.assert_allclose(ratio, a.mean(1) / 2.)
  np.testing.assert_allclose(stderr, a.std(1, ddof=1) / np.sqrt(50) / 2.)


def test_patching_refuses_to_measure_when_the_corruption_flips_nothing(subjects, monkeypatch, tmp_path):
  monkeypatch.setattr(patching.corruptions, 'corrupt',
                      lambda x, name, severity, seed, parameters: x)
  result = TOOLS['activation_patching'].run_one(subjects['vit'], batches, str(tmp_path))
  assert 'restored' not in result and result['pairs'] == 0
  assert 'on 0 of 36 evaluation images' in result['refused']
  text = TOOLS['activation_patching'].findings({'vit': result}, lambda *path, **kw: '')
  assert 'not measured' in ''.join(map(str, text['vit']))
