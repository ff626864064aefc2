"""The 15 ImageNet-C corruptions at 5 severities (Hendrycks & Dietterich 2019), as
the `imagecorruptions` package applies them, on the analysis's images, and the
mean corruption error.

The package refuses images under 32 x 32 pixels (one check for every corruption;
each of the 15 runs at 28 x 28 when called past that check). Smaller images, such
as Fashion-MNIST's 28 px, are reflect-padded to 32, corrupted and cropped back to
their centre, so every corruption keeps the package's own parameters; the
corruption then also sees the reflected border. Greyscale images come as three
equal channels (the pipeline's), and keep three channels: frost and snow add
colour as they do to any image. The tool corrupts each batch once and shows the
same images to every model.
"""
from typing import Dict, Sequence

import numpy as np

from vit_jax.errors import UserError

CORRUPTIONS = ('gaussian_noise', 'shot_noise', 'impulse_noise', 'defocus_blur', 'glass_blur',
               'motion_blur', 'zoom_blur', 'snow', 'frost', 'fog', 'brightness', 'contrast',
               'elastic_transform', 'pixelate', 'jpeg_compression')
SEVERITIES = (1, 2, 3, 4, 5)
MIN_SIZE = 32  # the package's smallest image side
# Corruptions that draw from generators of their own, seeded through an argument;
# the others draw from numpy's global generator.
SEEDED = ('impulse_noise', 'glass_blur')


def package():
  """The `imagecorruptions` module, or a UserError saying what to install."""
  try:
    import imagecorruptions
  except ImportError as e:
    raise UserError(
        'The corruption tool applies the ImageNet-C corruptions with the imagecorruptions '
        f'package, which is not installed ({e}): pip install imagecorruptions-imaug (the '
        'maintained build for current numpy and scikit-image).') from None
  return imagecorruptions


def to_uint8(images: np.ndarray) -> np.ndarray:
  """Images in [-1, 1] (the pipeline's) as uint8 in [0, 255]."""
  return np.clip(np.round((np.asarray(images, np.float32) + 1.) * 127.5), 0, 255).astype(np.uint8)


def to_model(images: np.ndarray) -> np.ndarray:
  """uint8 images back in [-1, 1]."""
  return images.astype(np.float32) / 127.5 - 1.


def corrupt(images: np.ndarray, name: str, severity: int, seed: int) -> np.ndarray:
  """`images` (B, H, W, 3) in [-1, 1] under corruption `name` at `severity`, in
  [-1, 1]; `seed` fixes the package's random draws, so that a run is repeatable."""
  if name not in CORRUPTIONS or severity not in SEVERITIES:
    raise ValueError(f'Unknown corruption {name!r} or severity {severity}: the corruptions '
                     f'are {", ".join(CORRUPTIONS)} at severities 1-5.')
  corrupt_one = package().corrupt
  pixels = to_uint8(images)
  height, width = pixels.shape[1:3]
  pad_h, pad_w = max(MIN_SIZE - height, 0), max(MIN_SIZE - width, 0)
  pads = ((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0))
  state = np.random.get_state()
  np.random.seed(seed)
  try:
    out = np.stack([corrupt_one(np.pad(image, pads, mode='reflect'), severity, name,
                                **({'seed': seed + i} if name in SEEDED else {}))
                    for i, image in enumerate(pixels)])
  finally:
    np.random.set_state(state)
  return to_model(out[:, pads[0][0]:pads[0][0] + height, pads[1][0]:pads[1][0] + width])


def corruption_errors(errors: Dict[str, Sequence[float]], clean: float,
                      baseline: Dict[str, Sequence[float]], baseline_clean: float
                      ) -> Dict[str, float]:
  """Hendrycks & Dietterich's corruption errors of a model against a baseline model:
  per corruption CE = sum_s E_s / sum_s E^base_s, mCE their mean over corruptions,
  and the relative mCE from sum_s (E_s - E_clean) / sum_s (E^base_s - E^base_clean)
  (None where the baseline's corrupted errors equal its clean one)."""
  ce = {c: float(np.sum(errors[c]) / np.sum(baseline[c])) for c in errors}
  relative = {}
  for c in errors:
    gap = np.sum(np.asarray(baseline[c]) - baseline_clean)
    relative[c] = float(np.sum(np.asarray(errors[c]) - clean) / gap) if gap > 0 else None
  finite = [v for v in relative.values() if v is not None]
  return {'ce': ce, 'mce': float(np.mean(list(ce.values()))), 'relative_ce': relative,
          'relative_mce': float(np.mean(finite)) if finite else None}
