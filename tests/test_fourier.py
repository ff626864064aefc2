"""Feature-map frequency tools: the authors' formulas written out in numpy, and maps
with known spectra."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import ndimage

from analysis.measures import frequency

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


def noise(shape=(64, 16, 16, 8), seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


# Park & Kim, github.com/xxxnell/how-do-vits-work, fourier_analysis.ipynb: fourier(),
# shift() and the loop over latents, in numpy on (B, C, h, w) as torch lays them out.
def authors_relative_log_amplitude(fmap):
  x = np.transpose(np.asarray(fmap, np.float64), (0, 3, 1, 2))
  b, c, h, w = x.shape
  f = np.log(np.abs(np.fft.fft2(x)) + 1e-6)
  f = np.roll(f, shift=(int(h / 2), int(w / 2)), axis=(2, 3)).mean(axis=(0, 1))
  latent = np.diagonal(f)[int(h / 2):]
  return latent - latent[0]


# featuremap_variance.ipynb: latent.var(dim=[-1, -2]).mean(dim=[0, 1]); torch's var is
# unbiased by default.
def authors_variance(fmap):
  x = np.transpose(np.asarray(fmap, np.float64), (0, 3, 1, 2))
  return x.var(axis=(-1, -2), ddof=1).mean(axis=(0, 1))


# ops/adversarial.py: FreqAttack._fourier_mask and _center_mask, with F.pad's
# placement of the ones, on (B, C, n, n) noise.
def authors_band_limited(noise_bchw, f, s=0.2):
  b, c, h, w = noise_bchw.shape
  def center_mask(w1, w2):
    w1 = w2 if w1 > w2 else w1
    w1 = 0 if w1 < 0 else w1
    pad = int((w2 - w1) / 2)
    return np.pad(np.ones((w1, w1)), pad)
  shift = lambda x: np.roll(x, shift=(int(h / 2), int(w / 2)), axis=(2, 3))
  x = shift(np.fft.fft2(noise_bchw))
  mask = (center_mask(int(((f + s) * h) / (2 * np.pi)) * 2, h)
          - center_mask(int(((f - s) * h) / (2 * np.pi)) * 2, h))
  x = mask * np.abs(x) * np.exp(1j * np.angle(x))
  return np.fft.ifft2(shift(x)).real


@pytest.mark.parametrize('shape', [(1, 1), (4, 4), (7, 7), (14, 14), (16, 16), (6, 8), (8, 5)])
def test_relative_log_amplitude_is_the_authors_curve(shape):
  x = noise((5,) + shape + (3,), seed=sum(shape)) * 3 + 1
  expected = authors_relative_log_amplitude(x)
  curve = np.asarray(frequency.relative_log_amplitude(x))
  assert not np.isnan(curve).any()
  # float32 FFT and logs of values O(1-100): 1e-4 absolute.
  np.testing.assert_allclose(curve, expected, atol=1e-4)
  if shape[0] == shape[1]:
    assert len(curve) == (shape[0] + 1) // 2


@pytest.mark.parametrize('shape', [(4, 4), (7, 7), (14, 14), (16, 16), (6, 8)])
def test_spatial_variance_is_the_authors_unbiased_variance(shape):
  x = noise((5,) + shape + (3,), seed=sum(shape)) * 2 + 0.5
  np.testing.assert_allclose(frequency.spatial_variance(x), authors_variance(x), rtol=1e-5)
  assert np.isnan(frequency.spatial_variance(np.ones((2, 1, 1, 3), np.float32)))


@pytest.mark.parametrize('size', [4, 14, 16, 28, 32])
@pytest.mark.parametrize('f', [0., 0.4, 1.0, 1.9, 2.6, np.pi])
def test_band_limited_noise_is_the_authors_freq_attack(size, f):
  sign_noise = np.sign(noise((3, size, size, 2), seed=size))
  expected = authors_band_limited(np.transpose(sign_noise, (0, 3, 1, 2)), f)
  out = frequency.band_limited(jnp.asarray(sign_noise), f)
  np.testing.assert_allclose(np.transpose(np.asarray(out), (0, 3, 1, 2)), expected, atol=1e-5)


def test_odd_sizes_shift_back_with_the_inverse_shift():
  x = noise((2, 7, 7, 1))
  # The full band keeps everything: the noise comes back unchanged.
  np.testing.assert_allclose(frequency.band_limited(jnp.asarray(x), np.pi, 10.), x, atol=1e-5)
  with pytest.raises(ValueError, match='square'):
    frequency.band_limited(jnp.zeros((1, 6, 8, 1)), 1.)


def test_frequency_noise_is_signed_noise_of_size_eps_in_its_band():
  full = frequency.frequency_noise(jax.random.PRNGKey(0), (2, 16, 16, 3), np.pi, 0.1, s=10.)
  np.testing.assert_allclose(np.abs(full), 0.1, rtol=1e-4)
  low = frequency.frequency_noise(jax.random.PRNGKey(0), (2, 16, 16, 3), 0., 0.1)
  # f = 0 with s = 0.2 keeps a 0x0 square at 16 px: nothing passes.
  np.testing.assert_allclose(low, 0., atol=1e-7)


def test_white_noise_gives_a_flat_curve():
  curve = np.asarray(frequency.relative_log_amplitude(noise()))
  assert curve.shape == (8,)
  # Zero frequency is a real-valued FFT bin whose log amplitude has another mean
  # (E log|N(0,1)| vs E log|CN(0,1)|); the complex bins after it are flat.
  inner = curve[1:]
  assert inner.max() - inner.min() < 0.05


@pytest.mark.parametrize('size', [14, 7])
def test_box_blur_lowers_and_laplacian_raises_high_frequencies(size):
  x = noise((64, size, size, 4))
  blur = ndimage.uniform_filter(x, size=(1, 3, 3, 1), mode='wrap')
  stencil = np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], np.float32)[None, :, :, None]
  laplacian = ndimage.convolve(x, stencil, mode='wrap')
  base = frequency.relative_log_amplitude(x)[-1]
  assert frequency.relative_log_amplitude(blur)[-1] < base - 1.
  assert frequency.relative_log_amplitude(laplacian)[-1] > base + 1.


def test_circular_shift_changes_nothing():
  x = noise((8, 12, 12, 3))
  shifted = np.roll(x, (3, -5), axis=(1, 2))
  chex.assert_trees_all_close(frequency.relative_log_amplitude(shifted),
                              frequency.relative_log_amplitude(x), atol=1e-4)


def test_variance_of_constant_is_zero_and_blur_lowers_it():
  assert float(frequency.spatial_variance(jnp.full((2, 5, 5, 3), 7.))) == 0.
  x = noise((16, 16, 16, 4))
  blur = ndimage.uniform_filter(x, size=(1, 3, 3, 1), mode='wrap')
  assert frequency.spatial_variance(blur) < 0.5 * frequency.spatial_variance(x)


def test_radial_band_noise_stays_in_its_band_and_has_the_norm():
  low = frequency.radial_band_noise(jax.random.PRNGKey(0), (4, 32, 32, 3), (0., 0.2), 5.)
  high = frequency.radial_band_noise(jax.random.PRNGKey(0), (4, 32, 32, 3), (0.7, 1.01), 5.)
  np.testing.assert_allclose(jnp.sqrt(jnp.sum(low**2, axis=(1, 2, 3))), 5., rtol=1e-5)
  # Low-band noise is smooth: far higher neighbour correlation than high-band noise.
  correlation = lambda z: float(jnp.mean(z[:, 1:] * z[:, :-1]) / jnp.mean(z * z))
  assert correlation(low) > 0.8 and correlation(high) < -0.3
