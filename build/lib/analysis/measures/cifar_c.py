"""The 15 corruptions of CIFAR-10-C and CIFAR-100-C (Hendrycks & Dietterich 2019)
with the parameters Hendrycks wrote for 32 px images, which Park & Kim's
robustness results rest on.

Each function follows `make_cifar_c.py` (hendrycks/robustness,
`ImageNet-C/create_c/make_cifar_c.py`; the line of each parameter table is in
`PARAMETERS`): it takes one uint8 image (H, W, 3) and the severity's parameters
and returns floats in [0, 255] (the caller rounds, as the authors' uint8 save
does). Three places needed more than the file gives:
- its motion blur (motion blur, snow) calls ImageMagick through `wand`; here the
  `imagecorruptions` package's numpy rewrite of that blur (`_motion_blur`) runs
  instead, as it does in that package's own ImageNet-C corruptions;
- the diamond-square fractal of fog is that package's `plasma_fractal` (float32
  where Hendrycks' is float64) and the frost pictures are the ones it ships;
- images other than 32 x 32 (Fashion-MNIST's 28 px, up to 64 px): the fixed 32 of
  the file (glass blur's pixel loop, fog's 32 x 32 fractal, elastic transform's
  IMSIZE, pixelate's and frost's crop sizes) becomes the image's own side.
Random draws come from numpy's global generator, as in the file; `corruptions`
seeds it per batch and restores it after.
"""
import functools
from io import BytesIO
from typing import Any, Callable, Dict, Sequence

import numpy as np
from PIL import Image
from scipy.ndimage import map_coordinates, zoom as scizoom

# Per corruption, the parameters of severities 1-5, each with the line of
# make_cifar_c.py that holds them.
PARAMETERS: Dict[str, Sequence] = {
    'gaussian_noise': (0.04, 0.06, .08, .09, .10),  # line 131
    'shot_noise': (500, 250, 100, 75, 50),  # line 138
    'impulse_noise': (.01, .02, .03, .05, .07),  # line 145
    'defocus_blur': ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),  # line 184
    'glass_blur': ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),  # 167
    'motion_blur': ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),  # line 198
    'zoom_blur': tuple(np.arange(1, top, 0.01) for top in (1.06, 1.11, 1.16, 1.21, 1.26)),  # 216
    'snow': ((0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),  # lines 251-255
             (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
             (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)),
    'frost': ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)),  # line 238
    'fog': ((.2, 3), (.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)),  # line 229
    'brightness': (.05, .1, .15, .2, .3),  # line 342
    'contrast': (.75, .5, .4, .3, 0.15),  # line 334
    'elastic_transform': ((0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06),  # 385-389,
                          (0.1, 0.04, 0.05), (0.1, 0.03, 0.03)),  # in units of IMSIZE
    'pixelate': (0.95, 0.9, 0.85, 0.75, 0.65),  # line 374
    'jpeg_compression': (80, 65, 58, 50, 40),  # line 364
}
FROST_FILES = ('frost1.png', 'frost2.png', 'frost3.png', 'frost4.jpg', 'frost5.jpg')  # line 240


def _package():
  from imagecorruptions import corruptions
  return corruptions


def _gaussian(x: np.ndarray, sigma: float) -> np.ndarray:
  from skimage.filters import gaussian
  return gaussian(x, sigma=sigma, channel_axis=-1)


def clipped_zoom(image: np.ndarray, factor: float) -> np.ndarray:
  """The centre 1/factor of `image` (H, W, C) zoomed back to (H, W), bilinear (the
  file's `clipped_zoom`, lines 112-122, per axis).

  Args:
    image: an (H, W, C) image.
    factor: the zoom, at least 1.

  Returns:
    The zoomed (H, W, C) image.
  """
  height, width = image.shape[:2]
  ch, cw = int(np.ceil(height / factor)), int(np.ceil(width / factor))
  top, left = (height - ch) // 2, (width - cw) // 2
  zoomed = scizoom(image[top:top + ch, left:left + cw], (factor, factor, 1), order=1)
  trim_top, trim_left = (zoomed.shape[0] - height) // 2, (zoomed.shape[1] - width) // 2
  return zoomed[trim_top:trim_top + height, trim_left:trim_left + width]


def gaussian_noise(x: np.ndarray, c: float) -> np.ndarray:
  """`make_cifar_c.py`'s gaussian noise.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['gaussian_noise']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  x = x / 255.
  return np.clip(x + np.random.normal(size=x.shape, scale=c), 0, 1) * 255


def shot_noise(x: np.ndarray, c: float) -> np.ndarray:
  """`make_cifar_c.py`'s shot noise.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['shot_noise']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  x = x / 255.
  return np.clip(np.random.poisson(x * c) / c, 0, 1) * 255


def impulse_noise(x: np.ndarray, c: float) -> np.ndarray:
  """`make_cifar_c.py`'s impulse noise.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['impulse_noise']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  from skimage.util import random_noise
  # Current scikit-image draws from its own generator: seeded from the global one.
  noisy = random_noise(x / 255., mode='s&p', amount=c, rng=np.random.randint(2 ** 31))
  return np.clip(noisy, 0, 1) * 255


def defocus_blur(x: np.ndarray, c: Any) -> np.ndarray:
  """`make_cifar_c.py`'s defocus blur.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['defocus_blur']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  import cv2
  kernel = _package().disk(radius=c[0], alias_blur=c[1])
  x = x / 255.
  blurred = np.stack([cv2.filter2D(x[:, :, d], -1, kernel) for d in range(3)], axis=-1)
  return np.clip(blurred, 0, 1) * 255


def glass_blur(x: np.ndarray, c: Any) -> np.ndarray:
  """`make_cifar_c.py`'s glass blur.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['glass_blur']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  sigma, delta, iterations = c
  x = np.uint8(_gaussian(x / 255., sigma) * 255)
  height, width, channels = x.shape
  order = [(h, w) for h in range(height - delta, delta, -1)
           for w in range(width - delta, delta, -1)]
  pixels = [tuple(p) for p in x.reshape(-1, channels).tolist()]
  for _ in range(iterations):  # locally shuffle pixels
    # The file draws (dx, dy) pixel by pixel; one draw of all of them is the same
    # sequence from numpy's generator.
    shifts = np.random.randint(-delta, delta, size=(len(order), 2)).tolist()
    for (h, w), (dx, dy) in zip(order, shifts):
      # The file's swap of numpy views: both pixels end as x[h + dy, w + dx] (kept,
      # as the published CIFAR-C was made by it).
      pixels[h * width + w] = pixels[(h + dy) * width + w + dx]
  x = np.array(pixels, np.uint8).reshape(height, width, channels)
  return np.clip(_gaussian(x / 255., sigma), 0, 1) * 255


def motion_blur(x: np.ndarray, c: Any) -> np.ndarray:
  """`make_cifar_c.py`'s motion blur.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['motion_blur']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  blurred = _package()._motion_blur(x, radius=c[0], sigma=c[1],
                                    angle=np.random.uniform(-45, 45))
  return np.clip(blurred, 0, 255)


def zoom_blur(x: np.ndarray, c: Any) -> np.ndarray:
  """`make_cifar_c.py`'s zoom blur.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['zoom_blur']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  x = (x / 255.).astype(np.float32)
  out = np.zeros_like(x)
  for factor in c:
    out += clipped_zoom(x, factor)
  return np.clip((x + out) / (len(c) + 1), 0, 1) * 255


def snow(x: np.ndarray, c: Any) -> np.ndarray:
  """`make_cifar_c.py`'s snow.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['snow']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  import cv2
  x = np.array(x, dtype=np.float32) / 255.
  layer = np.random.normal(size=x.shape[:2], loc=c[0], scale=c[1])
  layer = clipped_zoom(layer[..., np.newaxis], c[2])
  layer[layer < c[3]] = 0
  # The file blurs the layer as an 8-bit PNG and decodes the 8-bit result.
  layer = (np.clip(layer.squeeze(-1), 0, 1) * 255).astype(np.uint8)
  layer = _package()._motion_blur(layer, radius=c[4], sigma=c[5],
                                  angle=np.random.uniform(-135, -45))
  layer = (np.round(np.clip(layer, 0, 255)).astype(np.uint8) / 255.)[..., np.newaxis]
  grey = cv2.cvtColor(x, cv2.COLOR_RGB2GRAY)[..., np.newaxis]
  x = c[6] * x + (1 - c[6]) * np.maximum(x, grey * 1.5 + 0.5)
  return np.clip(x + layer + np.rot90(layer, k=2), 0, 1) * 255


@functools.lru_cache(maxsize=None)
def _frost_picture(name: str) -> np.ndarray:
  """One of the package's frost pictures, BGR, resized to a fifth as the file does;
  read once, as every image of every severity crops from the same five."""
  import cv2
  import importlib.resources
  with importlib.resources.as_file(
      importlib.resources.files('imagecorruptions') / 'frost' / name) as path:
    picture = cv2.imread(str(path))
  picture = cv2.resize(picture, (0, 0), fx=0.2, fy=0.2)
  picture.flags.writeable = False
  return picture


def frost(x: np.ndarray, c: Any) -> np.ndarray:
  """`make_cifar_c.py`'s frost.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['frost']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  picture = _frost_picture(FROST_FILES[np.random.randint(5)])
  height, width = x.shape[:2]
  top = np.random.randint(0, picture.shape[0] - height)
  left = np.random.randint(0, picture.shape[1] - width)
  picture = picture[top:top + height, left:left + width][..., [2, 1, 0]]  # BGR to RGB
  return np.clip(c[0] * np.array(x, np.float64) + c[1] * picture, 0, 255)


def fog(x: np.ndarray, c: Any) -> np.ndarray:
  """`make_cifar_c.py`'s fog.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['fog']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  height, width = x.shape[:2]
  side = 1 << int(np.ceil(np.log2(max(height, width))))
  x = x / 255.
  top = x.max()
  x = x + c[0] * _package().plasma_fractal(mapsize=side, wibbledecay=c[1])[
      :height, :width][..., np.newaxis]
  return np.clip(x * top / (top + c[0]), 0, 1) * 255


def brightness(x: np.ndarray, c: float) -> np.ndarray:
  """`make_cifar_c.py`'s brightness.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['brightness']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  from skimage.color import hsv2rgb, rgb2hsv
  x = rgb2hsv(x / 255.)
  x[:, :, 2] = np.clip(x[:, :, 2] + c, 0, 1)
  return np.clip(hsv2rgb(x), 0, 1) * 255


def contrast(x: np.ndarray, c: float) -> np.ndarray:
  """`make_cifar_c.py`'s contrast.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['contrast']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  x = x / 255.
  means = np.mean(x, axis=(0, 1), keepdims=True)
  return np.clip((x - means) * c + means, 0, 1) * 255


def elastic_transform(x: np.ndarray, c: Any) -> np.ndarray:
  """`make_cifar_c.py`'s elastic transform.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['elastic_transform']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  import cv2
  from skimage.filters import gaussian
  size = min(x.shape[:2])  # the file's IMSIZE
  alpha, sigma, shift = (size * v for v in c)
  image = np.array(x, dtype=np.float32) / 255.
  shape = image.shape
  centre = np.float32(shape[:2]) // 2
  square = min(shape[:2]) // 3
  pts1 = np.float32([centre + square, [centre[0] + square, centre[1] - square],
                     centre - square])
  pts2 = pts1 + np.random.uniform(-shift, shift, size=pts1.shape).astype(np.float32)
  image = cv2.warpAffine(image, cv2.getAffineTransform(pts1, pts2), shape[:2][::-1],
                         borderMode=cv2.BORDER_REFLECT_101)
  dx = (gaussian(np.random.uniform(-1, 1, size=shape[:2]), sigma, mode='reflect', truncate=3)
        * alpha).astype(np.float32)[..., np.newaxis]
  dy = (gaussian(np.random.uniform(-1, 1, size=shape[:2]), sigma, mode='reflect', truncate=3)
        * alpha).astype(np.float32)[..., np.newaxis]
  cols, rows, chans = np.meshgrid(np.arange(shape[1]), np.arange(shape[0]), np.arange(shape[2]))
  indices = (np.reshape(rows + dy, (-1, 1)), np.reshape(cols + dx, (-1, 1)),
             np.reshape(chans, (-1, 1)))
  return np.clip(map_coordinates(image, indices, order=1, mode='reflect').reshape(shape),
                 0, 1) * 255


def pixelate(x: np.ndarray, c: float) -> np.ndarray:
  """`make_cifar_c.py`'s pixelate.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['pixelate']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  height, width = x.shape[:2]
  image = Image.fromarray(x).resize((int(width * c), int(height * c)), Image.BOX)
  return np.asarray(image.resize((width, height), Image.BOX), np.float64)


def jpeg_compression(x: np.ndarray, c: int) -> np.ndarray:
  """`make_cifar_c.py`'s jpeg compression.

  Args:
    x: a uint8 (H, W, 3) image.
    c: the severity's parameters (`PARAMETERS['jpeg_compression']`).

  Returns:
    The corrupted image, floats in [0, 255].
  """
  output = BytesIO()
  Image.fromarray(x).save(output, 'JPEG', quality=c)
  return np.asarray(Image.open(output), np.float64)


CORRUPT: Dict[str, Callable[[np.ndarray, object], np.ndarray]] = {
    name: globals()[name] for name in PARAMETERS}


def corrupt_one(image: np.ndarray, name: str, severity: int) -> np.ndarray:
  """One uint8 image (H, W, 3) under CIFAR-C's corruption `name` at `severity`
  (1-5), as floats in [0, 255].

  Args:
    image: uint8 (H, W, 3), sides up to 64 px.
    name: one of `PARAMETERS`.
    severity: 1 to 5.

  Returns:
    The corrupted image, float (H, W, 3) in [0, 255].
  """
  return CORRUPT[name](image, PARAMETERS[name][severity - 1])
