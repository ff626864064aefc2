"""Frequency content of feature maps (Park & Kim 2022, Fig. 2, 8 and 9): relative log
amplitudes of the 2-D Fourier transform, feature-map variance, and noise confined
to a band of spatial frequencies for robustness tests, each as the authors'
code (how-do-vits-work) computes it.

Feature maps are (B, h, w, C) arrays; ViT tokens go through
`analysis.runtime.features.tokens_to_grid` first (class token dropped).
"""
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np


def log_amplitude(fmap: jax.Array) -> jax.Array:
  """(h, w) log(|FFT| + 1e-6) of every image and channel, zero frequency shifted to
  index (h//2, w//2) (torch.roll by (h//2, w//2), as the authors shift), averaged
  over images and channels.

  Args:
    fmap: (B, h, w, C) feature maps.

  Returns:
    The (h, w) mean log amplitude.
  """
  spectrum = jnp.fft.fftshift(jnp.fft.fft2(fmap, axes=(1, 2)), axes=(1, 2))
  return jnp.mean(jnp.log(jnp.abs(spectrum) + 1e-6), axis=(0, 3))


def relative_log_amplitude(fmap: jax.Array) -> jax.Array:
  """The authors' curve (Park & Kim, how-do-vits-work `fourier_analysis.ipynb`): the
  main diagonal of `log_amplitude` from index h//2 on, minus its first entry.

  For a square map of side n: ceil(n/2) entries, zero frequency first, entry i at
  frequency 2*pi*i/n on both axes; the last (the "high frequency" of their depth
  plot) is at pi*(n-1)/n for odd n and pi*(n-2)/n for even n (the Nyquist bin
  (pi, pi) of even sizes is not on this half-diagonal). A 1x1 map gives [0].
  Non-square maps (h, w) follow torch's `diag`: entries (i, i) for i from h//2
  to min(h, w) - 1, which start at zero frequency only when h//2 == w//2.

  Args:
    fmap: (B, h, w, C) feature maps.

  Returns:
    The curve, zero frequency first (its entry 0).
  """
  amplitude = log_amplitude(fmap)
  h, w = amplitude.shape
  if min(h, w) <= h // 2:
    raise ValueError(f'A {h}x{w} map has no diagonal entries from row {h // 2} on.')
  diagonal = jnp.diagonal(amplitude)[h // 2:]
  return diagonal - diagonal[0]


def curve_positions(length: int) -> np.ndarray:
  """Where the authors draw a curve of `length` entries: linspace(0, 1, length),
  labelled as fractions of pi, whatever the map size.

  Args:
    length: the curve's entries.

  Returns:
    Their x positions, in units of pi.
  """
  return np.linspace(0, 1, length) if length > 1 else np.zeros(1)


def spatial_variance(fmap: jax.Array) -> jax.Array:
  """Unbiased variance (n - 1) over spatial positions, averaged over channels and
  images: torch's `var` over (h, w), as the authors compute it. NaN for 1x1 maps.

  Args:
    fmap: (B, h, w, C) feature maps.

  Returns:
    The mean variance, a scalar.
  """
  return jnp.mean(jnp.var(fmap, axis=(1, 2), ddof=1))


def band_mask(size: int, f: float, s: float = 0.2) -> np.ndarray:
  """The authors' frequency mask (`FreqAttack._fourier_mask`) on a centre-shifted
  (size, size) spectrum: the centred square of side 2*int((f + s) size / 2 pi)
  less the one of side 2*int((f - s) size / 2 pi), sides clipped to [0, size].

  Args:
    size: the spectrum's side.
    f: the band's centre frequency, in [0, pi].
    s: its half-width.

  Returns:
    The (size, size) 0/1 mask.
  """
  def centred_square(side: int) -> np.ndarray:
    side = min(max(side, 0), size)
    start = (size - side) // 2
    square = np.zeros((size, size), np.float32)
    square[start:start + side, start:start + side] = 1
    return square
  return (centred_square(int((f + s) * size / (2 * np.pi)) * 2)
          - centred_square(int((f - s) * size / (2 * np.pi)) * 2))


def band_limited(noise: jax.Array, f: float, s: float = 0.2) -> jax.Array:
  """`noise` (B, n, n, C) with its centre-shifted spectrum multiplied by `band_mask`
  (amplitude masked, phase kept), transformed back, real part, not renormalised.

  For odd n the authors' second roll by n//2 does not undo the first; this uses
  the inverse shift, so the two agree for the even sizes their code runs on.

  Args:
    noise: (B, n, n, C) noise.
    f: the band's centre frequency, in [0, pi].
    s: its half-width.

  Returns:
    The band-limited noise, (B, n, n, C).
  """
  h, w = noise.shape[1:3]
  if h != w:
    raise ValueError(f'Frequency-band noise needs square images, got {h}x{w}.')
  spectrum = jnp.fft.fftshift(jnp.fft.fft2(noise, axes=(1, 2)), axes=(1, 2))
  spectrum = spectrum * band_mask(h, f, s)[None, :, :, None]
  return jnp.real(jnp.fft.ifft2(jnp.fft.ifftshift(spectrum, axes=(1, 2)), axes=(1, 2)))


def frequency_noise(key: jax.Array, shape: Tuple[int, ...], f: float, eps: float,
                    s: float = 0.2) -> jax.Array:
  """The authors' `FreqAttack` over their `Random` attack: eps * sign(N(0, 1)) noise
  confined to the square band of frequencies around `f` (in [0, pi]) of half-width
  `s`.

  Args:
    key: the noise's randomness.
    shape: (B, n, n, C).
    f: the band's centre frequency, in [0, pi].
    eps: the noise's amplitude before the band limit.
    s: the band's half-width.

  Returns:
    The noise, of `shape`.
  """
  return band_limited(eps * jnp.sign(jax.random.normal(key, shape)), f, s)


def radial_band_noise(key: jax.Array, shape: Tuple[int, ...], band: Tuple[float, float],
                      norm: float) -> jax.Array:
  """White noise keeping only radial frequencies in [band[0], band[1]) as fractions
  of the corner frequency sqrt(2) pi, rescaled to L2 norm `norm` per image (equal
  energy in every band): an alternative to the authors' protocol.

  Args:
    key: the noise's randomness.
    shape: (B, H, W, C).
    band: [low, high) radial frequencies, fractions of sqrt(2) pi.
    norm: each image's noise L2 norm.

  Returns:
    The noise, of `shape`.
  """
  _, h, w, _ = shape
  fy = np.abs(np.fft.fftfreq(h))[:, None] * 2
  fx = np.abs(np.fft.fftfreq(w))[None, :] * 2
  radius = np.sqrt(fy**2 + fx**2) / np.sqrt(2)
  mask = jnp.asarray(((radius >= band[0]) & (radius < band[1])).astype(np.float32))
  spectrum = jnp.fft.fft2(jax.random.normal(key, shape), axes=(1, 2)) * mask[None, :, :, None]
  noise = jnp.real(jnp.fft.ifft2(spectrum, axes=(1, 2)))
  norms = jnp.sqrt(jnp.sum(noise**2, axis=(1, 2, 3), keepdims=True))
  return norm * noise / jnp.maximum(norms, 1e-12)
