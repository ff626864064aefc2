"""The input pipeline's image operations against independent references: scipy's
linear interpolation, TensorFlow's ops (where TensorFlow is installed), closed forms."""
import numpy as np
import pytest
from scipy import ndimage

from vit_jax.data import augment

SHAPES = [((7, 5), (12, 9)), ((12, 9), (7, 5)), ((28, 28), (28, 28)), ((30, 20), (4, 11)),
          ((16, 12), (8, 6))]


def scipy_bilinear(image, size):
  """TensorFlow's bilinear resize from its definition: output pixel i samples the
  input at (i + 1/2) * in / out - 1/2, linearly, the edges held beyond the image."""
  rows = (np.arange(size[0]) + 0.5) * image.shape[0] / size[0] - 0.5
  cols = (np.arange(size[1]) + 0.5) * image.shape[1] / size[1] - 0.5
  grid = np.meshgrid(rows, cols, indexing='ij')
  return np.stack([ndimage.map_coordinates(image[..., c].astype(np.float64), grid, order=1,
                                           mode='nearest') for c in range(image.shape[-1])], -1)


@pytest.mark.parametrize('shape,size', SHAPES)
def test_resize_samples_at_half_pixel_centres_as_scipy_interpolates(shape, size):
  image = np.random.default_rng(0).integers(0, 256, shape + (3,)).astype(np.uint8)
  out = augment.resize(image, size)
  assert out.shape == size + (3,) and out.dtype == np.float32
  np.testing.assert_allclose(out, scipy_bilinear(image, size), atol=1e-3)


@pytest.mark.parametrize('shape,size', SHAPES)
def test_resize_equals_tensorflows(shape, size):
  tf = pytest.importorskip('tensorflow')
  image = np.random.default_rng(1).integers(0, 256, shape + (1,)).astype(np.uint8)
  np.testing.assert_allclose(augment.resize(image, size),
                             tf.image.resize(image, size, method='bilinear').numpy(), atol=1e-3)


@pytest.mark.parametrize('shape', [(40, 30), (31, 50), (24, 24)])
def test_resize_small_then_central_crop_equals_tensorflows(shape):
  tf = pytest.importorskip('tensorflow')
  image = np.random.default_rng(2).integers(0, 256, shape + (3,)).astype(np.uint8)
  size, small = 20, 23
  scale = small / min(shape)
  resized = tf.image.resize(image, np.round(np.array(shape, np.float32) * scale).astype(int),
                            method='bilinear')
  expected = tf.image.resize_with_crop_or_pad(resized, size, size).numpy()
  np.testing.assert_allclose(augment.eval_resize(image, size, small), expected, atol=1e-3)


def test_the_central_crop_keeps_the_middle():
  image = np.arange(7 * 6).reshape(7, 6, 1)
  np.testing.assert_array_equal(augment.central_crop(image, 4), image[1:5, 1:5])


def test_crop_windows_cover_the_inception_ranges():
  rng = np.random.default_rng(3)
  windows = np.array([augment.crop_window(60, 80, rng) for _ in range(2000)])
  top, left, h, w = windows.T
  assert np.all((top >= 0) & (left >= 0) & (top + h <= 60) & (left + w <= 80))
  area, aspect = h * w / (60 * 80), w / h
  # Rounding to whole pixels moves the ends by at most a pixel a side.
  assert area.min() >= 0.04 and area.max() >= 0.95
  assert 0.35 < area.mean() < 0.55  # uniform draws, less those that do not fit
  assert aspect.min() >= 0.7 and aspect.max() <= 1.4
  # An image too small for any window of the ranges is taken whole.
  assert augment.crop_window(1, 1, rng) == (0, 0, 1, 1)


def test_about_half_the_images_are_mirrored():
  mirror = augment.mirrored(4000, np.random.default_rng(4))
  assert mirror.dtype == bool and 0.47 < mirror.mean() < 0.53


def test_mixup_weights_follow_the_beta_distribution():
  batch = {'image': np.eye(2, dtype=np.float32)[:, :, None, None],
           'label': np.eye(2, dtype=np.float32)}
  rng = np.random.default_rng(5)
  weights = np.array([augment.mixup(batch, 0.4, rng)['label'][0, 0] for _ in range(4000)])
  # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
  assert weights.mean() == pytest.approx(0.5, abs=0.02)
  assert weights.var() == pytest.approx(1 / (4 * 1.8), rel=0.1)


IDENTITY_AT_ZERO = ['Rotate', 'Posterize', 'Solarize', 'SolarizeAdd', 'Color', 'Contrast',
                    'Brightness', 'Sharpness', 'ShearX', 'ShearY', 'TranslateX', 'TranslateY']


@pytest.mark.parametrize('name', list(augment.OPERATIONS))
def test_randaugment_operations_keep_the_image_and_vanish_at_magnitude_zero(name):
  image = np.random.default_rng(6).integers(0, 256, (16, 12, 3)).astype(np.uint8)
  picture = augment.PIL.Image.fromarray(image)
  for magnitude in (0, 5, 10):
    out = np.asarray(augment.OPERATIONS[name](picture, magnitude, np.random.default_rng(7)))
    assert out.shape == image.shape and out.dtype == np.uint8
    if magnitude == 0 and name in IDENTITY_AT_ZERO:
      np.testing.assert_array_equal(out, image)
  if name == 'Invert':
    np.testing.assert_array_equal(np.asarray(augment.OPERATIONS[name](picture, 0, None)),
                                  255 - image)


def test_randaugment_is_a_function_of_its_draws():
  image = np.random.default_rng(8).integers(0, 256, (16, 16, 3)).astype(np.uint8)
  run = lambda seed: augment.randaugment(image, 2, 9, np.random.default_rng(seed))
  np.testing.assert_array_equal(run(0), run(0))
  assert any(not np.array_equal(run(0), run(s)) for s in range(1, 5))
  np.testing.assert_array_equal(augment.randaugment(image, 0, 9, np.random.default_rng(0)), image)
