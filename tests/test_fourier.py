"""Feature-map frequency tools on maps with known spectra."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import ndimage

from analysis import fourier


def noise(shape=(64, 16, 16, 8), seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def test_white_noise_gives_a_flat_curve():
  curve = np.asarray(fourier.relative_log_amplitude(noise()))
  assert curve.shape == (9,)
  # Zero frequency and (pi, pi) are real-valued FFT bins whose log amplitude has
  # another mean (E log|N(0,1)| vs E log|CN(0,1)|); the complex bins between are flat.
  inner = curve[1:-1]
  assert inner.max() - inner.min() < 0.05


@pytest.mark.parametrize('size', [14, 7])
def test_box_blur_lowers_and_laplacian_raises_high_frequencies(size):
  x = noise((64, size, size, 4))
  blur = ndimage.uniform_filter(x, size=(1, 3, 3, 1), mode='wrap')
  stencil = np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], np.float32)[None, :, :, None]
  laplacian = ndimage.convolve(x, stencil, mode='wrap')
  base = fourier.relative_log_amplitude(x)[-1]
  assert fourier.relative_log_amplitude(blur)[-1] < base - 1.
  assert fourier.relative_log_amplitude(laplacian)[-1] > base + 1.


def test_circular_shift_changes_nothing():
  x = noise((8, 12, 12, 3))
  shifted = np.roll(x, (3, -5), axis=(1, 2))
  chex.assert_trees_all_close(fourier.relative_log_amplitude(shifted),
                              fourier.relative_log_amplitude(x), atol=1e-4)


def test_variance_of_constant_is_zero_and_blur_lowers_it():
  assert float(fourier.spatial_variance(jnp.full((2, 5, 5, 3), 7.))) == 0.
  x = noise((16, 16, 16, 4))
  blur = ndimage.uniform_filter(x, size=(1, 3, 3, 1), mode='wrap')
  np.testing.assert_allclose(fourier.spatial_variance(x), np.mean(np.var(x, axis=(1, 2))),
                             rtol=1e-5)
  assert fourier.spatial_variance(blur) < 0.5 * fourier.spatial_variance(x)


def test_band_noise_stays_in_its_band_and_has_the_norm():
  low = fourier.band_noise(jax.random.PRNGKey(0), (4, 32, 32, 3), (0., 0.2), 5.)
  high = fourier.band_noise(jax.random.PRNGKey(0), (4, 32, 32, 3), (0.7, 1.01), 5.)
  np.testing.assert_allclose(jnp.sqrt(jnp.sum(low**2, axis=(1, 2, 3))), 5., rtol=1e-5)
  # Low-band noise is smooth: far higher neighbour correlation than high-band noise.
  correlation = lambda z: float(jnp.mean(z[:, 1:] * z[:, :-1]) / jnp.mean(z * z))
  assert correlation(low) > 0.8 and correlation(high) < -0.3
