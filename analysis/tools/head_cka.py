"""Which attention heads resemble a convolutional network's lower layers? Linear CKA
between each head's output and another model's layers, against the head's mean
attention distance (Raghu et al. Fig. 5)."""
import os
from typing import Dict, List, Mapping, Sequence, Tuple

import jax
import numpy as np

from analysis.measures import attention, similarity
from analysis.reporting import plots
from analysis.runtime import features
from analysis.tool import ALL_MODELS, Batches, Figure, Subject, Tool, register


def lower_half(num_layers: int) -> int:
  """How many of a reference model's first stream layers count as its lower layers.

  Args:
    num_layers: the reference model's stream layers.

  Returns:
    The count.
  """
  return max(1, (num_layers + 1) // 2)


def attention_blocks(subject: Subject) -> List[int]:
  """The attention layers whose heads Raghu et al. show: the first and the last.

  Args:
    subject: a model that sows its heads' outputs.

  Returns:
    Their indices, in order.
  """
  return sorted({0, len(subject.layers.head_outputs) - 1})


def heads_per_layer(subject: Subject) -> int:
  """The heads of the first attention layer, from the shapes alone.

  Args:
    subject: a model that sows its heads' outputs.

  Returns:
    Their number.
  """
  name = subject.layers.head_outputs[0]
  return subject.intermediate_shapes([name])[name].shape[2]


def head_features(subject: Subject, images: np.ndarray, blocks: Sequence[int],
                  grid: Tuple[Tuple[int, int], float]) -> Tuple[List[np.ndarray], np.ndarray]:
  """Each head's output (spatial tokens, before the output projection) of the
  attention layers `blocks`, and each image's mean attention distance per head
  (class-token key dropped, as `attention_distance`).

  Args:
    subject: the model.
    images: a batch of images.
    blocks: attention layers (`attention_blocks`).
    grid: the subject's `token_grid()`, found once for all its batches.

  Returns:
    (b, tokens, head width) per head, the blocks' heads in order; and the (b,
    blocks, heads) distances in pixels.
  """
  heads_of = [subject.layers.head_outputs[b] for b in blocks]
  weights_of = [subject.layers.attention_weights[b] for b in blocks]
  side, pixels = grid
  inter = subject.intermediates(images, heads_of + weights_of)
  spatial = int(subject.has_cls) + subject.registers
  heads = [np.asarray(y[:, spatial:, h]) for y in (inter[n] for n in heads_of)
           for h in range(y.shape[2])]
  per_image = jax.vmap(lambda w: attention.mean_attention_distance(
      w[None], side, pixels, subject.has_cls, registers=subject.registers))
  return heads, np.stack([np.asarray(per_image(inter[n])) for n in weights_of], axis=1)


def measure(subjects: Sequence[Subject], batches: Batches) -> Dict:
  """For each model that sows its heads' outputs, against every other model:
  minibatch linear CKA (unbiased) between every head of the first and the last
  attention layer (`head_features`) and every stream layer of the others, in one
  pass over the evaluation split per such model, with each head's mean attention
  distance.

  Args:
    subjects: the models.
    batches: split -> its (images, labels) batches.

  Returns:
    The tool's JSON but its figures (`draw`'s): {'pairs': {'a vs b': a's heads
    against b's layers}}.
  """
  pairs = {}
  for s in subjects:
    others = [r for r in subjects if r is not s]
    if not s.layers.head_outputs or not others:
      continue
    blocks, grid = attention_blocks(s), s.token_grid()
    stream = similarity.MinibatchCKA('linear', unbiased=True)
    distances = []
    for images, _ in batches('eval'):
      heads, per_image = head_features(s, images, blocks, grid)
      stream.update(heads + features.layer_representations(
          others, [r.layers.stream for r in others], images))
      distances.append(per_image)
    matrix, num_heads = stream.result(), len(heads) // len(blocks)
    distance = np.concatenate(distances).mean(axis=0)
    bounds = len(heads) + np.cumsum([0] + [len(r.layers.stream) for r in others])
    for r, first, last in zip(others, bounds[:-1], bounds[1:]):
      cross = matrix[:len(heads), first:last].reshape(len(blocks), num_heads, -1)
      lower = lower_half(len(r.layers.stream))
      to_lower = cross[:, :, :lower].mean(-1)
      pairs[f'{s.label} vs {r.label}'] = {
          'blocks': block_labels(s, blocks), 'reference_layers': list(r.layers.labels),
          'lower_layers': lower, 'cka': cross.tolist(), 'cka_lower': to_lower.tolist(),
          'distance': distance.tolist(),
          'correlation': [correlation(distance[i], to_lower[i]) for i in range(len(blocks))],
          'num_examples': stream.num_examples}
  return {'pairs': pairs}


def draw(result: Mapping, subjects: Sequence[Subject], out: str) -> List[str]:
  """The figures of the tool's numbers (`measure`): per pair, in `result['pairs']`'s
  order, each head's CKA with the other model's lower layers against its mean
  attention distance.

  See `analysis.tool.Draw`.
  """
  figures = []
  for key, r in result['pairs'].items():
    a, b = key.split(' vs ')
    figures.append(plots.scatter(
        {f'{label} heads': (r['distance'][i], r['cka_lower'][i])
         for i, label in enumerate(r['blocks'])},
        os.path.join(out, f'head_cka_{a}_{b}.png'), f'Heads of {a} against the lower layers of {b}',
        'mean attention distance (pixels)', f'CKA with {b}\'s first {r["lower_layers"]} layers'))
  return figures


def block_labels(subject: Subject, blocks: Sequence[int]) -> List[str]:
  """The blocks' names as the figures give them.

  Args:
    subject: the model.
    blocks: attention layers.

  Returns:
    Their labels.
  """
  return [subject.layers.labels[subject.layers.attention[b]].split('/')[0] for b in blocks]


def correlation(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation across heads (NaN below three heads or without spread).

  Args:
    x: a value per head.
    y: another.

  Returns:
    The correlation.
  """
  if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
    return float('nan')
  return float(np.corrcoef(x, y)[0, 1])


def findings(result: Mapping, q) -> Dict[str, list]:
  """What the models show, per caption key.

  Args:
    result: the tool's JSON.
    q: makes a quote of a number of the JSON (`tool.QuoteFn`).

  Returns:
    Text fragments per caption key.
  """
  out = {}
  for key, r in result['pairs'].items():
    parts, quote = [f'{key}: '], lambda *path, **kw: q('pairs', key, *path, **kw)
    for i, block in enumerate(r['blocks']):
      parts += ['; ' if i else '', f'{block} heads at ', quote('distance', i, reduce='min'),
                ' to ', quote('distance', i, reduce='max'), ' px have CKA ',
                quote('cka_lower', i, reduce='min'), ' to ', quote('cka_lower', i, reduce='max'),
                ' with the lower layers (correlation with distance ', quote('correlation', i),
                ')']
    out[key] = parts
  return out


def pair_figures(result: Mapping) -> List[Figure]:
  """The figures of a JSON of pairs of models ({'pairs': {'a vs b': ...}, 'figures':
  one per pair, in the pairs' order}), each captioned by its pair.

  Args:
    result: the tool's JSON.

  Returns:
    The figures.
  """
  return [Figure(path, key, tuple(key.split(' vs ')))
          for key, path in zip(result['pairs'], result['figures'])]


def heads_and_second_model(subjects: Sequence[Subject]) -> str:
  """Why a tool comparing one model's attention heads with a second model's layers
  cannot run on `subjects` (`Tool.needs`), or '' when it can.

  Args:
    subjects: the models given.

  Returns:
    The reason, a clause after the tool's name, or ''.
  """
  if len(subjects) > 1 and any(s.layers.head_outputs for s in subjects):
    return ''
  return ('compares one model\'s attention heads with a second model\'s layers: give a ViT '
          'and a second model (--config2 with --workdir2 or --checkpoint2)')


TOOL = register(Tool(
    name='head_cka', importance=11, title='Attention heads against the other model\'s layers',
    quantity='Minibatch linear CKA (unbiased) between each head\'s output (spatial tokens, '
             'before the output projection) of the first and last attention layer and every '
             'stream layer of the other model, drawn against the head\'s mean attention '
             'distance; the y axis averages the CKA over the lower half of the other model\'s '
             'layers.',
    paper='Raghu et al. (Fig. 5): the ViT\'s lower-layer heads that attend locally are the ones '
          'most similar to the ResNet\'s lower layers; globally attending heads are not.',
    run=measure, draw=draw, runs_on=ALL_MODELS, findings=findings, figures=pair_figures,
    needs=heads_and_second_model))
