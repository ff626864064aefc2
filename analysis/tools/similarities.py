"""Representation similarity under several measures: Raghu et al.'s layer-by-layer
figures (Fig. 1-2) with linear and debiased CKA, Procrustes distance, mutual k-NN
alignment, RSA, SVCCA and PWCCA, a bootstrap standard error over the images for
every cell, the papers' similarity claims judged across the measures, and two
checks researchers run on a measure: whether it finds the corresponding layer of
a second training run (Kornblith et al. 2019) and how far a few high-norm images
move it (Davari et al. 2023)."""
import dataclasses
import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from analysis.measures import layer_similarity, neighbours
from analysis.reporting import plots, verdict
from analysis.runtime.estimate import Amounts, Work
from analysis.tool import ALL_MODELS, Batches, Figure, Subject, Tool, register
from analysis.tool_options import Budget, option
from analysis.tools import cka, head_cka
from vit_jax.errors import ConfigError
from vit_jax.models.family import CONVNET, TRANSFORMER

M = layer_similarity
FEATURE_BYTES = 2 << 30  # features held at once; more layers take further passes
KNN_QUANTILE = 0.95  # mutual k-NN's clipping quantile (platonic-rep's prepare_features)
KNN_CLIPS = ('model', 'layer')  # where that bound is found
# Fewer images leave the measures without meaning: 2 give every pair of layers CKA 1
# and Procrustes 0; debiased CKA divides by n - 3.
MIN_IMAGES = 4


@dataclasses.dataclass(frozen=True)
class MeasureOptions:
  """The options of every tool that measures under several similarity measures."""
  similarity_measures: str = option(
      'all', f'Comma-separated measures among {", ".join(M.MEASURES)}, or all.')
  similarity_resamples: int = option(
      20, 'Bootstrap draws of the images behind each standard error (a time budget\'s '
      'smaller sample: two thirds at a time, down to 5).', least=2,
      budget=Budget(minimum=5, order=0))
  similarity_knn: int = option(10, 'Mutual k-NN\'s neighbours per image (platonic-rep\'s '
                               'topk, 10 in their scripts).', least=1)
  similarity_svcca_dims: int = option(
      0, 'SVCCA\'s directions per layer: 0, those holding 99% of the singular values\' sum '
      '(Raghu et al. 2017); a count, that many (google/svcca\'s tutorial 001 keeps 20).',
      least=0)
  similarity_knn_clip: str = option(
      'model', 'Where mutual k-NN\'s outlier bound (the 0.95 quantile of absolute entries) '
      'is found: model, over all of a model\'s layers stacked, as platonic-rep clips; layer, '
      'over each layer alone.', choices=KNN_CLIPS)

  def __post_init__(self):
    try:
      M.check_measures(self.measures)
    except ValueError as e:
      raise ConfigError(f'--similarity_measures: {e}') from None

  @property
  def measures(self) -> Tuple[str, ...]:
    """The measures chosen, in MEASURES order."""
    if self.similarity_measures == 'all':
      return M.MEASURES
    return tuple(m.strip() for m in self.similarity_measures.split(',') if m.strip())

  @property
  def svcca_dims(self) -> Optional[int]:
    """`layer_similarity.values`' `svcca_dims`."""
    return self.similarity_svcca_dims or None

  def images(self, batches: Batches) -> int:
    """The evaluation images, counted before any model runs; refuses fewer than
    MIN_IMAGES, and a `--similarity_knn` that is not below their number.

    Args:
      batches: split -> its (images, labels) batches.

    Returns:
      Their number.
    """
    n = sum(len(images) for images, _ in batches('eval'))
    if n < MIN_IMAGES:
      raise ConfigError(f'{n} images are analysed, and the similarity measures need at least '
                        f'{MIN_IMAGES}: with 2, every pair of layers has CKA 1 and Procrustes '
                        'distance 0 whatever the layers, and below 4 debiased CKA is not '
                        f'defined. Give --num_images {MIN_IMAGES} or more.')
    if 'mutual_knn' in self.measures and self.similarity_knn >= n:
      raise ConfigError(f'--similarity_knn is {self.similarity_knn}, and {n} images are '
                        'analysed: give fewer neighbours than images.')
    return n


@dataclasses.dataclass(frozen=True)
class Options(MeasureOptions):
  """The similarities tool's command-line options."""
  similarity_outliers: float = option(
      0.01, 'For the outlier check, the share of images of largest feature norm taken from '
      'each layer and left out together (Davari et al.); 0: no check.', least=0.)

  def __post_init__(self):
    super().__post_init__()
    if self.similarity_outliers >= 0.5:
      raise ConfigError(f'--similarity_outliers is {self.similarity_outliers}; leave out less '
                        'than half of the images (0.01 leaves out the top 1% of each layer).')


def stacked_bounds(xs: Sequence[np.ndarray], measures: Sequence[str], knn_clip: str
                   ) -> List[Optional[float]]:
  """Mutual k-NN's clipping bound for each of one model's feature sets held at once:
  one bound over all of them stacked for 'model', each its own (None) for 'layer'.

  Args:
    xs: the feature sets (layers, heads or positions of one model).
    measures: the measures to be computed (no bound without mutual k-NN).
    knn_clip: one of KNN_CLIPS.

  Returns:
    A bound (or None) per feature set.
  """
  if 'mutual_knn' not in measures or knn_clip != 'model':
    return [None] * len(xs)
  total = sum(x.size for x in xs)
  bound = neighbours.stacked_bound([neighbours.largest_entries(x, total, KNN_QUANTILE)
                                    for x in xs], total, KNN_QUANTILE)
  return [bound] * len(xs)


def _pooled(subject: Subject, x: np.ndarray) -> np.ndarray:
  """A layer's channels averaged over its positions (spatial tokens or map)."""
  if x.ndim == 3:
    return x[:, int(subject.has_cls) + subject.registers:].mean(axis=1)
  return x.mean(axis=tuple(range(1, x.ndim - 1))) if x.ndim > 2 else x


def _passes(sizes: Sequence[int], count: int) -> List[List[int]]:
  """The layers (by index) taken together in each pass over the images: as many as
  fit in FEATURE_BYTES, `count` images of `sizes` float32 features each."""
  groups, group, held = [], [], 0
  for i, size in enumerate(sizes):
    if group and held + size * count * 4 > FEATURE_BYTES:
      groups.append(group)
      group, held = [], 0
    group.append(i)
    held += size * count * 4
  groups.append(group)
  return groups


def _model_bounds(subjects: Sequence[Subject], layers: Sequence[Tuple[Subject, str]],
                  sizes: Sequence[int], groups: Sequence[List[int]],
                  features: Callable[[List[int]], Dict[int, np.ndarray]], count: int
                  ) -> Tuple[Dict[int, Optional[float]], Optional[Dict[int, np.ndarray]]]:
  """Mutual k-NN's clipping bound of each layer, over all of its model's layers
  stacked (platonic-rep), and the features of the one pass where every layer fits
  at once (None where they take several passes, read again afterwards)."""
  totals = {id(s): count * sum(sizes[i] for i, (o, _) in enumerate(layers) if o is s)
            for s in subjects}
  tops = {id(s): [] for s in subjects}
  first = None
  for group in groups:  # one pass where every layer fits at once, else a first pass
    found = features(group)
    first = found if len(groups) == 1 else None
    for i, x in found.items():
      tops[id(layers[i][0])].append(
          neighbours.largest_entries(x, totals[id(layers[i][0])], KNN_QUANTILE))
  return ({i: neighbours.stacked_bound(tops[id(s)], totals[id(s)], KNN_QUANTILE)
           for i, (s, _) in enumerate(layers)}, first)


def summarise(subjects: Sequence[Subject], batches: Batches, measures: Sequence[str],
              count: int, knn_clip: str = 'model') -> List[M.Layer]:
  """Every stream layer of every model, summarised on the evaluation images; layers
  whose features together pass FEATURE_BYTES are taken in further passes.

  Args:
    subjects: the models.
    batches: split -> its (images, labels) batches.
    measures: the measures to be computed.
    count: the number of evaluation images.
    knn_clip: where mutual k-NN's clipping bound is found: 'model', over all of a
      model's layers stacked (platonic-rep); 'layer', over each layer alone.

  Returns:
    The summaries, the first model's first layer first.
  """
  layers = [(s, name) for s in subjects for name in s.layers.stream]
  images, _ = next(iter(batches('eval')))
  sizes = []
  for s in subjects:
    inter = s.intermediates(images[:1], s.layers.stream)
    sizes += [int(np.prod(np.shape(inter[name])[1:])) for name in s.layers.stream]
  groups = _passes(sizes, count)

  def features(group):
    kept = {i: [] for i in group}
    for images, _ in batches('eval'):
      for s in subjects:
        names = [name for i, (owner, name) in enumerate(layers) if owner is s and i in kept]
        if not names:
          continue
        inter = s.intermediates(images, names)
        for i in group:
          if layers[i][0] is s:
            kept[i].append(np.asarray(inter[layers[i][1]], np.float32))
    return {i: np.concatenate(kept[i]) for i in group}

  bounds: Dict[int, Optional[float]] = {i: None for i in range(len(layers))}
  first = None
  if 'mutual_knn' in measures and knn_clip == 'model':
    bounds, first = _model_bounds(subjects, layers, sizes, groups, features, count)
  summaries = []
  for group in groups:
    found = first if first is not None else features(group)
    for i in group:
      x = found.pop(i)
      summaries.append(M.summarise(x, _pooled(layers[i][0], x), measures, KNN_QUANTILE,
                                   bounds[i]))
  return summaries


def _pairs(subjects: Sequence[Subject], both_orders: bool
           ) -> Tuple[List[M.Pair], Dict[str, Tuple[slice, slice]]]:
  """Every pair of layers the figures show: within each model (in both orders for an
  asymmetric measure, else the upper triangle) and between each two models."""
  bounds = np.cumsum([0] + [len(s.layers.stream) for s in subjects])
  pairs, blocks = [], {}
  for a, sa in enumerate(subjects):
    for b in range(a, len(subjects)):
      key = sa.label if a == b else f'{sa.label} vs {subjects[b].label}'
      rows, cols = range(bounds[a], bounds[a + 1]), range(bounds[b], bounds[b + 1])
      blocks[key] = (slice(bounds[a], bounds[a + 1]), slice(bounds[b], bounds[b + 1]))
      pairs += [(i, j) for i in rows for j in cols if a != b or both_orders or j >= i]
  return pairs, blocks


def _matrices(pairs: Sequence[M.Pair], row: np.ndarray, blocks: Mapping[str, Tuple[slice, slice]],
              size: int) -> Dict[str, np.ndarray]:
  """One measure's values per figure key, as matrices (a symmetric measure's
  within-model matrix mirrored from its upper triangle)."""
  full = np.full((size, size), np.nan)
  for (i, j), value in zip(pairs, row):
    full[i, j] = value
  mirror = np.isnan(full) & ~np.isnan(full.T)
  full[mirror] = full.T[mirror]
  return {key: full[rows, cols] for key, (rows, cols) in blocks.items()}


def _share(chosen: np.ndarray, matrix: np.ndarray) -> float:
  """The share of True in `chosen`; NaN where a cell of `matrix` is empty."""
  return float('nan') if np.isnan(matrix).any() else float(np.mean(chosen))


def _best(matrix: np.ndarray, measure: str, axis: int) -> np.ndarray:
  """The index of the most alike layer along `axis` (lowest distance, highest similarity)."""
  return (np.argmin if measure in M.DISTANCES else np.argmax)(matrix, axis=axis)


def statistics(matrices: Mapping[str, np.ndarray], measure: str, subjects: Sequence[Subject]
               ) -> Dict[str, Dict[str, float]]:
  """What the verdicts and checks read of one measure's matrices.

  'uniformity': each model's mean between distinct layers; 'correspondence': for
  each pair of a transformer and a convolutional model, the share of the
  convolutional model's layers whose most alike transformer layer lies in its
  lower half; 'specificity': for each pair of models with the same layers (two
  runs of one recipe), the share of the first's layers whose most alike layer of
  the second is the same one (Kornblith et al. 2019, Table 2).

  Args:
    matrices: the measure's matrix per figure key.
    measure: its name.
    subjects: the models.

  Returns:
    {statistic: {key: value}}.
  """
  out = {'uniformity': {}, 'correspondence': {}, 'specificity': {}}
  by_label = {s.label: s for s in subjects}
  for key, matrix in matrices.items():
    a, _, b = key.partition(' vs ')
    if not b:
      out['uniformity'][key] = float(matrix[~np.eye(len(matrix), dtype=bool)].mean())
      continue
    kinds = by_label[a].layers.architecture, by_label[b].layers.architecture
    if set(kinds) == {TRANSFORMER, CONVNET}:
      vit_rows = kinds[0] == TRANSFORMER
      vit_layers = matrix.shape[0 if vit_rows else 1]
      best = _best(matrix, measure, axis=0 if vit_rows else 1)
      out['correspondence'][key] = _share(best < head_cka.lower_half(vit_layers), matrix)
    if by_label[a].layers.labels == by_label[b].layers.labels:
      best = _best(matrix, measure, axis=1)
      out['specificity'][key] = _share(best == np.arange(len(best)), matrix)
  return out


def _flat(stats: Mapping[str, Mapping[str, float]]) -> np.ndarray:
  return np.array([v for group in stats.values() for v in group.values()], np.float64)


def _unflat(stats: Mapping[str, Mapping[str, float]], vector: np.ndarray) -> Dict:
  it = iter(vector.tolist())
  return {name: {key: next(it) for key in group} for name, group in stats.items()}


def measure(subjects: Sequence[Subject], batches: Batches, options: Options = Options()) -> Dict:
  """Every stream layer of every model against every other under each measure, on
  the evaluation images, with bootstrap standard errors; the statistics the
  verdicts and checks read; and the outlier check.

  Args:
    subjects: the models.
    batches: split -> its (images, labels) batches.
    options: the tool's options.

  Returns:
    The tool's JSON but its figures (`draw`'s).
  """
  measures, k, dims = options.measures, options.similarity_knn, options.svcca_dims
  n = options.images(batches)
  layers = summarise(subjects, batches, measures, n, options.similarity_knn_clip)
  pairs = {m: _pairs(subjects, m in M.ASYMMETRIC)[0] for m in measures}
  blocks = _pairs(subjects, False)[1]
  size = len(layers)
  template = {}

  def statistic(measure, row, index):
    del index  # the statistics read the measure's values alone
    template[measure] = statistics(_matrices(pairs[measure], row, blocks, size), measure,
                                   subjects)
    return _flat(template[measure])

  found = M.measured(layers, pairs, measures, statistic, options.similarity_resamples, k, dims)
  estimate = found.values
  matrices = {m: _matrices(pairs[m], estimate[m], blocks, size) for m in measures}
  stderr = {m: _matrices(pairs[m], found.stderr[m], blocks, size) for m in measures}
  stats = {m: _unflat(template[m], found.statistics[m]) for m in measures}
  stats_stderr = {m: _unflat(template[m], found.statistics_stderr[m]) for m in measures}
  result = {
      'layers': {s.label: list(s.layers.labels) for s in subjects},
      'stages': {s.label: list(s.layers.stages) for s in subjects},
      'measures': list(measures), 'num_examples': n, 'resamples': options.similarity_resamples,
      'knn': k, 'knn_clip': options.similarity_knn_clip,
      'seconds_per_pair': found.seconds_per_pair,
      'similarity': {m: {key: v.tolist() for key, v in matrices[m].items()} for m in measures},
      'stderr': {m: {key: v.tolist() for key, v in stderr[m].items()} for m in measures}}
  for name in ('uniformity', 'correspondence', 'specificity'):
    result[name] = {m: {key: [value, stats_stderr[m][name][key]]
                        for key, value in stats[m][name].items()} for m in measures}
  if options.similarity_outliers > 0:
    result['outliers'] = _outlier_check(layers, pairs, estimate, stderr, blocks, size, options)
  kept = M.svcca_directions(layers, dims) if 'svcca' in measures else ()
  if kept:
    it = iter(kept)
    result['svcca_directions'] = {s.label: [next(it) for _ in s.layers.stream]
                                  for s in subjects}
  result['not_applicable'] = M.not_applicable(layers, estimate, kept)
  return result


def _outlier_check(layers, pairs, estimate, stderr, blocks, size, options: Options) -> Dict:
  """Each measure without the images of largest norm (Davari et al.): how far its
  cells move, and in how many the move passes two bootstrap standard errors."""
  measures, share = options.measures, options.similarity_outliers
  left_out = M.outlier_images(layers, share)
  kept = np.setdiff1d(np.arange(len(layers[0].norms)), left_out)
  without = M.values(layers, pairs, measures, kept, options.similarity_knn, options.svcca_dims)
  check = {'share': share, 'images_left_out': len(left_out)}
  for m in measures:
    moved = np.abs(without[m] - estimate[m])
    errors = np.concatenate([np.ravel(stderr[m][key]) for key in blocks])
    cells = np.concatenate([np.ravel(_matrices(pairs[m], moved, blocks, size)[key])
                            for key in blocks])
    valid = ~np.isnan(cells)
    check[m] = {'mean_change': float(np.nanmean(moved)) if valid.any() else float('nan'),
                'max_change': float(np.nanmax(moved)) if valid.any() else float('nan'),
                'beyond_2se': int(np.sum(cells[valid] > verdict.Z * errors[valid] + 1e-9)),
                'cells': int(valid.sum())}
  return check


def draw(result: Mapping, subjects: Sequence[Subject], out: str, options: Options) -> List[str]:
  """The figures of the tool's numbers (`measure`): every heat map of one measure on
  one colour scale, a figure per measure in `result['measures']`'s order.

  See `analysis.tool.Draw`.
  """
  figures = []
  for m in result['measures']:
    panels = cka.layer_panels(result['similarity'][m], result['layers'], result['stages'])
    figures.append(plots.heatmaps(
        panels, os.path.join(out, f'similarity_{m}.png'),
        f'{M.TITLES[m]} on {result["num_examples"]} images (one colour scale)',
        colorbar_label=M.TITLES[m]))
  return figures


def findings(result: Mapping, q) -> Dict[str, list]:
  """What the models show under each measure, per caption key (the measure).

  Args:
    result: the tool's JSON.
    q: makes a quote of a number of the JSON (`tool.QuoteFn`).

  Returns:
    Text fragments per caption key.
  """
  def stated(name, m, key):
    return estimate_quote(q, result[name][m][key], name, m, key)

  out = {}
  for m in result['measures']:
    parts = [f'{M.TITLES[m]}: mean between distinct layers']
    for i, label in enumerate(result['uniformity'][m]):
      parts += [', ' if i else ' ', f'{label} ', *stated('uniformity', m, label)]
    for key in result['correspondence'][m]:
      parts += [f'; {key}: share of the convolutional layers best matched in the ViT\'s lower '
                'half ', *stated('correspondence', m, key)]
    for key in result['specificity'][m]:
      parts += [f'; {key}: layers whose best match is the same layer ',
                *stated('specificity', m, key)]
    if 'outliers' in result and result['outliers'][m]['cells']:
      parts += ['; without the ', q('outliers', 'images_left_out'), ' highest-norm images the '
                'cells move by ', q('outliers', m, 'mean_change'), ' on average, ',
                q('outliers', m, 'beyond_2se'), ' of ', q('outliers', m, 'cells'),
                ' beyond two standard errors']
    if m == 'svcca':
      kept = [k for counts in result['svcca_directions'].values() for k in counts]
      parts += [f'; SVCCA keeps {min(kept)}-{max(kept)} directions of a layer on '
                f'{result["num_examples"]} images']
    if m in result['not_applicable']:
      parts += [f' ({result["not_applicable"][m]})']
    out[m] = parts
  return out


def estimate_quote(q, pair: Sequence[Optional[float]], *path) -> list:
  """Text fragments of a (value, standard error) pair of the JSON: both quoted, or
  words where either has no value (null in the JSON).

  Args:
    q: makes a quote of a number of the JSON (`tool.QuoteFn`).
    pair: the pair, at `path`.
    *path: its path in the JSON.

  Returns:
    The fragments.
  """
  value, stderr = (np.nan if v is None else v for v in pair)
  if not np.isfinite(value):
    return ['no value']
  if not np.isfinite(stderr):
    return [q(*path, 0), ' (spread unknown)']
  return [q(*path, 0), ' ± ', q(*path, 1)]


def figures(result: Mapping) -> List[Figure]:
  """One figure per measure, every model in it.

  Args:
    result: the tool's JSON.

  Returns:
    The figures.
  """
  return [Figure(path, m, tuple(result['layers']))
          for m, path in zip(result['measures'], result['figures'])]


def across_measures(finding: str, claim: str, per_measure: Mapping[str, verdict.Verdict]
                    ) -> verdict.Verdict:
  """One verdict from the same claim judged under each measure: it agrees only when
  measures of at least two families (`layer_similarity.FAMILIES`) agree and none
  differs, differs only when two families differ and none agrees, and is
  inconclusive otherwise, naming the measures on each side.

  Args:
    finding: the finding's short name.
    claim: the paper's claim.
    per_measure: measure -> its verdict.

  Returns:
    The verdict.
  """
  sides = {kind: [m for m, v in per_measure.items() if v.verdict == kind]
           for kind in (verdict.AGREES, verdict.DIFFERS, verdict.INCONCLUSIVE,
                        verdict.NOT_COMPARABLE)}
  families = {kind: {M.FAMILIES[m] for m in ms} for kind, ms in sides.items()}
  if len(sides[verdict.NOT_COMPARABLE]) == len(per_measure):
    judged = verdict.NOT_COMPARABLE
  elif len(families[verdict.AGREES]) >= 2 and not sides[verdict.DIFFERS]:
    judged = verdict.AGREES
  elif len(families[verdict.DIFFERS]) >= 2 and not sides[verdict.AGREES]:
    judged = verdict.DIFFERS
  else:
    judged = verdict.INCONCLUSIVE
  measured = '; '.join(f'{M.TITLES[m]} ({v.verdict}): {v.measured}'
                       for m, v in per_measure.items())
  why = '; '.join(f'{kind}: {", ".join(M.TITLES[m] for m in ms)}'
                  for kind, ms in sides.items() if ms)
  runs = min(v.runs for v in per_measure.values())
  return verdict.Verdict(finding, claim, measured, judged,
                         f'{why} (rests on {len(per_measure)} measures; reproduced only when two '
                         'families agree and none differs)', runs)


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """Raghu et al.'s similarity claims judged under every measure, then across them.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  within = list(result['layers'])
  uniform, matched = {}, {}
  for m in result['measures']:
    distance = m in M.DISTANCES
    uniform[m] = verdict.contrast(
        'uniform representations', '', 'mean ' + M.TITLES[m] + ' between distinct layers',
        models, within, lambda label, m=m: tuple(result['uniformity'][m][label]),
        higher=CONVNET if distance else TRANSFORMER, lower=TRANSFORMER if distance else CONVNET)
    pairs = result['correspondence'][m]
    if pairs:
      key = next(iter(pairs))
      share = tuple(pairs[key])  # JSON holds no value as null
      judged, why = verdict.judge(verdict.difference(share, (0.5, 0.)))
      matched[m] = verdict.Verdict('', '', f'{key}: {verdict.show(share)}', judged, why)
  found = [across_measures(
      'uniform representations, across measures',
      'ViT\'s representations are more uniform across depth than ResNet\'s (Raghu et al. '
      'Fig. 1), under each similarity measure.', uniform)]
  if matched:
    found.append(across_measures(
        'ViT\'s lower half matches the ResNet, across measures',
        'The ResNet\'s layers find their most alike ViT layers in the ViT\'s lower half: more '
        'than half of them do (Raghu et al. Fig. 2).', matched))
  return found


SUMMARIES, PAIRS_DRAW = 'layer summaries', 'layer pairs (one draw)'


def work(subject: Subject, options: Options, amounts: Amounts) -> Work:
  """A pass over the evaluation split and each layer's summary; the measures of
  every pair of layers on the estimate, each bootstrap draw and the outlier check,
  priced as two models of this one's size (twice its layers, about four times its
  pairs).

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  layers = 2 * len(subject.layers.stream)
  draws = options.similarity_resamples + 1 + (options.similarity_outliers > 0)
  return Work({'forward': amounts.batches}, {'forward': 1},
              host={SUMMARIES: layers, PAIRS_DRAW: draws * layers * (layers + 1) / 2})


def host_prices(subject: Subject, images: np.ndarray, labels: np.ndarray, options: Options,
                amounts: Amounts) -> Dict[str, float]:
  """Seconds of one layer's summary and of the measures on one pair of layers in one
  draw (`measure_prices`), on features of the subject's first and last layers' shapes.

  Args:
    subject: the model.
    images: one evaluation batch of images.
    labels: their labels.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    Seconds per unit, by the unit's name.
  """
  inter = subject.intermediates(images[:1], subject.layers.stream)
  shapes = [tuple(np.shape(inter[name])[1:]) for name in subject.layers.stream]
  return measure_prices((shapes[0], shapes[-1]), options, amounts)


def measure_prices(shapes: Tuple[Tuple[int, ...], Tuple[int, ...]], options: MeasureOptions,
                   amounts: Amounts) -> Dict[str, float]:
  """Seconds of one layer's summary (SUMMARIES) and of the measures on one pair of
  layers in one draw (PAIRS_DRAW), timed on random features of two layers' shapes:
  the summaries at the command's number of images, the pairs at up to 400 images
  (once to compile, then timed) and scaled to the command's by the cube of the
  ratio (the eigendecompositions and products of n x n matrices).

  Args:
    shapes: the two layers' feature shapes (without the images' axis).
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    Seconds per unit, by the unit's name.
  """
  random = np.random.RandomState(0)

  def summaries(n):
    return [M.summarise(x, x.reshape(n, -1, x.shape[-1]).mean(axis=1), options.measures)
            for x in (random.normal(size=(n,) + shape).astype(np.float32) for shape in shapes)]

  start = time.perf_counter()
  summaries(amounts.num_images)
  per_layer = (time.perf_counter() - start) / 2
  n = max(min(400, amounts.num_images), options.similarity_knn + 2)
  layers, pairs = summaries(n), [(0, 1), (0, 0), (1, 1)]
  timed = []
  for _ in range(2):
    start = time.perf_counter()
    M.values(layers, pairs, options.measures, random.randint(0, n, n), options.similarity_knn,
             options.svcca_dims)
    timed.append(time.perf_counter() - start)
  return {SUMMARIES: per_layer,
          PAIRS_DRAW: timed[-1] / len(pairs) * (amounts.num_images / n) ** 3}


TOOL = register(Tool(
    name='similarities', importance=21, title='Representation similarity under several measures',
    quantity='Every residual-stream layer against every other, within and between models, '
             'under linear and debiased CKA (Kornblith et al.), Procrustes distance (Ding et '
             'al.; lower is more alike), mutual k-NN alignment (Huh et al.), RSA (Kriegeskorte '
             'et al.), SVCCA (Raghu et al. 2017) and PWCCA on the channels averaged over '
             'positions (Morcos et al.), each as its authors\' code computes it, on the '
             'evaluation images; ± the bootstrap standard error over the images.',
    paper='Raghu et al. (Fig. 1-2) under linear CKA: ViT\'s representations are uniform across '
          'depth, ResNet\'s lower and higher layers differ; ResNet\'s layers match the ViT\'s '
          'lower half. Whether a finding survives another measure: Davari et al. (ICLR 2023), '
          'Klabunde et al. (ReSi), Huh et al. (2024).',
    run=measure, draw=draw, runs_on=ALL_MODELS, findings=findings, figures=figures,
    options=Options, verdicts=verdicts, work=work, host_prices=host_prices,
    shortened_by=('num_images', 'similarity_resamples'),
    minimum='5 bootstrap draws'))
