"""Frequency content of feature maps (Park & Kim 2022, Fig. 2 and 8): relative log
amplitudes of the 2-D Fourier transform, feature-map variance, and noise confined
to a band of spatial frequencies for robustness tests.

Feature maps are (B, h, w, C) arrays; ViT tokens go through
`analysis.features.tokens_to_grid` first (class token dropped).
"""
import jax
import jax.numpy as jnp
import numpy as np


def log_amplitude(fmap: jax.Array) -> jax.Array:
  """(h, w) log amplitude of the per-image, per-channel 2-D FFT, zero frequency
  shifted to the centre (index h//2, w//2), averaged over images and channels."""
  spectrum = jnp.fft.fftshift(jnp.fft.fft2(fmap, axes=(1, 2)), axes=(1, 2))
  return jnp.mean(jnp.log(jnp.abs(spectrum) + 1e-12), axis=(0, 3))


def relative_log_amplitude(fmap: jax.Array) -> jax.Array:
  """Log amplitude along the diagonal from zero frequency outwards, minus its value at
  zero frequency: (min(h, w)//2 + 1,), entry i at i/(size//2) of the highest
  frequency on the grid (pi for even sizes, pi (size-1)/size for odd ones).
  The amplitude of a real map is symmetric, so one direction suffices."""
  amplitude = log_amplitude(fmap)
  h, w = amplitude.shape
  steps = min(h, w) // 2
  rows = h // 2 - jnp.arange(steps + 1)  # fftshift puts -pi at index 0
  cols = w // 2 - jnp.arange(steps + 1)
  diagonal = amplitude[rows % h, cols % w]
  return diagonal - diagonal[0]


def normalised_frequencies(size: int) -> np.ndarray:
  """Frequencies of `relative_log_amplitude` as fractions of the highest one."""
  return np.arange(size // 2 + 1) / (size // 2)


def spatial_variance(fmap: jax.Array) -> jax.Array:
  """Variance over spatial positions, averaged over channels and images."""
  return jnp.mean(jnp.var(fmap, axis=(1, 2)))


def band_noise(key: jax.Array, shape, band: tuple, norm: float) -> jax.Array:
  """White noise keeping only radial frequencies in [band[0], band[1]) (as a fraction
  of the highest, pi), rescaled to L2 norm `norm` per image. shape = (B, H, W, C)."""
  _, h, w, _ = shape
  fy = np.abs(np.fft.fftfreq(h))[:, None] * 2
  fx = np.abs(np.fft.fftfreq(w))[None, :] * 2
  radius = np.sqrt(fy**2 + fx**2) / np.sqrt(2)
  mask = jnp.asarray(((radius >= band[0]) & (radius < band[1])).astype(np.float32))
  spectrum = jnp.fft.fft2(jax.random.normal(key, shape), axes=(1, 2)) * mask[None, :, :, None]
  noise = jnp.real(jnp.fft.ifft2(spectrum, axes=(1, 2)))
  norms = jnp.sqrt(jnp.sum(noise**2, axis=(1, 2, 3), keepdims=True))
  return norm * noise / jnp.maximum(norms, 1e-12)
