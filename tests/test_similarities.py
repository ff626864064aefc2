"""Layer-by-layer similarity under several measures: each measure from the layers'
summaries equals the measure's own function on the features, bootstrap draws
treat an image's copies as the measures need, the standard error covers the
population value, and the tool's matrices, checks and verdicts across measures."""
import json
import os

import jax
import numpy as np
import pytest

from analysis.measures import (cca, layer_similarity, neighbours, procrustes, rsa, similarity,
                               uncertainty)
from analysis.reporting import verdict
from analysis.runtime import features
from analysis.tool import run_on
from analysis.tools import TOOLS, similarities
from helpers import batches
from vit_jax.errors import ConfigError


def _layers(n=90, seed=0):
  """Two related layers of n images: a (4, 4, 6) map and (5, 5, 8) tokens-like map."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 4, 4, 6)) * np.linspace(0.5, 3., 6)
  y = np.tanh(x.reshape(n, -1) @ rng.normal(size=(96, 200)) / 5).reshape(n, 5, 5, 8)
  return x, y + 0.3 * rng.normal(size=y.shape)


def _own(measure, x, y):
  """The measure's own function on the features (PWCCA on the channels' means, SVCCA
  keeping 20 directions, google/svcca's tutorial's count)."""
  with jax.enable_x64(True):
    return {'cka': lambda: float(similarity.linear_cka(x, y)),
            'debiased_cka': lambda: float(similarity.linear_cka(x, y, unbiased=True)),
            'procrustes': lambda: procrustes.procrustes_distance(x, y),
            'mutual_knn': lambda: neighbours.mutual_knn(x, y),
            'rsa': lambda: rsa.rsa(x, y), 'svcca': lambda: cca.svcca(x, y, dims=20),
            'pwcca': lambda: cca.pwcca(x.mean(axis=(1, 2)), y.mean(axis=(1, 2)))}[measure]()


def _summaries(*xs):
  return [layer_similarity.summarise(x, x.mean(axis=(1, 2)), layer_similarity.MEASURES)
          for x in xs]


@pytest.mark.parametrize('measure', layer_similarity.MEASURES)
def test_each_measure_from_the_summaries_is_its_own_function(measure):
  x, y = _layers()
  found = layer_similarity.values(_summaries(x, y), [(0, 1), (0, 0)], [measure], np.arange(90),
                                  svcca_dims=20)
  np.testing.assert_allclose(found[measure][0], _own(measure, x, y), rtol=2e-6, atol=1e-9)
  identical = 0. if measure in layer_similarity.DISTANCES else 1.
  np.testing.assert_allclose(found[measure][1], identical, atol=1e-6)


@pytest.mark.parametrize('measure', layer_similarity.MEASURES)
def test_a_draw_in_another_order_is_the_same_sample(measure):
  """Every measure ignores the order of the images: a permutation of all of them is
  the estimate itself, and a draw without repeats is the measure on the drawn
  images' features (mutual k-NN's clipping bound being that of all the images)."""
  x, y = _layers()
  layers = _summaries(x, y)
  order = np.random.default_rng(1).permutation(90)
  found = layer_similarity.values(layers, [(0, 1)], [measure], order, svcca_dims=20)[measure][0]
  np.testing.assert_allclose(found, _own(measure, x, y), rtol=2e-6, atol=1e-9)
  part = order[:60]
  found = layer_similarity.values(layers, [(0, 1)], [measure], part, svcca_dims=20)[measure][0]
  if measure == 'mutual_knn':  # clipped at the bound of all the images, not the draw's
    clipped = [neighbours.clip_outliers(v.reshape(90, -1))[part] for v in (x, y)]
    expected = neighbours.mutual_knn(*clipped, quantile=1)
  else:
    expected = _own(measure, x[part], y[part])
  np.testing.assert_allclose(found, expected, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize('measure', ['procrustes', 'svcca'])
def test_a_layer_narrower_than_the_images_is_measured_from_its_features(measure):
  """A layer with fewer features than images keeps them, and Procrustes and SVCCA
  read them in place of the Gram matrix: with a narrow and a wide layer in either
  order, and two narrow ones, on all the images and on a draw without repeats,
  each equals the measure's own function."""
  x, y = _layers()
  narrow = x[:, :2, :2] + 0.1 * y[:, :2, :2, :6]  # 24 features for 90 images
  layers = _summaries(x, y, narrow, narrow[..., ::-1] ** 3)
  assert [layer.features is None for layer in layers] == [True, True, False, False]
  part = np.random.default_rng(2).permutation(90)[:70]
  for index in (np.arange(90), part):
    found = layer_similarity.values(layers, [(2, 1), (1, 2), (2, 3)], [measure], index,
                                    svcca_dims=20)[measure]
    expected = [_own(measure, *(v[index] for v in pair))
                for pair in ((narrow, y), (y, narrow), (narrow, narrow[..., ::-1] ** 3))]
    np.testing.assert_allclose(found, expected, rtol=2e-6, atol=1e-9)


def test_svcca_keeps_99_percent_and_leaves_pairs_that_must_share_directions_empty():
  """By default SVCCA keeps the directions holding 99% of the singular values' sum
  (Raghu et al. 2017), as `cca.svcca`; two layers keeping together as many
  directions as there are images share some whatever they compute, and are left
  empty with the reason."""
  x, y = _layers(n=600)
  layers = _summaries(x, y)
  found = layer_similarity.values(layers, [(0, 1)], ['svcca'], np.arange(600))['svcca']
  np.testing.assert_allclose(found, cca.svcca(x, y), rtol=1e-6)
  kept = layer_similarity.svcca_directions(layers)
  assert kept[0] < 96 and kept[1] < 200 and layer_similarity.svcca_gaps(kept, 600, found) == ''
  few = _summaries(x[:150], y[:150])
  found = layer_similarity.values(few, [(0, 1)], ['svcca'], np.arange(150))['svcca']
  kept = layer_similarity.svcca_directions(few)
  assert sum(kept) >= 150 and np.isnan(found[0])
  assert layer_similarity.svcca_gaps(kept, 150, found).startswith(
      f'SVCCA left 1 of 1 layer pairs empty: its layers keep {min(kept)}-{max(kept)} '
      'directions on 150 images')


def test_an_images_copies_are_not_its_neighbours_and_not_an_rsa_pair():
  """Drawn twice, an image's copies would be each other's nearest neighbours in every
  layer and would add pairs of distance 0 to RSA: the draw leaves both out, so a
  draw of every image twice measures what the images once do."""
  x, y = _layers()
  layers = _summaries(x, y)
  twice = np.repeat(np.arange(90), 2)
  once = layer_similarity.values(layers, [(0, 1)], ['mutual_knn', 'rsa'], np.arange(90))
  found = layer_similarity.values(layers, [(0, 1)], ['mutual_knn', 'rsa'], twice, k=20)
  # each image's 20 nearest among the copies are its 10 nearest others, each twice
  np.testing.assert_allclose(found['mutual_knn'], once['mutual_knn'], rtol=1e-12)
  expected = rsa.rsa(x[twice], y[twice])  # with the 90 pairs of copies, at distance 0
  assert abs(found['rsa'][0] - expected) > 1e-4
  np.testing.assert_allclose(found['rsa'], once['rsa'], rtol=1e-8)


def test_the_bootstrap_error_covers_the_population_value():
  """Debiased CKA (unbiased HSIC, so no drift with n) of y = x A + noise: over 40
  samples of 120 images, the estimate lies within two bootstrap standard errors of
  the value on 20,000 images in about 95% of them."""
  rng = np.random.default_rng(0)
  mixing = rng.normal(size=(6, 6))

  def sample(n):
    x = rng.normal(size=(n, 1, 1, 6))
    return x, x @ mixing + 2 * rng.normal(size=(n, 1, 1, 6))

  population = _own('debiased_cka', *sample(20000))
  covered = 0
  for seed in range(40):
    layers = _summaries(*sample(120))

    def statistic(index):
      return layer_similarity.values(layers, [(0, 1)], ['debiased_cka'], index)['debiased_cka']
    value = statistic(np.arange(120))[0]
    stderr = uncertainty.bootstrap_stderr(statistic, 120, 30, seed=seed)[0]
    covered += abs(value - population) <= 2 * stderr
  assert 33 <= covered <= 40, covered


def test_the_outlier_images_are_each_layers_largest_norms():
  x, y = _layers()
  x[7] *= 10
  y[3] *= 10
  layers = _summaries(x, y)
  assert layer_similarity.outlier_images(layers, 0.01).tolist() == [3, 7]


def test_pwcca_leaves_dependent_channels_and_too_few_images_empty_and_says_why():
  """google/svcca's CCA has no value on channels that are linearly dependent over the
  images (a ViT embedding averaged over positions, wider than a patch's pixels) or
  on fewer images than channels: those cells are NaN, and the reason is given."""
  rng = np.random.default_rng(0)
  base = rng.normal(size=(200, 1, 1, 12))
  dependent = base @ rng.normal(size=(12, 16))  # 16 channels of rank 12
  layers = _summaries(base, dependent + 0.1, np.tanh(base))
  found = layer_similarity.values(layers, [(0, 2), (1, 2), (0, 0)], ['pwcca'], np.arange(200))
  assert np.isnan(found['pwcca'][1]) and not np.isnan(found['pwcca'][[0, 2]]).any()
  assert layer_similarity.pwcca_gaps(layers, found['pwcca']) == (
      'PWCCA left 1 of 3 layer pairs empty: a layer\'s channels averaged over positions are '
      'linearly dependent (or nearly) over the images, where google/svcca\'s CCA has no value')
  assert layer_similarity.pwcca_gaps(layers, found['pwcca'][[0, 2]]) == ''
  few = _summaries(base[:10], np.tanh(base[:10]))
  found = layer_similarity.values(few, [(0, 1)], ['pwcca'], np.arange(10))['pwcca']
  assert 'a layer has 12 channels for 10 images' in layer_similarity.pwcca_gaps(few, found)


def test_measures_are_checked():
  with pytest.raises(ValueError, match='Unknown similarity measure cca; use some of cka'):
    layer_similarity.check_measures(['cka', 'cca'])
  with pytest.raises(ConfigError, match='--similarity_measures: Unknown similarity measure'):
    similarities.Options(similarity_measures='cka,bleu')
  with pytest.raises(ConfigError, match='--similarity_outliers is 0.5'):
    similarities.Options(similarity_outliers=0.5)
  assert similarities.Options(similarity_measures='rsa, cka').measures == ('rsa', 'cka')


def test_the_tool_on_two_runs_of_a_vit_and_a_resnet(subjects, tmp_path):
  """Matrices per measure within and between models, their standard errors, the
  checks (the twin ViT's layers against the ViT's, the outlier images) and one
  figure per measure; a second ViT of the same architecture is the seed twin."""
  vit, bit = subjects['vit'], subjects['bit']
  twin = features.Subject('twin', vit.config, jax.tree_util.tree_map(
      lambda p: p * 1.01, vit.params), vit.image_size, vit.recipe)
  options = similarities.Options(similarity_resamples=3, similarity_knn=5)
  result = run_on(TOOLS['similarities'], [vit, twin, bit], lambda s: batches, str(tmp_path),
                  options)
  json.dumps(result)
  assert result['measures'] == list(layer_similarity.MEASURES) and result['num_examples'] == 36
  keys = {'vit', 'twin', 'bit', 'vit vs twin', 'vit vs bit', 'twin vs bit'}
  for m in layer_similarity.MEASURES:
    assert set(result['similarity'][m]) == keys == set(result['stderr'][m])
    within = np.array(result['similarity'][m]['vit'])
    assert within.shape == (5, 5)
    assert np.array(result['similarity'][m]['vit vs bit']).shape == (5, 3)
    if m != 'pwcca':
      np.testing.assert_allclose(within, within.T, atol=1e-12)  # mirrored
    errors = np.array(result['stderr'][m]['vit'])
    # PWCCA on 36 images: a draw's repeats can leave its channels' covariance
    # singular; SVCCA's layers keep too many directions for 36 images: a cell with
    # such draws has no standard error
    assert np.all(errors >= 0) if m not in ('pwcca', 'svcca') else not np.any(errors < 0)
  np.testing.assert_allclose(np.diag(result['similarity']['cka']['vit']), 1., rtol=1e-9)
  np.testing.assert_allclose(np.diag(result['similarity']['procrustes']['vit']), 0., atol=1e-6)
  x = [np.concatenate([np.asarray(vit.intermediates(images, [name])[name])
                       for images, _ in batches('eval')]) for name in vit.layers.stream[:2]]
  np.testing.assert_allclose(result['similarity']['rsa']['vit'][0][1], rsa.rsa(*x), rtol=1e-5)
  assert set(result['specificity']['cka']) == {'vit vs twin'}
  assert set(result['correspondence']['cka']) == {'vit vs bit', 'twin vs bit'}
  value, stderr = result['uniformity']['cka']['vit']
  within = np.array(result['similarity']['cka']['vit'])
  assert value == pytest.approx(within[~np.eye(5, dtype=bool)].mean()) and stderr > 0
  assert 'a layer has 512 channels for 36 images' in result['not_applicable']['pwcca']
  assert result['not_applicable']['svcca'].startswith('SVCCA left')
  kept = result['svcca_directions']
  assert [len(kept[s.label]) for s in (vit, twin, bit)] == [5, 5, 3]
  assert all(0 < k <= 36 for counts in kept.values() for k in counts)
  assert result['outliers']['images_left_out'] >= 1
  assert all(os.path.exists(path) for path in result['figures'])
  assert len(result['figures']) == len(layer_similarity.MEASURES)
  with pytest.raises(ConfigError, match='--similarity_knn is 36, and 36 images'):
    TOOLS['similarities'].run([vit, bit], batches, similarities.Options(similarity_knn=36))


def _judged(kind):
  return verdict.Verdict('', '', 'x', kind, '')


@pytest.mark.parametrize('kinds, expected', [
    (dict(cka=verdict.AGREES, debiased_cka=verdict.AGREES, rsa=verdict.INCONCLUSIVE),
     verdict.INCONCLUSIVE),  # one family
    (dict(cka=verdict.AGREES, rsa=verdict.AGREES, svcca=verdict.INCONCLUSIVE), verdict.AGREES),
    (dict(cka=verdict.AGREES, rsa=verdict.AGREES, procrustes=verdict.DIFFERS),
     verdict.INCONCLUSIVE),  # a dissent
    (dict(cka=verdict.DIFFERS, procrustes=verdict.DIFFERS), verdict.DIFFERS),
    (dict(cka=verdict.NOT_COMPARABLE, rsa=verdict.NOT_COMPARABLE), verdict.NOT_COMPARABLE)])
def test_a_claim_is_reproduced_when_two_families_agree_and_none_differs(kinds, expected):
  found = similarities.across_measures('f', 'c', {m: _judged(k) for m, k in kinds.items()})
  assert found.verdict == expected
  for kind in set(kinds.values()):
    named = ', '.join(layer_similarity.TITLES[m] for m, k in kinds.items() if k == kind)
    assert f'{kind}: {named}' in found.why
  assert f'rests on {len(kinds)} measures' in found.why


def test_statistics_have_no_value_where_a_cell_is_empty(subjects):
  """An empty cell leaves no most alike layer: the shares it would enter are NaN."""
  vit, bit = subjects['vit'], subjects['bit']
  across = np.arange(15.).reshape(5, 3)
  found = similarities.statistics({'vit vs bit': across}, 'cka', [vit, bit])
  assert found['correspondence'] == {'vit vs bit': 0.}  # the ResNet's best: the last layer
  across[4, 0] = np.nan
  found = similarities.statistics({'vit vs bit': across}, 'cka', [vit, bit])
  assert np.isnan(found['correspondence']['vit vs bit'])


def test_verdicts_judge_each_measure_with_the_distance_turned_round():
  """A ViT more uniform than a ResNet under CKA (higher) and Procrustes (lower)."""
  result = {'layers': {'v': [], 'r': []}, 'measures': ['cka', 'procrustes'],
            'uniformity': {'cka': {'v': [0.9, 0.01], 'r': [0.5, 0.01]},
                           'procrustes': {'v': [0.1, 0.01], 'r': [0.6, 0.01]}},
            'correspondence': {'cka': {'v vs r': [1., 0.]}, 'procrustes': {'v vs r': [0.25, 0.1]}}}
  models = {'v': {'architecture': 'transformer'}, 'r': {'architecture': 'convnet'}}
  uniform, matched = similarities.verdicts(result, models)
  assert uniform.verdict == verdict.AGREES
  assert matched.verdict == verdict.INCONCLUSIVE and 'differs: Procrustes' in matched.why
  # A measure without values (null in the JSON) is not comparable, and the others judge.
  result['measures'].append('svcca')
  result['uniformity']['svcca'] = {'v': [None, None], 'r': [None, None]}
  result['correspondence']['svcca'] = {'v vs r': [None, None]}
  result['correspondence']['procrustes'] = {'v vs r': [1., 0.]}
  uniform, matched = similarities.verdicts(result, models)
  assert uniform.verdict == matched.verdict == verdict.AGREES
  assert 'not comparable: SVCCA' in matched.why


def _platonic_prepare_stacked(layers, q=0.95):
  """platonic-rep's prepare_features on a model's stacked (N, L, D) features
  (measure_alignment.py line 103; metrics.py remove_outliers, exact: the sorted
  absolute entries at int(q * numel), one clamp for the whole tensor), then each
  layer's rows L2-normalised as compute_score does, and their inner products."""
  stacked = np.stack([x.reshape(len(x), -1) for x in layers], axis=1)
  q_val = np.sort(np.abs(stacked).reshape(-1))[int(q * stacked.size)]
  clipped = np.clip(stacked, -q_val, q_val)
  out = []
  for i in range(clipped.shape[1]):
    f = clipped[:, i]
    f = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
    out.append(f @ f.T)
  return out


@pytest.mark.parametrize('feature_bytes', [None, 1])  # every layer at once; a pass a layer
def test_mutual_knn_clips_a_models_stacked_layers_at_one_bound_as_platonic_rep(
    subjects, monkeypatch, feature_bytes):
  vit = subjects['vit']
  if feature_bytes:
    monkeypatch.setattr(similarities, 'FEATURE_BYTES', feature_bytes)
  n = sum(len(images) for images, _ in batches('eval'))
  got = similarities.summarise([vit], batches, ('mutual_knn',), n)
  kept = [vit.intermediates(images, vit.layers.stream) for images, _ in batches('eval')]
  layers = [np.concatenate([np.asarray(k[name], np.float32) for k in kept]).astype(np.float64)
            for name in vit.layers.stream]
  assert len({x[0].size for x in layers}) == 1  # one width, as the authors' (N, L, D)
  for ours, theirs in zip(got, _platonic_prepare_stacked(layers)):
    np.testing.assert_allclose(ours.cosine, theirs, atol=1e-5)
  each = similarities.summarise([vit], batches, ('mutual_knn',), n, knn_clip='layer')
  assert any(not np.allclose(a.cosine, b.cosine, atol=1e-5) for a, b in zip(got, each))


def test_the_stacked_bound_from_each_layers_largest_entries_is_the_whole_stacks():
  rng = np.random.default_rng(0)
  parts = [rng.standard_t(3, size=s) for s in (50, 7, 300, 1)]
  total = sum(p.size for p in parts)
  for q in (0.5, 0.95, 0.999):
    want = np.sort(np.abs(np.concatenate(parts)))[int(q * total)]
    tops = [neighbours.largest_entries(p, total, q) for p in parts]
    assert neighbours.stacked_bound(tops, total, q) == want


def test_too_few_images_for_the_measures_are_refused_before_any_model_runs():
  two = lambda split: iter([(np.zeros((2, 8, 8, 3), np.float32), np.zeros(2, np.int32))])
  with pytest.raises(ConfigError, match='2 images are analysed, and the similarity measures '
                     'need at least 4: with 2, every pair of layers has CKA 1'):
    similarities.Options(similarity_measures='cka,procrustes').images(two)
