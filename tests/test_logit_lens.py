"""The logit lens on every family: the readout on the last stream entry is the
model's output, a ViT's middle layer read through its final LayerNorm and head
as numpy computes it, and the KL divergence against scipy."""
import json
import os

import numpy as np
import pytest
import scipy.special

from analysis.tools import TOOLS
from analysis.tools.logit_lens import kl_divergence, lens_logits, readable
from helpers import batches, images, subject_of, tiny_family_config
from vit_jax import models
from vit_jax.models.family import MLP, TRANSFORMER

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


@pytest.mark.parametrize('label', models.families(models.CLASSIFY) + ['vit_gap'])
def test_the_lens_on_the_last_entry_is_the_models_output(subjects, label, tmp_path):
  subject = subjects[label]
  entries = readable(subject)
  stream = subject.layers.stream
  assert entries[-1] == len(stream) - 1
  if subject.layers.architecture in (TRANSFORMER, MLP):
    assert entries == list(range(len(stream)))  # every token layer has the width
  else:  # the units of the last stage
    assert entries == list(range(subject.layers.stages[-1], len(stream)))
  x = images(4)
  final, read = lens_logits(subject, entries)(subject.variables, x)
  np.testing.assert_allclose(np.asarray(final), np.asarray(subject.logits(x)),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(read[-1]), np.asarray(final), rtol=1e-5, atol=1e-5)
  result = TOOLS['logit_lens'].run_one(subject, batches, str(tmp_path))
  json.dumps(result)
  assert os.path.exists(result['figures'][0])
  assert result['agreement'][-1] == 1. and result['kl'][-1] == pytest.approx(0., abs=1e-5)
  assert all((value is None) == (i not in entries) for i, value in enumerate(result['accuracy']))


def _layer_norm(x, scale, bias, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + eps) * scale + bias


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_a_vit_layer_read_through_its_final_norm_and_head(classifier):
  """The stream after block 0's attention, read as the ViT's head reads its last
  layer: the final LayerNorm on every token, then the class token (or the mean
  of the tokens) and the dense head, in float64 numpy."""
  subject = subject_of(tiny_family_config('vit', classifier=classifier), 'vit')
  stream = subject.layers.stream
  middle = stream.index('Transformer/encoderblock_0/+sa')
  x = images(4)
  _, read = lens_logits(subject, [middle])(subject.variables, x)
  tokens = np.asarray(subject.intermediates(x, [stream[middle]])[stream[middle]], np.float64)
  norm = {k: np.asarray(v, np.float64)
          for k, v in subject.params['Transformer']['encoder_norm'].items()}
  tokens = _layer_norm(tokens, norm['scale'], norm['bias'])
  pooled = tokens[:, 0] if classifier == 'token' else tokens.mean(1)
  head = {k: np.asarray(v, np.float64) for k, v in subject.params['head'].items()}
  np.testing.assert_allclose(np.asarray(read[0]), pooled @ head['kernel'] + head['bias'],
                             rtol=1e-4, atol=1e-5)


def test_kl_divergence_against_scipy():
  rng = np.random.RandomState(0)
  p, q = rng.randn(5, 7) * 3, rng.randn(5, 7) * 3
  expected = scipy.special.rel_entr(scipy.special.softmax(p, -1),
                                    scipy.special.softmax(q, -1)).sum(-1)
  np.testing.assert_allclose(kl_divergence(p, q), expected, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(kl_divergence(p, p), 0., atol=1e-6)
