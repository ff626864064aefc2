"""Rotary position embeddings (RoPE) on a 2-D grid of patches.

A ViT with RoPE has no position table: each attention layer rotates the patch
tokens' queries and keys by angles that grow with the patch's row and column, so
that their dot products depend on the patches' offsets. The class token and the
registers are not rotated. Being a function of the grid, it runs at any grid.
"""
import math
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

# 'dinov3': DINOv3's (Siméoni et al. 2025) rotation; 'none': no rotation.
ROPES = ('none', 'dinov3')


def dinov3_angles(grid: Tuple[int, int], head_dim: int, theta: float) -> np.ndarray:
  """DINOv3's rotation angles (gh * gw, head_dim) for a grid of patches.

  As `transformers`' `DINOv3ViTRopePositionEmbedding` (models/dinov3_vit/
  modeling_dinov3_vit.py, `get_patches_center_coordinates` and `forward`) and
  timm's `RotaryEmbeddingDinoV3` compute them at inference: each patch's centre
  at ((i + 0.5) / n) * 2 - 1 along each axis, in [-1, 1] whatever the grid;
  head_dim / 4 periods theta ** (4 j / head_dim); the angle 2 pi * coordinate /
  period, the row's head_dim / 4 angles then the column's, and the same
  head_dim / 2 again for the second half of the channels (the rotate-half
  layout). DINOv3's training-time jitter of the coordinates is not applied.

  Args:
    grid: (gh, gw) patches.
    head_dim: the channels per head (a multiple of 4).
    theta: the periods' base (`rope_theta`, 100 in DINOv3).

  Returns:
    The float32 angles, one row per patch in row-major order.
  """
  if head_dim % 4:
    raise ValueError(f'DINOv3 RoPE needs a head width divisible by 4, got {head_dim}.')
  inverse_periods = 1. / np.float32(theta) ** (np.arange(head_dim // 4, dtype=np.float32)
                                               * np.float32(4 / head_dim))
  rows, cols = ((np.arange(n, dtype=np.float32) + 0.5) / n * 2 - 1 for n in grid)
  coords = np.stack(np.meshgrid(rows, cols, indexing='ij'), axis=-1).reshape(-1, 2)
  angles = np.float32(2 * math.pi) * coords[:, :, None] * inverse_periods  # (N, 2, d / 4)
  return np.tile(angles.reshape(len(coords), -1), 2).astype(np.float32)


def rotate(x: jax.Array, angles: np.ndarray) -> jax.Array:
  """Queries or keys rotated in the rotate-half layout: x cos + rotate_half(x) sin,
  rotate_half(x) = [-x2, x1] for x's halves x1 and x2; the leading tokens beyond
  the angles' rows (the class token, the registers) are left as they are.

  Args:
    x: (B, T, heads, head_dim), the patches last.
    angles: (N, head_dim) angles of the N patches.

  Returns:
    x rotated, in its dtype (the rotation computed in float32).
  """
  extra = x.shape[1] - angles.shape[0]
  patches = x[:, extra:].astype(jnp.float32)
  cos = jnp.asarray(np.cos(angles))[None, :, None]
  sin = jnp.asarray(np.sin(angles))[None, :, None]
  first, second = jnp.split(patches, 2, axis=-1)
  rotated = patches * cos + jnp.concatenate([-second, first], axis=-1) * sin
  return jnp.concatenate([x[:, :extra], rotated.astype(x.dtype)], axis=1)


def angles(kind: str, grid: Tuple[int, int], head_dim: int, theta: float) -> np.ndarray:
  """The angles of RoPE `kind` (a `ROPES` key other than 'none') on `grid`.

  Args:
    kind: the rotation's kind.
    grid: (gh, gw) patches.
    head_dim: the channels per head.
    theta: the periods' base.

  Returns:
    The (gh * gw, head_dim) angles.
  """
  if kind != 'dinov3':
    raise ValueError(f'Unknown rope {kind!r}; use one of {ROPES}.')
  return dinov3_angles(grid, head_dim, theta)
