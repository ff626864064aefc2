"""Do final-layer tokens (or a ResNet's final positions) still know where they
are? Their CKA with every patch of the input image (Raghu et al. Fig. 9, 10)."""
from typing import Dict, List, Mapping, NamedTuple, Tuple

import numpy as np

from analysis.measures import embeddings, similarity, uncertainty
from analysis.reporting import plots, verdict
from analysis.runtime import features
from analysis.tool import (Batches, Subject, Tool, each_model, figure_path, model_scalars,
                           per_model, register)
from vit_jax.models.family import CONVNET, TRANSFORMER


def query_margins(maps: np.ndarray, own: np.ndarray) -> np.ndarray:
  """Per query, (CKA with the query's own patch) - (largest CKA with any other
  patch): positive where the map peaks at its own position. A patch whose pixels
  do not vary over the images (a blank corner over one minibatch) has no CKA (NaN)
  and is no other patch's rival; a NaN at the query's own patch leaves its margin
  NaN.

  Args:
    maps: (queries, h, w) CKA maps.
    own: each query's own patch, an index into the h * w patches.

  Returns:
    The (queries,) margins.
  """
  flat = maps.reshape(len(maps), -1)
  at_own = flat[np.arange(len(flat)), own]
  others = np.where((np.arange(flat.shape[1])[None] == own[:, None]) | np.isnan(flat),
                    -np.inf, flat).max(axis=1)
  return at_own - np.where(np.isinf(others), np.nan, others)


def own_margin(maps: np.ndarray, own: np.ndarray) -> float:
  """The mean over queries of `query_margins`: positive when every map peaks at its
  own position (NaN where a query's is).

  Args:
    maps: (queries, h, w) CKA maps.
    own: each query's own patch, an index into the h * w patches.

  Returns:
    The mean margin.
  """
  return float(np.mean(query_margins(maps, own)))


def query_positions(h: int, w: int) -> List[Tuple[int, int]]:
  """The query positions of an (h, w) grid: its corners and its centre.

  Args:
    h: the grid's rows.
    w: its columns.

  Returns:
    Their (row, column).
  """
  return [(0, 0), (0, w - 1), (h // 2, w // 2), (h - 1, 0), (h - 1, w - 1)]


class Positions(NamedTuple):
  """A batch's final-layer queries and input patches (`final_positions`)."""
  tokens: np.ndarray  # (b, queries, channels) the final representation at the queries
  patches: np.ndarray  # (b, h * w, pixels) the input's patches
  grid: Tuple[int, int]  # (h, w)
  queries: List[Tuple[int, int]]  # their (row, column)
  own: np.ndarray  # their own patches' indices into the h * w


def final_positions(subject: Subject, images: np.ndarray) -> Positions:
  """What Raghu et al. compare: the final-layer representation at five query
  positions of its (h, w) grid (spatial tokens of a ViT or Mixer, positions of a
  ResNet's or hybrid's final map: the corners and the centre) and the h x w
  non-overlapping patches of the input image at that grid (their pixels).

  Args:
    subject: the model.
    images: a batch of images.

  Returns:
    The queries and patches.
  """
  last = subject.layers.stream[-1]
  final = np.asarray(features.spatial_map(subject, subject.intermediates(images, [last])[last]))
  h, w = final.shape[1:3]
  queries = query_positions(h, w)
  own = np.array([i * w + j for i, j in queries])
  tokens = final.reshape(len(images), h * w, -1)[:, own]
  patches = np.asarray(embeddings.image_patches(images, (h, w)))
  return Positions(tokens, patches, (h, w), queries, own)


def measure(subject: Subject, batches: Batches) -> Dict:
  """Linear CKA (minibatch, unbiased HSIC, as the cka tool) over the evaluation
  images between the final-layer representation at five query positions of its
  (h, w) grid (spatial tokens of a ViT or Mixer, positions of a ResNet's or
  hybrid's final map) and each of the h x w non-overlapping patches of the input
  image (its pixels), as Raghu et al. compare them: a map per query. The margin
  of each map's own patch over the best other one, with its standard error over
  batches, says whether the position is kept.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  stream, sizes, grid = similarity.MinibatchCKA(), [], None
  for images, _ in batches('eval'):
    sizes.append(len(images))
    found = final_positions(subject, images)
    grid, queries, own = found.grid, found.queries, found.own
    h, w = grid
    pixels = [images.shape[1] // h, images.shape[2] // w]
    stream.update([found.tokens[:, q] for q in range(len(own))] +
                  [found.patches[:, p] for p in range(h * w)])
  if grid is None:
    raise ValueError('The evaluation split gave no batches.')
  split = len(queries)

  def maps_of(matrix):
    return np.asarray(matrix)[:split, split:].reshape(split, h, w)

  mean_maps = maps_of(stream.result())
  per_batch = [own_margin(maps_of(m), own) for m in stream.per_batch]
  return {'queries': queries, 'grid': list(grid), 'class_token': subject.has_cls,
          'patch_pixels': pixels,
          'maps': mean_maps.tolist(),
          'peak_at_query': [float(np.argmax(m) == k) for m, k in zip(mean_maps, own)],
          'own_margin': own_margin(mean_maps, own),
          'own_margin_stderr': float(uncertainty.weighted_mean_stderr(per_batch, sizes)),
          'num_images': stream.num_examples}


def draw(result: Mapping, subject: Subject, out: str) -> List[str]:
  """The figure of the tool's numbers (`measure`): each query's map of CKA over the
  input patches, the query marked.

  See `analysis.tool.Draw`.
  """
  maps, queries = np.asarray(result['maps']), [tuple(q) for q in result['queries']]
  return [plots.image_grid(
      maps, figure_path(out, 'localisation', subject),
      f'Final positions vs input patches: {subject.label}', cols=5,
      labels=[f'query (row {i}, col {j})' for i, j in queries], cmap='viridis',
      colorbar_label='linear CKA', vmin=float(maps.min()), vmax=float(maps.max()),
      marks=queries)]


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  claim = ('A class-token ViT\'s final-layer tokens are most similar to the input patch at '
           'their own position (Raghu et al. Fig. 9; GAP models localise less, Fig. 10).')
  what = 'own-patch CKA minus the best other patch\'s, mean over queries'
  models_here = per_model(result)
  estimate = lambda label: (models_here[label]['own_margin'],
                            models_here[label]['own_margin_stderr'])
  found = []
  for label, r in models_here.items():
    if models.get(label, {}).get('architecture') != TRANSFORMER:
      continue  # the contrast below places the other kinds
    if r['class_token']:
      found.append(verdict.single('tokens keep their position', claim, what, label,
                                  estimate(label)))
    else:
      found.append(verdict.Verdict(
          'tokens keep their position', claim, f'{label}: {what} {verdict.show(estimate(label))}',
          verdict.NOT_COMPARABLE, 'the claim concerns class-token ViTs; this one pools its '
          'tokens', label=label))
  found.append(verdict.contrast(
      'ViT localises more than ResNet',
      'ViT\'s final tokens keep their input position more faithfully than a ResNet\'s final '
      'positions, whose similarity is spread out (Raghu et al. Fig. 9).', what, models,
      list(models_here), estimate, higher=TRANSFORMER, lower=CONVNET))
  return found


TOOL = register(Tool(
    name='localisation', importance=10, title='Localisation of final-layer positions',
    quantity='Linear CKA over the evaluation images between the final-layer representation at '
             'five query positions (red crosses) and every non-overlapping patch of the input '
             'image at the same grid; the margin of the own patch over the best other one, '
             'with its standard error over batches.',
    paper='Raghu et al. (Fig. 9, 10): ViT\'s final tokens stay most similar to the input patch '
          'at their own position; ResNet\'s final positions and GAP models\' tokens less so.',
    run=measure, draw=draw,
    findings=each_model(lambda label, r, q: [
        f'{label}: own-patch CKA margin ', q('own_margin'), ' ± ', q('own_margin_stderr'),
        '; the mean maps peak at the query\'s own patch for ',
        q('peak_at_query', reduce='mean'), ' of the queries']),
    scalars=model_scalars(lambda r: {'localisation/peak_at_query': list(r['peak_at_query']),
                                     'localisation/own_margin': [r['own_margin']]}),
    verdicts=verdicts))
