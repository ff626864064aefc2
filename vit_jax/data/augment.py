"""Image operations of the input pipeline, in numpy: resizing, the Inception crop,
shifts, flips, RandAugment and mixup.

Resizing is TensorFlow's bilinear `tf.image.resize` (half-pixel centres, no
antialiasing), computed by OpenCV, so images are those the tf.data pipeline
made. The random operations draw from a `np.random.Generator` the caller seeds
from the position of the example or batch in the stream, which makes the stream
a function of (seed, position).
"""
from typing import Callable, Dict, List, Optional, Tuple

import cv2
import numpy as np
import PIL.Image
import PIL.ImageEnhance
import PIL.ImageOps

# The Inception crop's ranges (Szegedy et al., 2015), as the tf.data pipeline drew them.
CROP_AREA = (0.05, 1.0)
CROP_ASPECT = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 100


def to_rgb(image: np.ndarray) -> np.ndarray:
  """An (H, W, 1) or (H, W, 3) image (or a batch of them) with 3 channels."""
  return np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image


def resize(image: np.ndarray, size: Tuple[int, int]) -> np.ndarray:
  """Bilinear resize of an (H, W, C) image to `size` (height, width), as
  `tf.image.resize(image, size, 'bilinear')`: half-pixel centres, no antialiasing.

  OpenCV's `INTER_LINEAR` on float32 computes exactly that (its fixed-point
  arithmetic is for integer images only, so the image is converted first).

  Args:
    image: the image, any numeric dtype.
    size: (height, width).

  Returns:
    The float32 image.
  """
  out = cv2.resize(np.asarray(image, np.float32), (size[1], size[0]),
                   interpolation=cv2.INTER_LINEAR)
  return out.reshape(size + image.shape[2:])


def central_crop(image: np.ndarray, size: int) -> np.ndarray:
  """The central size x size window of an image at least that large on each side
  (`tf.image.resize_with_crop_or_pad` where it crops: the extra pixel of an odd
  margin on the bottom and right)."""
  top, left = (image.shape[0] - size) // 2, (image.shape[1] - size) // 2
  return image[top:top + size, left:left + size]


def eval_resize(image: np.ndarray, size: int, resize_small: Optional[int] = None) -> np.ndarray:
  """Resize to size x size, or resize the short side to `resize_small` then crop the centre.

  Args:
    image: an (H, W, C) image.
    size: the output side.
    resize_small: the short side before the centre crop, or None.

  Returns:
    The float32 (size, size, C) image.
  """
  if resize_small is None:
    return resize(image, (size, size))
  scale = resize_small / min(image.shape[:2])
  shape = tuple(int(np.round(np.float32(d) * np.float32(scale))) for d in image.shape[:2])
  return central_crop(resize(image, shape), size)


def crop_window(height: int, width: int, rng: np.random.Generator) -> Tuple[int, int, int, int]:
  """A random window of 5% to 100% of the image's area with aspect 3/4 to 4/3
  (area and aspect drawn uniformly, as `tf.image.sample_distorted_bounding_box`
  with the Inception crop's ranges); the whole image when 100 draws fit none.

  Args:
    height: the image's height.
    width: the image's width.
    rng: the draws.

  Returns:
    (top, left, crop height, crop width).
  """
  for _ in range(CROP_ATTEMPTS):
    area = rng.uniform(*CROP_AREA) * height * width
    aspect = rng.uniform(*CROP_ASPECT)
    h, w = int(round(np.sqrt(area / aspect))), int(round(np.sqrt(area * aspect)))
    if 0 < h <= height and 0 < w <= width:
      return int(rng.integers(height - h + 1)), int(rng.integers(width - w + 1)), h, w
  return 0, 0, height, width


def inception_crop(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """A random `crop_window` of the image, resized to size x size.

  Args:
    image: an (H, W, C) image.
    size: the output side.
    rng: the draws.

  Returns:
    The float32 (size, size, C) crop.
  """
  top, left, h, w = crop_window(image.shape[0], image.shape[1], rng)
  return resize(image[top:top + h, left:left + w], (size, size))


def pad_and_crop(image: np.ndarray, padding: int, rng: np.random.Generator) -> np.ndarray:
  """Zero-pads `padding` pixels on every side, then crops the original size at
  random: a shift of up to `padding` pixels each way, the CIFAR-style augmentation.

  Args:
    image: an (H, W, C) image.
    padding: pixels added on each side.
    rng: the draws.

  Returns:
    The shifted image, of the original size.
  """
  padded = np.pad(image, [(padding, padding), (padding, padding), (0, 0)])
  top, left = rng.integers(2 * padding + 1, size=2)
  return padded[top:top + image.shape[0], left:left + image.shape[1]]


def mirrored(count: int, rng: np.random.Generator) -> np.ndarray:
  """Which of `count` images to mirror left-right: each with probability 1/2.

  Args:
    count: the images.
    rng: the draws.

  Returns:
    A bool per image.
  """
  return rng.random(count) < 0.5


def mixup(batch: Dict[str, np.ndarray], alpha: float,
          rng: np.random.Generator) -> Dict[str, np.ndarray]:
  """Mixes each example with the batch in reverse order, weight ~ Beta(alpha, alpha)
  (Zhang et al., 2018), images and label distributions alike.

  Args:
    batch: {'image', 'label'} of one batch, labels one-hot.
    alpha: the Beta distribution's parameter.
    rng: the draws.

  Returns:
    The mixed batch.
  """
  weight = np.float32(rng.beta(alpha, alpha))
  mix = lambda x: weight * x + (1 - weight) * x[::-1]
  return {**batch, 'image': mix(batch['image']), 'label': mix(batch['label'])}


# ---------------------------------------------------------------------------
# RandAugment (Cubuk et al., 2020): `layers` operations drawn uniformly from
# OPERATIONS, each at `magnitude` of 10, with a random sign where the operation
# has a direction. The magnitudes map as in the paper's ImageNet policy code
# (the ranges of AutoAugment, Cubuk et al., 2019, Table 6).

_FILL = (128, 128, 128)


def _signed(value: float, rng: np.random.Generator) -> float:
  return value if rng.random() < 0.5 else -value


def _affine(image: PIL.Image.Image, matrix: Tuple[float, ...]) -> PIL.Image.Image:
  return image.transform(image.size, PIL.Image.AFFINE, matrix, resample=PIL.Image.NEAREST,
                         fillcolor=_FILL)


def _enhance(enhancer: Callable) -> Callable:
  # The enhancements' factor: 1 is the identity; magnitude 10 moves it by 0.9 either way.
  return lambda image, m, rng: enhancer(image).enhance(1 + _signed(0.09 * m, rng))


OPERATIONS: Dict[str, Callable[[PIL.Image.Image, float, np.random.Generator],
                               PIL.Image.Image]] = {
    'AutoContrast': lambda image, m, rng: PIL.ImageOps.autocontrast(image),
    'Equalize': lambda image, m, rng: PIL.ImageOps.equalize(image),
    'Invert': lambda image, m, rng: PIL.ImageOps.invert(image),
    'Rotate': lambda image, m, rng: image.rotate(_signed(3 * m, rng), fillcolor=_FILL),
    'Posterize': lambda image, m, rng: PIL.ImageOps.posterize(image, 8 - int(0.4 * m)),
    'Solarize': lambda image, m, rng: PIL.ImageOps.solarize(image, 256 - int(25.6 * m)),
    'SolarizeAdd': lambda image, m, rng: PIL.Image.fromarray(np.where(
        np.asarray(image) < 128, np.minimum(np.asarray(image) + int(11 * m), 255),
        np.asarray(image)).astype(np.uint8)),
    'Color': _enhance(PIL.ImageEnhance.Color),
    'Contrast': _enhance(PIL.ImageEnhance.Contrast),
    'Brightness': _enhance(PIL.ImageEnhance.Brightness),
    'Sharpness': _enhance(PIL.ImageEnhance.Sharpness),
    'ShearX': lambda image, m, rng: _affine(image, (1, _signed(0.03 * m, rng), 0, 0, 1, 0)),
    'ShearY': lambda image, m, rng: _affine(image, (1, 0, 0, _signed(0.03 * m, rng), 1, 0)),
    # Translations up to 45% of the side (the paper's 100 px of ImageNet's 224 px).
    'TranslateX': lambda image, m, rng: _affine(
        image, (1, 0, _signed(0.045 * m * image.size[0], rng), 0, 1, 0)),
    'TranslateY': lambda image, m, rng: _affine(
        image, (1, 0, 0, 0, 1, _signed(0.045 * m * image.size[1], rng))),
}


def randaugment(image: np.ndarray, layers: int, magnitude: float,
                rng: np.random.Generator) -> np.ndarray:
  """RandAugment: `layers` operations drawn uniformly from OPERATIONS, applied in
  turn at `magnitude` (0 to 10).

  Args:
    image: an (H, W, 3) image with values in [0, 255].
    layers: the operations per image.
    magnitude: their strength, 0 to 10.
    rng: the draws.

  Returns:
    The uint8 image.
  """
  picture = PIL.Image.fromarray(np.clip(np.round(image), 0, 255).astype(np.uint8))
  names: List[str] = list(OPERATIONS)
  for index in rng.integers(len(names), size=layers):
    picture = OPERATIONS[names[index]](picture, magnitude, rng)
  return np.asarray(picture)
