"""The `scales` collection that removes one residual branch at inference,
against zeroed parameters of that branch's last layer, and the lesion tool."""
import json
import os

import chex
import flax
import numpy as np
import pytest

from analysis.tools import TOOLS, lesion
from helpers import batches
from vit_jax import models
from vit_jax.models.family import SCALES, SHIFTS, branch_scales

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


def flat(tree):
  return flax.traverse_util.flatten_dict(tree, sep='/')


def logits(subject, scales, x):
  variables = {'params': subject.params}
  if scales is not None:
    variables[SCALES] = scales
  return np.asarray(subject.model.apply(variables, x))


def zeroed(params, prefix):
  """`params` with every array under `prefix` set to 0."""
  return flax.traverse_util.unflatten_dict(
      {k: (np.zeros_like(v) if k.startswith(prefix) else v) for k, v in flat(params).items()},
      sep='/')


def test_scale_one_everywhere_is_the_intact_model(subjects, family_name):
  subject = subjects[family_name]
  x = next(batches('eval'))[0]
  chex.assert_trees_all_equal(logits(subject, branch_scales(subject.layers), x),
                              logits(subject, None, x))


# Each branch's last layer, whose kernel and bias at 0 make the branch output 0:
# an independent way to the same lesion.
@pytest.mark.parametrize('label,branch,last_layer', [
    ('vit', 1, 'Transformer/encoderblock_0/MlpBlock_3/Dense_1'),
    ('vit', 2, 'Transformer/encoderblock_1/MultiHeadDotProductAttention_1/out'),
    ('bit', 1, 'resnet/block2/unit01/c/standardized_conv2d'),
    ('mixer', 0, 'MixerBlock_0/token_mixing/Dense_1'),
])
def test_a_lesion_equals_the_branch_with_its_last_layer_zeroed(subjects, label, branch,
                                                               last_layer):
  subject = subjects[label]
  assert any(k.startswith(last_layer) for k in flat(subject.params)), last_layer
  x = next(batches('eval'))[0]
  cases = lesion.lesions(subject)
  expected = np.asarray(subject.model.apply({'params': zeroed(subject.params, last_layer)}, x))
  got = logits(subject, cases[1 + branch], x)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)  # float32, one order of sums
  assert np.abs(got - logits(subject, None, x)).max() > 1e-3  # the branch mattered


def test_the_lesion_tool_on_every_family(subjects, family_name, tmp_path):
  subject = subjects[family_name]
  r = TOOLS['lesion'].run_one(subject, batches, str(tmp_path))
  json.dumps(r)
  branches = subject.layers.branches
  assert r['branches'] == [b.label for b in branches] and r['num_images'] == 36
  # The drop is the intact accuracy less the lesioned one, with the paired standard
  # error written out here from the predictions.
  x = np.concatenate([images for images, _ in batches('eval')])
  y = np.concatenate([labels for _, labels in batches('eval')])
  intact = logits(subject, None, x).argmax(-1) == y
  assert r['accuracy'] == pytest.approx(intact.mean())
  for i, case in enumerate(lesion.lesions(subject)[1:]):
    lesioned = logits(subject, case, x).argmax(-1) == y
    d = intact.astype(float) - lesioned
    assert r['drop'][i] == pytest.approx(d.mean(), abs=1e-12)
    assert r['drop_stderr'][i] == pytest.approx(d.std(ddof=1) / 6., abs=1e-12)
  ends = lesion.stage_ends(len(branches), subject.layers.branch_stages)
  assert r['stage_end_drop'] == pytest.approx(np.mean(np.array(r['drop'])[ends]))
  assert os.path.exists(r['figures'][0])


def test_stage_ends():
  assert lesion.stage_ends(4, ()) == [3]
  assert lesion.stage_ends(6, (2, 4)) == [1, 3, 5]


def test_every_stream_entry_branch_and_head_output_takes_the_edits(subjects, family_name):
  """What the analysis edits (lesions, ablations, patching, the logit lens) the
  family sows through `family.sow_edited`: a shift under a sown name moves what
  is sown there by that much, and a scale multiplies it, so the model goes on
  with the edited value."""
  subject = subjects[family_name]
  x = next(batches('eval'))[0][:2]
  layers = subject.layers
  names = list(layers.stream) + [b.output for b in layers.branches] + list(layers.head_outputs)
  _, intact = models.apply_with_intermediates(subject.model, {'params': subject.params}, x,
                                              names=names)
  for name in names:
    key = tuple(name.split('/'))
    edits = {SCALES: flax.traverse_util.unflatten_dict({key: np.float32(2.)}),
             SHIFTS: flax.traverse_util.unflatten_dict({key: np.float32(1.)})}
    _, edited = models.apply_with_intermediates(
        subject.model, {'params': subject.params, **edits}, x, names=[name])
    np.testing.assert_allclose(edited[name], 2. * np.asarray(intact[name]) + 1.,
                               rtol=1e-5, atol=1e-5, err_msg=name)
