"""Sparse autoencoders against numpy written from their authors' code, AuxK on a
constructed dead latent, the decoder constraint, and recovery of a known dictionary."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from analysis.measures import sparse_autoencoder as sae
from analysis.runtime import sae_files


def _relu(x):
  return np.maximum(x, 0.)


def _top(values, k):
  """Indices of the k largest of each row (torch.topk)."""
  return np.argsort(-values, axis=1, kind='stable')[:, :k]


def _openai_topk_loss(x, p, k, aux_k, dead, mse_scale, aux_coef):
  """openai/sparse_autoencoder, sparse_autoencoder/train.py: FastAutoencoder.forward
  (latents_pre_act = F.linear(x - pre_bias, encoder.weight, latent_bias); topk; relu;
  decode_sparse + pre_bias), auxk_mask_fn (dead mask multiplied in), and main()'s
  loss: mse_scale * mse(recons, x) + auxk_coef * normalized_mse(decode_sparse(auxk)
  , x - recons.detach() + pre_bias.detach()) (kernels.py: normalized_mse = mse(recon,
  xs) / mse(xs.mean(0), xs))."""
  n = len(x)
  pre = (x - p['b_dec']) @ p['W_enc'] + p['b_enc']

  def decode_sparse(values, k):
    inds = _top(values, k)
    vals = _relu(np.take_along_axis(values, inds, axis=1))
    out = np.zeros((n, p['W_dec'].shape[1]))
    for row in range(n):
      out[row] = vals[row] @ p['W_dec'][inds[row]]
    return out + p['b_dec']

  recons = decode_sparse(pre, k)
  aux = decode_sparse(pre * dead, aux_k)
  target = x - recons + p['b_dec']
  mse = lambda a, b: np.mean((a - b) ** 2)
  nmse = mse(aux, target) / mse(target.mean(0), target)
  return mse_scale * mse(recons, x) + aux_coef * np.nan_to_num(nmse), recons


def _bussmann_batch_topk_loss(x, p, k, aux_k, dead, aux_penalty):
  """bartbussmann/BatchTopK, sae.py: BatchTopKSAE.forward (acts = relu((x - b_dec) @
  W_enc); topk over acts.flatten() of top_k * batch; x_reconstruct = acts_topk @ W_dec
  + b_dec) and get_loss_dict / get_auxiliary_loss with l1_coeff 0 (its default)."""
  acts = _relu((x - p['b_dec']) @ p['W_enc'])
  flat = acts.reshape(-1)
  keep = np.argsort(-flat, kind='stable')[:k * len(x)]
  topk = np.zeros_like(flat)
  topk[keep] = flat[keep]
  recon = topk.reshape(acts.shape) @ p['W_dec'] + p['b_dec']
  l2 = np.mean((recon - x) ** 2)
  aux = 0.
  if dead.sum() > 0:
    residual = x - recon
    dead_acts = acts[:, dead]
    inds = _top(dead_acts, min(aux_k, int(dead.sum())))
    acts_aux = np.zeros_like(dead_acts)
    np.put_along_axis(acts_aux, inds, np.take_along_axis(dead_acts, inds, axis=1), axis=1)
    aux = aux_penalty * np.mean((acts_aux @ p['W_dec'][dead] - residual) ** 2)
  return l2 + aux, recon


def _saelens_standard_loss(x, p, l1):
  """SAELens, sae_lens/saes/standard_sae.py and sae_base.py: hidden_pre = (x - b_dec *
  apply_b_dec_to_input) @ W_enc + b_enc, relu; sae_out = feature_acts @ W_dec + b_dec;
  mse_loss = mse_loss(reduction='none').sum(-1).mean(); l1_loss = (l1_coefficient *
  (feature_acts * W_dec.norm(dim=1)).norm(p=1, dim=-1)).mean()."""
  acts = _relu((x - p['b_dec']) @ p['W_enc'] + p['b_enc'])
  out = acts @ p['W_dec'] + p['b_dec']
  mse = ((out - x) ** 2).sum(-1).mean()
  l1_loss = (l1 * np.abs(acts * np.linalg.norm(p['W_dec'], axis=1)).sum(-1)).mean()
  return mse + l1_loss, out


def _params(d=6, m=20, seed=0):
  rng = np.random.default_rng(seed)
  return {'W_enc': rng.normal(size=(d, m)) / np.sqrt(d), 'b_enc': rng.normal(size=m) * 0.1,
          'W_dec': rng.normal(size=(m, d)), 'b_dec': rng.normal(size=d) * 0.1}


@pytest.mark.numerics
@pytest.mark.parametrize('architecture', sae.ARCHITECTURES)
def test_forward_and_loss_are_the_authors(architecture):
  p = _params()
  x = np.random.default_rng(1).normal(size=(12, 6))
  dead = np.zeros(20, bool)
  dead[[2, 5, 7, 11, 13]] = True
  spec = sae.Spec(architecture=architecture, width=20, k=3, aux_k=4, aux_coef=0.5, l1=0.3)
  with jax.default_matmul_precision('highest'):
    value, _ = sae.loss(jax.tree_util.tree_map(jnp.asarray, p), jnp.asarray(x), spec,
                        jnp.asarray(dead), mse_scale=1.7)
    recon = sae.decode(p, sae.encode(p, jnp.asarray(x), spec)[0])
  if architecture == 'topk':
    expected, expected_recon = _openai_topk_loss(x, p, 3, 4, dead, 1.7, 0.5)
  elif architecture == 'batch_topk':
    expected, expected_recon = _bussmann_batch_topk_loss(x, p, 3, 4, dead, 0.5)
  else:
    expected, expected_recon = _saelens_standard_loss(x, p, 0.3)
  np.testing.assert_allclose(float(value), expected, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(recon), expected_recon, rtol=1e-5, atol=1e-5)


@pytest.mark.numerics
@pytest.mark.parametrize('architecture', ['topk', 'batch_topk'])
def test_auxk_reaches_a_dead_latent_only_through_the_aux_loss(architecture):
  """A latent whose encoder column never wins the top k: its encoder gets gradient
  only when it is counted dead, from the AuxK loss, and then the loss equals the
  authors' (above) and the main part is unchanged."""
  p = _params(m=8, seed=3)
  p['W_enc'][:, 0] = -5. * np.abs(p['W_enc'][:, 0]).mean()  # latent 0 loses everywhere
  x = np.abs(np.random.default_rng(4).normal(size=(10, 6)))
  spec = sae.Spec(architecture=architecture, width=8, k=2, aux_k=1, aux_coef=1.)
  params = jax.tree_util.tree_map(jnp.asarray, p)
  latents, _ = sae.encode(params, jnp.asarray(x), spec)
  assert not np.any(np.asarray(latents)[:, 0])
  alive, dead = np.zeros(8, bool), np.zeros(8, bool)
  dead[0] = True
  grad = lambda mask: jax.grad(lambda q: sae.loss(q, jnp.asarray(x), spec, mask)[0])(params)
  assert float(jnp.abs(grad(alive)['W_enc'][:, 0]).max()) == 0.
  if architecture == 'topk':  # the dead latent's pre-activation is negative: ReLU'd away
    params['b_enc'] = params['b_enc'].at[0].set(100.)
    latents, _ = sae.encode(params, jnp.asarray(x), spec)
    p['b_enc'] = np.asarray(params['b_enc'])
  else:  # relu((x - b_dec) W_enc) > 0 needs a positive column; top 2 of 10 x 8 avoid it
    params['W_enc'] = params['W_enc'].at[:, 0].set(1e-3)
    p['W_enc'] = np.asarray(params['W_enc'])
  assert float(jnp.abs(grad(dead)['W_enc'][:, 0]).max()) > 0.
  _, parts_alive = sae.loss(params, jnp.asarray(x), spec, jnp.asarray(alive))
  value, parts = sae.loss(params, jnp.asarray(x), spec, jnp.asarray(dead))
  assert float(parts['mse']) == float(parts_alive['mse']) and float(parts['aux']) > 0.
  reference = (_openai_topk_loss(x, p, 2, 1, dead, 1., 1.) if architecture == 'topk' else
               _bussmann_batch_topk_loss(x, p, 2, 1, dead, 1.))[0]
  np.testing.assert_allclose(float(value), reference, rtol=1e-5)


def test_the_decoder_constraint_keeps_rows_unit_and_gradients_across_them():
  p = jax.tree_util.tree_map(jnp.asarray, _params())
  g = jax.tree_util.tree_map(jnp.asarray, _params(seed=9))
  q, h = sae.unit_norm_decoder(p, g)
  np.testing.assert_allclose(np.linalg.norm(q['W_dec'], axis=1), 1., rtol=1e-6)
  np.testing.assert_allclose(np.sum(np.asarray(q['W_dec']) * np.asarray(h['W_dec']), axis=1),
                             0., atol=1e-5)
  # the rest untouched; the direction of each row kept
  np.testing.assert_array_equal(h['W_enc'], g['W_enc'])
  cos = np.sum(np.asarray(q['W_dec']) * np.asarray(p['W_dec']), 1) / np.linalg.norm(
      p['W_dec'], axis=1)
  np.testing.assert_allclose(cos, 1., rtol=1e-6)


def test_dead_latents_are_counted_as_the_authors_count_them():
  spec = sae.Spec(width=3, dead_steps=2)
  since = jnp.array([0, 2, 5])
  latents = jnp.array([[0., 0.5, 0.0005], [0., 0., 0.]])
  counted, dead = sae.steps_since_fired(latents, since, spec)  # OpenAI: fired -> 1
  assert counted.tolist() == [1, 1, 6] and dead.tolist() == [False, False, True]
  batch = sae.Spec(architecture='batch_topk', width=3, dead_steps=2)
  counted, dead = sae.steps_since_fired(latents, since, batch)  # Bussmann: positive -> 0
  assert counted.tolist() == [1, 0, 0] and dead.tolist() == [False, False, False]


@pytest.mark.slow
@pytest.mark.parametrize('architecture, cosine', [('topk', 0.99), ('batch_topk', 0.98)])
def test_a_known_sparse_dictionary_is_recovered(architecture, cosine):
  """Activations that are sparse positive codes of 24 unit directions in 16 dimensions:
  the SAE's decoder holds each direction (the TopK SAE at cosine > 0.99; BatchTopK,
  whose batch-wide selection gives inputs with larger codes more latents, stops
  near 0.985 here), and it explains the held-out activations' variance."""
  rng = np.random.default_rng(0)
  atoms, d, k = 24, 16, 2
  dictionary = rng.normal(size=(atoms, d))
  dictionary /= np.linalg.norm(dictionary, axis=1, keepdims=True)

  def sample(n):
    chosen = np.argsort(rng.random((n, atoms)), axis=1)[:, :k]  # k atoms of each, at random
    codes = np.zeros((n, atoms))
    np.put_along_axis(codes, chosen, rng.uniform(0.5, 2., (n, k)), axis=1)
    return (codes @ dictionary).astype(np.float32)

  spec = sae.Spec(architecture=architecture, width=48, k=k, aux_k=8, dead_steps=20, lr=3e-3,
                  b2=0.99)
  trained = sae.train(jax.random.PRNGKey(0), (sample(256) for _ in range(2000)), spec)
  decoder = np.array(trained.params['W_dec'])
  decoder /= np.linalg.norm(decoder, axis=1, keepdims=True)
  best = (dictionary @ decoder.T).max(axis=1)
  assert best.min() > cosine, np.sort(best)[:5]
  quality = sae.quality(trained.params, jnp.asarray(sample(2000)), spec)
  assert quality['fve'] > 0.95 and abs(quality['l0'] - k) < 1.5, quality


@pytest.mark.parametrize('suffix', sae_files.FORMATS)
def test_a_saved_dictionary_reads_back(tmp_path, suffix):
  spec = sae.authors_spec('batch_topk', width=20, k=3)
  trained = sae.Trained(spec, jax.tree_util.tree_map(jnp.asarray, _params()), np.zeros(1),
                        np.zeros(20))
  path = str(tmp_path / f'sae.{suffix}')
  about = {'site': 'block1/+mlp', 'model': 'ViT-Ti_16', 'normalisation': 'none'}
  sae_files.save(path, trained, about)
  params, read_spec, read_about = sae_files.load(path)
  assert read_spec == spec and read_about == about
  for name, value in trained.params.items():
    np.testing.assert_array_equal(params[name], np.asarray(value, np.float32))
  if suffix == 'safetensors':  # what PyTorch code reads: the tensors and the header's JSON
    import json
    import safetensors
    with safetensors.safe_open(path, 'np') as f:
      assert sorted(f.keys()) == sorted(sae_files.PARAMS)
      assert json.loads(f.metadata()['spec'])['architecture'] == 'batch_topk'


def test_a_file_that_is_no_dictionary_is_named(tmp_path):
  path = str(tmp_path / 'other.npz')
  np.savez(path, W_enc=np.zeros((2, 3)))
  with pytest.raises(ValueError, match=r'other.npz holds no b_enc, W_dec, b_dec: it is not an '
                                       r'SAE dictionary this project wrote \(its arrays: W_enc\)'):
    sae_files.load(path)


def test_a_steered_latent_moves_the_activation_along_its_decoder_row_only():
  p = _params()
  x = np.random.RandomState(1).normal(size=(5, 6))
  spec = sae.authors_spec('topk', width=20, k=3)
  latents = np.asarray(sae.encode(jax.tree_util.tree_map(jnp.asarray, p), jnp.asarray(x),
                                  spec)[0])
  j = int(np.argmax(latents.sum(axis=0)))
  for scale in (0., 1., 2.):
    expected = x + (scale - 1) * latents[:, [j]] * p['W_dec'][j][None]
    np.testing.assert_allclose(sae.steered(x, latents, p, j, scale, spec), expected, rtol=1e-5,
                               atol=1e-6)
  np.testing.assert_allclose(sae.steered(x, latents, p, j, 1., spec), x, rtol=1e-6)


@pytest.mark.parametrize('means, index', [([3., 1., 1., 1.], 0.5), ([2., 2., 2.], 0.),
                                          ([0., 4., 0.], 1.), ([0., 0.], 0.)])
def test_class_selectivity_is_morcos_et_als_index(means, index):
  """(mu_max - mu_-max) / (mu_max + mu_-max), mu_-max the mean over the other classes
  (Morcos et al. 2018, "On the importance of single directions for generalization",
  whose definition is in the paper's text)."""
  assert sae.class_selectivity(np.array(means)) == pytest.approx(index)


def test_a_latents_effects_are_the_numbers_written_out():
  """`_effects` against numpy on constructed logits: 8 images of 3 classes, the
  edit lowering class 1's logit on class 1's images only."""
  from analysis.tools import sae as tool
  labels = np.array([0, 0, 0, 1, 1, 1, 2, 2])
  clean = np.eye(3)[labels] * 2.
  edited = clean.copy()
  edited[labels == 1, 1] -= np.array([3., 2.5, 0.5])  # the first two images turn wrong
  activation = np.array([0., 0., 1., 4., 2., 3., 0., 1.])
  got = tool._effects(7, clean, edited, labels, activation)
  change = edited - clean
  np.testing.assert_allclose(got['logit_change'], change.mean(0))
  np.testing.assert_allclose(got['logit_change_stderr'], change.std(0, ddof=1) / np.sqrt(8))
  assert got['accuracy_drop'] == pytest.approx(2 / 8)
  differences = np.array([0, 0, 0, 1, 1, 0, 0, 0])
  assert got['accuracy_drop_stderr'] == pytest.approx(differences.std(ddof=1) / np.sqrt(8))
  mu = np.array([1 / 3, 3., 0.5])  # the activation's class means
  assert got['activation_selectivity'] == pytest.approx((3 - (1 / 3 + 0.5) / 2) /
                                                        (3 + (1 / 3 + 0.5) / 2))
  assert got['preferred_class'] == 1 and got['most_affected_class'] == 1
  assert got['effect_selectivity'] == pytest.approx(1.)  # only class 1's logit moved
  assert got['activation_selectivity_stderr'] > 0 and mu.argmax() == 1


@pytest.mark.parametrize('family', ['vit', 'bit'])
def test_splicing_the_sites_own_tokens_changes_no_logit(subjects, family):
  """The tool's splice puts the spatial tokens back where they came from: with the
  site's own tokens the logits are the clean ones, the class token kept."""
  from analysis.tools import sae as tool
  from helpers import images
  subject = subjects[family]
  _, name = tool.site_of(subject, tool.Options())
  x = images(4)
  tokens, value = tool._tokens(subject, name, x)
  edits = tool._edits(name, **tool._spliced(value, tokens, subject.has_cls, subject.registers))
  np.testing.assert_allclose(subject.edited_logits(x, edits), subject.logits(x), rtol=1e-5,
                             atol=1e-6)


def test_the_tool_trains_measures_and_keeps_its_dictionary(subjects, tmp_path):
  from analysis.tool import Kept
  from analysis.tools import sae as tool
  from helpers import batches
  from vit_jax.errors import ConfigError
  result = tool.TOOL.run_one(subjects['vit'], batches, str(tmp_path),
                         tool.Options(sae_steps=30, sae_expansion=2, sae_k=4))
  assert result['site'] == subjects['vit'].layers.labels[len(subjects['vit'].layers.labels) // 2]
  assert result['l0'] <= 4 and 0 <= result['dead'] <= 1 and np.isfinite(result['loss_recovered'])
  assert set(result['loss']) == {'clean', 'spliced', 'zero_ablated'}
  params, spec, about = sae_files.load(str(tmp_path / result['dictionary']))
  assert spec.width == result['latents'] and about['site'] == result['site']
  assert result['dictionary'].endswith('.npz') and about['normalisation'] == 'none'
  assert all(os.path.exists(path) for path in result['figures'])
  assert any('sae_activations' in path for path in result['figures'])  # the studied latents'
  assert len(result['features']) <= 4 and result['feature_scale'] == 0.
  classes = np.asarray(subjects['vit'].logits(next(batches('eval'))[0])).shape[-1]
  for effect in result['features']:
    assert len(effect['logit_change']) == classes and 0 <= effect['activation_selectivity'] <= 1
  # A latent's contribution scaled by 1 is the site as it was: no logit moves. The
  # measure alone writes nothing: its dictionary comes back unwritten.
  before = sorted(os.listdir(tmp_path))
  same = tool.TOOL.run(subjects['vit'], batches,
                       tool.Options(sae_steps=30, sae_expansion=2, sae_k=4, sae_features=2,
                                    sae_feature_scale=1.))
  assert sorted(os.listdir(tmp_path)) == before and 'figures' not in same
  assert isinstance(same['dictionary'], Kept) and same['dictionary'].name == 'sae_vit.npz'
  assert len(same['features']) == 2
  for effect in same['features']:
    np.testing.assert_allclose(effect['logit_change'], 0., atol=1e-5)
    assert effect['accuracy_drop'] == 0.
  with pytest.raises(ConfigError, match='--sae_site=nowhere is not a residual-stream entry'):
    tool.site_of(subjects['vit'], tool.Options(sae_site='nowhere'))
