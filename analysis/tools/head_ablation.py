"""Head ablation: the accuracy a trained ViT keeps with one attention head removed
at inference, head by head, drawn against the head's mean attention distance
(the axis of Raghu et al.'s Fig. 5). Heads are removed as Michel et al. (2019,
"Are Sixteen Heads Really Better than One?") mask them: the head's output is
multiplied by 0 before the output projection."""
import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import flax
import jax
import numpy as np

from analysis.measures import attention, uncertainty
from analysis.reporting import plots
from analysis.runtime.estimate import Work
from analysis.tools.common import head_counts
from analysis.tool import ATTENTION, Batches, Subject, Tool, each_model, figure_path, register
from analysis.tool_options import option
from vit_jax.models.family import SCALES, SHIFTS


@dataclasses.dataclass(frozen=True)
class Options:
  """The head-ablation tool's command-line options."""
  head_ablation: str = option(
      'zero', "zero: a removed head's output is multiplied by 0 (Michel et al.'s head "
      'masking); mean: replaced by its mean over the evaluation images, per token (mean-'
      'ablation, a departure that keeps the layer\'s input in its usual range).',
      choices=('zero', 'mean'))


def ablations(subject: Subject, means: Optional[Sequence[np.ndarray]] = None
              ) -> Tuple[List[Dict], List[Tuple[int, int]]]:
  """The intact edit collections, then one per head with that head removed (every
  one with the same tree, so that one compiled model runs them all), and the
  (layer, head) each removes. A head is removed by a scale of 0 on its output
  (`family.sow_edited`); with `means`, its output is then replaced by its mean.

  Args:
    subject: the model.
    means: per attention layer, the mean (T, heads, D/heads) head outputs over
      the data (`mean_head_outputs`), for mean-ablation; None for zero-ablation.

  Returns:
    (the `scales` and, with `means`, `shifts` collections, intact first; the
    (layer, head) of each after the first).
  """
  names, counts = subject.layers.head_outputs, head_counts(subject)
  keys = [tuple(n.split('/')) for n in names]
  intact = {k: np.ones((h, 1), np.float32) for k, h in zip(keys, counts)}
  # Mean-ablation shifts every layer by an array of one shape in every case.
  unshifted = None if means is None else {k: np.zeros_like(m) for k, m in zip(keys, means)}
  cases, removed = [(intact, unshifted)], []
  for layer, (key, count) in enumerate(zip(keys, counts)):
    for head in range(count):
      scales = np.ones((count, 1), np.float32)
      scales[head] = 0.
      shifts = None
      if means is not None:
        shift = np.zeros_like(means[layer])
        shift[:, head] = means[layer][:, head]
        shifts = {**unshifted, key: shift}
      cases.append(({**intact, key: scales}, shifts))
      removed.append((layer, head))
  unflatten = flax.traverse_util.unflatten_dict
  return [{SCALES: unflatten(scales), **({} if shifts is None else {SHIFTS: unflatten(shifts)})}
          for scales, shifts in cases], removed


def mean_head_outputs(subject: Subject, batches: Batches) -> List[np.ndarray]:
  """Each attention layer's head outputs (before the output projection) averaged
  over the evaluation images, per token position: what mean-ablation puts in a
  removed head's place.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.

  Returns:
    Per attention layer, the (T, heads, D/heads) mean.
  """
  names = subject.layers.head_outputs
  sums, count = None, 0
  for images, _ in batches('eval'):
    outputs = subject.intermediates(images, names)
    batch = [np.asarray(outputs[n], np.float64).sum(0) for n in names]
    sums = batch if sums is None else [a + b for a, b in zip(sums, batch)]
    count += len(images)
  return [(s / count).astype(np.float32) for s in sums]


def measure(subject: Subject, batches: Batches, options: Options = Options()) -> Dict:
  """Accuracy on the evaluation split with each attention head removed in turn,
  against the intact model; the drop's standard error is that of a paired
  difference over images. Each head's mean attention distance (spatial keys,
  renormalised: `attention.mean_attention_distance`) is measured on the same
  images.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    options: the tool's options: `head_ablation` 'zero' (the head's output times 0,
      Michel et al.'s masking) or 'mean' (replaced by its mean over the evaluation
      images, per token).

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  if not subject.layers.head_outputs:
    raise ValueError(f'{subject.label} ({subject.config.name}) sows no per-head outputs of '
                     'its attention: head ablation needs a ViT.')
  cases, removed = ablations(subject, mean_head_outputs(subject, batches)
                             if options.head_ablation == 'mean' else None)
  counts = [sum(1 for l, _ in removed if l == layer)
            for layer in range(len(subject.layers.head_outputs))]
  grid, pixels = subject.token_grid()
  names = subject.layers.attention_weights
  distances_of = jax.jit(lambda inter: [attention.mean_attention_distance(
      inter[n], grid, pixels, subject.has_cls, registers=subject.registers) for n in names])
  correct, distances, sizes = [[] for _ in cases], [], []
  for images, labels in batches('eval'):
    for i, edits in enumerate(cases):
      predicted = np.asarray(subject.edited_logits(images, edits)).argmax(-1)
      correct[i].append(predicted == np.asarray(labels))
    distances.append([np.asarray(d, np.float64) for d in distances_of(
        subject.intermediates(images, names))])
    sizes.append(len(images))
  correct = np.array([np.concatenate(c) for c in correct], np.float64)  # (1 + heads, N)
  n = correct.shape[1]
  drop, drop_stderr = uncertainty.paired_drops(correct)
  distance = [np.average([d[layer] for d in distances], axis=0, weights=sizes)
              for layer in range(len(names))]
  by_layer = lambda values: [[float(values[k]) for k, (l, _) in enumerate(removed) if l == layer]
                             for layer in range(len(counts))]
  accuracy = float(correct[0].mean())
  layer_names = [b.label for b in subject.layers.branches if b.kind == 'attention']
  return {'accuracy': accuracy,
          'accuracy_stderr': float(uncertainty.binomial_stderr(accuracy, n)),
          'mode': options.head_ablation, 'layers': layer_names, 'heads': counts,
          'drop': by_layer(drop), 'drop_stderr': by_layer(drop_stderr),
          'distance': [d.tolist() for d in distance],
          'num_images': n}


def draw(result: Mapping, subject: Subject, out: str, options: Options = Options()) -> List[str]:
  """The figure of the tool's numbers (`measure`): each head's accuracy lost against its mean attention distance, a colour per layer.

  See `analysis.tool.Draw`.
  """
  return [plots.scatter(
      {name: (np.asarray(result['distance'][layer]), 100 * np.asarray(result['drop'][layer]))
       for layer, name in enumerate(result['layers'])},
      figure_path(out, 'head_ablation', subject),
      f'Head ablation ({result["mode"]}): {subject.label} '
      f'(intact {100 * result["accuracy"]:.1f}%)',
      'mean attention distance (pixels)', 'accuracy lost (points)')]


def _findings(label, r, q):
  flat = [(l, h) for l, row in enumerate(r['drop']) for h in range(len(row))]
  layer, head = max(flat, key=lambda lh: r['drop'][lh[0]][lh[1]])
  return [f'{label}: intact ', q('accuracy'), ' ± ', q('accuracy_stderr'),
          '; one head removed costs from ', q('drop', reduce='min'), ' to ',
          q('drop', reduce='max'), f' (most: {r["layers"][layer]} head {head}, at ',
          q('distance', layer, head), ' px, ± ', q('drop_stderr', layer, head), ')']


TOOL = register(Tool(
    name='head_ablation', importance=18, title='Head ablation',
    quantity='Accuracy on the evaluation split with one attention head removed at inference '
             "(its output times 0 before the output projection, through the model's "
             '`scales` collection, as Michel et al. 2019 mask heads): the drop from the '
             'intact accuracy ± the standard error of the paired difference over images, per '
             'head, against the head\'s mean attention distance on the same images.',
    paper='No claim of the two papers: Raghu et al. sort heads by their mean attention '
          'distance (the axis of their Fig. 5); this asks which of them the prediction '
          'needs.',
    reads_logits=True, options=Options,
    run=measure, draw=draw, runs_on=ATTENTION, findings=each_model(_findings),
    scalars=lambda result, label: ({'head_ablation/drop': [
        d for row in result[label]['drop'] for d in row]} if label in result else {}),
    # One forward pass over the evaluation split per head, the intact one, the
    # attention maps' pass and, for mean-ablation, the means' pass.
    work=lambda subject, options, amounts: Work(
        {'forward': (2 + (options.head_ablation == 'mean') + sum(head_counts(subject)))
         * amounts.batches}, {'forward': 2})))
