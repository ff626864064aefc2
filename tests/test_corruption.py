"""The CIFAR-C corruptions against Hendrycks' make_cifar_c.py written out here,
the ImageNet-C ones on the analysis's images (through imagecorruptions),
Hendrycks & Dietterich's corruption errors written out in numpy, and the
corruption tool."""
import json
import os
import sys

import numpy as np
import pytest

from analysis.measures import corruptions
from analysis.tool import run_on
from analysis.tools import TOOLS
from analysis.tools.corruption import Options
from helpers import batches
from vit_jax.errors import ConfigError, UserError

imagecorruptions = pytest.importorskip('imagecorruptions')


def images(size, n=3, seed=0):
  grey = np.random.RandomState(seed).uniform(-1, 1, (n, size, size, 1)).astype(np.float32)
  return np.repeat(grey, 3, axis=-1)  # the pipeline's greyscale: three equal channels


def test_pixels_round_trip_on_the_uint8_grid():
  pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1).repeat(3, -1)
  np.testing.assert_array_equal(corruptions.to_uint8(corruptions.to_model(pixels)), pixels)


@pytest.mark.parametrize('parameters', corruptions.PARAMETER_SETS)
@pytest.mark.parametrize('size', [28, 32])
@pytest.mark.parametrize('name', corruptions.CORRUPTIONS)
def test_every_corruption_keeps_shape_and_range_and_repeats(name, size, parameters):
  x = images(size)
  y = corruptions.corrupt(x, name, 5, seed=3, parameters=parameters)
  assert y.shape == x.shape and y.dtype == np.float32
  assert y.min() >= -1 and y.max() <= 1
  np.testing.assert_array_equal(y, corruptions.corrupt(x, name, 5, seed=3,
                                                       parameters=parameters))
  assert np.abs(y - x).mean() > 0.01  # severity 5 changes the image


def test_at_32_px_it_is_the_package_on_each_image():
  x = images(32, n=2)
  for name in ('gaussian_noise', 'glass_blur', 'fog'):
    np.random.seed(7)
    expected = [imagecorruptions.corrupt(p, 4, name, **({'seed': 7 + i} if name in
                                                         corruptions.SEEDED else {}))
                for i, p in enumerate(corruptions.to_uint8(x))]
    np.testing.assert_array_equal(corruptions.corrupt(x, name, 4, seed=7,
                                                      parameters='imagenet'),
                                  corruptions.to_model(np.stack(expected)))


def test_small_images_are_padded_then_cropped_back():
  """Brightness acts on each pixel alone: on the padded 32 px image cropped back it
  equals the package's brightness function called on the 28 px image itself."""
  from imagecorruptions import corruptions as functions
  x = images(28)
  expected = np.stack([np.uint8(functions.brightness(p, 3))
                       for p in corruptions.to_uint8(x)])
  np.testing.assert_array_equal(corruptions.corrupt(x, 'brightness', 3, seed=0,
                                                    parameters='imagenet'),
                                corruptions.to_model(expected))
  with pytest.raises(ValueError, match="Unknown corruption 'rain'"):
    corruptions.corrupt(x, 'rain', 3, seed=0)


# make_cifar_c.py's parameter tables (hendrycks/robustness,
# ImageNet-C/create_c/make_cifar_c.py), by the line that holds each.
CIFAR_C = {
    'gaussian_noise': [0.04, 0.06, .08, .09, .10],  # 131
    'shot_noise': [500, 250, 100, 75, 50],  # 138
    'impulse_noise': [.01, .02, .03, .05, .07],  # 145
    'defocus_blur': [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],  # 184
    'glass_blur': [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],  # 167
    'motion_blur': [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],  # 198
    'zoom_blur': [np.arange(1, 1.06, 0.01), np.arange(1, 1.11, 0.01), np.arange(1, 1.16, 0.01),
                  np.arange(1, 1.21, 0.01), np.arange(1, 1.26, 0.01)],  # 216-217
    'snow': [(0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
             (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
             (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)],  # 251-255
    'frost': [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],  # 238
    'fog': [(.2, 3), (.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],  # 229
    'brightness': [.05, .1, .15, .2, .3],  # 342
    'contrast': [.75, .5, .4, .3, 0.15],  # 334
    # 385-389: (IMSIZE*a, IMSIZE*b, IMSIZE*c) with IMSIZE = 32.
    'elastic_transform': [(0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
                          (0.1, 0.03, 0.03)],
    'pixelate': [0.95, 0.9, 0.85, 0.75, 0.65],  # 374
    'jpeg_compression': [80, 65, 58, 50, 40],  # 364
}


def test_cifar_c_parameters_are_hendrycks():
  from analysis.measures import cifar_c
  assert set(cifar_c.PARAMETERS) == set(CIFAR_C) == set(corruptions.CORRUPTIONS)
  for name, table in CIFAR_C.items():
    for ours, theirs in zip(cifar_c.PARAMETERS[name], table):
      np.testing.assert_allclose(np.asarray(ours, float), np.asarray(theirs, float),
                                 rtol=1e-12, err_msg=name)
  assert corruptions.parameters_for(28) == corruptions.parameters_for(64) == 'cifar'
  assert corruptions.parameters_for(224) == 'imagenet'
  assert corruptions.parameters_for(28, 'imagenet') == 'imagenet'


def authors_cifar_c(x, name, severity):
  """make_cifar_c.py's functions on one uint8 32 px image, those whose code needs
  neither ImageMagick nor its frost pictures, as the file writes them (skimage's
  `multichannel=True` is today's `channel_axis=-1`)."""
  from io import BytesIO
  from PIL import Image
  from scipy.ndimage import zoom as scizoom
  from skimage.filters import gaussian
  import skimage.color
  c = CIFAR_C[name][severity - 1]
  if name == 'gaussian_noise':
    x = np.array(x) / 255.
    return np.clip(x + np.random.normal(size=x.shape, scale=c), 0, 1) * 255
  if name == 'shot_noise':
    x = np.array(x) / 255.
    return np.clip(np.random.poisson(x * c) / c, 0, 1) * 255
  if name == 'glass_blur':
    x = np.uint8(gaussian(np.array(x) / 255., sigma=c[0], channel_axis=-1) * 255)
    for i in range(c[2]):
      for h in range(32 - c[1], c[1], -1):
        for w in range(32 - c[1], c[1], -1):
          dx, dy = np.random.randint(-c[1], c[1], size=(2,))
          h_prime, w_prime = h + dy, w + dx
          x[h, w], x[h_prime, w_prime] = x[h_prime, w_prime], x[h, w]
    return np.clip(gaussian(x / 255., sigma=c[0], channel_axis=-1), 0, 1) * 255
  if name == 'zoom_blur':
    def clipped_zoom(img, zoom_factor):
      h = img.shape[0]
      ch = int(np.ceil(h / zoom_factor))
      top = (h - ch) // 2
      img = scizoom(img[top:top + ch, top:top + ch], (zoom_factor, zoom_factor, 1), order=1)
      trim_top = (img.shape[0] - h) // 2
      return img[trim_top:trim_top + h, trim_top:trim_top + h]
    x = (np.array(x) / 255.).astype(np.float32)
    out = np.zeros_like(x)
    for zoom_factor in c:
      out += clipped_zoom(x, zoom_factor)
    return np.clip((x + out) / (len(c) + 1), 0, 1) * 255
  if name == 'contrast':
    x = np.array(x) / 255.
    means = np.mean(x, axis=(0, 1), keepdims=True)
    return np.clip((x - means) * c + means, 0, 1) * 255
  if name == 'brightness':
    x = skimage.color.rgb2hsv(np.array(x) / 255.)
    x[:, :, 2] = np.clip(x[:, :, 2] + c, 0, 1)
    return np.clip(skimage.color.hsv2rgb(x), 0, 1) * 255
  if name == 'pixelate':
    x = Image.fromarray(x).resize((int(32 * c), int(32 * c)), Image.BOX)
    return x.resize((32, 32), Image.BOX)
  if name == 'jpeg_compression':
    output = BytesIO()
    Image.fromarray(x).save(output, 'JPEG', quality=c)
    return Image.open(output)
  raise KeyError(name)


@pytest.mark.parametrize('severity', [1, 5])
@pytest.mark.parametrize('name', ['gaussian_noise', 'shot_noise', 'glass_blur', 'zoom_blur',
                                  'contrast', 'brightness', 'pixelate', 'jpeg_compression'])
def test_cifar_c_corruptions_are_hendrycks_code(name, severity):
  """The same draws from numpy's generator, and the file's np.uint8 truncation."""
  x = np.random.RandomState(4).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  np.random.seed(11)
  expected = np.stack([np.uint8(authors_cifar_c(p, name, severity))
                       for p in corruptions.to_uint8(x)])
  np.testing.assert_array_equal(corruptions.corrupt(x, name, severity, seed=11),
                                corruptions.to_model(expected))


def test_cifar_c_noise_is_gentler_than_imagenet_c_at_32_px():
  """Gaussian noise at severity 5 on a mid-grey image: std 0.10 (CIFAR-C, which
  hardly clips there) against 0.38 (ImageNet-C, clipped at 0 and 1 to about 0.3)."""
  x = np.zeros((4, 32, 32, 3), np.float32)
  noise = lambda parameters: np.std((corruptions.corrupt(
      x, 'gaussian_noise', 5, seed=0, parameters=parameters) + 1) / 2)
  assert noise('cifar') == pytest.approx(0.10, rel=0.05)
  assert noise('imagenet') > 0.25


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
  vit, bit = subjects['vit'], subjects['bit']
  r = run_on(TOOLS['corruption'], [vit, bit], lambda s: batches, str(tmp_path))
  json.dumps(r)
  assert r['baseline'] == 'bit' and r['num_images'] == 36  # the convolutional model
  assert r['parameters'] == 'cifar'  # 32 px images: CIFAR-C's set
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
    TOOLS['corruption'].run([vit, bit], batches, Options(corruption_baseline='resnet'))
  # A time budget's smaller sample: the first half of the images (whole batches of 12).
  half = TOOLS['corruption'].run([vit, bit], batches, Options(corruption_fraction=0.5))
  assert half['num_images'] == 24 and half['fraction'] == 0.5
  assert half['clean_error']['vit'] == pytest.approx(np.mean(np.concatenate([
      np.asarray(vit.logits(x)).argmax(-1) != y for x, y in list(batches('eval'))[:2]])))


def test_tfds_corruptions_need_cifar10_models(subjects, tmp_path):  # noqa: F811
  with pytest.raises(ConfigError, match='every model must be a CIFAR-10 model'):
    TOOLS['corruption'].run([subjects['vit']], batches, Options(corruptions_from='tfds'))


def test_the_tfds_source_reads_each_corruption_and_severity(subjects, tmp_path, monkeypatch):  # noqa: F811,E501
  from analysis.runtime import features
  read = []

  def corrupted(name, split, image_size, batch_size, num_images, data_dir):
    read.append((name, split, image_size, batch_size, num_images))
    return batches('eval')
  monkeypatch.setattr(features, 'dataset_batches', corrupted)
  vit = subjects['vit']
  vit.recipe.dataset = 'cifar10'
  try:
    r = TOOLS['corruption'].run([vit], batches, Options(corruptions_from='tfds'))
  finally:
    vit.recipe.dataset = ''
  assert len(read) == 75 and read[0] == ('cifar10_corrupted/gaussian_noise_1', 'test', 32, 12, 36)
  assert r['source'] == 'tfds' and r['mce']['vit'] == pytest.approx(1.)


def test_without_the_package_the_tool_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, 'imagecorruptions', None)
  with pytest.raises(UserError, match='pip install imagecorruptions-imaug'):
    corruptions.package()
