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


def run_head_cka(subjects: Sequence[Subject], batches: Batches, out: str) -> Dict:
  """For each model that sows its heads' outputs, against every other model:
  minibatch linear CKA (unbiased) between every head of the first and the last
  attention layer (`head_features`) and every stream layer of the others, in one
  pass over the evaluation split per such model, with each head's mean attention
  distance.

  Args:
    subjects: the models.
    batches: split -> its (images, labels) batches.
    out: the directory the figures go to.

  Returns:
    The tool's JSON.
  """
  result = {}
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
    labels = block_labels(s, blocks)
    bounds = len(heads) + np.cumsum([0] + [len(r.layers.stream) for r in others])
    for r, first, last in zip(others, bounds[:-1], bounds[1:]):
      cross = matrix[:len(heads), first:last].reshape(len(blocks), num_heads, -1)
      lower = lower_half(len(r.layers.stream))
      to_lower = cross[:, :, :lower].mean(-1)
      figure = plots.scatter(
          {f'{label} heads': (distance[i], to_lower[i]) for i, label in enumerate(labels)},
          os.path.join(out, f'head_cka_{s.label}_{r.label}.png'),
          f'Heads of {s.label} against the lower layers of {r.label}',
          'mean attention distance (pixels)', f'CKA with {r.label}\'s first {lower} layers')
      result[f'{s.label} vs {r.label}'] = {
          'blocks': labels, 'reference_layers': list(r.layers.labels), 'lower_layers': lower,
          'cka': cross.tolist(), 'cka_lower': to_lower.tolist(), 'distance': distance.tolist(),
          'correlation': [correlation(distance[i], to_lower[i]) for i in range(len(blocks))],
          'num_examples': stream.num_examples, 'figures': [figure]}
  return result


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
  for key, r in result.items():
    parts = [f'{key}: ']
    for i, block in enumerate(r['blocks']):
      parts += ['; ' if i else '', f'{block} heads at ', q(key, 'distance', i, reduce='min'),
                ' to ', q(key, 'distance', i, reduce='max'), ' px have CKA ',
                q(key, 'cka_lower', i, reduce='min'), ' to ', q(key, 'cka_lower', i, reduce='max'),
                ' with the lower layers (correlation with distance ', q(key, 'correlation', i),
                ')']
    out[key] = parts
  return out


def figures(result: Mapping) -> List[Figure]:
  """The figures of the tool's JSON, with their captions' keys.

  Args:
    result: the tool's JSON.

  Returns:
    The figures.
  """
  return [Figure(path, key, tuple(key.split(' vs ')))
          for key, r in result.items() for path in r['figures']]


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
    run=run_head_cka, runs_on=ALL_MODELS, findings=findings, figures=figures,
    needs=heads_and_second_model))
