"""Artifact tokens: the norms, outlier shares and class-token attention against
numpy on what the model sows, the neighbour similarity on constructed images,
the registers kept apart from the patches, and the refusal without attention."""
import json

import numpy as np
import pytest

from analysis.tools import TOOLS
from analysis.tools.artifact_tokens import Options, neighbour_similarity, pixel_patches
from helpers import batches, subject_of, tiny_family_config

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


@pytest.mark.parametrize('registers', [0, 2])
def test_norms_shares_and_attention_against_numpy(registers, tmp_path):
  subject = subject_of(tiny_family_config('vit', num_registers=registers), 'vit')
  layers = subject.layers
  result = TOOLS['artifact_tokens'].run_one(subject, batches, str(tmp_path), Options(
      artifact_rule='relative', artifact_factor=1.2))
  json.dumps(result)
  last = layers.attention_weights[-1]
  sown = [subject.intermediates(x, list(layers.stream) + [last]) for x, _ in batches('eval')]
  prefix = 1 + registers
  for k, name in enumerate(layers.stream):
    tokens = np.concatenate([np.asarray(s[name], np.float64) for s in sown])
    norms = np.sqrt(np.sum(tokens ** 2, -1))[:, prefix:]
    cut = 1.2 * np.median(norms)
    np.testing.assert_allclose(result['threshold'][k], cut, rtol=1e-9)
    np.testing.assert_allclose(result['norm_percentiles'][k],
                               np.percentile(norms, [50, 90, 99, 100]), rtol=1e-9)
    share = np.mean(norms > cut, axis=1)
    np.testing.assert_allclose(result['share'][k], share.mean(), rtol=1e-9)
    np.testing.assert_allclose(result['share_stderr'][k],
                               share.std(ddof=1) / np.sqrt(len(share)), rtol=1e-9)
  assert len(result['prefix_norm_last']) == prefix
  # The last entry's norms binned: every patch token once, between their extremes.
  edges, counts = (np.asarray(result['norm_histogram'][k]) for k in ('edges', 'counts'))
  assert counts.sum() == norms.size and len(edges) == len(counts) + 1 == 31
  np.testing.assert_allclose(edges[[0, -1]], [norms.min(), norms.max()], rtol=1e-6)
  outlier = norms > cut
  assert 0 < outlier.mean() < 1
  attention = np.concatenate([np.asarray(s[last], np.float64) for s in sown])
  from_cls = attention[:, :, 0, prefix:].mean(1)  # over heads, to the patches
  np.testing.assert_allclose(result['cls_attention_share_outliers'],
                             from_cls[outlier].sum() / from_cls.sum(), rtol=1e-6)
  np.testing.assert_allclose(result['cls_attention_outliers'], from_cls[outlier].mean(),
                             rtol=1e-6)
  # The paper's absolute rule: no token of a fresh tiny model reaches a norm of 150.
  paper = TOOLS['artifact_tokens'].run_one(subject, batches, str(tmp_path))
  assert paper['threshold'][-1] == 150. and paper['share'][-1] == 0.
  assert paper['first_outlier_layer'] is None
  assert paper['neighbour_similarity_outliers'] is None


def test_massive_activations_are_the_authors_statistics(tmp_path):
  """locuslab/massive-activations, main_vit.py `exp2`, written out in numpy: per image
  (their batch of one) and stream entry, the flattened |activations| sorted
  descending, the first 3, and torch.median (the lower middle value of an even
  count); then the mean over images, `np.mean(stats, axis=0)`."""
  subject = subject_of(tiny_family_config('vit', num_registers=2), 'vit')
  layers = subject.layers
  result = TOOLS['artifact_tokens'].run_one(subject, batches, str(tmp_path))
  json.dumps(result)
  sown = [subject.intermediates(x, list(layers.stream)) for x, _ in batches('eval')]
  stats = []
  for image in range(sum(len(x) for x, _ in batches('eval'))):
    per_layer = np.zeros((4, len(layers.stream)))
    for k, name in enumerate(layers.stream):
      feat = np.concatenate([np.asarray(s[name], np.float64) for s in sown])[image]
      feat_abs = np.abs(feat).flatten()
      ordered = np.sort(feat_abs)[::-1]
      per_layer[:3, k] = ordered[:3]
      per_layer[3, k] = np.sort(feat_abs)[(feat_abs.size - 1) // 2]  # torch.median
    stats.append(per_layer)
  mean = np.mean(stats, axis=0)
  np.testing.assert_allclose(np.array(result['massive_top3']).T, mean[:3], rtol=1e-9)
  np.testing.assert_allclose(result['massive_median'], mean[3], rtol=1e-9)
  np.testing.assert_allclose(result['massive_ratio'], mean[0] / mean[3], rtol=1e-9)
  peak = int(np.argmax(mean[0] / mean[3]))
  assert result['massive_peak_layer'] == layers.labels[peak]
  # The most common place of each image's largest activation at that entry.
  feats = np.concatenate([np.asarray(s[layers.stream[peak]], np.float64) for s in sown])
  places = [divmod(int(np.argmax(np.abs(f))), f.shape[-1]) for f in feats]
  common = max(set(places), key=places.count)
  assert places.count(tuple(result['massive_peak_position'])) == places.count(common)
  assert result['massive_peak_position_share'] == pytest.approx(places.count(common) / len(places))


def test_neighbour_similarity_on_constructed_images():
  """A 2x2 grid of 2 px patches: a uniform image is alike everywhere (1); with the
  right column negated, each patch has one neighbour alike and one opposite (0)."""
  uniform = np.ones((1, 4, 4, 3), np.float32)
  np.testing.assert_allclose(neighbour_similarity(pixel_patches(uniform, 2)), 1.)
  flipped = uniform.copy()
  flipped[:, :, 2:] = -1.
  np.testing.assert_allclose(neighbour_similarity(pixel_patches(flipped, 2)), 0., atol=1e-12)
  # A 3x3 grid whose centre patch is negated: the centre is opposite to its 4
  # neighbours (-1); an edge patch has 1 of its 3 neighbours opposite (1/3); a
  # corner has none (1).
  centre = np.ones((1, 3, 3, 1))
  centre[:, 1, 1] = -1.
  np.testing.assert_allclose(neighbour_similarity(pixel_patches(centre, 3)).reshape(3, 3),
                             [[1, 1 / 3, 1], [1 / 3, -1, 1 / 3], [1, 1 / 3, 1]], atol=1e-12)


def _cosine_to_neighbours(vectors):
  """Darcet et al.'s Sec. 2.1 measure written out patch by patch: the mean cosine
  similarity of a patch's vector with each of its (up to 4) grid neighbours."""
  b, rows, cols, _ = vectors.shape
  out = np.zeros((b, rows, cols))
  for i in range(rows):
    for j in range(cols):
      near = [(i + di, j + dj) for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1))
              if 0 <= i + di < rows and 0 <= j + dj < cols]
      for n in range(b):
        a = vectors[n, i, j]
        out[n, i, j] = np.mean([a @ vectors[n, k, l] / np.linalg.norm(a) /
                                np.linalg.norm(vectors[n, k, l]) for k, l in near])
  return out.reshape(b, -1)


def test_the_neighbour_similarity_compares_patch_embeddings_as_the_paper_does(tmp_path):
  """By default the similarity is of the patch embeddings right after the patch
  embedding layer (Darcet et al. Sec. 2.1), computed here from the parameters alone:
  each patch's pixels times the embedding kernel, plus its bias; pixels are the
  named departure. On a uniform image the two differ: every pixel patch is alike
  (1) while the embeddings, with their bias, need not be."""
  subject = subject_of(tiny_family_config('vit'), 'vit')
  params, p = subject.params, subject.config.patch_size
  kernel = np.asarray(params['embedding']['kernel'], np.float64)
  bias = np.asarray(params['embedding']['bias'], np.float64)
  images = np.concatenate([x for x, _ in batches('eval')]).astype(np.float64)
  side = images.shape[1] // p
  embedded = pixel_patches(images, side) @ kernel.reshape(-1, kernel.shape[-1]) + bias
  expected = _cosine_to_neighbours(embedded)
  for rule, factor in (('relative', 1.05),):
    result = TOOLS['artifact_tokens'].run_one(subject, batches, str(tmp_path), Options(
        artifact_rule=rule, artifact_factor=factor))
    assert result['similarity'] == 'embedding'
    # Which tokens are outliers the model's norms decide; over all patches the
    # means weighted by the outlier counts give the mean of every patch.
    outlier_share = result['share'][-1]
    overall = (outlier_share * result['neighbour_similarity_outliers'] +
               (1 - outlier_share) * result['neighbour_similarity_others'])
    np.testing.assert_allclose(overall, expected.mean(), rtol=1e-5)
  pixels = TOOLS['artifact_tokens'].run_one(subject, batches, str(tmp_path), Options(
      artifact_rule='relative', artifact_factor=1.05, artifact_similarity='pixels'))
  assert pixels['similarity'] == 'pixels'
  overall = (pixels['share'][-1] * pixels['neighbour_similarity_outliers'] +
             (1 - pixels['share'][-1]) * pixels['neighbour_similarity_others'])
  np.testing.assert_allclose(overall, _cosine_to_neighbours(pixel_patches(images, side)).mean(),
                             rtol=1e-9)


def test_artifact_tokens_refuse_a_model_without_attention(subjects, tmp_path):
  resnet = next(s for s in subjects.values() if not s.layers.attention_weights)
  assert not TOOLS['artifact_tokens'].applies_to(resnet)
  with pytest.raises(ValueError, match='artifact tokens need a ViT'):
    TOOLS['artifact_tokens'].run_one(resnet, batches, str(tmp_path))


def test_the_registers_verdict_pairs_a_model_without_registers_with_one_with_them():
  from analysis.reporting import verdict
  from analysis.tools.artifact_tokens import verdicts
  entry = lambda registers, share, stderr: {'registers': registers, 'share': [0.5, share],
                                            'share_stderr': [0.1, stderr], 'figures': []}
  judged, = verdicts({'plain': entry(0, 0.03, 0.005), 'reg4': entry(4, 0.001, 0.001)}, {})
  assert judged.verdict == verdict.AGREES and 'plain' in judged.measured
  judged, = verdicts({'plain': entry(0, 0.001, 0.001), 'reg4': entry(4, 0.03, 0.005)}, {})
  assert judged.verdict == verdict.DIFFERS
  judged, = verdicts({'plain': entry(0, 0.03, 0.005)}, {})
  assert judged.verdict == verdict.NOT_COMPARABLE
  judged, = verdicts({'plain': entry(0, 0., 0.), 'reg4': entry(4, 0., 0.)}, {})
  assert judged.verdict == verdict.NOT_COMPARABLE and 'nothing to remove' in judged.why
