"""Rotary position embeddings (RoPE) on a 2-D grid of patches.

A ViT with RoPE has no position table: each attention layer rotates the patch
tokens' queries and keys by angles that grow with the patch's row and column, so
that their dot products depend on the patches' offsets. The class token and the
registers are not rotated. Being a function of the grid, it runs at any grid;
EVA-02 has it beside a position table.
"""
import math
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

# 'dinov3': DINOv3's (Siméoni et al. 2025) rotation; 'eva02': EVA-02's (Fang et al.
# 2024); 'pe': Perception Encoder's (Bolya et al. 2025), EVA-02's with the columns'
# angles first; 'none': no rotation.
ROPES = ('none', 'dinov3', 'eva02', 'pe')
# The kinds whose channels rotate in pairs (x0, x1), (x2, x3), ...; the others rotate
# the first half of the channels with the second (the rotate-half layout).
INTERLEAVED = ('eva02', 'pe')


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


def eva02_angles(grid: Tuple[int, int], head_dim: int, theta: float,
                 reference: Optional[Tuple[int, int]] = None, offset: float = 0.,
                 columns_first: bool = False) -> np.ndarray:
  """EVA-02's rotation angles (gh * gw, head_dim) for a grid of patches, or with
  `columns_first` Perception Encoder's.

  As timm's `RotaryEmbeddingCat` computes them for `Eva` (timm/layers/
  pos_embed_sincos.py: `freq_bands` with step 1, `_build_grid` of grid_type
  'index' with `grid_offset` and `ref_feat_shape`, `build_fourier_pos_embed`,
  `_rope_layout` interleaved): each patch at its row and column index plus
  `offset`, scaled by reference / n along each axis when a `reference` grid is
  given (EVA-02's pretraining grid, 16 x 16, whatever the images' grid); head_dim /
  4 frequencies theta ** (-j / (head_dim / 4)); the angle coordinate * frequency,
  the row's head_dim / 4 angles then the column's (the column's first with
  `columns_first`: timm's grid_indexing 'xy', as Perception Encoder has them),
  each repeated for the pair of channels it rotates.

  Args:
    grid: (gh, gw) patches.
    head_dim: the channels per head (a multiple of 4).
    theta: the frequencies' base (timm's `rope_temperature`, 10000 in EVA-02).
    reference: the grid the coordinates are scaled to, or None (unscaled).
    offset: added to the indices before the scaling (timm's `rope_grid_offset`).
    columns_first: the columns' angles before the rows'.

  Returns:
    The float32 angles, one row per patch in row-major order.
  """
  if head_dim % 4:
    raise ValueError(f'EVA-02 RoPE needs a head width divisible by 4, got {head_dim}.')
  bands = head_dim // 4
  frequencies = 1. / np.float32(theta) ** (np.arange(bands, dtype=np.float32)
                                           / np.float32(bands))
  axes = [np.arange(n, dtype=np.float32) + np.float32(offset) for n in grid]
  if reference is not None:
    axes = [t / np.float32(n) * np.float32(r) for t, n, r in zip(axes, grid, reference)]
  coords = np.stack(np.meshgrid(*axes, indexing='ij'), axis=-1).reshape(-1, 2)
  if columns_first:
    coords = coords[:, ::-1]
  angles = coords[:, :, None] * frequencies  # (N, 2, d / 4)
  return np.repeat(angles.reshape(len(coords), -1), 2, axis=-1).astype(np.float32)


def rotate(x: jax.Array, angles: np.ndarray, interleaved: bool = False) -> jax.Array:
  """Queries or keys rotated: x cos + r(x) sin, with r(x) = [-x2, x1] for x's halves
  x1 and x2 (the rotate-half layout), or, `interleaved`, r(x) = [-x1, x0, -x3, x2,
  ...] (each pair of channels rotated together); the leading tokens beyond the
  angles' rows (the class token, the registers) are left as they are.

  Args:
    x: (B, T, heads, head_dim), the patches last.
    angles: (N, head_dim) angles of the N patches.
    interleaved: the channels' layout.

  Returns:
    x rotated, in its dtype (the rotation computed in float32).
  """
  extra = x.shape[1] - angles.shape[0]
  patches = x[:, extra:].astype(jnp.float32)
  cos = jnp.asarray(np.cos(angles))[None, :, None]
  sin = jnp.asarray(np.sin(angles))[None, :, None]
  if interleaved:
    turned = jnp.stack([-patches[..., 1::2], patches[..., ::2]], axis=-1).reshape(patches.shape)
  else:
    first, second = jnp.split(patches, 2, axis=-1)
    turned = jnp.concatenate([-second, first], axis=-1)
  rotated = patches * cos + turned * sin
  return jnp.concatenate([x[:, :extra], rotated.astype(x.dtype)], axis=1)


def angles(kind: str, grid: Tuple[int, int], head_dim: int, theta: float,
           reference: Optional[Tuple[int, int]] = None, offset: float = 0.) -> np.ndarray:
  """The angles of RoPE `kind` (a `ROPES` key other than 'none') on `grid`.

  Args:
    kind: the rotation's kind.
    grid: (gh, gw) patches.
    head_dim: the channels per head.
    theta: the periods' base.
    reference: the grid EVA-02's and Perception Encoder's coordinates are scaled to
      (`eva02_angles`), or None; DINOv3's coordinates span [-1, 1] on every grid
      and take none.
    offset: added to EVA-02's and Perception Encoder's indices; DINOv3's take none.

  Returns:
    The (gh * gw, head_dim) angles.
  """
  if kind == 'dinov3':
    if reference is not None or offset:
      raise ValueError("DINOv3's rotary coordinates span [-1, 1] on every grid: give no "
                       'rope_grid and no rope_offset with rope dinov3.')
    return dinov3_angles(grid, head_dim, theta)
  if kind in ('eva02', 'pe'):
    return eva02_angles(grid, head_dim, theta, reference, offset, columns_first=kind == 'pe')
  raise ValueError(f'Unknown rope {kind!r}; use one of {ROPES}.')
