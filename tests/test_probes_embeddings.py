"""Closed-form probes and the ViT-paper embedding figures."""
import numpy as np
import pytest

from analysis.measures import embeddings, linear_probes
from vit_jax.models.vit import sincos2d_posembed


def planted(n, d=20, classes=4, seed=0):
  """Features whose labels are the argmax of a fixed linear map of them."""
  rng = np.random.RandomState(seed)
  w = np.random.RandomState(99).randn(d, classes)
  x = rng.randn(n, d)
  return x, np.argmax(x @ w, axis=1)


def test_ridge_matches_normal_equations():
  rng = np.random.RandomState(0)
  x, t = rng.randn(50, 6), rng.randn(50, 3)
  weights, biases = linear_probes.ridge_fit(x, t, [0.5])
  xc = x - x.mean(0)
  expected = np.linalg.solve(xc.T @ xc + 0.5 * np.eye(6), xc.T @ (t - t.mean(0)))
  np.testing.assert_allclose(weights[0], expected, rtol=1e-10)
  np.testing.assert_allclose(biases[0], t.mean(0) - x.mean(0) @ expected, rtol=1e-10)


def test_probe_recovers_a_planted_linear_labelling():
  train_x, train_y = planted(2000)
  test_x, test_y = planted(500, seed=1)
  result = linear_probes.probe_accuracy(train_x, train_y, test_x, test_y, 4)
  assert result['accuracy'] > 0.9
  # Shuffled labels carry nothing: chance level.
  shuffled = np.random.RandomState(2).permutation(train_y)
  assert linear_probes.probe_accuracy(train_x, shuffled, test_x, test_y, 4)['accuracy'] < 0.4


def test_few_shot_improves_with_shots_and_checks_class_sizes():
  train_x, train_y = planted(2000)
  test_x, test_y = planted(500, seed=1)
  one = linear_probes.few_shot_accuracy(train_x, train_y, test_x, test_y, 4, shots=1)
  many = linear_probes.few_shot_accuracy(train_x, train_y, test_x, test_y, 4, shots=25)
  assert many > one and many > 0.7
  with pytest.raises(ValueError, match='fewer than'):
    linear_probes.few_shot_accuracy(train_x[:10], train_y[:10], test_x, test_y, 4, shots=25)


def test_a_token_that_carries_the_label_classifies_alone():
  """(N, 3, 4, 6) noise maps; the token at row 1, column 2 holds the signed one-hot
  label in its first 4 channels: its 10-shot probe is exact, the others at chance."""
  rng = np.random.RandomState(0)
  labels = np.arange(400) % 4
  maps = rng.randn(400, 3, 4, 6)
  maps[:, 1, 2, :4] += 3. * linear_probes.signed_one_hot(labels, 4)
  grid = linear_probes.few_shot_per_position(maps[:200], labels[:200], maps[200:], labels[200:], 4,
                                      shots=10)
  assert grid.shape == (3, 4) and grid[1, 2] == 1.
  others = np.delete(grid.ravel(), 1 * 4 + 2)
  assert np.all(others < 0.45), grid  # chance is 0.25; 200 test images


def test_embedding_components_are_orthonormal_and_ordered():
  rng = np.random.RandomState(0)
  # 64 filters of 4x4x3 varying mostly along two fixed directions.
  directions = rng.randn(2, 48)
  kernel = (rng.randn(64, 2) * [10., 3.]) @ directions + 0.1 * rng.randn(64, 48)
  kernel = kernel.T.reshape(4, 4, 3, 64)
  components = embeddings.patch_embedding_components(kernel, k=5).reshape(5, -1)
  np.testing.assert_allclose(components @ components.T, np.eye(5), atol=1e-10)
  unit = directions[0] / np.linalg.norm(directions[0])
  assert abs(components[0] @ unit) > 0.99


def test_the_share_gray_images_reach_is_that_of_the_channel_constant_part():
  rng = np.random.RandomState(0)
  constant = np.repeat(rng.randn(4, 4, 1, 8), 3, axis=2)  # the same in every channel
  varying = rng.randn(4, 4, 3, 8)
  varying -= varying.mean(2, keepdims=True)  # sums to zero over the channels
  share = embeddings.gray_reached_share(constant + varying)
  assert share == pytest.approx(np.sum(constant ** 2) /
                                (np.sum(constant ** 2) + np.sum(varying ** 2)), rel=1e-12)
  assert embeddings.gray_reached_share(constant) == pytest.approx(1.)
  assert embeddings.gray_reached_share(varying) == pytest.approx(0., abs=1e-12)


def test_position_similarity_of_a_sincos_grid_peaks_at_itself():
  posemb = np.asarray(sincos2d_posembed((4, 4), 32))  # (16, 32)
  with_cls = np.concatenate([np.ones((1, 32)), posemb])[None]
  similarity = embeddings.position_embedding_similarity(with_cls, (4, 4), has_cls=True)
  assert similarity.shape == (4, 4, 4, 4)
  for i in range(4):
    for j in range(4):
      assert np.unravel_index(np.argmax(similarity[i, j]), (4, 4)) == (i, j)
  np.testing.assert_allclose(similarity, np.transpose(similarity, (2, 3, 0, 1)), atol=1e-6)


def test_image_patches_are_the_grid_cells_in_row_major_order():
  images = np.random.RandomState(0).randn(2, 10, 9, 3)  # a 3 x 2 grid: 3 x 4 px, 1 row/col cut
  patches = embeddings.image_patches(images, (3, 2))
  assert patches.shape == (2, 6, 3 * 4 * 3)
  for r in range(3):
    for c in range(2):
      np.testing.assert_array_equal(patches[:, r * 2 + c],
                                    images[:, 3 * r:3 * r + 3, 4 * c:4 * c + 4].reshape(2, -1))
