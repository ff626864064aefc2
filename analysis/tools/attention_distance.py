"""Mean attention distance per layer and head (Raghu et al. Fig. 3, ViT paper Fig. 7)."""
from typing import Dict

import jax.numpy as jnp
import numpy as np

from analysis import attention, features, plots
from analysis.tool import (ATTENTION, Batches, Subject, Tool, batch_mean, each_model,
                           figure_path, model_scalars, register)


def run_attention_distance(subject: Subject, batches: Batches, out: str) -> Dict:
  """Mean attention distance in pixels per layer and head, averaged over images:
  spatial queries, the class-token key dropped and the rest renormalised; for
  class-token models also with that key kept as it is (weight at distance 0)."""
  names = features.attention_names(subject)
  grid, pixels = subject.token_grid()
  variants = (False, True) if subject.has_cls else (False,)

  def per_layer(images, _):
    inter = subject.intermediates(images, names)
    return jnp.stack([jnp.stack([attention.mean_attention_distance(
        inter[n], grid, pixels, subject.has_cls, keep) for n in names]) for keep in variants])

  distances = batch_mean(batches('eval'), per_layer)
  figure = plots.scatter_by_layer(distances[0], figure_path(out, 'attention_distance', subject),
                                  f'Mean attention distance: {subject.label}', 'pixels')
  result = {'distance_per_layer_head': distances[0].tolist(), 'pixels_per_token': pixels,
            'figures': [figure]}
  if subject.has_cls:
    result['distance_with_class_key_per_layer_head'] = distances[1].tolist()
  return result


def _findings(label, r, q):
  return [f'{label}: block 0 heads from ', q('distance_per_layer_head', 0, reduce='min'),
          ' to ', q('distance_per_layer_head', 0, reduce='max'),
          ' px, last block from ', q('distance_per_layer_head', -1, reduce='min'),
          ' to ', q('distance_per_layer_head', -1, reduce='max'), ' px']


TOOL = register(Tool(
    name='attention_distance', title='Attention distance',
    quantity='Mean attention distance in pixels per head: distance from each spatial query to '
             'every key patch weighted by its attention, the class-token key dropped and the '
             'rest renormalised.',
    paper='Raghu et al. (Fig. 3), ViT paper (Fig. 7): lower layers hold local and global '
          'heads, higher layers attend globally; with less pre-training data the local heads '
          'of lower layers disappear.',
    run=run_attention_distance, runs_on=ATTENTION, findings=each_model(_findings),
    scalars=model_scalars(lambda r: {'attention_distance/mean_over_heads_px': np.mean(
        r['distance_per_layer_head'], axis=1).tolist()})))
