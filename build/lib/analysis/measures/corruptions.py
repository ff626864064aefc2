"""The 15 corruptions of Hendrycks & Dietterich (2019) at 5 severities on the
analysis's images, and the mean corruption error.

Two parameter sets: 'cifar', CIFAR-10-C's (`analysis.measures.cifar_c`, written from
Hendrycks' `make_cifar_c.py` for 32 px images), and 'imagenet', ImageNet-C's as
the `imagecorruptions` package applies them (written for 224 px: at 32 px its
Gaussian noise has std 0.08-0.38 where CIFAR-C's has 0.04-0.10). `parameters_for`
picks CIFAR-C's for images up to 64 px, as Park & Kim's CIFAR-C results use.

The package refuses images under 32 x 32 pixels (one check for every corruption;
each of the 15 runs at 28 x 28 when called past that check). With ImageNet-C's
set, smaller images, such as Fashion-MNIST's 28 px, are reflect-padded to 32,
corrupted and cropped back to their centre, so every corruption keeps the
package's own parameters; the corruption then also sees the reflected border.
Greyscale images come as three equal channels (the pipeline's), and keep three
channels: frost and snow add colour as they do to any image. The tool corrupts
each batch once and shows the same images to every model.
"""
from typing import Dict, Sequence

import numpy as np

from analysis.measures import cifar_c
from vit_jax.errors import UserError

CORRUPTIONS = ('gaussian_noise', 'shot_noise', 'impulse_noise', 'defocus_blur', 'glass_blur',
               'motion_blur', 'zoom_blur', 'snow', 'frost', 'fog', 'brightness', 'contrast',
               'elastic_transform', 'pixelate', 'jpeg_compression')
SEVERITIES = (1, 2, 3, 4, 5)
MIN_SIZE = 32  # the package's smallest image side
PARAMETER_SETS = ('cifar', 'imagenet')
CIFAR_MAX_SIZE = 64  # images up to this side get CIFAR-C's parameters by default
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
  """Images in [-1, 1] (the pipeline's) as uint8 in [0, 255].

  Args:
    images: images in [-1, 1].

  Returns:
    The uint8 images.
  """
  return np.clip(np.round((np.asarray(images, np.float32) + 1.) * 127.5), 0, 255).astype(np.uint8)


def to_model(images: np.ndarray) -> np.ndarray:
  """uint8 images back in [-1, 1].

  Args:
    images: uint8 images.

  Returns:
    float32 images in [-1, 1].
  """
  return images.astype(np.float32) / 127.5 - 1.


def parameters_for(image_size: int, parameters: str = 'auto') -> str:
  """The parameter set for images of side `image_size`: `parameters` itself, or for
  'auto' CIFAR-C's up to `CIFAR_MAX_SIZE` px and ImageNet-C's above.

  Args:
    image_size: the images' side in pixels.
    parameters: 'auto', 'cifar' or 'imagenet'.

  Returns:
    'cifar' or 'imagenet'.
  """
  if parameters == 'auto':
    return 'cifar' if image_size <= CIFAR_MAX_SIZE else 'imagenet'
  if parameters not in PARAMETER_SETS:
    raise ValueError(f'Unknown corruption parameters {parameters!r}; use auto or one of '
                     f'{", ".join(PARAMETER_SETS)}.')
  return parameters


def corrupt(images: np.ndarray, name: str, severity: int, seed: int,
            parameters: str = 'cifar') -> np.ndarray:
  """`images` under corruption `name` at `severity`.

  Args:
    images: (B, H, W, 3) in [-1, 1].
    name: one of `CORRUPTIONS`.
    severity: one of `SEVERITIES`.
    seed: fixes the random draws, so that a run is repeatable.
    parameters: 'cifar' (CIFAR-C's, `analysis.measures.cifar_c`) or 'imagenet'
      (ImageNet-C's, through the package; module docstring).

  Returns:
    The corrupted images, (B, H, W, 3) in [-1, 1].
  """
  if name not in CORRUPTIONS or severity not in SEVERITIES:
    raise ValueError(f'Unknown corruption {name!r} or severity {severity}: the corruptions '
                     f'are {", ".join(CORRUPTIONS)} at severities 1-5.')
  if parameters not in PARAMETER_SETS:
    raise ValueError(f'Unknown corruption parameters {parameters!r}; use one of '
                     f'{", ".join(PARAMETER_SETS)}.')
  package()  # both sets use its helpers
  pixels = to_uint8(images)
  state = np.random.get_state()
  np.random.seed(seed)
  try:
    if parameters == 'cifar':
      # np.uint8 truncates, as the file's `np.uint8(corruption(...))` does.
      return to_model(np.stack([np.uint8(cifar_c.corrupt_one(image, name, severity))
                                for image in pixels]))
    height, width = pixels.shape[1:3]
    pad_h, pad_w = max(MIN_SIZE - height, 0), max(MIN_SIZE - width, 0)
    pads = ((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0))
    out = np.stack([package().corrupt(np.pad(image, pads, mode='reflect'), severity, name,
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
  (None where the baseline's corrupted errors equal its clean one).

  Args:
    errors: the model's error per corruption, one per severity.
    clean: its clean error.
    baseline: the baseline model's errors, the same keys.
    baseline_clean: its clean error.

  Returns:
    {'ce', 'mce', 'relative_ce', 'relative_mce'}.
  """
  ce = {c: float(np.sum(errors[c]) / np.sum(baseline[c])) for c in errors}
  relative = {}
  for c in errors:
    gap = np.sum(np.asarray(baseline[c]) - baseline_clean)
    relative[c] = float(np.sum(np.asarray(errors[c]) - clean) / gap) if gap > 0 else None
  finite = [v for v in relative.values() if v is not None]
  return {'ce': ce, 'mce': float(np.mean(list(ce.values()))), 'relative_ce': relative,
          'relative_mce': float(np.mean(finite)) if finite else None}
