"""Multi-head self-attention with the published parameter names, fused or explicit.

The explicit path materialises the attention weights (B, heads, N, N) and sows
them for the analysis tools; the fused path calls `jax.nn.dot_product_attention`
and never forms them outside the kernel. Both compute the same function.
"""
import functools
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import rope as rope_lib
from vit_jax.models.family import sow_edited

Dtype = Any
ATTENTION_IMPLS = ('auto', 'xla', 'cudnn', 'explicit')
ATTENTION_WEIGHTS = 'attention_weights'  # the sown name of the explicit path's weights
HEAD_OUTPUTS = 'head_outputs'  # the sown name of each head's output, before the projection
# cuDNN's fused kernels take sequence lengths in multiples of this; shorter
# sequences are padded and the padded keys masked.
CUDNN_SEQ_MULTIPLE = 8
# Which of the query, key and value projections have a bias: all three (the published
# ViTs'), the query's and the value's (DINOv3's, whose key bias is masked to zero), or
# none (timm's DINOv3 files without `_qkvb`).
ATTENTION_BIASES = {'qkv': ('query', 'key', 'value'), 'qv': ('query', 'value'), 'none': ()}


def resolve_impl(impl: str, dtype: Any) -> str:
  """'auto' as the backend runs it best: cuDNN's flash attention on a GPU in
  half precision (its kernels are for bfloat16 and float16, and have no second
  derivative, which the Hessian tools take in float32), the explicit form on a
  CPU (where XLA:CPU runs it faster than the fused form), XLA's fused form
  elsewhere. Other names are kept as they are.

  Args:
    impl: 'auto', 'explicit', 'xla' or 'cudnn'.
    dtype: the compute dtype.

  Returns:
    The implementation's name.
  """
  if impl != 'auto':
    return impl
  backend = jax.default_backend()
  if backend == 'gpu' and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return 'cudnn'
  return 'explicit' if backend == 'cpu' else 'xla'


def fused_attention(query: jax.Array, key: jax.Array, value: jax.Array, impl: str) -> jax.Array:
  """softmax(q k^T / sqrt(d)) v over (B, N, heads, d) operands by `impl` 'xla' or
  'cudnn', without the weights left behind.

  Args:
    query: (B, N, heads, d).
    key: (B, N, heads, d).
    value: (B, N, heads, d).
    impl: 'xla' or 'cudnn'.

  Returns:
    The (B, N, heads, d) output.
  """
  if impl == 'cudnn':
    return padded_attention(query, key, value, CUDNN_SEQ_MULTIPLE, 'cudnn')
  return jax.nn.dot_product_attention(query, key, value, implementation='xla')


def padded_attention(query: jax.Array, key: jax.Array, value: jax.Array, multiple: int,
                     implementation: str) -> jax.Array:
  """`jax.nn.dot_product_attention` with the tokens padded to a multiple of
  `multiple`: padded keys are masked out and padded queries dropped.

  Args:
    query: (B, N, heads, d).
    key: (B, N, heads, d).
    value: (B, N, heads, d).
    multiple: the token count is padded to a multiple of it.
    implementation: `jax.nn.dot_product_attention`'s.

  Returns:
    The (B, N, heads, d) output.
  """
  b, n = query.shape[:2]
  padded = -(-n // multiple) * multiple
  pad = lambda x: jnp.pad(x, ((0, 0), (0, padded - n), (0, 0), (0, 0)))
  lengths = jnp.full((b,), n, jnp.int32)
  out = jax.nn.dot_product_attention(
      pad(query), pad(key), pad(value), query_seq_lengths=lengths,
      key_value_seq_lengths=lengths, implementation=implementation)
  return out[:, :n]


def window_mask(grid: Tuple[int, int], window: int, extra: int) -> np.ndarray:
  """(T, T) boolean mask, T = extra + gh * gw: a patch query at (r, c) sees the
  window x window patches at rows r - window // 2 ... r + (window - 1) // 2 (and
  the same columns), cut at the grid's edges; the `extra` leading tokens (the
  class token) see and are seen by every token.

  Args:
    grid: (gh, gw) patches.
    window: the window's side in patches.
    extra: leading tokens outside the grid.

  Returns:
    The (T, T) mask, True where a query sees a key.
  """
  rows, cols = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
  near = lambda p: ((p[None, :] - p[:, None] >= -(window // 2))
                    & (p[None, :] - p[:, None] <= (window - 1) // 2))
  mask = np.ones((extra + rows.size,) * 2, bool)
  mask[extra:, extra:] = near(rows) & near(cols)
  return mask


def relative_logits(query: jax.Array, table: jax.Array, extra: int) -> jax.Array:
  """1-D relative attention logits (B, heads, T, T) / sqrt(d): each patch query
  (B, T, heads, d) dotted with the table's embedding (2n - 1, heads, d) of the
  offset p_q - p_k between its position and the key's in the flattened patch
  sequence. The `extra` leading tokens (the class token) get 0.

  Args:
    query: (B, T, heads, d).
    table: (2n - 1, heads, d) offset embeddings.
    extra: leading tokens outside the grid.

  Returns:
    The (B, heads, T, T) logits.
  """
  n = query.shape[1] - extra
  if table.shape[0] != 2 * n - 1:
    raise ValueError(f'A relative table of {table.shape[0]} offsets does not fit {n} patches '
                     f'({2 * n - 1} offsets).')
  per_offset = jnp.einsum('bqhd,rhd->bhqr', query[:, extra:], table.astype(query.dtype),
                          preferred_element_type=jnp.float32)
  offsets = np.arange(n)[:, None] - np.arange(n)[None, :] + n - 1
  logits = jnp.take_along_axis(per_offset, offsets[None, None], axis=-1)
  logits = jnp.pad(logits, ((0, 0), (0, 0), (extra, 0), (extra, 0)))
  return logits / np.sqrt(query.shape[-1]).astype(np.float32)


class MultiHeadAttention(nn.Module):
  """Self-attention over (B, N, D) tokens: `query`, `key`, `value` (D, heads, D/heads)
  and `out` (heads, D/heads, D), as in the published checkpoints.

  `impl` picks the computation (`ATTENTION_IMPLS`, 'auto' by `resolve_impl`):
  'explicit' forms the weights and sows them as `attention_weights`; the others
  are fused. Every path sows the heads' outputs before the output projection as
  `head_outputs`, edited first by the `scales` and `shifts` collections
  where `apply` is given them (`family.sow_edited`: a (heads, 1) scale of 0
  removes a head). Attention dropout needs the weights, so a training call with
  `dropout_rate` > 0 is explicit. With `window` > 0 patch tokens attend only to
  their neighbours on `grid` (`window_mask`); a `relative_table` adds
  `relative_logits` before the softmax. Both run fused through XLA where the
  padded cuDNN path would be picked. `bias` names the projections with a bias
  (`ATTENTION_BIASES`); `rope` (`rope.ROPES`) rotates the patch tokens' queries
  and keys on `grid` (`rope.rotate`), with periods of base `rope_theta` and, for
  EVA-02's and Perception Encoder's, coordinates offset by `rope_offset` and
  scaled to `rope_grid` (`rope.angles`). Without `out_bias` the output projection
  has no bias (AIMv2's). A `key_mask` (B, T), True for the tokens that are there,
  keeps every query from the padded ones (SigLIP 2's `pixel_attention_mask`).
  """
  num_heads: int
  dropout_rate: float = 0.
  impl: str = 'auto'
  dtype: Dtype = jnp.float32
  grid: Optional[Tuple[int, int]] = None  # the patch grid, for `window` and relative tables
  window: int = 0
  bias: str = 'qkv'
  rope: str = 'none'
  rope_theta: float = 100.
  rope_grid: Optional[Tuple[int, int]] = None
  rope_offset: float = 0.
  out_bias: bool = True

  @nn.compact
  def __call__(self, x, *, train: bool, relative_table: Optional[jax.Array] = None,
               key_mask: Optional[jax.Array] = None):
    for field, valid in (('implementation', ATTENTION_IMPLS), ('bias', ATTENTION_BIASES),
                         ('rope', rope_lib.ROPES)):
      value = getattr(self, 'impl' if field == 'implementation' else field)
      if value not in valid:
        raise ValueError(f'Unknown attention {field} {value!r}; use one of {tuple(valid)}.')
    if self.rope != 'none' and self.grid is None:
      raise ValueError('Rotary position embeddings need the patch grid: give grid.')
    width = x.shape[-1]
    if width % self.num_heads:
      raise ValueError(f'Width {width} is not divisible by {self.num_heads} heads.')
    dense = functools.partial(nn.DenseGeneral, dtype=self.dtype,
                              kernel_init=nn.initializers.xavier_uniform())
    heads = (self.num_heads, width // self.num_heads)
    biased = ATTENTION_BIASES[self.bias]
    q, k, v = (dense(heads, use_bias=name in biased, name=name)(x)
               for name in ('query', 'key', 'value'))
    if self.rope != 'none':
      angles = rope_lib.angles(self.rope, self.grid, width // self.num_heads, self.rope_theta,
                               self.rope_grid, self.rope_offset)
      interleaved = self.rope in rope_lib.INTERLEAVED
      q, k = (rope_lib.rotate(a, angles, interleaved) for a in (q, k))
    extra = x.shape[1] - (self.grid[0] * self.grid[1] if self.grid else 0)
    bias = None if relative_table is None else relative_logits(q, relative_table, extra)
    mask = window_mask(self.grid, self.window, extra)[None, None] if self.window else None
    if key_mask is not None:  # (B, 1, 1, T): no query sees a padded key
      padded = key_mask[:, None, None, :]
      mask = padded if mask is None else jnp.logical_and(mask, padded)
    impl = resolve_impl(self.impl, self.dtype)
    if impl == 'explicit' or (train and self.dropout_rate > 0):
      y = self.explicit(q, k, v, bias, mask, train=train)
    elif bias is not None or mask is not None:
      y = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, implementation='xla')
    else:
      y = fused_attention(q, k, v, impl)
    y = sow_edited(self, HEAD_OUTPUTS, y)  # (B, N, heads, D/heads)
    return dense(width, axis=(-2, -1), use_bias=self.out_bias, name='out')(y)

  def explicit(self, q: jax.Array, k: jax.Array, v: jax.Array, bias: Optional[jax.Array],
               mask: Optional[jax.Array], *, train: bool) -> jax.Array:
    """softmax(q k^T / sqrt(d) + bias) v, the weights sown (`ATTENTION_WEIGHTS`)
    and, in training, dropped out.

    Args:
      q: (B, N, heads, d) queries.
      k: (B, N, heads, d) keys.
      v: (B, N, heads, d) values.
      bias: logits added before the softmax, or None.
      mask: True where a query sees a key, broadcast to (B, heads, N, N), or None.
      train: apply attention dropout.

    Returns:
      The (B, N, heads, d) output.
    """
    # Heads moved in front of the tokens first: both products are then batched
    # over (B, heads) with contiguous operands, which XLA:CPU runs 3.5x faster
    # than the same einsums on (B, N, heads, d) (ViT-B/16, docs/benchmarks.md).
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # (B, heads, N, d)
    logits = jnp.einsum('bhqd,bhkd->bhqk', q, k, preferred_element_type=jnp.float32)
    logits = logits / jnp.sqrt(q.shape[-1]).astype(jnp.float32)
    if bias is not None:
      logits = logits + bias
    if mask is not None:
      logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits)
    self.sow('intermediates', ATTENTION_WEIGHTS, weights)
    weights = nn.Dropout(self.dropout_rate, broadcast_dims=())(weights, deterministic=not train)
    return jnp.swapaxes(jnp.einsum('bhqk,bhkd->bhqd', weights.astype(v.dtype), v), 1, 2)
