"""What the input layers of a ViT learn (Dosovitskiy et al. 2021, Fig. 7) and how
final tokens relate to input patches (Raghu et al. 2021, localisation)."""
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np


def patch_embedding_components(kernel: np.ndarray, k: int = 28) -> np.ndarray:
  """Top-k principal components of the patch-embedding filters, (k, p, p, C).

  The D filters of the (p, p, C, D) kernel are the samples; components are unit
  vectors ordered by explained variance.

  Args:
    kernel: the (p, p, C, D) patch-embedding kernel.
    k: how many components.

  Returns:
    The (k, p, p, C) components.
  """
  p, q, c, d = kernel.shape
  filters = np.asarray(kernel, np.float64).reshape(p * q * c, d).T
  filters = filters - filters.mean(0)
  _, _, vt = np.linalg.svd(filters, full_matrices=False)
  return vt[:k].reshape(-1, p, q, c)


def gray_reached_share(kernel: np.ndarray) -> float:
  """The share of the patch-embedding kernel's squared norm that gray images reach.

  A gray image enters as C equal channels, so each filter acts on it through its
  sum over the channels alone: the part of the kernel that varies across channels
  (C - 1 of every C directions of a filter) never meets an image, and training on
  gray images leaves it as initialisation and weight decay made it. That part is
  in the principal components of the whole filters all the same.

  Args:
    kernel: the (p, p, C, D) patch-embedding kernel.

  Returns:
    ||the kernel projected on channel-constant filters||^2 / ||kernel||^2.
  """
  kernel = np.asarray(kernel, np.float64)
  constant = np.broadcast_to(kernel.mean(2, keepdims=True), kernel.shape)
  return float(np.sum(constant ** 2) / np.sum(kernel ** 2))


def cosine_similarity(a: jax.Array, b: jax.Array) -> jax.Array:
  """(..., n, D) x (..., m, D) -> (..., n, m) cosine similarities.

  Args:
    a: (..., n, D) vectors.
    b: (..., m, D) vectors.

  Returns:
    The (..., n, m) cosine similarities.
  """
  a = a / jnp.linalg.norm(a, axis=-1, keepdims=True)
  b = b / jnp.linalg.norm(b, axis=-1, keepdims=True)
  return a @ jnp.swapaxes(b, -1, -2)


def position_embedding_similarity(posemb: np.ndarray, grid: Tuple[int, int],
                                  has_cls: bool) -> np.ndarray:
  """(h, w, h, w): cosine similarity of each position's embedding to every other's.

  `posemb` is (1, N, D) as stored in the checkpoint; the class-token row, when
  present, is left out.

  Args:
    posemb: the (1, N, D) position embeddings.
    grid: (h, w) patches.
    has_cls: the first row is the class token's.

  Returns:
    The (h, w, h, w) similarities.
  """
  spatial = np.asarray(posemb)[0, 1:] if has_cls else np.asarray(posemb)[0]
  return np.asarray(cosine_similarity(spatial, spatial)).reshape(tuple(grid) * 2)


def image_patches(images: np.ndarray, grid: Tuple[int, int]) -> np.ndarray:
  """(B, H, W, C) images cut into the non-overlapping patches of a (h, w) grid:
  (B, h * w, ph * pw * C), patches in row-major order, ph = H // h, pw = W // w;
  rows and columns beyond h * ph and w * pw (where the grid does not divide the
  image) are left out.

  Args:
    images: (B, H, W, C) images.
    grid: (h, w) patches.

  Returns:
    The (B, h * w, ph * pw * C) patches.
  """
  b, height, width, c = images.shape
  (h, w) = grid
  ph, pw = height // h, width // w
  x = np.asarray(images)[:, :h * ph, :w * pw].reshape(b, h, ph, w, pw, c)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, h * w, ph * pw * c)
