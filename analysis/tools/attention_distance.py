"""Mean attention distance per layer and head (Raghu et al. Fig. 3, ViT paper Fig. 7)."""
from typing import Dict, List, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from analysis.measures import attention
from analysis.reporting import plots, verdict
from analysis.runtime import features
from analysis.tool import (ATTENTION, Batches, Subject, Tool, batch_mean, each_model,
                           figure_path, model_scalars, per_model, register)


def measure(subject: Subject, batches: Batches) -> Dict:
  """Mean attention distance in pixels per layer and head, averaged over images:
  spatial queries, the class-token key dropped and the rest renormalised; for
  class-token models also with that key kept as it is (weight at distance 0). The
  distance uniform attention would give is the reference line.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  names = features.attention_names(subject)
  grid, pixels = subject.token_grid()
  variants = (False, True) if subject.has_cls else (False,)

  # One compiled program per batch: eager steps on weights split over many CPU
  # devices can leave XLA:CPU's collectives waiting on one another.
  distances_of = jax.jit(lambda inter: jnp.stack([jnp.stack([
      attention.mean_attention_distance(inter[n], grid, pixels, subject.has_cls, keep,
                                        subject.registers) for n in names])
      for keep in variants]))

  def per_layer(images, _):
    return distances_of(subject.intermediates(images, names))

  distances, stderr = batch_mean(batches('eval'), per_layer)
  uniform = float(attention.patch_distances(grid, pixels).mean())
  result = {'distance_per_layer_head': distances[0].tolist(),
            'distance_stderr': stderr[0].tolist(), 'uniform_distance': uniform,
            'pixels_per_token': pixels}
  if subject.has_cls:
    result['distance_with_class_key_per_layer_head'] = distances[1].tolist()
  return result


def draw(result: Mapping, subject: Subject, out: str) -> List[str]:
  """The figure of the tool's numbers (`measure`): each head's distance per layer,
  with its standard error and the distance of uniform attention.

  See `analysis.tool.Draw`.
  """
  return [plots.scatter_by_layer(
      np.asarray(result['distance_per_layer_head']),
      figure_path(out, 'attention_distance', subject),
      f'Mean attention distance: {subject.label}', 'mean attention distance (pixels)',
      errors=np.asarray(result['distance_stderr']), reference=result['uniform_distance'],
      reference_label='uniform attention')]


def _findings(label, r, q):
  return [f'{label}: block 0 heads from ', q('distance_per_layer_head', 0, reduce='min'),
          ' to ', q('distance_per_layer_head', 0, reduce='max'),
          ' px, last block from ', q('distance_per_layer_head', -1, reduce='min'),
          ' to ', q('distance_per_layer_head', -1, reduce='max'), ' px; uniform attention ',
          q('uniform_distance'), ' px']


def _block(r: Mapping, i: int, reduce) -> verdict.Estimate:
  """A reduction over the heads of block i, with a standard error bounded by the
  mean of the heads' (their batches are shared, so correlated: the bound holds)."""
  row = np.asarray(r['distance_per_layer_head'][i], np.float64)
  return float(reduce(row)), float(np.mean(np.asarray(r['distance_stderr'][i], np.float64)))


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  found = []
  for label, r in per_model(result).items():
    first, last = 0, len(r['distance_per_layer_head']) - 1
    found.append(verdict.single(
        'global attention deeper',
        'Higher layers attend more globally than lower ones (Raghu et al. Fig. 3).',
        'mean distance of the last block minus block 0 (px)', label,
        verdict.difference(_block(r, last, np.mean), _block(r, first, np.mean))))
    spread = lambda i: verdict.difference(_block(r, i, np.max), _block(r, i, np.min))
    found.append(verdict.single(
        'local and global heads low',
        'Lower layers mix local and global heads; higher layers\' heads are all global '
        '(Raghu et al. Fig. 3).', 'range of head distances, block 0 minus the last block (px)',
        label, verdict.difference(spread(first), spread(last))))
  return found


TOOL = register(Tool(
    name='attention_distance', importance=3, title='Attention distance',
    quantity='Mean attention distance in pixels per head: distance from each spatial query to '
             'every key patch weighted by its attention, the class-token key dropped and the '
             'rest renormalised; error bars are standard errors over batches, the line the '
             'distance of uniform attention.',
    paper='Raghu et al. (Fig. 3), ViT paper (Fig. 7): lower layers hold local and global '
          'heads, higher layers attend globally; with less pre-training data the local heads '
          'of lower layers disappear.',
    run=measure, draw=draw, runs_on=ATTENTION, findings=each_model(_findings),
    scalars=model_scalars(lambda r: {'attention_distance/mean_over_heads_px': np.mean(
        r['distance_per_layer_head'], axis=1).tolist()}),
    verdicts=verdicts))
