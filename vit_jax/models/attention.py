"""Multi-head self-attention with the published parameter names, fused or explicit.

The explicit path materialises the attention weights (B, heads, N, N) and sows
them for the analysis tools; the fused path calls `jax.nn.dot_product_attention`
and never forms them outside the kernel. Both compute the same function.
"""
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any
ATTENTION_IMPLS = ('auto', 'xla', 'cudnn', 'explicit')
ATTENTION_WEIGHTS = 'attention_weights'  # the sown name of the explicit path's weights
# cuDNN's fused kernels take sequence lengths in multiples of this; shorter
# sequences are padded and the padded keys masked.
CUDNN_SEQ_MULTIPLE = 8


def resolve_impl(impl: str, dtype) -> str:
  """'auto' as the backend runs it best: cuDNN's flash attention on a GPU in
  half precision (its kernels are for bfloat16 and float16, and have no second
  derivative, which the Hessian tools take in float32), the explicit form on a
  CPU (where XLA:CPU runs it faster than the fused form), XLA's fused form
  elsewhere. Other names are kept as they are."""
  if impl != 'auto':
    return impl
  backend = jax.default_backend()
  if backend == 'gpu' and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return 'cudnn'
  return 'explicit' if backend == 'cpu' else 'xla'


def fused_attention(query: jax.Array, key: jax.Array, value: jax.Array, impl: str) -> jax.Array:
  """softmax(q k^T / sqrt(d)) v over (B, N, heads, d) operands by `impl` 'xla' or
  'cudnn', without the weights left behind."""
  if impl == 'cudnn':
    return padded_attention(query, key, value, CUDNN_SEQ_MULTIPLE, 'cudnn')
  return jax.nn.dot_product_attention(query, key, value, implementation='xla')


def padded_attention(query: jax.Array, key: jax.Array, value: jax.Array, multiple: int,
                     implementation: str) -> jax.Array:
  """`jax.nn.dot_product_attention` with the tokens padded to a multiple of
  `multiple`: padded keys are masked out and padded queries dropped."""
  b, n = query.shape[:2]
  padded = -(-n // multiple) * multiple
  pad = lambda x: jnp.pad(x, ((0, 0), (0, padded - n), (0, 0), (0, 0)))
  lengths = jnp.full((b,), n, jnp.int32)
  out = jax.nn.dot_product_attention(
      pad(query), pad(key), pad(value), query_seq_lengths=lengths,
      key_value_seq_lengths=lengths, implementation=implementation)
  return out[:, :n]


class MultiHeadAttention(nn.Module):
  """Self-attention over (B, N, D) tokens: `query`, `key`, `value` (D, heads, D/heads)
  and `out` (heads, D/heads, D), as in the published checkpoints.

  `impl` picks the computation (`ATTENTION_IMPLS`, 'auto' by `resolve_impl`):
  'explicit' forms the weights and sows them as `attention_weights`; the others
  are fused. Attention dropout needs the weights, so a training call with
  `dropout_rate` > 0 is explicit.
  """
  num_heads: int
  dropout_rate: float = 0.
  impl: str = 'auto'
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool):
    if self.impl not in ATTENTION_IMPLS:
      raise ValueError(f'Unknown attention implementation {self.impl!r}; '
                       f'use one of {ATTENTION_IMPLS}.')
    width = x.shape[-1]
    if width % self.num_heads:
      raise ValueError(f'Width {width} is not divisible by {self.num_heads} heads.')
    dense = functools.partial(nn.DenseGeneral, dtype=self.dtype,
                              kernel_init=nn.initializers.xavier_uniform())
    heads = (self.num_heads, width // self.num_heads)
    q, k, v = (dense(heads, name=name)(x) for name in ('query', 'key', 'value'))
    impl = resolve_impl(self.impl, self.dtype)
    if impl == 'explicit' or (train and self.dropout_rate > 0):
      y = self.explicit(q, k, v, train=train)
    else:
      y = fused_attention(q, k, v, impl)
    return dense(width, axis=(-2, -1), name='out')(y)

  def explicit(self, q, k, v, *, train: bool):
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(logits / jnp.sqrt(q.shape[-1]).astype(jnp.float32))
    self.sow('intermediates', ATTENTION_WEIGHTS, weights)
    weights = nn.Dropout(self.dropout_rate, broadcast_dims=())(weights, deterministic=not train)
    return jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
