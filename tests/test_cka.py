"""CKA against golden values of Kornblith et al., invariances and the streamed form."""
import chex
import jax
import numpy as np
import pytest
from scipy.stats import ortho_group

from analysis.measures import similarity

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


@pytest.fixture(autouse=True)
def float64():
  with jax.enable_x64(True):
    yield


def golden_xy():
  np.random.seed(1337)
  x = np.random.randn(100, 10)
  y = np.random.randn(100, 10) + x
  return x, y


def test_golden_values():
  x, y = golden_xy()
  np.testing.assert_allclose(similarity.cka(similarity.gram_linear(x), similarity.gram_linear(y)), 0.55761, atol=5e-6)
  np.testing.assert_allclose(similarity.cka(similarity.gram_rbf(x, 0.5), similarity.gram_rbf(y, 0.5)), 0.65483,
                             atol=5e-6)
  np.testing.assert_allclose(similarity.cka(similarity.gram_linear(x), similarity.gram_linear(y), unbiased=True),
                             0.51346, atol=5e-6)


@pytest.mark.parametrize('unbiased', [False, True])
def test_feature_form_equals_gram_form(unbiased):
  x, y = golden_xy()
  y = np.concatenate([y, y[:, :3] ** 2], axis=1)  # different widths are allowed
  np.testing.assert_allclose(similarity.linear_cka(x, y, unbiased),
                             similarity.cka(similarity.gram_linear(x), similarity.gram_linear(y), unbiased), rtol=1e-12)


@pytest.mark.parametrize('unbiased', [False, True])
def test_identity_symmetry_and_invariances(unbiased):
  x, y = golden_xy()
  rng = np.random.RandomState(0)
  np.testing.assert_allclose(similarity.linear_cka(x, x, unbiased), 1., rtol=1e-12)
  np.testing.assert_allclose(similarity.linear_cka(x, y, unbiased), similarity.linear_cka(y, x, unbiased),
                             rtol=1e-12)
  reference = similarity.linear_cka(x, y, unbiased)
  rotation = ortho_group.rvs(10, random_state=0)
  np.testing.assert_allclose(similarity.linear_cka(x @ rotation, 3.7 * y, unbiased), reference,
                             rtol=1e-10)
  np.testing.assert_allclose(similarity.cka(similarity.gram_rbf(x @ rotation), similarity.gram_rbf(3.7 * y),
                                     unbiased), similarity.cka(similarity.gram_rbf(x), similarity.gram_rbf(y), unbiased),
                             rtol=1e-10)
  general = rng.randn(10, 10) @ np.diag(np.logspace(-2, 2, 10))
  assert abs(similarity.linear_cka(x @ general, y, unbiased) - reference) > 1e-2


def test_flattens_and_centres_examples():
  x = np.random.RandomState(0).randn(30, 4, 5)
  y = np.random.RandomState(1).randn(30, 20) + 10.  # an offset changes nothing
  np.testing.assert_allclose(similarity.linear_cka(x, y), similarity.linear_cka(x.reshape(30, 20), y - 10.),
                             rtol=1e-10)


def minibatches(num_batches=6, n=40, seed=0):
  """Batches of three layers: x, a noisy function of x, and independent noise."""
  rng = np.random.RandomState(seed)
  for _ in range(num_batches):
    x = rng.randn(n, 8)
    yield [x, np.tanh(x @ rng.randn(8, 16)) + 0.3 * rng.randn(n, 16), rng.randn(n, 5, 3)]


def explicit_minibatch_cka(batches, i, j, unbiased=True):
  """Sum of HSICs over batches, from the Gram form one pair at a time."""
  def hsic(a, b):
    ka = similarity.center_gram(similarity.gram_linear(a), unbiased)
    kb = similarity.center_gram(similarity.gram_linear(b), unbiased)
    return float(np.vdot(ka, kb))
  xy = sum(hsic(b[i], b[j]) for b in batches)
  xx = sum(hsic(b[i], b[i]) for b in batches)
  yy = sum(hsic(b[j], b[j]) for b in batches)
  return xy / np.sqrt(xx * yy)


def test_streamed_equals_one_shot():
  batches = list(minibatches())
  stream = similarity.MinibatchCKA()
  for batch in batches:
    stream.update(batch)
  result = stream.result()
  assert stream.hsic_sum.dtype == np.float64
  # Gram matrices are formed in float32 on the device (relative error ~1e-7 per
  # entry); only the sums are float64.
  for i in range(3):
    for j in range(3):
      np.testing.assert_allclose(result[i, j], explicit_minibatch_cka(batches, i, j), rtol=1e-5)
  chex.assert_trees_all_close(result, result.T)
  np.testing.assert_allclose(np.diag(result), 1., rtol=1e-12)


def test_unbiased_estimate_of_independent_features_is_near_zero():
  batches = list(minibatches(num_batches=20, n=32))
  biased, unbiased = similarity.MinibatchCKA(unbiased=False), similarity.MinibatchCKA(unbiased=True)
  for batch in batches:
    biased.update(batch)
    unbiased.update(batch)
  # Layers 0 and 2 are independent: the biased estimate is inflated at this
  # batch size, the unbiased one is centred on 0.
  assert biased.result()[0, 2] > 0.15
  assert abs(unbiased.result()[0, 2]) < 0.03


def test_cross_model_block_equals_joint_computation():
  model_a = list(minibatches(seed=0))
  model_b = list(minibatches(seed=0))
  rng = np.random.RandomState(5)
  model_b = [[b[0] @ rng.randn(8, 8), b[1] ** 2] for b in model_b]
  joint = similarity.MinibatchCKA()
  for a, b in zip(model_a, model_b):
    joint.update(a + b)
  cross = joint.result()[:3, 3:]
  both = [a + b for a, b in zip(model_a, model_b)]
  for i in range(3):
    for j in range(2):
      np.testing.assert_allclose(cross[i, j], explicit_minibatch_cka(both, i, 3 + j), rtol=1e-5)
  # Model b's first layer is a general linear map of model a's: strongly related,
  # though below the 1 a rotation would give.
  assert cross[0, 0] > 0.5


def test_rejects_unknown_kernel_and_empty_stream():
  with pytest.raises(ValueError, match='kernel'):
    similarity.minibatch_hsic([np.ones((5, 2))], kernel='cosine')
  with pytest.raises(ValueError, match='No batches'):
    similarity.MinibatchCKA().result()


def unbiased_hsic_song(x, y):
  """HSIC_1 of Song et al. (2012), eq. 5, as Nguyen et al. (2021) use it for minibatch
  CKA, written out from the paper with linear kernels on centred, flattened features:
  [tr(K~L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3)), K~ = K with a
  zero diagonal."""
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  y = np.asarray(y, np.float64).reshape(len(y), -1)
  x, y = x - x.mean(0), y - y.mean(0)
  n = len(x)
  k, l = x @ x.T, y @ y.T
  np.fill_diagonal(k, 0)
  np.fill_diagonal(l, 0)
  ones = np.ones(n)
  return (np.trace(k @ l) + (ones @ k @ ones) * (ones @ l @ ones) / ((n - 1) * (n - 2))
          - 2 / (n - 2) * ones @ k @ l @ ones) / (n * (n - 3))


def test_streamed_cka_equals_the_papers_unbiased_hsic_formula():
  batches = list(minibatches(num_batches=5, n=24, seed=3))
  stream = similarity.MinibatchCKA(unbiased=True)
  for batch in batches:
    stream.update(batch)
  for i in range(3):
    for j in range(3):
      xy = sum(unbiased_hsic_song(b[i], b[j]) for b in batches)
      xx = sum(unbiased_hsic_song(b[i], b[i]) for b in batches)
      yy = sum(unbiased_hsic_song(b[j], b[j]) for b in batches)
      # Grams in float32 on the device, sums in float64: 1e-5 relative.
      np.testing.assert_allclose(stream.result()[i, j], xy / np.sqrt(xx * yy), rtol=1e-5,
                                 atol=1e-6)
  one = batches[0]
  np.testing.assert_allclose(
      similarity.linear_cka(one[0], one[1], unbiased=True),
      unbiased_hsic_song(one[0], one[1]) / np.sqrt(unbiased_hsic_song(one[0], one[0])
                                                   * unbiased_hsic_song(one[1], one[1])),
      rtol=1e-8)
