"""The ImageNet-C corruptions on the analysis's images (through imagecorruptions),
Hendrycks & Dietterich's corruption errors written out in numpy, and the
corruption tool."""
import json
import os
import sys

import numpy as np
import pytest

from analysis import corruptions
from analysis.tools import TOOLS
from test_representation_tools import batches, subjects  # noqa: F401  (fixture)
from vit_jax.errors import ConfigError, UserError

imagecorruptions = pytest.importorskip('imagecorruptions')


def images(size, n=3, seed=0):
  grey = np.random.RandomState(seed).uniform(-1, 1, (n, size, size, 1)).astype(np.float32)
  return np.repeat(grey, 3, axis=-1)  # the pipeline's greyscale: three equal channels


def test_pixels_round_trip_on_the_uint8_grid():
  pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1).repeat(3, -1)
  np.testing.assert_array_equal(corruptions.to_uint8(corruptions.to_model(pixels)), pixels)


@pytest.mark.parametrize('size', [28, 32])
@pytest.mark.parametrize('name', corruptions.CORRUPTIONS)
def test_every_corruption_keeps_shape_and_range_and_repeats(name, size):
  x = images(size)
  y = corruptions.corrupt(x, name, 5, seed=3)
  assert y.shape == x.shape and y.dtype == np.float32
  assert y.min() >= -1 and y.max() <= 1
  np.testing.assert_array_equal(y, corruptions.corrupt(x, name, 5, seed=3))
  assert np.abs(y - x).mean() > 0.01  # severity 5 changes the image


def test_at_32_px_it_is_the_package_on_each_image():
  x = images(32, n=2)
  for name in ('gaussian_noise', 'glass_blur', 'fog'):
    np.random.seed(7)
    expected = [imagecorruptions.corrupt(p, 4, name, **({'seed': 7 + i} if name in
                                                         corruptions.SEEDED else {}))
                for i, p in enumerate(corruptions.to_uint8(x))]
    np.testing.assert_array_equal(corruptions.corrupt(x, name, 4, seed=7),
                                  corruptions.to_model(np.stack(expected)))


def test_small_images_are_padded_then_cropped_back():
  """Brightness acts on each pixel alone: on the padded 32 px image cropped back it
  equals the package's brightness function called on the 28 px image itself."""
  from imagecorruptions import corruptions as functions
  x = images(28)
  expected = np.stack([np.uint8(functions.brightness(p, 3))
                       for p in corruptions.to_uint8(x)])
  np.testing.assert_array_equal(corruptions.corrupt(x, 'brightness', 3, seed=0),
                                corruptions.to_model(expected))
  with pytest.raises(ValueError, match="Unknown corruption 'rain'"):
    corruptions.corrupt(x, 'rain', 3, seed=0)


def test_corruption_errors_are_hendrycks_and_dietterichs():
  errors = {'a': [0.2, 0.3, 0.4, 0.5, 0.6], 'b': [0.1, 0.1, 0.2, 0.2, 0.3]}
  base = {'a': [0.4, 0.4, 0.5, 0.6, 0.8], 'b': [0.2, 0.2, 0.2, 0.3, 0.3]}
  r = corruptions.corruption_errors(errors, 0.05, base, 0.1)
  assert r['ce'] == pytest.approx({'a': 2.0 / 2.7, 'b': 0.9 / 1.2})
  assert r['mce'] == pytest.approx((2.0 / 2.7 + 0.9 / 1.2) / 2)
  assert r['relative_ce']['a'] == pytest.approx((2.0 - 0.25) / (2.7 - 0.5))
  assert r['relative_ce']['b'] == pytest.approx((0.9 - 0.25) / (1.2 - 0.5))
  itself = corruptions.corruption_errors(base, 0.1, base, 0.1)
  assert itself['mce'] == pytest.approx(1.) and itself['relative_mce'] == pytest.approx(1.)
  # A baseline no corruption hurts has no relative error to divide by.
  assert corruptions.corruption_errors(errors, 0.05, {'a': [0.1] * 5, 'b': [0.1] * 5},
                                       0.1)['relative_ce']['a'] is None


def test_the_corruption_tool_on_two_models(subjects, tmp_path):  # noqa: F811
  vit, bit = subjects[0], subjects[2]
  r = TOOLS['corruption'].run([vit, bit], batches, str(tmp_path))
  json.dumps(r)
  assert r['baseline'] == 'bit' and r['num_images'] == 36  # the convolutional model
  assert set(r['errors']['vit']) == set(corruptions.CORRUPTIONS)
  assert all(len(v) == 5 and all(0 <= e <= 1 for e in v) for v in r['errors']['vit'].values())
  assert r['mce']['bit'] == pytest.approx(1.)
  # The errors are the model's on the corrupted images, written out here.
  x, y = next(batches('eval'))
  wrong = np.asarray(vit.logits(corruptions.corrupt(x, 'fog', 2, seed=0))).argmax(-1) != y
  others = [np.asarray(vit.logits(corruptions.corrupt(im, 'fog', 2, seed=1000 * i))
                       ).argmax(-1) != lab for i, (im, lab) in enumerate(batches('eval')) if i]
  assert r['errors']['vit']['fog'][1] == pytest.approx(np.concatenate([wrong] + others).mean())
  assert all(os.path.exists(p) for p in r['figures'])
  assert TOOLS['corruption'].joint(r, {}, str(tmp_path))
  judged, = TOOLS['corruption'].verdicts(r, {'vit': {'architecture': 'transformer'},
                                              'bit': {'architecture': 'convnet'}})
  assert judged.finding == 'robust to corruptions'
  assert f"vit {-r['mean_error']['vit']:.3f}" in judged.measured
  with pytest.raises(ConfigError, match='--corruption_baseline=resnet is not one of'):
    TOOLS['corruption'].run([vit, bit], batches, str(tmp_path), baseline='resnet')


def test_tfds_corruptions_need_cifar10_models(subjects, tmp_path):  # noqa: F811
  with pytest.raises(ConfigError, match='every model must be a CIFAR-10 model'):
    TOOLS['corruption'].run([subjects[0]], batches, str(tmp_path), source='tfds')


def test_the_tfds_source_reads_each_corruption_and_severity(subjects, tmp_path, monkeypatch):  # noqa: F811,E501
  from analysis import features
  read = []

  def corrupted(name, split, image_size, batch_size, num_images, data_dir):
    read.append((name, split, image_size, batch_size, num_images))
    return batches('eval')
  monkeypatch.setattr(features, 'dataset_batches', corrupted)
  vit = subjects[0]
  vit.recipe.dataset = 'cifar10'
  try:
    r = TOOLS['corruption'].run([vit], batches, str(tmp_path), source='tfds')
  finally:
    vit.recipe.dataset = ''
  assert len(read) == 75 and read[0] == ('cifar10_corrupted/gaussian_noise_1', 'test', 32, 12, 36)
  assert r['source'] == 'tfds' and r['mce']['vit'] == pytest.approx(1.)


def test_without_the_package_the_tool_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, 'imagecorruptions', None)
  with pytest.raises(UserError, match='pip install imagecorruptions-imaug'):
    corruptions.package()
