"""Lesion study (Park & Kim, Sec. 4): the accuracy a trained model keeps with one
residual branch removed at inference, branch by branch."""
from typing import Dict, List, Mapping

import flax
import numpy as np

from analysis.measures import uncertainty
from analysis.reporting import plots
from analysis.runtime.estimate import Work
from analysis.tool import Batches, Subject, Tool, each_model, figure_path, register
from vit_jax.models.family import SCALES, branch_scales


def lesions(subject: Subject) -> List[Dict]:
  """The intact `scales` collection, then one per branch with that branch's scale
  0: every one has the same tree, so one compiled model runs them all.

  Args:
    subject: the model.

  Returns:
    The collections, intact first.
  """
  intact = flax.traverse_util.flatten_dict(branch_scales(subject.layers))
  out = [intact]
  for branch in subject.layers.branches:
    out.append({**intact, tuple(branch.output.split('/')): np.float32(0.)})
  return [flax.traverse_util.unflatten_dict(scales) for scales in out]


def measure(subject: Subject, batches: Batches) -> Dict:
  """Accuracy on the evaluation split with each residual branch f(z) removed in
  turn (the stream goes on with its shortcut z, or the projection of z where the
  branch changes the shape), against the intact model. The drop's standard error
  is that of a paired difference: over images, of (intact correct) - (lesioned
  correct).

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  branches = subject.layers.branches
  cases = lesions(subject)
  correct = [[] for _ in cases]
  for images, labels in batches('eval'):
    for i, scales in enumerate(cases):
      predicted = np.asarray(subject.edited_logits(images, {SCALES: scales})).argmax(-1)
      correct[i].append(predicted == np.asarray(labels))
  correct = np.array([np.concatenate(c) for c in correct], np.float64)  # (1 + branches, N)
  n = correct.shape[1]
  drop, drop_stderr = uncertainty.paired_drops(correct)
  ends = stage_ends(len(branches), subject.layers.branch_stages)
  accuracy = float(correct[0].mean())
  return {'accuracy': accuracy,
          'accuracy_stderr': float(uncertainty.binomial_stderr(accuracy, n)),
          'branches': [b.label for b in branches], 'kinds': [b.kind for b in branches],
          'lesioned_accuracy': correct[1:].mean(axis=1).tolist(),
          'drop': drop.tolist(), 'drop_stderr': drop_stderr.tolist(),
          'stage_end_drop': float(drop[ends].mean()),
          'other_drop': float(np.delete(drop, ends).mean()) if len(ends) < len(drop) else None,
          'num_images': n}


def draw(result: Mapping, subject: Subject, out: str) -> List[str]:
  """The figure of the tool's numbers (`measure`): the accuracy each branch's removal costs, in points.

  See `analysis.tool.Draw`.
  """
  return [plots.bars(100 * np.asarray(result['drop']), 100 * np.asarray(result['drop_stderr']),
                     result['branches'], result['kinds'], figure_path(out, 'lesion', subject),
                     f'Lesion: {subject.label} (intact {100 * result["accuracy"]:.1f}%)',
                     'accuracy lost (points)', separators=subject.layers.branch_stages)]


def stage_ends(num_branches: int, branch_stages) -> List[int]:
  """The index of each stage's last branch (one stage where none begins).

  Args:
    num_branches: the branches.
    branch_stages: branch indices where a stage begins.

  Returns:
    The indices.
  """
  return [start - 1 for start in branch_stages] + [num_branches - 1]


def _findings(label, r, q):
  worst = int(np.argmax(r['drop']))
  text = [f'{label}: intact ', q('accuracy'), ' ± ', q('accuracy_stderr'),
          '; one branch removed costs from ', q('drop', reduce='min'), ' to ',
          q('drop', reduce='max'), f' (most: {r["branches"][worst]}, {r["kinds"][worst]}, ± ',
          q('drop_stderr', worst), '); the last branch of each stage costs ',
          q('stage_end_drop'), ' on average']
  if r['other_drop'] is not None:
    text += [', the others ', q('other_drop')]
  return text


TOOL = register(Tool(
    name='lesion', importance=14, title='Lesion study',
    quantity='Accuracy on the evaluation split with one residual branch removed at inference '
             '(its output set to 0 through the `scales` collection, shortcut or projection '
             'kept): each branch of a ViT block (attention, MLP) and each unit of a ResNet, '
             'AlterNet or Mixer apart; the drop from the intact accuracy ± the standard error '
             'of the paired difference over images, and the mean drop of the last branch of '
             'each stage against the others.',
    paper='Park & Kim (Sec. 4, lesion study): multi-stage networks behave like a series of '
          'small models; the blocks at the end of a stage are the ones the accuracy depends '
          'on, which is where AlterNet puts its attention.',
    reads_logits=True,
    run=measure, draw=draw, findings=each_model(_findings),
    scalars=lambda result, label: ({'lesion/drop': result[label]['drop']}
                                   if label in result else {}),
    # One forward pass over the evaluation split per branch, and the intact one.
    work=lambda subject, options, amounts: Work(
        {'forward': (1 + len(subject.layers.branches)) * amounts.batches}, {'forward': 1})))
