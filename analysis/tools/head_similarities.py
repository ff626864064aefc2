"""Raghu et al.'s Fig. 5 under several similarity measures: each attention head of
a ViT's first and last attention layer against every layer of another model under
linear and debiased CKA, Procrustes distance, mutual k-NN alignment, RSA, SVCCA
and PWCCA, drawn against the head's mean attention distance, with bootstrap
standard errors over the images; the claim that locally attending heads are the
ones most alike the other model's lower layers, judged under each measure and
across them."""
import os
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from analysis.measures import layer_similarity
from analysis.reporting import plots, verdict
from analysis.runtime.estimate import Amounts, Work
from analysis.tool import ALL_MODELS, Batches, Subject, Tool, register
from analysis.tools import head_cka, similarities
from vit_jax.models.family import CONVNET, TRANSFORMER

M = layer_similarity


def measure(subjects: Sequence[Subject], batches: Batches,
            options: similarities.MeasureOptions = similarities.MeasureOptions()) -> Dict:
  """For each model that sows its heads' outputs, against every other model: every
  head of its first and last attention layer (`head_cka.head_features`) against
  every stream layer of the other under each measure, on the evaluation images;
  per head, the mean over the other model's lower half (`head_cka.lower_half`), and
  per attention layer the correlation across heads of that mean with the heads'
  mean attention distance. Each with its bootstrap standard error (the distances
  are drawn with the images).

  Args:
    subjects: the models.
    batches: split -> its (images, labels) batches.
    options: the tool's options.

  Returns:
    The tool's JSON but its figures (`draw`'s): {'pairs': {'a vs b': a's heads
    against b's layers}}.
  """
  measures, n = options.measures, options.images(batches)
  pairs = {}
  for s in subjects:
    others = [r for r in subjects if r is not s]
    if not s.layers.head_outputs or not others:
      continue
    blocks, distances, layers = _heads(s, batches, options)
    layers += similarities.summarise(others, batches, measures, n, options.similarity_knn_clip)
    kept = M.svcca_directions(layers, options.svcca_dims) if 'svcca' in measures else ()
    bounds = (len(blocks) * distances.shape[2]
              + np.cumsum([0] + [len(r.layers.stream) for r in others]))
    for r, first, last in zip(others, bounds[:-1], bounds[1:]):
      pairs[f'{s.label} vs {r.label}'] = _entry(s, r, blocks, distances, layers, kept,
                                                (first, last), n, options)
  return {'pairs': pairs}


def _heads(s: Subject, batches: Batches, options: similarities.MeasureOptions
           ) -> Tuple[List[int], np.ndarray, List]:
  """The attention blocks compared, each image's mean attention distance per block
  and head (n, blocks, heads), and each head's outputs summarised for the measures."""
  blocks, grid = head_cka.attention_blocks(s), s.token_grid()
  heads, distances = [], []
  for images, _ in batches('eval'):
    outputs, per_image = head_cka.head_features(s, images, blocks, grid)
    heads.append(outputs)
    distances.append(per_image)
  xs = [np.concatenate(parts) for parts in zip(*heads)]
  del heads
  return blocks, np.concatenate(distances), [
      M.summarise(x, x.mean(axis=1), options.measures, similarities.KNN_QUANTILE, bound)
      for x, bound in zip(xs, similarities.stacked_bounds(xs, options.measures,
                                                          options.similarity_knn_clip))]


def _entry(s: Subject, r: Subject, blocks: Sequence[int], distances: np.ndarray,
           layers: Sequence, kept: Any, span: Tuple[int, int], n: int,
           options: similarities.MeasureOptions) -> Dict:
  """`s`'s heads against `r`'s stream layers (`layers[span[0]:span[1]]`): the
  similarities, each head's mean to `r`'s lower half, and per block the correlation
  across heads of that mean with the heads' attention distance, with their
  bootstrap standard errors."""
  measures, (first, last) = options.measures, span
  num_heads = distances.shape[2]
  lower = head_cka.lower_half(len(r.layers.stream))
  pairs = [(h, j) for h in range(len(blocks) * num_heads) for j in range(first, last)]

  def statistic(measure, row, index):
    del measure  # the same statistics of every measure
    to_lower = row.reshape(len(blocks), num_heads, -1)[:, :, :lower].mean(-1)
    drawn = distances[index].mean(axis=0)
    return np.concatenate([[head_cka.correlation(drawn[b], to_lower[b])
                            for b in range(len(blocks))], to_lower.ravel()])

  found = M.measured(layers, {m: pairs for m in measures}, measures, statistic,
                     options.similarity_resamples, options.similarity_knn, options.svcca_dims)
  shape, split = (len(blocks), num_heads, last - first), len(blocks)
  return {
      'blocks': head_cka.block_labels(s, blocks), 'reference_layers': list(r.layers.labels),
      'lower_layers': lower, 'measures': list(measures), 'num_examples': n,
      'resamples': options.similarity_resamples,
      'distance': distances.mean(axis=0).tolist(),
      'similarity': {m: found.values[m].reshape(shape).tolist() for m in measures},
      'stderr': {m: found.stderr[m].reshape(shape).tolist() for m in measures},
      'to_lower': {m: found.statistics[m][split:].reshape(shape[:2]).tolist() for m in measures},
      'to_lower_stderr': {m: found.statistics_stderr[m][split:].reshape(shape[:2]).tolist()
                          for m in measures},
      'correlation': {m: [[found.statistics[m][b], found.statistics_stderr[m][b]]
                          for b in range(split)] for m in measures},
      'seconds_per_pair': found.seconds_per_pair,
      'not_applicable': M.not_applicable(layers, found.values, kept)}


def draw(result: Mapping, subjects: Sequence[Subject], out: str,
         options: similarities.MeasureOptions) -> List[str]:
  """The figures of the tool's numbers (`measure`): per pair, in `result['pairs']`'s
  order, a panel per measure of each head's mean over the other model's lower layers
  against its mean attention distance.

  See `analysis.tool.Draw`.
  """
  figures = []
  for key, entry in result['pairs'].items():
    a, b = key.split(' vs ')
    panels = {}
    for m in entry['measures']:
      distance, to_lower = np.asarray(entry['distance']), np.asarray(entry['to_lower'][m])
      panels[M.TITLES[m]] = (
          {f'{block} heads': (distance[i], to_lower[i])
           for i, block in enumerate(entry['blocks'])},
          f'{"distance" if m in M.DISTANCES else "similarity"} to the first '
          f'{entry["lower_layers"]} layers')
    figures.append(plots.scatter_panels(
        panels, os.path.join(out, f'head_similarities_{a}_{b}.png'),
        f'Heads of {key}: the lower layers of {b} under each measure',
        'mean attention distance (pixels)'))
  return figures


def findings(result: Mapping, q) -> Dict[str, list]:
  """What the models show, per caption key (the pair of models).

  Args:
    result: the tool's JSON.
    q: makes a quote of a number of the JSON (`tool.QuoteFn`).

  Returns:
    Text fragments per caption key.
  """
  out = {}
  for key, r in result['pairs'].items():
    parts = [f'{key}, correlation across heads of the mean attention distance with the '
             'measure to the lower layers']
    for i, m in enumerate(r['measures']):
      parts += ['; ' if i else ': ', f'{M.TITLES[m]} ']
      for b, block in enumerate(r['blocks']):
        parts += [', ' if b else '', f'{block} ', *similarities.estimate_quote(
            q, r['correlation'][m][b], 'pairs', key, 'correlation', m, b)]
    for m, why in r['not_applicable'].items():
      parts += [f' ({why})']
    out[key] = parts
  return out


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """Raghu et al.'s Fig. 5 judged under every measure, then across them: in the first
  attention layer of a transformer, against a convolutional model, the correlation
  across heads of the mean attention distance with the similarity to the lower
  layers is negative (positive for a distance). A model given as several runs is
  judged on their combined correlation.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  claim = ('The ViT\'s lower-layer heads that attend locally are the ones most alike the '
           'ResNet\'s lower layers (Raghu et al. Fig. 5), under each similarity measure.')
  pairs, chosen = result['pairs'], {}
  for key in pairs:
    a, _, b = key.partition(' vs ')
    kinds = models.get(a, {}).get('architecture'), models.get(b, {}).get('architecture')
    if kinds == (TRANSFORMER, CONVNET):
      chosen.setdefault(a, key)  # the first convolutional model each transformer meets
  if not chosen:
    return []
  measures = pairs[next(iter(chosen.values()))]['measures']
  per_measure = {}
  for m in measures:
    sign = 1. if m in M.DISTANCES else -1.
    singles = []
    for label, key in chosen.items():
      value, stderr = pairs[key]['correlation'][m][0]
      what = (f'the correlation, across {pairs[key]["blocks"][0]}\'s heads, of mean attention '
              f'distance with {M.TITLES[m]} to the lower layers')
      singles.append(verdict.single(
          'local heads match the lower layers', '', what if sign > 0 else 'minus ' + what,
          label, (None if value is None else sign * value, stderr)))
    per_measure[m] = verdict.across_seeds(singles, models)
  found = []
  for i in range(len(next(iter(per_measure.values())))):
    found.append(similarities.across_measures(
        'local heads match the lower layers, across measures', claim,
        {m: per_measure[m][i] for m in measures}))
  return found


SUMMARIES, PAIRS_DRAW = similarities.SUMMARIES, similarities.PAIRS_DRAW


def work(subject: Subject, options: similarities.MeasureOptions, amounts: Amounts) -> Work:
  """A pass over the evaluation split for the heads and one for the other model's
  layers; each head's and layer's summary; the measures of every head against every
  layer on the estimate and each bootstrap draw, the other model priced as this
  one's layers.

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  heads = 2 * head_cka.heads_per_layer(subject) if subject.layers.head_outputs else 0
  layers = len(subject.layers.stream)
  draws = options.similarity_resamples + 1
  return Work({'forward': 2 * amounts.batches}, {'forward': 1},
              host={SUMMARIES: heads + layers, PAIRS_DRAW: draws * heads * layers})


def host_prices(subject: Subject, images: np.ndarray, labels: np.ndarray,
                options: similarities.MeasureOptions, amounts: Amounts) -> Dict[str, float]:
  """Seconds of a summary and of a head against a layer in one draw, timed on
  features of a head's and the last stream layer's shapes
  (`similarities.measure_prices`).

  Args:
    subject: the model.
    images: one evaluation batch of images.
    labels: their labels.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    Seconds per unit, by the unit's name.
  """
  last = subject.layers.stream[-1]
  layer = tuple(np.shape(subject.intermediates(images[:1], [last])[last])[1:])
  if not subject.layers.head_outputs:
    return similarities.measure_prices((layer, layer), options, amounts)
  heads, _ = head_cka.head_features(subject, images[:1], [0], subject.token_grid())
  return similarities.measure_prices((heads[0].shape[1:], layer), options, amounts)


TOOL = register(Tool(
    name='head_similarities', importance=22,
    title='Attention heads against the other model\'s layers, under several measures',
    quantity='Each head\'s output (spatial tokens, before the output projection) of the first '
             'and last attention layer against every stream layer of the other model, under '
             'the similarities tool\'s measures, each as its authors\' code computes it; per '
             'head the mean over the other model\'s lower half of its layers, drawn against '
             'the head\'s mean attention distance; ± the bootstrap standard error over the '
             'images.',
    paper='Raghu et al. (Fig. 5) under linear CKA: the ViT\'s lower-layer heads that attend '
          'locally are the ones most similar to the ResNet\'s lower layers. Whether it '
          'survives another measure: Davari et al. (ICLR 2023), Klabunde et al. (ReSi).',
    run=measure, draw=draw, runs_on=ALL_MODELS, findings=findings,
    figures=head_cka.pair_figures,
    options=similarities.MeasureOptions, verdicts=verdicts, work=work, host_prices=host_prices,
    shortened_by=('num_images', 'similarity_resamples'), minimum='5 bootstrap draws',
    needs=head_cka.heads_and_second_model))
