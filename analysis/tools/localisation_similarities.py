"""Raghu et al.'s Fig. 9-10 under several similarity measures: the final-layer
representation at five query positions against every patch of the input image
(`localisation.final_positions`) under linear and debiased CKA, Procrustes
distance, mutual k-NN alignment, RSA, SVCCA and PWCCA, with bootstrap standard
errors over the images; whether each map peaks at the query's own patch, judged
under each measure and across them."""
from typing import Dict, List, Mapping, Tuple

import numpy as np

from analysis.measures import layer_similarity
from analysis.reporting import plots, verdict
from analysis.runtime.estimate import Amounts, Work
from analysis.tool import Batches, Subject, Tool, figure_path, per_model, register
from analysis.tools import localisation, similarities
from vit_jax.models.family import CONVNET, TRANSFORMER

M = layer_similarity


def measure(subject: Subject, batches: Batches,
            options: similarities.MeasureOptions = similarities.MeasureOptions()) -> Dict:
  """The final representation at each query position against each input patch
  under each measure, on the evaluation images: a map per query and measure, and
  the margin of the own patch over the best other one (`localisation.query_margins`;
  for a distance, the best other's distance less the own's), with bootstrap
  standard errors. A query's vector and a patch's pixels are the neurons PWCCA
  weighs: neither has positions to average.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    options: the tool's options.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  measures = options.measures
  n = options.images(batches)
  tokens, patches, queries, own, (h, w), grey = _positions(subject, batches)
  xs = [tokens[:, q] for q in range(len(queries))] + [patches[:, p] for p in range(h * w)]
  layers = [M.summarise(x, x, measures, similarities.KNN_QUANTILE, bound) for x, bound in
            zip(xs, similarities.stacked_bounds(xs, measures, options.similarity_knn_clip))]
  pairs = [(q, len(queries) + p) for q in range(len(queries)) for p in range(h * w)]

  def statistic(measure, row, index):
    del index  # the margins read the measure's values alone
    margins = _margins(measure, row.reshape(len(queries), h, w), own)
    return np.concatenate([[np.mean(margins)], margins])

  measured = M.measured(layers, {m: pairs for m in measures}, measures, statistic,
                        options.similarity_resamples, options.similarity_knn,
                        options.svcca_dims)
  maps = {m: measured.values[m].reshape(len(queries), h, w) for m in measures}
  result = {
      'queries': queries, 'grid': [h, w], 'class_token': subject.has_cls,
      'measures': list(measures), 'num_images': n, 'resamples': options.similarity_resamples,
      'maps': {m: maps[m].tolist() for m in measures},
      'stderr': {m: measured.stderr[m].reshape(len(queries), h, w).tolist() for m in measures},
      'own_margin': {m: [measured.statistics[m][0], measured.statistics_stderr[m][0]]
                     for m in measures},
      'query_margins': {m: measured.statistics[m][1:].tolist() for m in measures},
      'peak_at_query': {m: _peaks(measured.statistics[m][1:]) for m in measures},
      'seconds_per_pair': measured.seconds_per_pair}
  result['not_applicable'] = M.not_applicable(
      layers, measured.values,
      M.svcca_directions(layers, options.svcca_dims) if 'svcca' in measures else (),
      'a query\'s channels or a patch\'s pixels' +
      (' (grey images: each pixel three times)' if grey else '') + ' are')
  return result


def _positions(subject: Subject, batches: Batches) -> Tuple:
  """The evaluation images' final representations at the query positions and their
  input patches (`localisation.final_positions`), the queries, each query's own
  patch, the patch grid, and whether every image is grey."""
  tokens, patches, found, grey = [], [], None, True
  for images, _ in batches('eval'):
    grey = grey and bool(np.all(images == images[..., :1]))
    found = localisation.final_positions(subject, images)
    tokens.append(found.tokens)
    patches.append(found.patches)
  return (np.concatenate(tokens), np.concatenate(patches), found.queries, found.own,
          found.grid, grey)


def draw(result: Mapping, subject: Subject, out: str,
         options: similarities.MeasureOptions = similarities.MeasureOptions()) -> List[str]:
  """The figure of the tool's numbers (`measure`): a map per query (columns) and
  measure (rows).

  See `analysis.tool.Draw`.
  """
  measures, queries = result['measures'], [tuple(q) for q in result['queries']]
  return [plots.image_grid(
      np.concatenate([np.asarray(result['maps'][m], np.float64) for m in measures]),
      figure_path(out, 'localisation_similarities', subject),
      f'Final positions vs input patches: {subject.label}\n(a row per measure, each map on '
      'its own scale;\nfor the Procrustes distance the darkest is the most alike)',
      cols=len(queries),
      labels=[f'{M.TITLES[m]}\nquery ({i}, {j})' for m in measures for i, j in queries],
      cmap='viridis', marks=[q for _ in measures for q in queries])]


def _peaks(margins: np.ndarray) -> float:
  """The share of the queries with a margin whose map peaks at the own patch."""
  known = margins[np.isfinite(margins)]
  return float(np.mean(known > 0)) if len(known) else float('nan')


def _known(value) -> bool:
  """Whether a number of the JSON has a value (NaN is null there)."""
  return value is not None and bool(np.isfinite(value))


def _margins(measure: str, maps: np.ndarray, own: np.ndarray) -> np.ndarray:
  """`localisation.query_margins` of a measure's maps, positive where the own patch
  is the most alike (for a distance, the lowest)."""
  return localisation.query_margins(-maps if measure in M.DISTANCES else maps, own)


def findings(result: Mapping, q) -> Dict[str, list]:
  """What each model shows, per caption key (the model).

  Args:
    result: the tool's JSON.
    q: makes a quote of a number of the JSON (`tool.QuoteFn`).

  Returns:
    Text fragments per caption key.
  """
  out = {}
  for label, r in per_model(result).items():
    parts = [f'{label}: own-patch margin']
    for i, m in enumerate(r['measures']):
      parts += [', ' if i else ' ', f'{M.TITLES[m]} ', *similarities.estimate_quote(
          q, r['own_margin'][m], label, 'own_margin', m)]
      if _known(r['peak_at_query'][m]):
        parts += [' (peaks at the own patch for ', q(label, 'peak_at_query', m),
                  ' of the queries)']
    for why in r['not_applicable'].values():
      parts += [f' ({why})']
    out[label] = parts
  return out


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """Raghu et al.'s Fig. 9 claims judged under every measure, then across them: a
  class-token ViT's final tokens peak at their own patch (the mean margin is
  positive), and a ViT's margin exceeds a ResNet's. A model given as several runs
  is judged on their combined margin.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  here = per_model(result)
  if not here:
    return []
  measures = next(iter(here.values()))['measures']
  own, contrast = {}, {}
  for m in measures:
    what = f'{M.TITLES[m]}: own-patch margin over the best other patch, mean over queries'
    estimate = lambda label, m=m: tuple(here[label]['own_margin'][m])
    singles = [verdict.single('tokens keep their position', '', what, label, estimate(label))
               for label, r in here.items()
               if r['class_token'] and models.get(label, {}).get('architecture') == TRANSFORMER]
    if singles:
      own[m] = verdict.across_seeds(singles, models)
    contrast[m] = verdict.contrast('', '', what, models, list(here), estimate,
                                   higher=TRANSFORMER, lower=CONVNET)
  found = []
  if own:
    for i in range(len(next(iter(own.values())))):
      found.append(similarities.across_measures(
          'tokens keep their position, across measures',
          'A class-token ViT\'s final-layer tokens are most alike the input patch at their own '
          'position (Raghu et al. Fig. 9), under each similarity measure.',
          {m: own[m][i] for m in own}))
  found.append(similarities.across_measures(
      'ViT localises more than ResNet, across measures',
      'ViT\'s final tokens keep their input position more faithfully than a ResNet\'s final '
      'positions (Raghu et al. Fig. 9), under each similarity measure.', contrast))
  return found


SUMMARIES, PAIRS_DRAW = similarities.SUMMARIES, similarities.PAIRS_DRAW


def _grid(subject: Subject) -> Tuple[int, int]:
  """The final layer's (h, w) grid, from the shapes alone."""
  last = subject.layers.stream[-1]
  shape = subject.intermediate_shapes([last])[last].shape
  if len(shape) == 3:  # a square grid of tokens
    side = int(round(np.sqrt(shape[1] - int(subject.has_cls) - subject.registers)))
    return side, side
  return shape[1], shape[2]


def work(subject: Subject, options: similarities.MeasureOptions, amounts: Amounts) -> Work:
  """A pass over the evaluation split; a summary per query and patch; the measures
  of every query against every patch on the estimate and each bootstrap draw.

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  h, w = _grid(subject)
  positions, queries = h * w, len(localisation.query_positions(h, w))
  return Work({'forward': amounts.batches}, {'forward': 1},
              host={SUMMARIES: queries + positions,
                    PAIRS_DRAW: (options.similarity_resamples + 1) * queries * positions})


def host_prices(subject: Subject, images: np.ndarray, labels: np.ndarray,
                options: similarities.MeasureOptions, amounts: Amounts) -> Dict[str, float]:
  """Seconds of a summary and of a query against a patch in one draw, timed on
  features of their shapes (`similarities.measure_prices`).

  Args:
    subject: the model.
    images: one evaluation batch of images.
    labels: their labels.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    Seconds per unit, by the unit's name.
  """
  found = localisation.final_positions(subject, images[:1])
  return similarities.measure_prices((found.tokens.shape[2:], found.patches.shape[2:]),
                                     options, amounts)


TOOL = register(Tool(
    name='localisation_similarities', importance=23,
    title='Localisation of final-layer positions, under several measures',
    quantity='The final-layer representation at five query positions (red crosses) against '
             'every non-overlapping patch of the input image at the same grid, under the '
             'similarities tool\'s measures, each as its authors\' code computes it, on the '
             'evaluation images; the margin of the own patch over the best other one (for '
             'Procrustes, a distance, the best other\'s distance less the own\'s), ± the '
             'bootstrap standard error over the images.',
    paper='Raghu et al. (Fig. 9, 10) under linear CKA: ViT\'s final tokens stay most similar to '
          'the input patch at their own position; ResNet\'s final positions and GAP models\' '
          'tokens less so.',
    run=measure, draw=draw, findings=findings, options=similarities.MeasureOptions,
    verdicts=verdicts, work=work, host_prices=host_prices,
    shortened_by=('num_images', 'similarity_resamples'),
    minimum='5 bootstrap draws'))
