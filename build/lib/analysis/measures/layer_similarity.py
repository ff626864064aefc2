"""Every layer against every other under several similarity measures, on one set of
images, with bootstrap standard errors over the images.

`summarise` reduces a layer's features on n images to what the measures read: the
Gram matrix of its centred features (linear and debiased CKA, Procrustes, SVCCA),
its representational dissimilarity matrix (RSA), the cosine similarities of its
outlier-clipped features (mutual k-NN) and its channels averaged over positions
(PWCCA). `values` computes every measure for the chosen layer pairs on the images
an index draws: all of them in order (the estimate, equal to each measure's own
function in `analysis.measures` on the features), or a bootstrap draw with
replacement. On a draw, every feature is centred over the drawn images, pairs of
one image drawn twice are left out of RSA's correlation, and an image's copies are
not its neighbours; the clipping bound and SVCCA's and PWCCA's conventions are
each measure's own. The linear algebra runs on one BLAS thread: the n x n
eigendecompositions gain little from a second, and threads that wait on each
other on a busy machine made them up to a hundred times slower.
"""
import dataclasses
import time
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import jax
import numpy as np
import scipy.stats
import threadpoolctl

from analysis.measures import cca, neighbours, procrustes, rsa, similarity, uncertainty

MEASURES = ('cka', 'debiased_cka', 'procrustes', 'mutual_knn', 'rsa', 'svcca', 'pwcca')
TITLES = {'cka': 'linear CKA', 'debiased_cka': 'debiased linear CKA',
          'procrustes': 'Procrustes distance', 'mutual_knn': 'mutual k-NN alignment',
          'rsa': 'RSA (Spearman)', 'svcca': 'SVCCA', 'pwcca': 'PWCCA'}
# Measures of one family share their construction and are not independent evidence.
FAMILIES = {'cka': 'CKA', 'debiased_cka': 'CKA', 'procrustes': 'Procrustes',
            'mutual_knn': 'mutual k-NN', 'rsa': 'RSA', 'svcca': 'CCA', 'pwcca': 'CCA'}
DISTANCES = ('procrustes',)  # lower is more alike; the others: higher
ASYMMETRIC = ('pwcca',)  # weighted by one side (`cca.pwcca`): both orders are computed
_NEEDS = {'gram': ('cka', 'debiased_cka', 'procrustes', 'svcca'), 'rdm': ('rsa',),
          'cosine': ('mutual_knn',), 'pooled': ('pwcca',)}

Pair = Tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Layer:
  """What the measures read of one layer on n images (None: no chosen measure reads it)."""
  gram: Optional[np.ndarray]  # (n, n) Gram matrix of the features centred over the images
  rdm: Optional[np.ndarray]  # (n, n) 1 - Pearson correlation between images' patterns
  cosine: Optional[np.ndarray]  # (n, n) cosine similarity of the outlier-clipped features
  pooled: Optional[np.ndarray]  # (n, channels) the channels averaged over positions
  norms: np.ndarray  # (n,) each image's centred-feature norm
  distinct: np.ndarray  # (n,) ids equal where two images' features are
  # (n, d) the features themselves where d < n: Procrustes and SVCCA then work on
  # (d x d) matrices instead of the (n x n) Gram matrix's eigendecomposition
  features: Optional[np.ndarray] = None


def check_measures(measures: Sequence[str]) -> None:
  """Refuses an unknown measure in one sentence.

  Args:
    measures: measure names.

  Raises:
    ValueError: a name not in MEASURES.
  """
  unknown = [m for m in measures if m not in MEASURES]
  if unknown or not measures:
    raise ValueError(f'Unknown similarity measure {", ".join(unknown) or "(none given)"}; '
                     f'use some of {", ".join(MEASURES)}.')


@threadpoolctl.threadpool_limits.wrap(limits=1, user_api='blas')
def summarise(x: np.ndarray, pooled: np.ndarray, measures: Sequence[str],
              knn_quantile: float = 0.95, knn_bound: Optional[float] = None) -> Layer:
  """One layer's summary for `measures`.

  Args:
    x: (n, ...) the layer's features on n images.
    pooled: (n, channels) its channels averaged over positions (google/svcca's
      tutorial 002, "Average Pool", which makes layers of any grid comparable).
    measures: the measures to be computed.
    knn_quantile: `neighbours.clip_outliers`' quantile for mutual k-NN.
    knn_bound: the clipping bound found over the model's stacked layers
      (`neighbours.stacked_bound`, as platonic-rep clips); None: this layer's own.

  Returns:
    The summary.
  """
  def needed(what):
    return any(m in measures for m in _NEEDS[what])

  flat = np.asarray(x, np.float64).reshape(len(x), -1)
  centred = flat - flat.mean(axis=0, keepdims=True)
  gram = rdm = cosine = None
  if needed('gram'):
    gram = centred @ centred.T
  if needed('rdm'):
    with np.errstate(invalid='ignore', divide='ignore'):  # a blank patch: NaN, left out
      rdm = rsa.dissimilarity_matrix(flat).astype(np.float32)
  if needed('cosine'):
    clipped = neighbours.clip_outliers(flat, knn_quantile, knn_bound)
    clipped = clipped / np.maximum(np.linalg.norm(clipped, axis=1, keepdims=True), 1e-12)
    cosine = (clipped @ clipped.T).astype(np.float32)
  pooled = np.asarray(pooled, np.float64).reshape(len(x), -1) if needed('pooled') else None
  narrow = flat.shape[1] < len(flat) and any(m in measures for m in ('procrustes', 'svcca'))
  distinct = np.unique(flat, axis=0, return_inverse=True)[1].reshape(-1)
  return Layer(gram, rdm, cosine, pooled, np.linalg.norm(centred, axis=1), distinct,
               flat if narrow else None)


class _Draw:
  """One draw's per-layer quantities, each made once, when a measure first reads it."""

  def __init__(self, layers: Sequence[Layer], index: np.ndarray, k: int,
               svcca_dims: Optional[int]):
    self.layers, self.index, self.k, self.svcca_dims = layers, index, k, svcca_dims
    self.copies = index[:, None] == index[None, :]  # the same image drawn twice (and i == i)
    self.cache: Dict[Tuple[str, int], np.ndarray] = {}

  def get(self, what: str, i: int) -> np.ndarray:
    """Quantity `what` ('centred', 'debiased', 'features', 'root', 'directions',
    'ranks', 'neighbours') of layer i on the drawn images."""
    if (what, i) not in self.cache:
      self.cache[what, i] = getattr(self, '_' + what)(i)
    return self.cache[what, i]

  def constant(self, i: int) -> bool:
    """Whether layer i is the same on every drawn image (a blank patch of pixels)."""
    drawn = self.layers[i].distinct[self.index]
    return bool(drawn.min() == drawn.max())

  def _take(self, matrix: np.ndarray) -> np.ndarray:
    return matrix[np.ix_(self.index, self.index)]

  def _centred(self, i: int) -> np.ndarray:
    return np.asarray(similarity.center_gram(self._take(self.layers[i].gram)))

  def _debiased(self, i: int) -> np.ndarray:
    return np.asarray(similarity.center_gram(self._take(self.layers[i].gram), unbiased=True))

  def _features(self, i: int) -> np.ndarray:  # centred over the drawn images
    x = self.layers[i].features[self.index]
    return x - x.mean(axis=0, keepdims=True)

  def _root(self, i: int) -> np.ndarray:
    return procrustes.unit_root(self.get('centred', i))

  def _directions(self, i: int) -> np.ndarray:
    if self.layers[i].features is None:
      reduced = cca.reduced_from_gram(self.get('centred', i), self.svcca_dims)
    else:  # the singular vectors over the images, as the Gram matrix's eigenvectors
      u, s, _ = np.linalg.svd(self.get('features', i), full_matrices=False)
      reduced = cca.top_directions(s, u, self.svcca_dims)
    return reduced / np.linalg.norm(reduced, axis=0)

  def _ranks(self, i: int) -> np.ndarray:
    return scipy.stats.rankdata(self._take(self.layers[i].rdm)[np.triu(~self.copies, k=1)])

  def _neighbours(self, i: int) -> np.ndarray:
    cosine = np.where(self.copies, -1e8, self._take(self.layers[i].cosine))
    nearest = np.argsort(-cosine, axis=1, kind='stable')[:, :self.k]
    mask = np.zeros(cosine.shape, bool)
    mask[np.arange(len(mask))[:, None], nearest] = True
    return mask


def _pair_value(draw: _Draw, measure: str, i: int, j: int) -> float:
  """One measure of layers i and j on the draw's images."""
  if measure in ('cka', 'debiased_cka'):
    what = 'centred' if measure == 'cka' else 'debiased'
    return float(similarity.cka_of_centred(draw.get(what, i), draw.get(what, j)))
  if measure == 'procrustes':  # symmetric: a layer with its features kept goes first
    if draw.layers[i].features is None and draw.layers[j].features is not None:
      i, j = j, i
    if draw.layers[i].features is not None:
      return procrustes.distance_from_features(draw.get('features', i), draw.get('centred', j))
    return procrustes.distance_from_grams(draw.get('root', i), draw.get('centred', j))
  if measure == 'svcca':  # the reduced directions are orthogonal and centred: CCA's whitening
    # leaves them orthonormal, and the correlations are the singular values of their product
    directions = draw.get('directions', i), draw.get('directions', j)
    if directions[0].shape[1] + directions[1].shape[1] >= len(draw.index):
      return np.nan  # they share directions whatever the layers compute (`svcca_gaps`)
    product = directions[0].T @ directions[1]
    return float(np.mean(np.linalg.svd(product, compute_uv=False)))
  if measure == 'pwcca':
    pooled = draw.layers[i].pooled, draw.layers[j].pooled
    with np.errstate(invalid='ignore'):  # dependent channels: NaN, then `pwcca_gaps`
      return cca.pwcca(pooled[0][draw.index], pooled[1][draw.index])
  if measure == 'rsa':
    return float(np.corrcoef(draw.get('ranks', i), draw.get('ranks', j))[0, 1])
  masks = draw.get('neighbours', i), draw.get('neighbours', j)
  return float(np.sum(masks[0] & masks[1]) / (len(masks[0]) * draw.k))


@threadpoolctl.threadpool_limits.wrap(limits=1, user_api='blas')
def values(layers: Sequence[Layer], pairs: Union[Sequence[Pair], Mapping[str, Sequence[Pair]]],
           measures: Sequence[str], index: np.ndarray, k: int = 10,
           svcca_dims: Optional[int] = None) -> Dict[str, np.ndarray]:
  """Every measure of every pair of layers on the images `index` draws.

  Args:
    layers: the layers' summaries over the same n images (`summarise`).
    pairs: (i, j) indices into `layers`, for every measure or per measure; PWCCA
      weighs layer i's side unless j keeps fewer neurons (`cca.pwcca`).
    measures: the measures.
    index: (n,) the drawn images; np.arange(n) for the estimate itself.
    k: mutual k-NN's neighbours.
    svcca_dims: SVCCA's directions per layer (`cca.svcca`'s `dims`; None: 99% of the
      singular values' sum).

  Returns:
    measure -> (len(pairs),) values; NaN where PWCCA has none (`pwcca_gaps`),
    where SVCCA's two layers keep as many directions as there are images
    (`svcca_gaps`) and where a layer is the same on every drawn image.
  """
  draw = _Draw(layers, np.asarray(index), k, svcca_dims)
  out = {}
  with jax.enable_x64(True):
    for measure in measures:
      chosen = pairs[measure] if isinstance(pairs, Mapping) else pairs
      row = np.full(len(chosen), np.nan)
      for p, (i, j) in enumerate(chosen):
        if draw.constant(i) or draw.constant(j):
          continue  # no measure compares a layer that does not vary
        try:
          row[p] = _pair_value(draw, measure, i, j)
        except ValueError:  # CCA on too few images or dependent channels (`pwcca_gaps`);
          if measure != 'pwcca':  # numpy's LinAlgError is a ValueError
            raise
      out[measure] = row
  return out


@dataclasses.dataclass(frozen=True)
class Measured:
  """Every measure of the chosen pairs on all the images, and statistics of them,
  each with its bootstrap standard error over the images."""
  values: Dict[str, np.ndarray]  # measure -> (pairs,)
  stderr: Dict[str, np.ndarray]
  statistics: Dict[str, np.ndarray]  # measure -> (statistics,)
  statistics_stderr: Dict[str, np.ndarray]
  seconds_per_pair: Dict[str, float]  # process time of the estimate, per pair


Statistic = Callable[[str, np.ndarray, np.ndarray], np.ndarray]


def measured(layers: Sequence[Layer], pairs: Mapping[str, Sequence[Pair]],
             measures: Sequence[str], statistic: Statistic, resamples: int, k: int = 10,
             svcca_dims: Optional[int] = None) -> Measured:
  """`values` on all the images and on `resamples` bootstrap draws of them, and a
  statistic of each measure's values (what a figure's verdict reads), each with
  the standard deviation over the draws as its standard error.

  Args:
    layers: the layers' summaries over the same n images (`summarise`).
    pairs: measure -> its (i, j) pairs.
    measures: the measures.
    statistic: (measure, its values for the pairs, the drawn images' indices) ->
      a vector of statistics (empty where none).
    resamples: the bootstrap draws.
    k: mutual k-NN's neighbours.
    svcca_dims: `values`' `svcca_dims`.

  Returns:
    The values and statistics with their standard errors.
  """
  n = len(layers[0].norms)
  estimate, seconds = {}, {}
  for measure in measures:
    start = time.process_time()
    estimate[measure] = values(layers, pairs, [measure], np.arange(n), k, svcca_dims)[measure]
    seconds[measure] = (time.process_time() - start) / max(1, len(pairs[measure]))
  stats = {m: np.asarray(statistic(m, estimate[m], np.arange(n)), np.float64).ravel()
           for m in measures}

  def draw(index):
    found = values(layers, pairs, measures, index, k, svcca_dims)
    return np.concatenate([np.concatenate([found[m], np.ravel(statistic(m, found[m], index))])
                           for m in measures])

  spread = uncertainty.bootstrap_stderr(draw, n, resamples)
  stderr, stats_stderr, at = {}, {}, 0
  for m in measures:
    stderr[m] = spread[at:at + len(pairs[m])]
    at += len(pairs[m])
    stats_stderr[m] = spread[at:at + len(stats[m])]
    at += len(stats[m])
  return Measured(estimate, stderr, stats, stats_stderr, seconds)


def pwcca_gaps(layers: Sequence[Layer], row: np.ndarray,
               channels: str = 'a layer\'s channels averaged over positions are') -> str:
  """Why PWCCA left cells empty, or '' where it left none.

  google/svcca's CCA needs more images than channels, and fails where a layer's
  averaged channels are linearly dependent, or nearly, over the images (their
  covariance is singular to rounding: the square root of its pseudo-inverse has
  negative eigenvalues, and `cca_core` gives NaN or no convergence). A ViT's embedding averaged
  over positions is such a layer when its width exceeds the pixels of a patch.

  Args:
    layers: the summaries.
    row: PWCCA's values for the pairs, NaN where it could not be computed.
    channels: what PWCCA took as a layer's neurons, in words, for the reason.

  Returns:
    The reason, a sentence, or ''.
  """
  empty = int(np.sum(np.isnan(row)))
  if not empty:
    return ''
  n = len(layers[0].pooled)
  widest = max(layer.pooled.shape[1] for layer in layers)
  if widest >= n:
    cause = (f'it needs more images than channels, and a layer has {widest} channels for {n} '
             'images (give more --num_images)')
  else:
    cause = (f'{channels} linearly dependent (or nearly) over the images, where '
             'google/svcca\'s CCA has no value')
  return f'PWCCA left {empty} of {len(row)} layer pairs empty: {cause}'


def empty_cells(measure: str, row: np.ndarray) -> str:
  """Why a measure left cells empty where `svcca_gaps` and `pwcca_gaps` do not say,
  or '' where it left none: a layer with the same features on every
  image (a blank patch of pixels), and for RSA also a layer whose features are all
  equal on some image, whose correlation distance to the others is undefined.

  Args:
    measure: the measure.
    row: its values for the pairs, NaN where it has none.

  Returns:
    The reason, a sentence, or ''.
  """
  empty = int(np.sum(np.isnan(row)))
  if not empty:
    return ''
  cause = 'a layer has the same features on every image (a blank patch)'
  if measure == 'rsa':
    cause = ('a layer\'s features are all equal on some image (a blank patch), so that '
             'image has no correlation distance')
  return f'{TITLES[measure]} left {empty} of {len(row)} pairs empty: {cause}'


def not_applicable(layers: Sequence[Layer], found: Mapping[str, np.ndarray],
                   svcca_kept: Sequence[int] = (),
                   channels: str = 'a layer\'s channels averaged over positions are'
                   ) -> Dict[str, str]:
  """Why each measure left cells empty, for the measures that did: PWCCA's
  (`pwcca_gaps`), SVCCA's pairs that keep as many directions as images
  (`svcca_gaps`), and otherwise `empty_cells`.

  Args:
    layers: the summaries.
    found: measure -> its values for the pairs, NaN where it has none.
    svcca_kept: each layer's SVCCA directions (`svcca_directions`), where SVCCA
      was measured.
    channels: `pwcca_gaps`' words for what PWCCA took as a layer's neurons.

  Returns:
    measure -> the reason, a sentence.
  """
  n = len(layers[0].norms)
  out = {}
  for measure, row in found.items():
    if not np.isnan(row).any():
      continue
    if measure == 'pwcca':
      out[measure] = pwcca_gaps(layers, row, channels)
    elif measure == 'svcca' and 2 * max(svcca_kept) >= n:
      out[measure] = svcca_gaps(svcca_kept, n, row)
    else:
      out[measure] = empty_cells(measure, row)
  return out


@threadpoolctl.threadpool_limits.wrap(limits=1, user_api='blas')
def svcca_directions(layers: Sequence[Layer], dims: Optional[int] = None) -> list:
  """How many directions SVCCA keeps of each layer on all the images.

  Args:
    layers: the summaries (with Gram matrices).
    dims: `values`' `svcca_dims`.

  Returns:
    The counts, in the layers' order.
  """
  with jax.enable_x64(True):
    return [cca.reduced_from_gram(np.asarray(similarity.center_gram(layer.gram)), dims).shape[1]
            for layer in layers]


def svcca_gaps(kept: Sequence[int], n: int, row: np.ndarray) -> str:
  """Why SVCCA left cells empty, or '' where it left none: two layers that keep
  together as many directions as there are images share at least that excess of
  directions in the images' space, each with canonical correlation 1, so their
  SVCCA nears 1 whatever the layers compute.

  Args:
    kept: each layer's directions (`svcca_directions`).
    n: the number of images.
    row: SVCCA's values for the pairs, NaN where left empty.

  Returns:
    The reason, a sentence, or ''.
  """
  empty = int(np.sum(np.isnan(row)))
  if not empty:
    return ''
  return (f'SVCCA left {empty} of {len(row)} layer pairs empty: its layers keep '
          f'{min(kept)}-{max(kept)} directions on {n} images, and a pair keeping together as '
          'many directions as images shares some whatever it computes (give more '
          '--num_images, or fewer directions with --similarity_svcca_dims)')


def outlier_images(layers: Sequence[Layer], share: float) -> np.ndarray:
  """The images among the `share` of largest centred-feature norm in any layer
  (Davari et al. 2023's sensitivity of CKA to a few high-norm examples).

  Args:
    layers: the summaries.
    share: the share of the images taken from each layer, at least one image.

  Returns:
    The images' indices, sorted.
  """
  count = max(1, int(np.ceil(share * len(layers[0].norms))))
  chosen = set()
  for layer in layers:
    chosen.update(np.argsort(-layer.norms)[:count].tolist())
  return np.array(sorted(chosen))
