"""Raghu et al.'s head (Fig. 5) and localisation (Fig. 9-10) figures under every
similarity measure: each cell is the measure's own function on the features the
figure compares, the statistics are the CKA tools' own on each measure's values,
and the verdicts judge each measure with distances turned round, then across
measures and seeds."""
import json
import os

import jax
import numpy as np
import pytest

from analysis.measures import attention, layer_similarity, neighbours, procrustes, similarity
from analysis.reporting import verdict
from analysis.tool import run_on
from analysis.tools import TOOLS, head_cka, localisation, similarities
from helpers import batches

OPTIONS = similarities.MeasureOptions(similarity_resamples=3, similarity_knn=5)


def _concatenated(subject, names):
  found = {name: [] for name in names}
  for images, _ in batches('eval'):
    inter = subject.intermediates(images, names)
    for name in names:
      found[name].append(np.asarray(inter[name]))
  return {name: np.concatenate(parts) for name, parts in found.items()}


def test_heads_against_the_other_models_layers_under_every_measure(subjects, tmp_path):
  """Every head of the first and last attention layer against every ResNet layer:
  a cell is the measure on the head's spatial tokens and the layer's features, the
  distances are `attention.mean_attention_distance` over all the images, and the
  statistic per layer is head_cka's correlation of the distances with the mean
  over the lower layers."""
  vit, bit = subjects['vit'], subjects['bit']
  result = run_on(TOOLS['head_similarities'], [vit, bit], lambda s: batches, str(tmp_path),
                  OPTIONS)
  json.dumps(result)
  entry = result['pairs']['vit vs bit']
  assert set(result['pairs']) == {'vit vs bit'} and entry['lower_layers'] == 2
  blocks = head_cka.attention_blocks(vit)
  outputs = _concatenated(vit, [vit.layers.head_outputs[b] for b in blocks] +
                          [vit.layers.attention_weights[b] for b in blocks])
  layers = _concatenated(bit, bit.layers.stream)
  heads = outputs[vit.layers.head_outputs[0]].shape[2]
  for m in layer_similarity.MEASURES:
    assert np.shape(entry['similarity'][m]) == (2, heads, 3) == np.shape(entry['stderr'][m])
  head = outputs[vit.layers.head_outputs[-1]][:, 1:, 1]  # the class token left out
  layer = layers[bit.layers.stream[2]]
  # Mutual k-NN clips each model's feature sets at one bound over all of them, as
  # platonic-rep clips a model's stacked layers: the ViT's heads, the ResNet's layers.
  all_heads = [outputs[vit.layers.head_outputs[b]][:, 1:, h] for b in blocks
               for h in range(heads)]
  bound = lambda xs: np.sort(np.abs(np.concatenate([x.reshape(-1) for x in xs])))[
      int(0.95 * sum(x.size for x in xs))]
  clipped_head = np.clip(head, -bound(all_heads), bound(all_heads))
  all_layers = [layers[name] for name in bit.layers.stream]
  clipped_layer = np.clip(layer, -bound(all_layers), bound(all_layers))
  with jax.enable_x64(True):
    expected = {'cka': float(similarity.linear_cka(head, layer)),
                'procrustes': procrustes.procrustes_distance(head, layer),
                'mutual_knn': neighbours.mutual_knn(clipped_head, clipped_layer, k=5,
                                                    quantile=1)}
  for m, value in expected.items():
    assert entry['similarity'][m][1][1][2] == pytest.approx(value, rel=1e-6)
  grid, pixels = vit.token_grid()
  distance = [np.asarray(attention.mean_attention_distance(
      outputs[vit.layers.attention_weights[b]], grid, pixels, vit.has_cls)) for b in blocks]
  np.testing.assert_allclose(entry['distance'], distance, rtol=1e-5)
  for m in ('cka', 'rsa'):
    to_lower = np.asarray(entry['similarity'][m])[:, :, :2].mean(-1)
    np.testing.assert_allclose(entry['to_lower'][m], to_lower, rtol=1e-9)
    correlation = np.corrcoef(distance[0], to_lower[0])[0, 1]
    assert entry['correlation'][m][0][0] == pytest.approx(correlation, rel=1e-4)
    assert entry['correlation'][m][0][1] > 0
  for m in layer_similarity.MEASURES:  # every empty cell with its reason
    assert np.isnan(np.array(entry['similarity'][m], float)).any() == (
        m in entry['not_applicable'])
  assert [os.path.basename(path) for path in result['figures']] == [
      'head_similarities_vit_bit.png'] and os.path.exists(result['figures'][0])


def test_final_positions_against_the_input_patches_under_every_measure(subjects, tmp_path):
  """A map per query and measure: a cell is the measure on the query's final token
  and the patch's pixels; the own-patch margin is `localisation.own_margin` of the
  maps, of the maps turned round for Procrustes' distance."""
  vit = subjects['vit']
  result = TOOLS['localisation_similarities'].run_one(vit, batches, str(tmp_path), OPTIONS)
  json.dumps(result)
  h, w = result['grid']
  parts = [localisation.final_positions(vit, images) for images, _ in batches('eval')]
  tokens = np.concatenate([p.tokens for p in parts])
  patches = np.concatenate([p.patches for p in parts])
  own = parts[0].own
  for m in layer_similarity.MEASURES:
    assert np.shape(result['maps'][m]) == (5, h, w) == np.shape(result['stderr'][m])
  with jax.enable_x64(True):
    cka = float(similarity.linear_cka(tokens[:, 2], patches[:, 7]))
  assert result['maps']['cka'][2][7 // w][7 % w] == pytest.approx(cka, rel=1e-6)
  distance = procrustes.procrustes_distance(tokens[:, 4], patches[:, 0])
  assert result['maps']['procrustes'][4][0][0] == pytest.approx(distance, rel=1e-6)
  maps = {m: np.asarray(result['maps'][m]) for m in ('cka', 'procrustes')}
  assert result['own_margin']['cka'][0] == pytest.approx(
      localisation.own_margin(maps['cka'], own))
  assert result['own_margin']['procrustes'][0] == pytest.approx(
      localisation.own_margin(-maps['procrustes'], own))
  assert result['peak_at_query']['cka'] == np.mean(
      localisation.query_margins(maps['cka'], own) > 0)
  for m in layer_similarity.MEASURES:
    assert np.isnan(np.array(result['maps'][m], float)).any() == (m in result['not_applicable'])
  assert all(os.path.exists(path) for path in result['figures'])


def test_a_layer_that_does_not_vary_has_no_value_under_any_measure():
  """A blank patch (the same pixels on every image, or on every drawn one) is no
  representation to compare: every measure leaves its pairs empty, and a draw
  that leaves a rare pattern out does the same."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, 6))
  blank = np.zeros((40, 6))
  rare = blank.copy()
  rare[3] = 1.
  layers = [layer_similarity.summarise(v, v, layer_similarity.MEASURES) for v in (x, blank, rare)]
  found = layer_similarity.values(layers, [(0, 1), (1, 0), (0, 2)], layer_similarity.MEASURES,
                                  np.arange(40), k=5, svcca_dims=3)
  for m in layer_similarity.MEASURES:
    assert np.isnan(found[m][:2]).all()
  without = np.delete(np.arange(40), 3)
  found = layer_similarity.values(layers, [(0, 2)], ['cka', 'rsa'], without, k=5)
  assert np.isnan(found['cka']).all() and np.isnan(found['rsa']).all()
  assert layer_similarity.empty_cells('cka', found['cka']) == (
      'linear CKA left 1 of 1 pairs empty: a layer has the same features on every image (a '
      'blank patch)')
  assert 'all equal on some image' in layer_similarity.empty_cells('rsa', found['rsa'])
  assert layer_similarity.empty_cells('cka', np.array([0.5])) == ''


MODELS = {'v0': {'architecture': 'transformer', 'group': 'v'},
          'v1': {'architecture': 'transformer', 'group': 'v'},
          'r': {'architecture': 'convnet'}}


def test_head_verdicts_turn_the_distance_round_and_join_the_seeds():
  """Local heads most alike the lower layers: a negative correlation for a
  similarity, a positive one for Procrustes' distance; two runs of one ViT give one
  verdict per measure on their combined correlation."""
  def entry(cka, distance):
    return {'blocks': ['block0', 'block1'], 'measures': ['cka', 'procrustes'],
            'correlation': {'cka': [[cka, 0.05], [0., 0.1]],
                            'procrustes': [[distance, 0.05], [0., 0.1]]}}

  result = {'pairs': {'v0 vs r': entry(-0.9, 0.8), 'v1 vs r': entry(-0.8, 0.9),
                      'v0 vs v1': entry(0.9, 0.9)}}
  found, = TOOLS['head_similarities'].verdicts(result, MODELS)
  assert found.verdict == verdict.AGREES and found.runs == 2
  assert 'v (2 seeds)' in found.measured and 'agrees: linear CKA, Procrustes' in found.why
  result = {'pairs': {'v0 vs r': entry(0.9, 0.8)}}
  found, = TOOLS['head_similarities'].verdicts(result, MODELS)
  assert found.verdict == verdict.INCONCLUSIVE and 'differs: linear CKA' in found.why
  assert TOOLS['head_similarities'].verdicts({'pairs': {'v0 vs v1': entry(0.9, 0.9)}},
                                             MODELS) == []


def test_localisation_verdicts_per_measure_and_across_them():
  """A class-token ViT whose own patch wins under two families agrees; the contrast
  with a ResNet is judged under each measure."""
  def entry(class_token, cka, distance):
    return {'class_token': class_token, 'measures': ['cka', 'procrustes'],
            'own_margin': {'cka': [cka, 0.01], 'procrustes': [distance, 0.01]}}

  result = {'v0': entry(True, 0.2, 0.1), 'r': entry(False, -0.05, -0.01)}
  own, contrast = TOOLS['localisation_similarities'].verdicts(result, MODELS)
  assert own.verdict == contrast.verdict == verdict.AGREES
  assert own.finding == 'tokens keep their position, across measures'
  result['r'] = entry(False, 0.3, 0.)
  _, contrast = TOOLS['localisation_similarities'].verdicts(result, MODELS)
  assert contrast.verdict == verdict.INCONCLUSIVE
  assert 'differs: linear CKA' in contrast.why and 'agrees: Procrustes' in contrast.why
