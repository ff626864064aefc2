"""Head ablation: the accuracy a trained ViT keeps with one attention head removed
at inference, head by head, drawn against the head's mean attention distance
(the axis of Raghu et al.'s Fig. 5). Heads are removed as Michel et al. (2019,
"Are Sixteen Heads Really Better than One?") mask them: the head's output is
multiplied by 0 before the output projection."""
from typing import Dict, List, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from analysis import attention, features, plots, uncertainty
from analysis.estimate import Work
from analysis.features import shard_examples
from analysis.tool import ATTENTION, Batches, Subject, Tool, each_model, figure_path, register
from vit_jax import models
from vit_jax.models.attention import HEAD_SCALES


def head_counts(subject: Subject) -> List[int]:
  """The number of heads of each attention layer, from the shape of what it sows.

  Args:
    subject: the model.

  Returns:
    One count per entry of `Layers.head_outputs`.
  """
  names = subject.layers.head_outputs
  shapes = jax.eval_shape(
      lambda p, x: models.apply_with_intermediates(
          subject.model, {'params': p}, x, names=names)[1],
      subject.params, jax.ShapeDtypeStruct((1, subject.image_size, subject.image_size, 3),
                                           jnp.float32))
  return [int(shapes[n].shape[2]) for n in names]


def ablations(subject: Subject) -> Tuple[List[Dict], List[Tuple[int, int]]]:
  """The intact `head_scales` collection, then one per head with that head's scale
  0 (every one with the same tree, so that one compiled model runs them all), and
  the (layer, head) each removes.

  Args:
    subject: the model.

  Returns:
    (the collections, intact first; the (layer, head) of each after the first).
  """
  names, counts = subject.layers.head_outputs, head_counts(subject)
  intact = {tuple(n.split('/')): np.ones(h, np.float32) for n, h in zip(names, counts)}
  cases, removed = [intact], []
  for layer, (name, count) in enumerate(zip(names, counts)):
    for head in range(count):
      scales = np.ones(count, np.float32)
      scales[head] = 0.
      cases.append({**intact, tuple(name.split('/')): scales})
      removed.append((layer, head))
  return [flax.traverse_util.unflatten_dict(c) for c in cases], removed


def run_head_ablation(subject: Subject, batches: Batches, out: str) -> Dict:
  """Accuracy on the evaluation split with each attention head removed in turn,
  against the intact model; the drop's standard error is that of a paired
  difference over images. Each head's mean attention distance (spatial keys,
  renormalised: `attention.mean_attention_distance`) is measured on the same
  images.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    out: the directory the figures go to.

  Returns:
    The model's JSON.
  """
  if not subject.layers.head_outputs:
    raise ValueError(f'{subject.label} ({subject.config.name}) sows no per-head outputs of '
                     'its attention: head ablation needs a ViT.')
  model = subject.model
  cases, removed = ablations(subject)
  counts = [sum(1 for l, _ in removed if l == layer)
            for layer in range(len(subject.layers.head_outputs))]
  predict = jax.jit(lambda params, scales, x: jnp.argmax(
      model.apply({'params': params, HEAD_SCALES: scales}, x), -1))
  grid, pixels = subject.token_grid()
  names = subject.layers.attention_weights
  distances_of = jax.jit(lambda inter: [attention.mean_attention_distance(
      inter[n], grid, pixels, subject.has_cls, registers=subject.registers) for n in names])
  correct, distances, sizes = [[] for _ in cases], [], []
  for images, labels in batches('eval'):
    x = shard_examples(images, mesh=subject.mesh)
    for i, scales in enumerate(cases):
      correct[i].append(np.asarray(predict(subject.params, scales, x)) == np.asarray(labels))
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
  figure = plots.scatter(
      {name: (distance[layer], np.array(by_layer(100 * drop)[layer]))
       for layer, name in enumerate(layer_names)},
      figure_path(out, 'head_ablation', subject),
      f'Head ablation: {subject.label} (intact {100 * accuracy:.1f}%)',
      'mean attention distance (pixels)', 'accuracy lost (points)')
  return {'accuracy': accuracy,
          'accuracy_stderr': float(uncertainty.binomial_stderr(accuracy, n)),
          'layers': layer_names, 'heads': counts,
          'drop': by_layer(drop), 'drop_stderr': by_layer(drop_stderr),
          'distance': [d.tolist() for d in distance],
          'num_images': n, 'figures': [figure]}


def _findings(label, r, q):
  flat = [(l, h) for l, row in enumerate(r['drop']) for h in range(len(row))]
  layer, head = max(flat, key=lambda lh: r['drop'][lh[0]][lh[1]])
  return [f'{label}: intact ', q('accuracy'), ' ± ', q('accuracy_stderr'),
          '; one head removed costs from ', q('drop', reduce='min'), ' to ',
          q('drop', reduce='max'), f' (most: {r["layers"][layer]} head {head}, at ',
          q('distance', layer, head), ' px, ± ', q('drop_stderr', layer, head), ')']


TOOL = register(Tool(
    name='head_ablation', title='Head ablation',
    quantity='Accuracy on the evaluation split with one attention head removed at inference '
             "(its output times 0 before the output projection, through the model's "
             '`head_scales` collection, as Michel et al. 2019 mask heads): the drop from the '
             'intact accuracy ± the standard error of the paired difference over images, per '
             'head, against the head\'s mean attention distance on the same images.',
    paper='No claim of the two papers: Raghu et al. sort heads by their mean attention '
          'distance (the axis of their Fig. 5); this asks which of them the prediction '
          'needs.',
    reads_logits=True,
    run=run_head_ablation, runs_on=ATTENTION, findings=each_model(_findings),
    scalars=lambda result, label: ({'head_ablation/drop': [
        d for row in result[label]['drop'] for d in row]} if label in result else {}),
    # One forward pass over the evaluation split per head, the intact one, and the
    # attention maps' pass.
    work=lambda subject, options, amounts: Work(
        {'forward': (2 + sum(head_counts(subject))) * amounts.batches}, {'forward': 2})))
