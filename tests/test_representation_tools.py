"""The representation tools end to end on tiny models of each family."""
import dataclasses
import json
import os
import subprocess
import sys

import chex
import flax
import jax
import numpy as np
import pytest

from analysis.measures import embeddings, similarity
from analysis.runtime import features
from analysis.tool import run_on
from analysis.tools import TOOLS, hessian, nll, robustness
from helpers import TINY_VIT, batches, init, make_folder, perturbed, subject
from vit_jax import checkpoint, models
from xla_flags import optimised

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cka_within_and_across_models(subjects, tmp_path):
  chosen = [subjects[k] for k in ('vit', 'bit', 'alternet')]
  result = run_on(TOOLS['cka'], chosen, lambda s: batches, str(tmp_path))
  json.dumps(result)
  vit, across = np.array(result['cka']['vit']), np.array(result['cka']['vit vs bit'])
  assert vit.shape == (5, 5) and across.shape == (5, 3)  # embedding + 2 x 2 branches; root + 2
  np.testing.assert_allclose(np.diag(vit), 1., rtol=1e-6)
  assert result['num_examples'] == 36
  assert all(os.path.exists(f) for f in result['figures'])


def test_cka_across_every_family(subjects, tmp_path):
  chosen = [subjects[name] for name in models.families(models.CLASSIFY)]
  result = TOOLS['cka'].run(chosen, batches)
  for s in chosen:
    block = np.array(result['cka'][s.label])
    assert block.shape == (len(s.layers.stream),) * 2
    np.testing.assert_allclose(np.diag(block), 1., rtol=1e-6)
  assert np.array(result['cka']['mixer vs alternet']).shape == (5, 4)


def test_head_cka_against_another_model_and_a_twin(subjects, tmp_path):
  """Heads of the first and last block against the ResNet's layers; against the
  class-token ViT's own stream, its distances are those of attention_distance."""
  vit, bit = subjects['vit'], subjects['bit']
  result = run_on(TOOLS['head_cka'], [vit, bit], lambda s: batches, str(tmp_path))
  json.dumps(result)
  r = result['pairs']['vit vs bit']
  assert r['blocks'] == ['block0', 'block1'] and r['lower_layers'] == 2
  assert np.array(r['cka']).shape == (2, 4, 3) and np.array(r['distance']).shape == (2, 4)
  assert np.all((np.array(r['cka']) > -0.2) & (np.array(r['cka']) <= 1 + 1e-6))
  np.testing.assert_allclose(r['cka_lower'], np.array(r['cka'])[:, :, :2].mean(-1), rtol=1e-6)
  distances = TOOLS['attention_distance'].run_one(vit, batches, str(tmp_path))
  np.testing.assert_allclose(r['distance'], distances['distance_per_layer_head'], rtol=1e-5)
  assert set(result['pairs']) == {'vit vs bit'} and len(result['figures']) == 1
  assert os.path.basename(result['figures'][0]) == 'head_cka_vit_bit.png'
  assert os.path.exists(result['figures'][0])
  # With a third model (the GAP twin, whose heads are compared too) the pairs of the
  # first run come out the same: each pair's CKA is its own.
  three = TOOLS['head_cka'].run([vit, subjects['vit_gap'], bit], batches)['pairs']
  assert set(three) == {'vit vs vit_gap', 'vit vs bit', 'vit_gap vs vit', 'vit_gap vs bit'}
  np.testing.assert_allclose(three['vit vs bit']['cka'], r['cka'], rtol=1e-5, atol=1e-6)


def test_nll_and_accuracy_follow_the_formula():
  """Softmax cross-entropy written out in numpy, for integer labels and for label
  distributions (mixup), and the accuracy against the most likely class."""
  from analysis.tools import nll
  rng = np.random.RandomState(0)
  logits = rng.randn(6, 4).astype(np.float32)
  log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  labels = np.array([0, 1, 2, 3, 0, 1])
  expected = [-log_softmax[np.arange(6), labels].mean(), np.mean(logits.argmax(-1) == labels)]
  np.testing.assert_allclose(nll.nll_and_accuracy(logits, labels), expected, rtol=1e-5)
  mixed = 0.7 * np.eye(4)[labels] + 0.3 * np.eye(4)[(labels + 1) % 4]
  expected = [-(mixed * log_softmax).sum(-1).mean(), np.mean(logits.argmax(-1) == labels)]
  np.testing.assert_allclose(nll.nll_and_accuracy(logits, mixed), expected, rtol=1e-5)


def test_nll_tool_and_its_joint_figure(subjects, tmp_path):
  def endless(split):  # the training pipeline repeats: the tool takes what it needs
    while split == features.TRAIN_AUGMENTED:
      yield from batches(split)
    yield from batches(split)
  results = {s.label: TOOLS['nll'].run_one(s, endless, str(tmp_path)) for s in (subjects[k] for k in ('vit', 'vit_gap', 'bit'))}
  json.dumps(results)
  for r in results.values():
    assert r['train_nll'] > 0 and 0 <= r['test_error'] <= 1
    assert r['num_test'] == 36 and r['num_train'] == 36
    assert r['test_error_stderr'] == pytest.approx(
        np.sqrt(r['test_error'] * (1 - r['test_error']) / 36))
  figure, = TOOLS['nll'].joint(results, {}, str(tmp_path))
  assert os.path.exists(figure)


def timm_mixup_targets(labels, flipped, lam, num_classes, smoothing):
  """timm's `mixup_target`: each one-hot label smoothed (off = smoothing / C, on =
  1 - smoothing + off), then mixed lam : 1 - lam."""
  off = smoothing / num_classes
  on = 1. - smoothing + off
  one_hot = lambda y: np.where(np.eye(num_classes)[y] > 0, on, off)
  return lam * one_hot(labels) + (1. - lam) * one_hot(flipped)


@pytest.mark.numerics
def test_the_training_nll_is_the_loss_the_authors_log(subjects, tmp_path):
  """Park & Kim's train/nll: SoftTargetCrossEntropy (sum of -target * log_softmax,
  mean over the batch) on timm's smoothed Mixup targets, in train mode. The test's
  training batches mix each label 0.8 : 0.2 with the next class, as Mixup with
  lam = 0.8 does; this ViT has no dropout, so train mode gives the evaluation
  logits; a ViT with dropout must differ from them."""
  s = subjects['vit']
  result = TOOLS['nll'].run_one(s, batches, str(tmp_path))
  assert result['train_nll_kind'] == 'training' and result['train_loss']['mode'] == 'train'
  losses, sizes = [], []
  for images, _ in batches(features.TRAIN_AUGMENTED):
    labels = np.arange(12) % 3
    targets = timm_mixup_targets(labels, (labels + 1) % 3, 0.8, 3, s.recipe.label_smoothing)
    logits = np.asarray(s.logits(images), np.float64)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    losses.append(np.mean(np.sum(-targets * log_softmax, axis=-1)))
    sizes.append(len(images))
  assert result['train_nll'] == pytest.approx(np.average(losses, weights=sizes), rel=1e-5)
  plain = TOOLS['nll'].run_one(s, batches, str(tmp_path), nll.Options(nll_train='plain'))
  assert plain['train_nll'] < result['train_nll']  # smoothing penalises confident fits
  assert plain['test_nll'] == result['test_nll']
  noisy = subject('ViT-Ti_16', 'vit', **{**TINY_VIT, 'dropout_rate': 0.5})
  noisy = features.Subject(noisy.label, noisy.config, s.params, 32, s.recipe)
  assert TOOLS['nll'].run_one(noisy, batches, str(tmp_path))['train_nll'] != pytest.approx(
      result['train_nll'], rel=1e-3)
  no_recipe = features.Subject('bare', s.config, s.params, 32)
  with pytest.raises(ValueError, match='needs the recipe'):
    TOOLS['nll'].run_one(no_recipe, batches, str(tmp_path))


def test_a_head_compared_with_itself_has_cka_one():
  """The CKA of every head's output with itself, in the tool's accumulator."""
  from analysis.measures import similarity
  rng = np.random.RandomState(0)
  stream = similarity.MinibatchCKA('linear', unbiased=True)
  for _ in range(3):
    heads = rng.randn(12, 16, 4, 8)  # (B, tokens, heads, D/heads)
    stream.update([heads[:, :, h] for h in range(4)] * 2)
  np.testing.assert_allclose(np.diag(stream.result()[:4, 4:]), 1., rtol=1e-6)


def test_attention_tools_refuse_models_without_global_attention(subjects, family_name, tmp_path):
  s = subjects[family_name]
  if s.layers.attention_weights:
    assert TOOLS['attention_distance'].applies_to(s)
    return
  assert not TOOLS['attention_distance'].applies_to(s)
  with pytest.raises(ValueError, match='sows no global attention'):
    TOOLS['attention_distance'].run_one(s, batches, str(tmp_path))


@pytest.mark.parametrize('tool', ['attention_distance', 'vit_figures'])
@pytest.mark.parametrize('label', ['vit', 'vit_gap'])
def test_vit_tools(subjects, tool, label, tmp_path):
  result = TOOLS[tool].run_one(subjects[label], batches, str(tmp_path))
  json.dumps(result)
  assert result['figures'] and all(os.path.exists(f) for f in result['figures'])
  if tool == 'attention_distance':
    distances = np.array(result['distance_per_layer_head'])
    assert distances.shape == (2, 4)
    # Between 0 and the diagonal of the 32 px image.
    assert np.all(distances > 0) and np.all(distances < 32 * np.sqrt(2))
    if subjects[label].has_cls:  # the class-token key kept: its weight counts as 0 px
      kept = np.array(result['distance_with_class_key_per_layer_head'])
      assert np.all(kept < distances + 1e-6)
    else:
      assert 'distance_with_class_key_per_layer_head' not in result


def test_a_table_resized_to_each_grid_is_drawn_at_its_own(tmp_path):
  """A SigLIP 2 tower's table (`posemb_grid`, 2 x 2 here) at 4 x 4 patches: the
  position-similarity panel is the table's, and the attention distances are the
  images' grid's."""
  s = subject('ViT-Ti_16', 'siglip2', **{**TINY_VIT, 'classifier': 'map',
                                         'posemb_grid': (2, 2)})
  figures = TOOLS['vit_figures'].run_one(s, batches, str(tmp_path))
  assert np.array(figures['position_similarity']).shape == (2, 2, 2, 2)
  distances = TOOLS['attention_distance'].run_one(s, batches, str(tmp_path))
  assert np.array(distances['distance_per_layer_head']).shape == (2, 4)


def test_vit_figures_says_how_much_of_the_filters_gray_images_reach(subjects, tmp_path):
  s = subjects['vit']
  assert 'gray_reached_share' not in TOOLS['vit_figures'].run_one(s, batches, str(tmp_path))

  def gray(split):
    for images, labels in batches(split):
      yield np.repeat(images.mean(-1, keepdims=True), 3, -1), labels

  result = TOOLS['vit_figures'].run_one(s, gray, str(tmp_path))
  # A gray image g meets a filter w as g * sum_c w_c: the nearest filter that is the same in
  # every channel is sum_c w_c / C, of squared norm sum (sum_c w_c)^2 / C.
  kernel = np.asarray(s.parameter(s.layers.embedding), np.float64)
  reached = np.sum(kernel.sum(2) ** 2) / kernel.shape[2]
  assert result['gray_reached_share'] == pytest.approx(reached / np.sum(kernel ** 2), rel=1e-6)

  def quote(label, *path):
    value = result
    for key in path:
      value = value[key]
    return f'{value:.2f}'

  caption = TOOLS['vit_figures'].findings({s.label: result}, quote)[f'{s.label} filters']
  assert 'gray' in ''.join(caption) and f'{result["gray_reached_share"]:.2f}' in caption


class RegistersHidden(features.Subject):
  """A ViT with registers seen as one without: its token sequences lack the
  registers, and its attention maps lack their rows and columns, each query's
  weights renormalised over the keys left."""

  def __init__(self, with_registers: features.Subject):
    super().__init__('hidden', with_registers.config, with_registers.params, 32,
                     with_registers.recipe)
    self.start, self.stop = int(with_registers.has_cls), int(with_registers.has_cls) + 2

  @property
  def layers(self):
    return dataclasses.replace(super().layers, registers=0)

  def intermediates(self, images, names):
    keep = lambda n: np.r_[0:self.start, self.stop:n]
    out = {}
    for name, x in super().intermediates(images, names).items():
      x = np.asarray(x)
      if name in self.layers.attention_weights:
        x = x[:, :, keep(x.shape[2])][..., keep(x.shape[3])]
        x = x / x.sum(-1, keepdims=True)
      elif x.ndim >= 3:
        x = x[:, keep(x.shape[1])]
      out[name] = jax.numpy.asarray(x)
    return out


@pytest.mark.parametrize('fields', [
    dict(classifier='token'), dict(classifier='gap'),
    # DINOv3's: rotary position embeddings, no position table, no key bias, LayerScale.
    dict(classifier='token', posemb='none', rope='dinov3', attention_bias='qv',
         layer_scale_init=1e-5),
    # EVA-02's: rotary embeddings beside the table, the MLP's LayerNorm, the class token
    # that the head does not pool, and the LayerNorm after the patches' mean.
    dict(classifier='token_gap', pooled_norm=True, rope='eva02', rope_theta=10000.,
         rope_grid=(16, 16), attention_bias='qv', activation='swiglu', mlp_norm=True),
    # Perception Encoder's: offset rotary coordinates, attention pooling of the class
    # token and the patches with heads and a width of its own.
    dict(classifier='token_map', rope='pe', rope_theta=10000., rope_offset=1.,
         rope_grid=(24, 24), pre_norm=True, map_heads=2, map_mlp_dim=48),
    # AIMv2's: RMSNorms (the patch embeddings' too), no biases, its attention pooling.
    dict(normalization='rms', patch_norm=True, attention_bias='none', projection_bias=False,
         activation='swiglu', classifier='attention_pool')],
    ids=['token', 'gap', 'dinov3', 'eva02', 'pe', 'aimv2'])
def test_registers_never_reach_a_spatial_analysis(fields, tmp_path):
  """Each tool that reads patch tokens gives a ViT with 2 registers the result it
  gives when the registers are cut out of what the model sows: attention distances
  (spatial keys renormalised), localisation maps, per-token probes, Fourier maps
  and the spatial tokens' norm ratios; a DINOv3, an EVA-02 and a Perception
  Encoder with their rotary embeddings too, and an AIMv2 with its RMSNorms."""
  from helpers import subject_of, tiny_family_config
  with_registers = subject_of(tiny_family_config('vit', num_registers=2, **fields), 'registers')
  assert with_registers.registers == 2 and with_registers.token_grid()[0] == (4, 4)
  hidden = RegistersHidden(with_registers)
  one_batch = lambda split: iter([next(batches(split))])
  for tool, keys in [('attention_distance', ['distance_per_layer_head']),
                     ('localisation', ['maps']), ('fourier', ['curves', 'high_frequency']),
                     ('norm_ratio', ['ratios'])]:
    ours, theirs = ({k: r[k] for k in keys} for r in (
        TOOLS[tool].run_one(s, one_batch, str(tmp_path)) for s in (with_registers, hidden)))
    chex.assert_trees_all_close(ours, theirs, rtol=1e-5, atol=1e-6)
  probes = [TOOLS['probes'].run(s, batches, shots=(1, 5))[
      'few_shot_per_token']['accuracy'] for s in (with_registers, hidden)]
  np.testing.assert_allclose(*probes, atol=1e-6)


@pytest.mark.parametrize('label', models.families(models.CLASSIFY) + ['vit_gap', 'hybrid'])
def test_localisation_on_every_family(subjects, label, tmp_path):
  """A ViT's, a hybrid's and a Mixer's tokens, a ResNet's and AlterNet's final
  positions: a CKA map per query over the patches of the same grid, as Raghu et
  al.'s formula written out in numpy gives it on one batch (the minibatch estimate
  of one batch is the unbiased linear CKA of that batch)."""
  s = (subject('R+ViT-Ti_16', 'hybrid', **{**TINY_VIT, 'patch_size': 2})
       if label == 'hybrid' else subjects[label])
  result = TOOLS['localisation'].run_one(s, batches, str(tmp_path))
  json.dumps(result)
  h, w = result['grid']
  assert np.array(result['maps']).shape == (5, h, w) and result['num_images'] == 36
  assert result['patch_pixels'] == [32 // h, 32 // w]
  assert np.isfinite(result['own_margin']) and result['own_margin_stderr'] > 0
  one_batch = lambda split: iter([next(batches(split))])
  single = TOOLS['localisation'].run_one(s, one_batch, str(tmp_path))
  images, _ = next(batches('eval'))
  last = s.layers.stream[-1]
  final = np.asarray(features.spatial_map(s, s.intermediates(images, [last])[last]),
                     np.float64).reshape(12, h * w, -1)
  patches = np.asarray(images, np.float64)[:, :h * (32 // h), :w * (32 // w)].reshape(
      12, h, 32 // h, w, 32 // w, 3).transpose(0, 1, 3, 2, 4, 5).reshape(12, h * w, -1)
  for q, (i, j) in enumerate(single['queries']):
    expected = [numpy_unbiased_linear_cka(final[:, i * w + j], patches[:, p])
                for p in range(h * w)]
    np.testing.assert_allclose(np.ravel(single['maps'][q]), expected, rtol=1e-3, atol=1e-4)


def numpy_unbiased_linear_cka(x, y):
  """CKA with HSIC1 (Song et al. 2012) written out: Gram matrices with zeroed
  diagonals, HSIC1 = [tr(K L) + 1'K1 1'L1 / ((n-1)(n-2)) - 2/(n-2) 1'K L1] / (n(n-3))."""
  def hsic(k, l):
    n = len(k)
    one = np.ones(n)
    return (np.trace(k @ l) + one @ k @ one * (one @ l @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * one @ k @ l @ one) / (n * (n - 3))

  def gram(a):
    g = a @ a.T
    np.fill_diagonal(g, 0.)
    return g
  k, l = gram(x), gram(y)
  return hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l))


class CopyingModel(features.Subject):
  """A model whose final map at each position is its input patch there (a 4 x 4
  grid of 8 px patches), as an ideally localising network would keep it."""

  @property
  def layers(self):
    return dataclasses.replace(super().layers, stream=('input', 'final'))

  def intermediates(self, images, names):
    grid = embeddings.image_patches(np.asarray(images), (4, 4)).reshape(len(images), 4, 4, -1)
    return {'final': jax.numpy.asarray(grid)}


def test_a_patch_without_cka_is_no_rival_in_the_localisation_margin():
  from analysis.tools.localisation import own_margin
  maps = np.array([[[0.9, np.nan], [0.2, 0.5]], [[0.1, 0.4], [np.nan, 0.3]]])
  assert own_margin(maps, np.array([0, 1])) == pytest.approx(((0.9 - 0.5) + (0.4 - 0.3)) / 2)
  assert np.isnan(own_margin(maps, np.array([1, 0])))


def test_localisation_finds_positions_a_model_keeps(subjects, tmp_path):
  copying = CopyingModel('copying', subjects['bit'].config, subjects['bit'].params, 32)
  result = TOOLS['localisation'].run_one(copying, batches, str(tmp_path))
  assert result['grid'] == [4, 4] and result['peak_at_query'] == [1.] * 5
  for (i, j), m in zip(result['queries'], result['maps']):
    assert m[i][j] == pytest.approx(1., abs=1e-5)  # the patch itself
  assert result['own_margin'] > 0.5


def test_norm_ratio_erf_probes(subjects, family_name, tmp_path):
  s = subjects[family_name]
  ratios = TOOLS['norm_ratio'].run_one(s, batches, str(tmp_path))['ratios']
  assert list(ratios) == [b.label for b in s.layers.branches]
  counted = {'vit': 4, 'mixer': 4, 'bit': 2, 'alternet': 3}  # by hand, for these families
  assert len(ratios) == counted.get(s.label, len(s.layers.branches))
  assert all(v > 0 for row in ratios.values() for v in row.values())
  assert all(('cls' in row) == s.has_cls for row in ratios.values())
  fields = TOOLS['erf'].run(s, batches, num_images=4)
  assert len(fields['fields']) == len(s.layers.stream)
  # A patch model's embedding sees one 8x8 patch; later layers see at least as much.
  if s.config.get('patch_size') == 8:
    assert fields['half_mass_pixels'][0] <= 64 <= fields['half_mass_pixels'][-1]
  result = TOOLS['probes'].run(s, batches, shots=(1, 5, 20))
  result['figures'] = TOOLS['probes'].draw(result, s, str(tmp_path))
  json.dumps(result)
  assert set(result['few_shot_pre_logits']) == {1, 5} and result['shots_left_out'] == [20]
  # 12 images per class: a 10-shot probe on each final-layer token, drawn as a grid.
  token = result['few_shot_per_token']
  grid = np.asarray(token['accuracy'])
  assert grid.ndim == 2 and grid.size > 1 and np.all((0 <= grid) & (grid <= 1))
  assert token['layer'] == s.layers.labels[-1] and len(result['figures']) == 2
  assert set(token['pooled']) == {'token mean'} | ({'class token'} if s.has_cls else set())
  for rows in result['probes'].values():
    assert all(0 <= r['accuracy'] <= 1 for r in rows)


@pytest.mark.slow
def test_landscape_tools(subjects, family_name, tmp_path):
  s = subjects[family_name]
  # Few Lanczos steps (their accuracy is tested in test_hessian_lanczos.py) and one
  # minibatch, so that the top-k and the density share one compiled product (several
  # minibatches: test_paper_scale_command_on_a_generated_checkpoint).
  result = TOOLS['hessian'].run_one(s, batches, str(tmp_path), hessian.Options(
      hessian_batches=1, hessian_top_k=3, lanczos_steps=4, density_steps=5, density_probes=1,
      trace_probes=3, block_steps=2))
  json.dumps(result)
  assert np.array(result['top_per_minibatch']).shape == (1, 3)
  # The blocks' traces add up to the whole trace, probe by probe.
  assert sum(result['block_traces'].values()) == pytest.approx(result['trace'], rel=1e-5)
  assert result['trace_stderr'] > 0 and len(result['figures']) == 3
  assert set(result['block_top_eigenvalue']) == set(result['block_traces'])
  # The L2 term (weight_decay / lr on every parameter, as the authors' AdamW decays
  # them all) holds l2 per parameter.
  assert result['trace_l2'] == pytest.approx(1e-3 * result['num_parameters'])
  assert result['objective']['l2_on'] == 'all' and result['density_width'] == 'pyhessian'
  np.testing.assert_allclose(np.sum(result['slq_weights'], axis=1), 1., rtol=1e-6)
  assert 0 <= result['negative_fraction'] <= 1
  assert result['objective']['l2'] == pytest.approx(1e-3)  # weight_decay / lr
  assert result['objective']['label_smoothing'] == 0.1
  result = TOOLS['fourier'].run_one(s, batches, str(tmp_path))
  json.dumps(result)
  curves = result['curves']
  assert len(curves) == len(result['layers'])
  # 4x4 tokens for the ViT and the Mixer; 8 px root and 8, 4 px stages for the ResNet;
  # AlterNet's 16 px stem and first stage, then 8 px.
  lengths = {'vit': [2] * 5, 'mixer': [2] * 5, 'bit': [4, 4, 2],
             'alternet': [8, 8, 4, 4]}[s.label]
  assert [len(c) for c in curves] == lengths
  assert all(c[0] == 0. and c[-1] == h for c, h in zip(curves, result['high_frequency']))
  assert np.all(np.array(result['variance']) > 0)
  assert result['attention_layers'] == {'vit': [1, 3], 'alternet': [3]}.get(s.label, [])
  result = TOOLS['robustness'].run_one(s, batches, str(tmp_path), robustness.Options(
      noise_epsilons=(0.1, 1.), noise_frequencies=(0., 1.5), noise_band_width=0.1))
  json.dumps(result)
  assert np.array(result['accuracy']).shape == (2, 2)
  # f = 0 of half-width 0.1 passes no noise at 32 px (a 0x0 square): no measurement.
  assert result['band_pixels'][0] == 0 and result['band_pixels'][1] > 0
  assert [row[0] for row in result['accuracy']] == [None, None]
  assert [row[0] for row in result['accuracy_stderr']] == [None, None]
  # Binomial standard errors, written out: sqrt(p (1 - p) / n) over the 36 images.
  n = result['num_images']
  assert n == 36
  for p, e in zip([row[1] for row in result['accuracy']],
                  [row[1] for row in result['accuracy_stderr']]):
    np.testing.assert_allclose(e, np.sqrt(p * (1 - p) / n), rtol=1e-12)
  p = result['clean_accuracy']
  np.testing.assert_allclose(result['clean_stderr'], np.sqrt(p * (1 - p) / n), rtol=1e-12)
  assert all(os.path.exists(f) for f in result['figures'])


def test_hessian_objectives_differ_and_are_named(subjects, tmp_path):
  s = subjects['vit']
  small = hessian.Options(hessian_batches=1, hessian_top_k=2, lanczos_steps=6, density_steps=6,
                          density_probes=1, trace_probes=2, block_steps=2)
  training = TOOLS['hessian'].run_one(s, batches, str(tmp_path), small)
  clean = TOOLS['hessian'].run_one(s, batches, str(tmp_path),
                               dataclasses.replace(small, hessian_objective='clean'))
  assert clean['objective']['l2'] == 0 and 'evaluation' in clean['objective']['data']
  assert 'augmentation' in training['objective']['data']
  assert not np.allclose(training['top_per_minibatch'], clean['top_per_minibatch'])
  # This project's decay mask: the L2 term on the kernels alone.
  kernels = TOOLS['hessian'].run_one(s, batches, str(tmp_path),
                                 dataclasses.replace(small, hessian_l2_on='kernels'))
  count = sum(np.size(v) for k, v in flax.traverse_util.flatten_dict(s.params).items()
              if k[-1] == 'kernel')
  assert kernels['objective']['l2_on'] == 'kernels'
  assert kernels['trace_l2'] == pytest.approx(1e-3 * count)
  no_recipe = features.Subject('bare', s.config, s.params, 32)
  with pytest.raises(ValueError, match='needs the recipe'):
    TOOLS['hessian'].run_one(no_recipe, batches, str(tmp_path), small)


def test_cka_features_sharded_over_devices_equal_one_device(subjects):
  s = subjects['vit']
  names = list(s.layers.stream)
  images = np.random.RandomState(4).uniform(-1, 1, (16, 32, 32, 3)).astype(np.float32)
  sharded = features.layer_representations([s], [names], images)
  assert len(sharded[0].sharding.device_set) == 8
  single = jax.jit(lambda p, x: models.apply_with_intermediates(
      s.model, {'params': p}, x, names=names)[1])(s.params, jax.device_put(images,
                                                                          jax.devices()[0]))
  one = [single[n] for n in names]
  streams = []
  for reps in (sharded, one):
    stream = similarity.MinibatchCKA()
    stream.update(reps)
    streams.append(stream.result())
  # float32 Grams; the sharded program sums across devices in another order.
  np.testing.assert_allclose(streams[0], streams[1], rtol=1e-5, atol=1e-6)


def batches_of_16(split):
  """Two batches of 16, which 8 devices split evenly."""
  rng = np.random.RandomState(5)
  for _ in range(2):
    labels = np.arange(16) % 3
    if split == features.TRAIN_AUGMENTED:
      labels = np.eye(3)[labels]
    yield rng.uniform(-1, 1, (16, 32, 32, 3)).astype(np.float32), labels


def test_hessian_and_cka_on_split_parameters_equal_whole_ones(subjects, tmp_path):
  """`--sharding fsdp`: parameters split over the 8 devices (each holds about an
  eighth), batches and Lanczos vectors with them; the tools' results are those of
  whole parameters up to float32 summation order. (The Lanczos loop run from
  Python, as for ResNets on CPU, splits its vectors alike: test_hessian_lanczos.py.)"""
  whole = subjects['vit']
  split = features.split_parameters(whole)
  largest = max(jax.tree_util.tree_leaves(split.params), key=lambda leaf: leaf.size)
  assert len(largest.sharding.device_set) == 8 and not largest.sharding.is_fully_replicated
  small = hessian.Options(hessian_batches=1, hessian_top_k=2, lanczos_steps=4, density_steps=4,
                          density_probes=1, trace_probes=2, block_steps=2)
  for name in ('whole', 'split'):
    (tmp_path / name).mkdir()
  results = [TOOLS['hessian'].run_one(s, batches_of_16, str(tmp_path / name), small)
             for s, name in ((whole, 'whole'), (split, 'split'))]
  for key in ('top_per_minibatch', 'trace', 'slq_nodes'):
    np.testing.assert_allclose(results[1][key], results[0][key], rtol=2e-3, atol=1e-4)
  other = subjects['mixer']  # a model whose parameters stay whole
  ckas = [TOOLS['cka'].run([s, other], batches_of_16)
          for s, name in ((whole, 'whole'), (split, 'split'))]
  assert set(ckas[1]['cka']) == set(ckas[0]['cka']) == {
      whole.label, other.label, f'{whole.label} vs {other.label}'}
  for key, matrix in ckas[0]['cka'].items():
    np.testing.assert_allclose(ckas[1]['cka'][key], matrix, rtol=1e-4, atol=1e-5)


def test_the_analysis_command_splits_parameters_when_asked(tmp_path):
  """`--sharding fsdp` through the command, on two CPU devices (more simulated
  devices than cores only slow the collectives down)."""
  folder = make_folder(str(tmp_path / 'images'), {'train': [4, 4], 'test': [4, 4]}, (40, 40))
  flags = ' '.join(f for f in os.environ.get('XLA_FLAGS', '').split()
                   if 'device_count' not in f)
  out = tmp_path / 'out'
  subprocess.run(
      [sys.executable, '-m', 'analysis', 'cka', '--config', 'configs/vit_b16.py:imagenet2012',
       '--config.model_name=ViT-Ti_16', '--config.image_size=32', '--config.model.dtype=float32',
       '--config.train_split=train', '--config.eval_split=test',
       '--checkpoint', published_layout(tmp_path, 'ViT-Ti_16'), '--dataset', folder,
       '--num_images', '8', '--batch_size', '4', '--sharding', 'fsdp', '--out', str(out)],
      check=True, cwd=ROOT, env=dict(os.environ, XLA_FLAGS=flags, JAX_NUM_CPU_DEVICES='2'))
  result = json.loads((out / 'cka.json').read_text())
  np.testing.assert_allclose(np.diag(result['cka']['vit_b16']), 1., rtol=1e-4)


def published_layout(tmp_path, name, num_classes=2):
  """A generated checkpoint of a published model, in the published layout."""
  path = str(tmp_path / f'{name}.npz')
  params = perturbed(init(models.get_model(name, num_classes), 32), scale=0.02)['params']
  checkpoint.save(path, params)
  return path


@pytest.mark.slow
@pytest.mark.e2e
def test_paper_scale_command_on_a_generated_checkpoint(tmp_path, warm_python):
  """The README's Park & Kim command (a published-layout ViT-Ti/16 with the ImageNet
  fine-tuning recipe), on a generated checkpoint and image folder at 32 px."""
  folder = make_folder(str(tmp_path / 'images'), {'train': [6, 6], 'test': [6, 6]}, (40, 40))
  path = published_layout(tmp_path, 'ViT-Ti_16')
  out = tmp_path / 'out'
  subprocess.run(
      [warm_python, '-m', 'analysis', 'hessian', '--config', 'configs/vit_b16.py:imagenet2012',
       '--config.model_name=ViT-Ti_16', '--config.image_size=32', '--config.model.dtype=float32',
       '--config.train_split=train', '--config.eval_split=test', '--checkpoint', path,
       '--dataset', folder, '--num_images', '8', '--batch_size', '4', '--hessian_batches', '2',
       '--lanczos_steps', '3', '--out', str(out)], check=True, cwd=ROOT,
      env=dict(os.environ, XLA_FLAGS=optimised()))
  result = json.loads((out / 'hessian.json').read_text())['vit_b16']
  assert np.array(result['top_per_minibatch']).shape == (2, 3)  # 3 steps: 3 Ritz values
  assert result['objective']['name'] == 'training'
  assert json.loads((out / 'timings.json').read_text())['hessian'] > 0


@pytest.mark.slow
@pytest.mark.e2e
def test_paper_scale_forward_commands_on_generated_checkpoints(tmp_path, warm_python):
  """The README's CKA and attention-distance commands (published ViT, hybrid and
  BiT layouts with their ImageNet recipes) on generated checkpoints, with the
  smallest published model of each kind, at 32 px."""
  folder = make_folder(str(tmp_path / 'images'), {'train': [4, 4], 'test': [4, 4]}, (40, 40))
  vit = ['--config', 'configs/vit_b16.py:imagenet2012', '--config.model_name=ViT-Ti_16',
         '--config.image_size=32', '--config.model.dtype=float32',
         '--config.train_split=train', '--config.eval_split=test',
         '--checkpoint', published_layout(tmp_path, 'ViT-Ti_16')]
  bit = ['--config2', 'configs/bit_r50x1.py:imagenet2012', '--config2.image_size=32',
         '--config2.model.dtype=float32', '--config2.train_split=train',
         '--config2.eval_split=test', '--checkpoint2', published_layout(tmp_path, 'BiT-M-R50x1')]
  hybrid = ['--config2', 'configs/vit_b16.py:imagenet2012', '--config2.model_name=R+ViT-Ti_16',
            '--config2.image_size=32', '--config2.model.dtype=float32',
            '--config2.train_split=train', '--config2.eval_split=test',
            '--checkpoint2', published_layout(tmp_path, 'R+ViT-Ti_16')]
  data = ['--dataset', folder, '--num_images', '8', '--batch_size', '4']
  # The Fourier command differs from the CKA one by its tool name alone; its runner is
  # tested on every family in test_landscape_tools.
  for tool, second in (('cka', bit), ('attention_distance', hybrid)):
    out = tmp_path / tool
    subprocess.run([warm_python, '-m', 'analysis', tool] + vit + second + data +
                   ['--out', str(out)], check=True, cwd=ROOT)
    result = json.loads((out / f'{tool}.json').read_text())
    assert json.loads((out / 'timings.json').read_text())[tool] > 0
    if tool == 'cka':
      assert np.array(result['cka']['vit_b16 vs bit_r50x1']).shape == (25, 17)
    else:
      assert {k: np.array(v['distance_per_layer_head']).shape for k, v in result.items()} == {
          'vit_b16': (12, 3), 'vit_b16_2': (12, 3)}


def test_a_headless_model_from_a_timm_file_runs_the_representation_tools(tmp_path):
  """DINOv2 with registers from a .safetensors state dict at a small width: read
  by name, its registers and missing head known; the tools that read logits are
  refused before any runs, naming the others; attention distances run."""
  from safetensors.numpy import save_file
  from analysis.cli import command
  from vit_jax.files import timm_files
  small = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2)
  config = models.get_config('DINOv2-S_14-reg4', num_classes=0, **small)
  params = perturbed(init(models.build_model(config), 28))['params']
  save_file(timm_files.to_timm(params, 'DINOv2-S_14-reg4'), str(tmp_path / 'dinov2.safetensors'))
  s = features.load_subject('DINOv2-S_14-reg4', str(tmp_path / 'dinov2.safetensors'), 28,
                            overrides=small)
  assert s.registers == 4 and s.config.num_classes == 0 and s.token_grid()[0] == (2, 2)
  chex.assert_trees_all_close(jax.device_get(s.params), jax.device_get(params))
  with pytest.raises(command.ConfigError, match=r'DINOv2-S_14-reg4 has no classifier head, and '
                     r'nll read its logits: run the tools that read representations \(.*cka'):
    command.check_heads([s], ['attention_distance', 'nll'])
  command.check_heads([s], ['attention_distance', 'cka', 'sae'])
  small_batches = lambda split: iter(
      [(images[:, :28, :28], labels) for images, labels in batches(split)])
  result = TOOLS['attention_distance'].run_one(s, small_batches, str(tmp_path))
  assert np.array(result['distance_per_layer_head']).shape == (2, 4)
  # An SAE without a head: its quality and top images, no loss and no logit effects.
  from analysis.tools import sae
  result = TOOLS['sae'].run_one(s, small_batches, str(tmp_path), sae.Options(
      sae_steps=20, sae_expansion=2, sae_k=4, sae_features=1))
  assert result['loss'] == {} and result['loss_recovered'] is None and result['features'] == []
  assert 0 < result['fve'] <= 1 and any('sae_top_images' in f for f in result['figures'])
  assert 'no classifier head, so no loss is spliced' in ''.join(
      part for part in sae._findings('dinov2', result, lambda *keys: '') if isinstance(part, str))


def test_two_recipes_of_one_file_are_labelled_by_their_arguments(tmp_path, warm_python):
  """'configs/papers.py:vit' and ':vit-authors' are papers_vit and papers_vit-authors;
  one recipe twice stays <file> and <file>_2."""
  from configs import papers
  config = papers.get_config('vit')
  model = models.get_model(config.model_name, 10, **config.model)
  path = str(tmp_path / 'vit.npz')
  checkpoint.save(path, perturbed(init(model, 28), scale=0.02)['params'])
  for second, labels in (('vit-authors', ['papers_vit', 'papers_vit-authors']),
                         ('vit', ['papers', 'papers_2'])):
    out = tmp_path / second
    subprocess.run([warm_python, '-m', 'analysis', 'attention_distance',
                    '--config', 'configs/papers.py:vit', '--checkpoint', path,
                    '--config2', f'configs/papers.py:{second}', '--checkpoint2', path,
                    '--num_images', '8', '--batch_size', '8', '--out', str(out)],
                   check=True, cwd=ROOT)
    assert sorted(json.loads((out / 'attention_distance.json').read_text())) == labels
