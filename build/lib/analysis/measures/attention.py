"""Where attention goes: mean attention distance per head (Dosovitskiy et al. 2021,
Raghu et al. 2021) and attention rollout (Abnar & Zuidema 2020)."""
from typing import Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np


def patch_centres(grid: Tuple[int, int], patch_size: float) -> np.ndarray:
  """(h*w, 2) pixel coordinates of the patch centres, row-major like the tokens.

  Args:
    grid: (h, w) patches.
    patch_size: a patch's side in pixels.

  Returns:
    The (h*w, 2) (row, column) centres.
  """
  rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), indexing='ij')
  return (np.stack([rows.ravel(), cols.ravel()], axis=1) + 0.5) * patch_size


def patch_distances(grid: Tuple[int, int], patch_size: float) -> np.ndarray:
  """(h*w, h*w) Euclidean pixel distances between patch centres.

  Args:
    grid: (h, w) patches.
    patch_size: a patch's side in pixels.

  Returns:
    The (h*w, h*w) distances.
  """
  centres = patch_centres(grid, patch_size)
  return np.linalg.norm(centres[:, None] - centres[None, :], axis=-1)


def spatial_attention(weights: jax.Array, has_cls: bool,
                      keep_class_key: bool = False, registers: int = 0) -> jax.Array:
  """Attention among spatial tokens only: (B, H, N, N) -> (B, H, n, n), n = h*w.

  The class token's query row is dropped, and so is the weight each spatial
  query gives the class token (it has no position); the remaining weights are
  renormalised to sum to 1, so the result says where the spatial part of the
  attention goes. With `keep_class_key` they are left as they are: the class
  token's share then counts as distance 0 in `mean_attention_distance`.
  Registers (the tokens after the class token, which have no position either)
  are dropped as the class token is.

  Args:
    weights: (B, H, N, N) attention weights, queries by keys.
    has_cls: the first token is a class token.
    keep_class_key: keep the weights on the class token's (and registers') keys,
      unrenormalised.
    registers: the number of registers after the class token.

  Returns:
    The (B, H, n, n) weights among spatial tokens.
  """
  prefix = int(has_cls) + registers
  if not prefix:
    return weights
  weights = weights[..., prefix:, prefix:]
  return weights if keep_class_key else weights / jnp.sum(weights, axis=-1, keepdims=True)


def mean_attention_distance(weights: jax.Array, grid: Tuple[int, int], patch_size: float,
                            has_cls: bool, keep_class_key: bool = False,
                            registers: int = 0) -> jax.Array:
  """(B, H, N, N) attention weights -> (H,) mean distance in pixels.

  For each spatial query, the sum over spatial keys of weight x distance between
  the query and key patch centres; averaged over queries and images. The class
  token and registers are handled as in `spatial_attention`.

  Args:
    weights: (B, H, N, N) attention weights.
    grid: (h, w) patches.
    patch_size: a patch's side in pixels.
    has_cls: the first token is a class token.
    keep_class_key: as in `spatial_attention`.
    registers: the number of registers after the class token.

  Returns:
    The (H,) mean distance per head, in pixels.
  """
  weights = spatial_attention(weights, has_cls, keep_class_key, registers)
  distances = jnp.asarray(patch_distances(grid, patch_size), weights.dtype)
  per_query = jnp.einsum('bhqk,qk->bhq', weights, distances)
  return jnp.mean(per_query, axis=(0, 2))


def attention_rollout(weights: Sequence[jax.Array]) -> jax.Array:
  """Attention rollout through the layers: (B, N, N) from per-layer (B, H, N, N).

  Each layer's head-averaged attention is mixed half-and-half with the identity
  (the residual connection), rows renormalised, and the layers multiplied in order.

  Args:
    weights: each layer's (B, H, N, N) attention weights, input to output.

  Returns:
    The (B, N, N) rollout.
  """
  rollout = None
  for layer in weights:
    mixed = 0.5 * jnp.mean(layer, axis=1) + 0.5 * jnp.eye(layer.shape[-1], dtype=layer.dtype)
    mixed = mixed / jnp.sum(mixed, axis=-1, keepdims=True)
    rollout = mixed if rollout is None else mixed @ rollout
  return rollout


def rollout_map(rollout: jax.Array, grid: Tuple[int, int], has_cls: bool,
                registers: int = 0) -> jax.Array:
  """(B, N, N) rollout -> (B, h, w) input-patch relevance for the model's output,
  from the class token's row, or for a GAP model the mean of the spatial rows;
  registers (which the head never reads) are left out as rows and columns.

  Args:
    rollout: the (B, N, N) `attention_rollout`.
    grid: (h, w) patches.
    has_cls: the first token is a class token.
    registers: the number of registers after the class token.

  Returns:
    The (B, h, w) relevance, scaled to a maximum of 1 per image.
  """
  prefix = int(has_cls) + registers
  if has_cls:
    relevance = rollout[:, 0, prefix:]
  else:
    relevance = jnp.mean(rollout[:, prefix:, prefix:], axis=1)
  relevance = relevance / jnp.max(relevance, axis=-1, keepdims=True)
  return relevance.reshape((-1,) + tuple(grid))
