"""Vision Transformer and hybrid ResNet+ViT, with the published parameter names.

The model sows its patch embedding's output (`patch_embedding`, before positions);
each encoder block sows its input, the attention branch output (`sa`), the
residual after it (`+sa`), the MLP branch output (`mlp`) and the residual after
it (`+mlp`); the attention module sows its weights (B, heads, N, N). Nothing is
kept unless `intermediates` is mutable in `apply`.
"""
import dataclasses
import functools
import logging
import math
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import scipy.ndimage

from vit_jax.models import aimv2_layouts, conv, eva_layouts, vit_layouts
from vit_jax.models.attention import (ATTENTION_BIASES, ATTENTION_IMPLS, ATTENTION_WEIGHTS,
                                     HEAD_OUTPUTS, MultiHeadAttention)
from vit_jax.models.family import (CLASSIFY, HYBRID, SCAN, TENSOR_PARALLEL, TRANSFORMER, Branch,
                                   CheckpointError, Family, Fit, Flat, Layers, sow_edited)
from vit_jax.models.resnet import ResNetV1
from vit_jax.models.rope import ROPES

PATCH_EMBEDDING = 'patch_embedding'  # the sown output of the patch embedding, (B, patches, D)
log = logging.getLogger(__name__)

Dtype = Any
CLASSIFIERS = ('token', 'gap', 'token_gap', 'map', 'token_map', 'attention_pool', 'unpooled',
               'token_unpooled')
# The heads whose pooling has no parameters: `pooled_norm` may normalise what they pool.
PARAMETER_FREE_POOLING = ('token', 'gap', 'token_gap')
POSEMBS = ('learn', 'learn2d', 'sincos2d', 'relative', 'none')
# Where position information enters: before the first block, before every block
# from its own embedding, or before every block from one shared embedding.
POSEMB_WHERE = ('input', 'every_layer', 'every_layer_shared')
SKIPS = ('sa', 'mlp')
# What a rematerialised encoder block keeps from its forward pass for the
# backward one: 'full' keeps only its input, 'dots' also the outputs of its
# weight matmuls (not the attention products, which are recomputed).
REMAT_POLICIES = {'none': None, 'full': jax.checkpoint_policies.nothing_saveable,
                  'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def sincos2d_posembed(grid: Tuple[int, int], width: int, temperature: float = 10_000.
                      ) -> np.ndarray:
  """Fixed 2-D sine-cosine position embeddings (N, width): a quarter of the
  channels each for sin(x), cos(x), sin(y), cos(y) at geometric frequencies.

  Args:
    grid: (h, w) patches.
    width: the embedding width (a multiple of 4).
    temperature: the frequencies' base.

  Returns:
    The (h*w, width) embeddings.
  """
  if width % 4:
    raise ValueError(f'sincos2d position embeddings need a width divisible by 4, got {width}.')
  y, x = np.mgrid[:grid[0], :grid[1]]
  omega = 1. / temperature**(np.arange(width // 4) / max(width // 4 - 1, 1))
  y = y.reshape(-1, 1) * omega
  x = x.reshape(-1, 1) * omega
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


def antialiased_resize_weights(size_in: int, size_out: int) -> np.ndarray:
  """The (size_out, size_in) weights of a bilinear, antialiased resize of one axis,
  as SigLIP 2 resizes its position table to each image's patches (`transformers`'
  models/siglip2/modeling_siglip2.py, `resize_positional_embeddings`, the weights of
  `F.interpolate(mode='bilinear', align_corners=False, antialias=True)`): output i
  centred at (i + 0.5) * scale - 0.5 of the input, scale = size_in / size_out, a
  triangle of half-width max(scale, 1) over the inputs, normalised to sum to 1.

  Args:
    size_in: the table's side along the axis.
    size_out: the grid's side along the axis.

  Returns:
    The float32 weights; resizing is `weights @ table` along the axis.
  """
  scale = size_in / size_out
  centre = (np.arange(size_out, dtype=np.float64) + 0.5) * scale - 0.5
  weights = np.clip(1 - np.abs(np.arange(size_in)[None] - centre[:, None]) / max(scale, 1.),
                    0, None)
  return (weights / weights.sum(-1, keepdims=True)).astype(np.float32)


class AddPositionEmbs(nn.Module):
  """Adds position embeddings of `kind` to (B, T, D) tokens, T = extra + gh * gw.

  'learn': one learned (N(0, 0.02)) row per token, the `extra` leading tokens
  (the class token) included. 'learn2d': two learned tables, `pos_embedding_row`
  (gh, D/2) and `pos_embedding_col` (gw, D/2); the patch at (r, c) gets row r's
  embedding concatenated with column c's, the extra tokens a learned
  `pos_embedding_extra` row each. 'sincos2d': fixed, zeros for the extra tokens.
  The learned tables start from `posemb_init` (N(0, 0.02) by default). With a
  `table_grid`, a 'learn' table holds that grid's patches (after the `extra` rows)
  and is resized to `grid` in every call, bilinearly with antialiasing in float32
  (`antialiased_resize_weights`), as SigLIP 2 runs at any image's grid; given
  `grids` (one (rows, columns) per image, each within `grid`), to each image's own
  grid, placed at the top left of `grid` (the rest, padding, gets zeros).
  """
  grid: Tuple[int, int]
  kind: str = 'learn'
  posemb_init: Callable[..., Any] = nn.initializers.normal(stddev=0.02)
  table_grid: Optional[Tuple[int, int]] = None

  @nn.compact
  def __call__(self, x, grids: Optional[Sequence[Tuple[int, int]]] = None):
    extra, width = x.shape[1] - self.grid[0] * self.grid[1], x.shape[-1]
    init = self.posemb_init
    if self.kind == 'learn' and self.table_grid is None:
      pe = self.param('pos_embedding', init, (1,) + x.shape[1:])
    elif self.kind == 'learn':
      (th, tw), (gh, gw) = self.table_grid, self.grid
      pe = self.param('pos_embedding', init, (1, extra + th * tw, width))
      table = pe[0, extra:].reshape(th, tw, width).astype(jnp.float32)
      rows, cols = _resize_weights(th, gh, [g[0] for g in grids] if grids else None), (
          _resize_weights(tw, gw, [g[1] for g in grids] if grids else None))
      table = jnp.einsum('byh,bxw,hwd->byxd', rows, cols, table)
      pe = jnp.concatenate([jnp.broadcast_to(pe[:, :extra], (len(table), extra, width)),
                            table.reshape(-1, gh * gw, width).astype(pe.dtype)], axis=1)
    elif self.kind == 'learn2d':
      if width % 2:
        raise ValueError(f'learn2d position embeddings need an even width, got {width}.')
      rows = self.param('pos_embedding_row', init, (self.grid[0], width // 2))
      cols = self.param('pos_embedding_col', init, (self.grid[1], width // 2))
      pe = jnp.concatenate([jnp.repeat(rows, self.grid[1], axis=0),
                            jnp.tile(cols, (self.grid[0], 1))], axis=1)
      if extra:
        pe = jnp.concatenate([self.param('pos_embedding_extra', init, (extra, width)), pe])
      pe = pe[None]
    else:
      grid_pe = sincos2d_posembed(self.grid, width)
      pe = np.concatenate([np.zeros((extra, width), np.float32), grid_pe])[None]
    return x + jnp.asarray(pe, x.dtype)


def _resize_weights(size_in: int, size_out: int, sizes: Optional[Sequence[int]]) -> np.ndarray:
  """(B, size_out, size_in) resize weights of one axis: to `size_out` (B = 1), or
  each example's to its own size in `sizes`, its rows past that size zeros."""
  if sizes is None:
    return antialiased_resize_weights(size_in, size_out)[None]
  out = np.zeros((len(sizes), size_out, size_in), np.float32)
  for i, size in enumerate(sizes):
    out[i, :size] = antialiased_resize_weights(size_in, size)
  return out


class RelativeEmbedding(nn.Module):
  """The learned table (2n - 1, heads, head_dim) of 1-D relative attention over
  n patches: one embedding per offset p_q - p_k (`attention.relative_logits`)."""
  num_patches: int
  num_heads: int
  head_dim: int

  @nn.compact
  def __call__(self):
    return self.param('relative_embedding', nn.initializers.normal(stddev=0.02),
                      (2 * self.num_patches - 1, self.num_heads, self.head_dim))


# The MLP's nonlinearity: the published ViTs' and SigLIP's tanh-approximated GELU,
# the exact GELU of DINOv2 and DeiT, OpenAI CLIP's x * sigmoid(1.702 x); and SwiGLU
# (Shazeer 2020), DINOv2 ViT-g's and Web-DINO's gated unit: its first layer packs
# 2 * mlp_dim outputs [a | b] and the MLP goes on with silu(a) * b, as timm's
# `SwiGLUPacked` and `transformers`' `Dinov2SwiGLUFFN` compute it.
ACTIVATIONS = {
    'gelu_tanh': functools.partial(nn.gelu, approximate=True),
    'gelu': functools.partial(nn.gelu, approximate=False),
    'quick_gelu': lambda x: x * nn.sigmoid(1.702 * x),
    'swiglu': lambda x: (lambda a, b: nn.silu(a) * b)(*jnp.split(x, 2, axis=-1)),
}
GATED = ('swiglu',)  # the activations whose first layer is twice mlp_dim wide
# Every normalisation of a ViT: LayerNorm (the published ViTs'), or RMSNorm (AIMv2's:
# x / sqrt(mean(x^2) + epsilon) times a learned `scale`, no mean subtracted and no bias,
# as timm's `RmsNorm` and `transformers`' `Aimv2RMSNorm`).
NORMALIZATIONS = {'layer': nn.LayerNorm, 'rms': nn.RMSNorm}


def norm_layer(kind: str, epsilon: float, dtype: Dtype, name: Optional[str] = None) -> nn.Module:
  """The normalisation `kind` (a `NORMALIZATIONS` key) of epsilon `epsilon`.

  Args:
    kind: 'layer' or 'rms'.
    epsilon: added to the variance (or the mean square).
    dtype: the computation's dtype.
    name: the module's name; None: Flax's automatic one.

  Returns:
    The Flax module.
  """
  return NORMALIZATIONS[kind](epsilon=epsilon, dtype=dtype, name=name)


class MlpBlock(nn.Module):
  """Dense -> GELU (`activation`, an `ACTIVATIONS` key) -> dropout -> Dense back to
  the input width -> dropout; for a gated activation (`GATED`), the first Dense is
  2 * mlp_dim wide and the unit leaves mlp_dim. With `norm`, a LayerNorm (`norm`,
  of epsilon `layer_norm_eps`; an RMSNorm with `normalization` 'rms') of the mlp_dim
  hidden units comes before the second Dense, as EVA-02's MLP has it (timm's
  `scale_mlp`). Without `bias`, neither Dense has a bias (AIMv2's, timm's
  `proj_bias=False`)."""
  mlp_dim: int
  dropout_rate: float = 0.
  dtype: Dtype = jnp.float32
  activation: str = 'gelu_tanh'
  norm: bool = False
  layer_norm_eps: float = 1e-6
  bias: bool = True
  normalization: str = 'layer'

  @nn.compact
  def __call__(self, x, *, train: bool):
    dense = lambda features, name: nn.Dense(
        features, dtype=self.dtype, use_bias=self.bias,
        kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6), name=name)
    width = self.mlp_dim * (2 if self.activation in GATED else 1)
    y = ACTIVATIONS[self.activation](dense(width, 'Dense_0')(x))
    y = nn.Dropout(self.dropout_rate)(y, deterministic=not train)
    if self.norm:
      y = norm_layer(self.normalization, self.layer_norm_eps, self.dtype, 'norm')(y)
    y = dense(x.shape[-1], 'Dense_1')(y)
    return nn.Dropout(self.dropout_rate)(y, deterministic=not train)


class MAPHead(nn.Module):
  """Multi-head attention pooling (big_vision's `MAPHead`): a learned probe token
  attends over all tokens, then gets a residual MLP on its layer norm (of
  `normalization`)."""
  mlp_dim: int
  num_heads: int
  dtype: Dtype = jnp.float32
  activation: str = 'gelu_tanh'
  layer_norm_eps: float = 1e-6
  normalization: str = 'layer'

  @nn.compact
  def __call__(self, x, *, train: bool, key_mask: Optional[jax.Array] = None):
    """`key_mask` (B, T), where given, keeps the probe from the padded tokens."""
    probe = self.param('probe', nn.initializers.xavier_uniform(), (1, 1, x.shape[-1]))
    probe = jnp.tile(probe.astype(x.dtype), (x.shape[0], 1, 1))
    mask = None if key_mask is None else key_mask[:, None, None, :]
    x = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, dtype=self.dtype,
                                        kernel_init=nn.initializers.xavier_uniform())(
                                            probe, x, mask=mask)
    y = norm_layer(self.normalization, self.layer_norm_eps, self.dtype, 'LayerNorm_0')(x)
    return (x + MlpBlock(self.mlp_dim, dtype=self.dtype, activation=self.activation)(
        y, train=train))[:, 0]


class AttentionPool(nn.Module):
  """AIMv2's attention pooling (`transformers`' `Aimv2AttentionPoolingHead`): a
  learned query (`query`, (1, 1, D), cut into the heads) attends over the tokens
  through key and value projections alone (with biases where `bias`), and the
  heads' outputs, joined, go through an output projection with a bias (`out`);
  no LayerNorm, no MLP."""
  num_heads: int
  dtype: Dtype = jnp.float32
  bias: bool = False

  @nn.compact
  def __call__(self, x):
    b, _, d = x.shape
    if d % self.num_heads:
      raise ValueError(f'Width {d} is not divisible by {self.num_heads} heads.')
    heads = (self.num_heads, d // self.num_heads)
    dense = functools.partial(nn.DenseGeneral, dtype=self.dtype,
                              kernel_init=nn.initializers.xavier_uniform())
    query = self.param('query', nn.initializers.normal(stddev=0.02), (1, 1, d))
    query = jnp.broadcast_to(query.astype(x.dtype).reshape(1, 1, *heads), (b, 1, *heads))
    key, value = (dense(heads, use_bias=self.bias, name=name)(x) for name in ('key', 'value'))
    y = jax.nn.dot_product_attention(query, key, value)  # (B, 1, heads, D / heads)
    return dense(d, axis=(-2, -1), name='out')(y)[:, 0]


class Encoder1DBlock(nn.Module):
  """Pre-LN transformer block: x + attn(LN(x)), then x + mlp(LN(x)).

  `drop_path` is the stochastic-depth rate: each branch is dropped for whole
  examples (the mask broadcasts over tokens and channels) and rescaled. Without
  `attention_skip` (or `mlp_skip`) the branch output replaces the stream instead
  of adding to it (Raghu et al.'s skip removal). `grid` and `attention_window`
  restrict attention to neighbouring patches; a `relative_table` adds relative
  attention logits. `layer_scale_init` > 0 multiplies each branch by a learned
  per-channel scale (`ls1`, `ls2`) starting at that value, LayerScale as CaiT,
  DeiT III and DINOv2 have it (timm's `ls1.gamma`, `ls2.gamma`). `attention_bias`,
  `rope`, `rope_theta`, `rope_grid` and `rope_offset` are the attention's `bias`,
  `rope`, `rope_theta`, `rope_grid` and `rope_offset` (`MultiHeadAttention`);
  `mlp_norm` is the MLP's `norm` (`MlpBlock`). `normalization` (`NORMALIZATIONS`)
  is every norm's kind; without `projection_bias` neither the attention's output
  projection nor the MLP has a bias (timm's `proj_bias`).
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  drop_path: float = 0.
  attention_impl: str = 'auto'
  dtype: Dtype = jnp.float32
  grid: Optional[Tuple[int, int]] = None
  attention_window: int = 0
  attention_skip: bool = True
  mlp_skip: bool = True
  layer_scale_init: float = 0.
  activation: str = 'gelu_tanh'
  layer_norm_eps: float = 1e-6
  attention_bias: str = 'qkv'
  rope: str = 'none'
  rope_theta: float = 100.
  rope_grid: Optional[Tuple[int, int]] = None
  rope_offset: float = 0.
  mlp_norm: bool = False
  normalization: str = 'layer'
  projection_bias: bool = True

  @nn.compact
  def __call__(self, x, train: bool = False, relative_table=None, drop_path=None,
               key_mask=None):
    """`drop_path`, when given, overrides the attribute: a scanned block's rate is
    an array, one entry per layer. `key_mask` (B, T), where given, keeps every
    token from the padded ones."""
    rate = self.drop_path if drop_path is None else drop_path
    x = sow_edited(self, 'input', x)

    y = norm_layer(self.normalization, self.layer_norm_eps, self.dtype, 'LayerNorm_0')(x)
    y = MultiHeadAttention(self.num_heads, self.attention_dropout_rate, self.attention_impl,
                           self.dtype, self.grid, self.attention_window,
                           self.attention_bias, self.rope, self.rope_theta, self.rope_grid,
                           self.rope_offset, self.projection_bias,
                           name='MultiHeadDotProductAttention_1')(
                               y, train=train, relative_table=relative_table,
                               key_mask=key_mask)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=not train)
    y = self._layer_scale('ls1', y)
    y = sow_edited(self, 'sa', y)
    y = self._drop_path(y, rate, train)
    x = x + y if self.attention_skip else y
    x = sow_edited(self, '+sa', x)

    y = norm_layer(self.normalization, self.layer_norm_eps, self.dtype, 'LayerNorm_2')(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, self.activation,
                 self.mlp_norm, self.layer_norm_eps, self.projection_bias, self.normalization,
                 name='MlpBlock_3')(y, train=train)
    y = self._layer_scale('ls2', y)
    y = sow_edited(self, 'mlp', y)
    y = self._drop_path(y, rate, train)
    x = x + y if self.mlp_skip else y
    x = sow_edited(self, '+mlp', x)
    return x

  def _layer_scale(self, name: str, y):
    """The branch times its learned per-channel scale `name`, where the block has one."""
    if not self.layer_scale_init:
      return y
    scale = self.param(name, nn.initializers.constant(self.layer_scale_init), (y.shape[-1],))
    return y * scale.astype(y.dtype)

  def _drop_path(self, y, rate, train: bool):
    """Drops the branch for whole examples with probability `rate` and rescales
    the kept ones, as `nn.Dropout(rate, broadcast_dims=(1, 2))`, but `rate` may be
    traced."""
    if not train or (isinstance(rate, (int, float)) and rate == 0):
      return y
    keep = 1. - jnp.asarray(rate, jnp.float32)
    mask = jax.random.bernoulli(self.make_rng('dropout'), keep, (y.shape[0],) + (1,) * (y.ndim - 1))
    # A rate of 1 drops everything: the unselected 1/0 never reaches the output.
    return y * jnp.where(mask, 1. / keep, 0.).astype(y.dtype)


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
  """What an `Encoder` computes, as one value: the transformer's size, its
  regularisation, the papers' ablations and how it is computed.

  `VisionTransformer` builds it from its fields of the same names
  (`VisionTransformer.encoder_spec`), LiT's text tower and the original's
  `Encoder` from theirs. The fields are those `VisionTransformer` documents;
  `stochastic_depth` is the rate of the last block (0 at the first, linear in
  between) and `skip_removed` holds (block, 'sa' or 'mlp') pairs.
  `pooled_norm`: the final LayerNorm normalises what the head pools, not every
  token (`Encoder`'s `pool`).
  """
  num_layers: int
  mlp_dim: int
  num_heads: int
  _: dataclasses.KW_ONLY  # the rest by keyword: too many to pass by position
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  stochastic_depth: float = 0.
  posemb: str = 'learn'
  posemb_where: str = 'input'
  posemb_grid: Optional[Tuple[int, int]] = None
  attention_window: int = 0
  skip_removed: Sequence[Tuple[int, str]] = ()
  layer_scale_init: float = 0.
  activation: str = 'gelu_tanh'
  layer_norm_eps: float = 1e-6
  pre_norm: bool = False
  attention_bias: str = 'qkv'
  rope: str = 'none'
  rope_theta: float = 100.
  rope_grid: Optional[Tuple[int, int]] = None
  rope_offset: float = 0.
  mlp_norm: bool = False
  pooled_norm: bool = False
  normalization: str = 'layer'
  projection_bias: bool = True
  attention_impl: str = 'auto'
  remat: str = 'none'
  scan_layers: bool = False
  dtype: Dtype = jnp.float32


class Encoder(nn.Module):
  """Position embeddings, dropout, `num_layers` blocks and the final LayerNorm, as
  `spec` (an `EncoderSpec`) says, on the tokens of a `grid` of patches.

  Position information (`posemb`) enters where `posemb_where` says: at the input
  (`posembed_input`, the published layout), before every block from its own
  parameters (`posembed_{i}`), or before every block from the one
  `posembed_input`; for 'relative' it enters the attention logits of those
  blocks instead. Stochastic depth grows linearly from 0 at the first block to
  `stochastic_depth` at the last. `remat` (a `REMAT_POLICIES` key) recomputes
  each block's activations in the backward pass instead of storing them;
  parameter names are unchanged. `scan_layers` runs identical blocks as one
  `nn.scan`, their parameters stacked under `encoderblock` (layer axis first);
  `checkpoint.save` still writes the published per-block names. `prefix`
  tokens (a ViT's class token and registers, where it has registers) join the
  sequence in front after the input position embedding, without one. With
  `spec.pooled_norm` the final LayerNorm normalises `pool` of the tokens (the
  head's pooling) instead of every token, as timm's `fc_norm` does. A batch of
  images of several grids padded to `grid` gives `grids` (each image's (rows,
  columns) of patches, for the position table) and `key_mask` ((B, T), True for
  the tokens that are there, for the attention).
  """
  spec: EncoderSpec
  grid: Tuple[int, int]

  @nn.compact
  def __call__(self, x, *, train: bool, prefix: Optional[jax.Array] = None,
               pool: Optional[Callable[[jax.Array], jax.Array]] = None,
               grids: Optional[Sequence[Tuple[int, int]]] = None,
               key_mask: Optional[jax.Array] = None):
    spec = self.spec
    if spec.pooled_norm and pool is None:
      raise ValueError('pooled_norm normalises the pooled tokens: give the Encoder pool.')
    if prefix is not None and spec.posemb not in ('none', 'relative') and (
        spec.posemb_where != 'input'):
      raise ValueError(f'Registers join the tokens after the position embedding at the input; '
                       f'posemb_where {spec.posemb_where!r} adds it before every block: use '
                       "posemb_where='input' with registers.")
    for block_index, kind in spec.skip_removed:
      if kind not in SKIPS or not 0 <= block_index < spec.num_layers:
        raise ValueError(f'skip_removed entry {(block_index, kind)} names no skip connection: '
                         f'use (block, branch) with block in 0..{spec.num_layers - 1} and '
                         f'branch in {SKIPS}.')
    # The position module entering before each block that gets one.
    if spec.posemb == 'none':
      entries = {}
    elif spec.posemb_where == 'input':
      entries = {0: 'posembed_input'}
    elif spec.posemb_where == 'every_layer':
      entries = {i: f'posembed_{i}' for i in range(spec.num_layers)}
    else:
      entries = dict.fromkeys(range(spec.num_layers), 'posembed_input')
    relative = spec.posemb == 'relative'
    modules = {}

    def position(name: str) -> nn.Module:
      """The position module `name`, made once: a shared one is called again."""
      if name not in modules:
        modules[name] = (RelativeEmbedding(self.grid[0] * self.grid[1], spec.num_heads,
                                           x.shape[-1] // spec.num_heads, name=name)
                         if relative else AddPositionEmbs(self.grid, spec.posemb,
                                                          table_grid=spec.posemb_grid, name=name))
      return modules[name]

    if not relative and 0 in entries:
      x = position(entries.pop(0))(x, grids)
    if prefix is not None:
      x = jnp.concatenate([prefix.astype(x.dtype), x], axis=1)
    x = nn.Dropout(spec.dropout_rate)(x, deterministic=not train)
    if spec.pre_norm:  # CLIP's LayerNorm of the embedded tokens, before the blocks
      x = norm_layer(spec.normalization, spec.layer_norm_eps, spec.dtype, 'pre_norm')(x)
    block = Encoder1DBlock
    if spec.remat != 'none':
      # static_argnums counts `self`: `train` (index 2) selects the program.
      block = nn.remat(block, policy=REMAT_POLICIES[spec.remat], static_argnums=(2,))
    block = functools.partial(block, activation=spec.activation,
                              layer_norm_eps=spec.layer_norm_eps,
                              attention_bias=spec.attention_bias, rope=spec.rope,
                              rope_theta=spec.rope_theta, rope_grid=spec.rope_grid,
                              rope_offset=spec.rope_offset, mlp_norm=spec.mlp_norm,
                              normalization=spec.normalization,
                              projection_bias=spec.projection_bias)
    rates = [spec.stochastic_depth * i / max(spec.num_layers - 1, 1)
             for i in range(spec.num_layers)]
    if spec.scan_layers:
      x = self._scanned_blocks(block, x, jnp.asarray(rates, jnp.float32), train, key_mask)
      return self._final_norm(x, pool)
    removed = {(int(b), str(k)) for b, k in spec.skip_removed}
    for i in range(spec.num_layers):
      table = None
      if i in entries:
        if relative:
          table = position(entries[i])()
        else:
          x = position(entries[i])(x)
      x = block(
          spec.mlp_dim, spec.num_heads, spec.dropout_rate, spec.attention_dropout_rate,
          drop_path=rates[i], attention_impl=spec.attention_impl, dtype=spec.dtype,
          grid=self.grid,
          attention_window=spec.attention_window, attention_skip=(i, 'sa') not in removed,
          mlp_skip=(i, 'mlp') not in removed, layer_scale_init=spec.layer_scale_init,
          name=f'encoderblock_{i}')(x, train, table, None, key_mask)
    return self._final_norm(x, pool)

  def _final_norm(self, x, pool):
    """The final LayerNorm of every token, or of `pool` of them (`pooled_norm`)."""
    if self.spec.pooled_norm:
      x = pool(x)
    return norm_layer(self.spec.normalization, self.spec.layer_norm_eps, self.spec.dtype,
                      'encoder_norm')(x)

  def _scanned_blocks(self, block, x, rates, train: bool, key_mask=None):
    """The blocks as one `nn.scan` over stacked parameters `encoderblock/...` (layer
    axis first, as big_vision scans): one block is compiled whatever the depth.
    Each block gets its stochastic-depth rate from `rates`; what varies otherwise
    from block to block cannot be scanned."""
    spec = self.spec
    varying = [name for name, value in (
        ('skip_removed', spec.skip_removed),
        ("posemb 'relative'", spec.posemb == 'relative'),
        (f'posemb_where {spec.posemb_where!r}',
         spec.posemb != 'none' and spec.posemb_where != 'input')) if value]
    if varying:
      raise ValueError(f'scan_layers needs identical blocks, but {" and ".join(varying)} '
                       'makes them differ; set scan_layers=False.')

    def body(layer, carry, rate, mask):
      return layer(carry, train, None, rate, mask), None

    scan = nn.scan(body, variable_axes={'params': 0, 'intermediates': 0},
                   split_rngs={'params': True, 'dropout': True}, length=spec.num_layers,
                   in_axes=(0, nn.broadcast))
    x, _ = scan(block(spec.mlp_dim, spec.num_heads, spec.dropout_rate,
                      spec.attention_dropout_rate, attention_impl=spec.attention_impl,
                      dtype=spec.dtype, grid=self.grid, attention_window=spec.attention_window,
                      layer_scale_init=spec.layer_scale_init, name='encoderblock'), x, rates,
                key_mask)
    return x


class VisionTransformer(nn.Module):
  """ViT, or with `resnet_layers` set the hybrid ResNet+ViT.

  Images (B, H, W, 3) in [-1, 1] -> logits (B, C) for the `token`, `gap`,
  `token_gap` (a class token that the blocks see, the head pooling the patches'
  mean, as timm's class-token ViTs with global_pool='avg'), `map` and `token_map`
  (attention pooling of the patches, or of the class token and the patches, as
  Perception Encoder's), `attention_pool` (AIMv2's: a learned query attending over
  the tokens, `AttentionPool`) heads, per-token logits (B, N, C) for `unpooled` and
  (B, N+1, C) for `token_unpooled`; with `num_classes` 0 or None, the (pre-)logits features.
  `attention_impl` (`ATTENTION_IMPLS`), `remat` (`REMAT_POLICIES`) and
  `scan_layers` (the blocks as one `nn.scan`) change how, not what, it
  computes. The papers' ablations: `posemb` (`POSEMBS`) entering where
  `posemb_where` (`POSEMB_WHERE`) says, `skip_removed` ((block, 'sa' or 'mlp')
  pairs whose residual connection is dropped) and `attention_window` (k > 0:
  each patch attends to the k x k patches around it; the class token stays
  global). `layer_scale_init` > 0 gives every block LayerScale.
  `num_registers` > 0 adds that many learned tokens (`registers`, Darcet et al.
  2024, "Vision Transformers Need Registers") after the class token: every block
  sees them, the head does not. A ViT with registers adds its position
  embeddings to the patches only (one row per patch), the class token and the
  registers joining after, as DINOv2 with registers and timm (`reg_token`,
  `no_embed_class`) have it. The ViTs trained otherwise differ in `activation`
  (`ACTIVATIONS`), `layer_norm_eps`, `pre_norm` (CLIP's LayerNorm before the
  blocks, `pre_norm`), a patch embedding without bias (`patch_bias`, CLIP's) and
  the pixel statistics they were trained on:
  `pixel_mean` and `pixel_std` (per channel, for images in [0, 1]) make the
  model take [-1, 1] images as every model here does and normalise them itself.
  `head_bias_init` is the head's initial bias (big_vision's and the original
  code's field; a sigmoid loss starts from a negative one). `attention_bias`
  (`attention.ATTENTION_BIASES`) names the attention projections with a bias;
  `rope` (`rope.ROPES`) gives every attention layer rotary position embeddings
  with periods of base `rope_theta`, as DINOv3 has them with `posemb='none'`: no
  position table, so the model runs at any grid. `posemb_grid` (rows, columns)
  gives the 'learn' table that grid of patches whatever the images' grid, resized
  to each call's grid as SigLIP 2 does (`AddPositionEmbs`); None, the default: the
  table is the images' grid. `rope_grid` scales EVA-02's rotary coordinates to that
  grid whatever the images' (its pretraining grid; `rope.eva02_angles`), after
  adding `rope_offset` to the patch indices (Perception Encoder's 1); `map_heads`
  and `map_mlp_dim` give the attention pooling its own heads and MLP width
  (Perception Encoder's 8 and 4 x the width; None: the blocks'); `mlp_norm`
  gives every MLP EVA-02's LayerNorm of its hidden units (`MlpBlock`);
  `pooled_norm` moves the final LayerNorm after the head's pooling (timm's
  `fc_norm`, EVA-02's and timm's average-pooling ViTs'). AIMv2's blocks differ in
  `normalization` (`NORMALIZATIONS`: 'rms' makes every norm an RMSNorm), a norm of
  the patch embeddings before their positions (`patch_norm`, a module of that
  name), and `projection_bias` (False: neither the attention's output projection
  nor the MLP has a bias, timm's `proj_bias`). `__call__`'s `grids` run a batch of
  images of mixed shapes, as SigLIP 2 does.
  """
  num_classes: Optional[int]
  patch_size: int
  hidden_size: int
  mlp_dim: int
  num_heads: int
  num_layers: int
  classifier: str = 'token'
  representation_size: Optional[int] = None
  posemb: str = 'learn'
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  stochastic_depth: float = 0.
  resnet_layers: Optional[Sequence[int]] = None
  resnet_width: float = 1
  attention_impl: str = 'auto'
  remat: str = 'none'
  scan_layers: bool = False
  dtype: Dtype = jnp.float32
  posemb_where: str = 'input'
  attention_window: int = 0
  skip_removed: Sequence[Tuple[int, str]] = ()
  layer_scale_init: float = 0.
  num_registers: int = 0
  activation: str = 'gelu_tanh'
  layer_norm_eps: float = 1e-6
  pre_norm: bool = False
  pixel_mean: Optional[Sequence[float]] = None
  pixel_std: Optional[Sequence[float]] = None
  patch_bias: bool = True
  head_bias_init: float = 0.
  attention_bias: str = 'qkv'
  rope: str = 'none'
  rope_theta: float = 100.
  posemb_grid: Optional[Sequence[int]] = None
  rope_grid: Optional[Sequence[int]] = None
  rope_offset: float = 0.
  mlp_norm: bool = False
  pooled_norm: bool = False
  map_heads: Optional[int] = None
  map_mlp_dim: Optional[int] = None
  normalization: str = 'layer'
  projection_bias: bool = True
  patch_norm: bool = False

  def encoder_spec(self) -> EncoderSpec:
    """The encoder's fields as one value: this model's fields of `EncoderSpec`'s names.

    Returns:
      The `EncoderSpec` its `Encoder` computes.
    """
    fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(EncoderSpec)}
    for name in ('posemb_grid', 'rope_grid'):
      if fields[name] is not None:
        fields[name] = tuple(fields[name])
    return EncoderSpec(**fields)

  @nn.compact
  def __call__(self, images, *, train: bool = False,
               grids: Optional[Sequence[Tuple[int, int]]] = None):
    """The model on `images` (B, H, W, 3) in [-1, 1].

    Args:
      images: the images; with `grids`, each padded at its bottom and right to H x W.
      train: dropout and stochastic depth on.
      grids: a batch of mixed shapes, as SigLIP 2 runs one: each image's (rows,
        columns) of patches, Python ints (under `jax.jit` a tuple of tuples named
        in `static_argnames`), at the top left of the padded images.
        Each image gets its own grid's position table (`posemb_grid`'s, resized
        to it) and the padded patches are kept from attention and pooling, as
        SigLIP 2's `spatial_shapes` and `pixel_attention_mask`; None: every image
        is all there.

    Returns:
      The logits, or the features of a headless model.
    """
    for field, valid in (('classifier', CLASSIFIERS), ('posemb', POSEMBS),
                         ('posemb_where', POSEMB_WHERE), ('activation', ACTIVATIONS),
                         ('attention_impl', ATTENTION_IMPLS), ('remat', REMAT_POLICIES),
                         ('attention_bias', ATTENTION_BIASES), ('rope', ROPES),
                         ('normalization', NORMALIZATIONS)):
      if getattr(self, field) not in valid:
        raise ValueError(f'Unknown {field} {getattr(self, field)!r}; use one of {tuple(valid)}.')
    if self.posemb_grid is not None and (self.posemb != 'learn' or len(self.posemb_grid) != 2):
      raise ValueError(f'posemb_grid {self.posemb_grid!r} is the (rows, columns) of a learned '
                       f"table (posemb='learn'), and this model's posemb is {self.posemb!r}: "
                       "use posemb='learn' or posemb_grid=None.")
    if self.pooled_norm and self.classifier not in PARAMETER_FREE_POOLING:
      raise ValueError(f'pooled_norm normalises what the head pools, and classifier '
                       f'{self.classifier!r} pools nothing or by parameters of its own: use '
                       f'one of {PARAMETER_FREE_POOLING}, or pooled_norm=False.')
    if self.rope_grid is not None and (self.rope not in ('eva02', 'pe')
                                       or len(self.rope_grid) != 2):
      raise ValueError(f"rope_grid {self.rope_grid!r} is the (rows, columns) EVA-02's and "
                       "Perception Encoder's rotary coordinates are scaled to (rope 'eva02' or "
                       f"'pe'), and this model's rope is {self.rope!r}: use one of those or "
                       'rope_grid=None.')
    if self.rope_offset and self.rope not in ('eva02', 'pe'):
      raise ValueError(f'rope_offset {self.rope_offset!r} shifts the patch indices of rope '
                       f"'eva02' or 'pe', and this model's rope is {self.rope!r}: use one of "
                       'those or rope_offset=0.')
    if grids is not None:
      self._check_grids(images, grids)
    x = images.astype(self.dtype)
    if self.pixel_mean is not None:  # [-1, 1] images as the model was trained to see them
      x = ((x + 1) / 2 - jnp.asarray(self.pixel_mean, x.dtype)) / jnp.asarray(
          self.pixel_std, x.dtype)
    if self.resnet_layers is not None:
      resnet = ResNetV1(tuple(self.resnet_layers), self.resnet_width, self.dtype)
      nn.share_scope(self, resnet)
      x = resnet(x)

    p = self.patch_size
    if x.shape[1] % p or x.shape[2] % p:
      raise ValueError(
          f'Image size {images.shape[1:3]} gives a feature map {x.shape[1:3]} that is not '
          f'divisible by the patch size {p}; resize or crop the images to a multiple of '
          f'{p * images.shape[1] // x.shape[1]} pixels.')
    x = nn.Conv(self.hidden_size, (p, p), strides=(p, p), padding='VALID', dtype=self.dtype,
                use_bias=self.patch_bias, conv_general_dilated=conv.conv_general_dilated,
                name='embedding')(x)
    b, gh, gw, d = x.shape
    x = x.reshape(b, gh * gw, d)
    if self.patch_norm:  # AIMv2's: the patch embeddings normalised before their positions
      x = norm_layer(self.normalization, self.layer_norm_eps, self.dtype, 'patch_norm')(x)
    self.sow('intermediates', PATCH_EMBEDDING, x)  # before positions, class token, registers
    tokens = []  # before the patches: the class token, then the registers
    if _has_token(self):
      tokens.append(self.param('cls', nn.initializers.zeros, (1, 1, d)))
    if self.num_registers:
      # Random, not zeros: identical registers would get identical gradients.
      tokens.append(self.param('registers', nn.initializers.normal(stddev=0.02),
                               (1, self.num_registers, d)))
    prefix = None
    if tokens:
      prefix = jnp.tile(jnp.concatenate(tokens, axis=1).astype(x.dtype), (b, 1, 1))
    if prefix is not None and not self.num_registers:  # the class token gets a position
      x, prefix = jnp.concatenate([prefix, x], axis=1), None

    leading = int(_has_token(self)) + self.num_registers
    key_mask = None
    if grids is not None:  # the tokens that are there: the prefix, each image's patches
      there = np.array([[r < h and c < w for r in range(gh) for c in range(gw)]
                        for h, w in grids])
      key_mask = jnp.asarray(np.concatenate([np.ones((b, leading), bool), there], axis=1))
    pool = functools.partial(self._pool, leading=leading, key_mask=key_mask)
    x = Encoder(self.encoder_spec(), (gh, gw), name='Transformer')(
        x, train=train, prefix=prefix, pool=pool, grids=grids, key_mask=key_mask)
    if not self.pooled_norm:
      x = pool(x)
    if self.classifier == 'attention_pool':
      x = AttentionPool(self.map_heads or self.num_heads, self.dtype,
                        self.attention_bias == 'qkv', name='attention_pool')(x)
    if self.classifier in ('map', 'token_map'):
      x = MAPHead(self.map_mlp_dim or self.mlp_dim, self.map_heads or self.num_heads,
                  self.dtype, self.activation, self.layer_norm_eps,
                  self.normalization)(x, train=train, key_mask=None if key_mask is None
                                      else key_mask[:, leading:])
    if self.representation_size is not None:
      x = jnp.tanh(nn.Dense(self.representation_size, dtype=self.dtype, name='pre_logits')(x))
    self.sow('intermediates', 'pre_logits', x)
    if self.num_classes:
      x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                   bias_init=nn.initializers.constant(self.head_bias_init), name='head')(x)
    return x.astype(jnp.float32)

  def _check_grids(self, images, grids) -> None:
    """Refuses `grids` that are not one grid per image within the images' patches,
    or a model whose position information or head a batch of mixed shapes would
    change."""
    p, (height, width) = self.patch_size, images.shape[1:3]
    if len(grids) != images.shape[0] or any(
        len(g) != 2 or not all(isinstance(n, (int, np.integer)) and 0 < n for n in g)
        or g[0] * p > height or g[1] * p > width for g in grids):
      raise ValueError(f'grids {list(grids)!r} must give each of the {images.shape[0]} images '
                       f'its (rows, columns) of patches, positive integers within the padded '
                       f'{height // p} x {width // p}.')
    for refused, why in (
        (self.resnet_layers is not None, 'a hybrid, whose ResNet sees the padding'),
        (self.posemb != 'none' and (self.posemb != 'learn' or self.posemb_grid is None),
         f'posemb {self.posemb!r} without posemb_grid, whose table is the padded grid'),
        (self.rope != 'none', f'rope {self.rope!r}, whose angles are the padded grid\'s'),
        (self.posemb_where != 'input', f'posemb_where {self.posemb_where!r}'),
        (self.classifier not in ('token', 'gap', 'map'),
         f'classifier {self.classifier!r}, whose pooling would read the padding'),
        (self.attention_window > 0, 'attention_window, whose windows are the padded grid\'s')):
      if refused:
        raise ValueError(f'A batch of mixed shapes (grids) runs a ViT whose position table is '
                         f'resized per image (posemb_grid) or that has none, pooled by the '
                         f"class token, the patches' mean or attention; this one has {why}: run "
                         'each shape as its own batch.')

  def _pool(self, x, *, leading: int, key_mask: Optional[jax.Array] = None):
    """What the head sees of the (B, T, D) tokens, whose first `leading` are the
    class token and the registers: the class token, the patches' mean (of those
    `key_mask` says are there), or the tokens without the registers, which never
    reach the head."""
    if self.classifier == 'token':
      return x[:, 0]
    patches = x[:, leading:]
    if self.classifier in ('gap', 'token_gap') and key_mask is not None:
      there = key_mask[:, leading:, None].astype(patches.dtype)
      return jnp.sum(patches * there, axis=1) / jnp.sum(there, axis=1)
    if self.classifier in ('gap', 'token_gap'):
      return jnp.mean(patches, axis=1)
    kept = int(self.classifier in ('token_unpooled', 'token_map'))  # the class token
    return jnp.concatenate([x[:, :kept], patches], axis=1)


# ---------------------------------------------------------------------------
# The family: published variants, sown layers, fine-tuning from a checkpoint.

# hidden size, MLP size, heads, layers
SIZES = {
    'Ti': (192, 768, 3, 12),
    'S': (384, 1536, 6, 12),
    'B': (768, 3072, 12, 12),
    'L': (1024, 4096, 16, 24),
    'H': (1280, 5120, 16, 32),
    # "Scaling Vision Transformers" (Table 2) and SigLIP's shape-optimised So400m, as
    # big_vision builds them; published as big_vision files (`checkpoint.load` reads them).
    'So400m': (1152, 4304, 16, 27),
    'g': (1408, 6144, 16, 40),
    'G': (1664, 8192, 16, 48),
}
PUBLISHED = ('Ti/16', 'S/16', 'S/32', 'B/8', 'B/16', 'B/32', 'L/16', 'L/32', 'H/14',
             'So400m/14', 'g/14', 'G/14')
# name: (ViT size, patch size on the ResNet features, ResNet stage depths)
HYBRID_PUBLISHED = {
    'R50+ViT-B_16': ('B', 1, (3, 4, 9)),
    'R26+ViT-S_32': ('S', 1, (2, 2, 2, 2)),
    'R26+ViT-B_32': ('B', 1, (2, 2, 2, 2)),
    'R50+ViT-L_32': ('L', 1, (3, 4, 6, 3)),
    'R+ViT-Ti_16': ('Ti', 8, ()),
}


def _fields(size: str, patch: int, resnet_layers=None) -> dict:
  hidden, mlp, heads, layers = SIZES[size]
  return dict(patch_size=patch, hidden_size=hidden, mlp_dim=mlp, num_heads=heads,
              num_layers=layers, classifier='token', representation_size=None, posemb='learn',
              dropout_rate=0., attention_dropout_rate=0., stochastic_depth=0.,
              resnet_layers=resnet_layers, resnet_width=1, attention_impl='auto', remat='none',
              scan_layers=False, posemb_where='input', attention_window=0, skip_removed=(),
              layer_scale_init=0., num_registers=0, activation='gelu_tanh', layer_norm_eps=1e-6,
              pre_norm=False, pixel_mean=None, pixel_std=None, patch_bias=True,
              head_bias_init=0., attention_bias='qkv', rope='none', rope_theta=100.,
              posemb_grid=None, rope_grid=None, rope_offset=0., mlp_norm=False,
              pooled_norm=False, map_heads=None, map_mlp_dim=None, normalization='layer',
              projection_bias=True, patch_norm=False)


# The AugReg paper's GAP models without a pre-logits layer, as the original code names them.
GAP_NOREP = ('S/16', 'B/16', 'S/32', 'B/32')

# The pixel statistics (per channel, images in [0, 1]) the models below were trained on.
IMAGENET_PIXELS = dict(pixel_mean=(0.485, 0.456, 0.406), pixel_std=(0.229, 0.224, 0.225))
CLIP_PIXELS = dict(pixel_mean=(0.48145466, 0.4578275, 0.40821073),
                   pixel_std=(0.26862954, 0.26130258, 0.27577711))
_DINOV2 = dict(layer_scale_init=1e-5, activation='gelu', **IMAGENET_PIXELS)
_DEIT = dict(activation='gelu', **IMAGENET_PIXELS)
# DINOv2's ViT-g ("giant2"): 1536 wide, 24 heads, 40 blocks of SwiGLU MLPs of 4096 units.
_DINOV2_GIANT = dict(_DINOV2, hidden_size=1536, num_heads=24, mlp_dim=4096, activation='swiglu')

# TIPSv2's image towers (Google DeepMind 2026): DINOv2's block with LayerScale
# starting at 1, exact GELU, one register, and images in [0, 1] as they are (mean 0,
# std 1); the g/14 with DINOv2-g's SwiGLU MLP.
_TIPSV2 = dict(layer_scale_init=1.0, activation='gelu', num_registers=1,
               pixel_mean=(0., 0., 0.), pixel_std=(1., 1., 1.))
# DINOv3 (Simeoni et al. 2025): 2D RoPE of base 100 and no position table, four
# registers, LayerScale, exact GELU or (S+, H+, 7B) SwiGLU, LayerNorms of epsilon 1e-5;
# its key bias is masked to zero, and timm's files without `_qkvb` hold no query or
# value bias either.
_DINOV3 = dict(posemb='none', rope='dinov3', rope_theta=100., attention_bias='none',
               num_registers=4, layer_scale_init=1e-5, activation='gelu', layer_norm_eps=1e-5,
               **IMAGENET_PIXELS)
# name: (SIZES key, what differs from that size, timm's model name)
_DINOV3_SIZES = {
    'S': ('S', {}, 'vit_small_patch16_dinov3'),
    'S+': ('S', dict(activation='swiglu'), 'vit_small_plus_patch16_dinov3'),
    'B': ('B', {}, 'vit_base_patch16_dinov3'),
    'L': ('L', {}, 'vit_large_patch16_dinov3'),
    'H+': ('H', dict(num_heads=20, activation='swiglu'), 'vit_huge_plus_patch16_dinov3'),
    '7B': ('H', dict(hidden_size=4096, mlp_dim=8192, num_heads=32, num_layers=40,
                     activation='swiglu'), 'vit_7b_patch16_dinov3'),
}

# EVA-02 (Fang et al. 2024, "EVA-02: A Visual Representation for Neon Genesis"): a
# class-token ViT with a position table and, beside it, 2D RoPE in interleaved pairs
# (base 10000, coordinates scaled to the 16 x 16 grid of its 224 px pretraining),
# query and value biases, SwiGLU MLPs 8/3 times the width (B and L with a LayerNorm
# of the hidden units), the patches' mean pooled then normalised, CLIP's pixels.
_EVA02 = dict(rope='eva02', rope_theta=10000., rope_grid=(16, 16), attention_bias='qv',
              activation='swiglu', classifier='token_gap', pooled_norm=True, **CLIP_PIXELS)
# size: (MLP width, what differs from _EVA02)
_EVA02_SIZES = {'Ti': (512, {}), 'S': (1024, {}), 'B': (2048, dict(mlp_norm=True)),
                'L': (2730, dict(mlp_norm=True))}
_EVA02_TIMM = {'Ti': 'tiny', 'S': 'small', 'B': 'base', 'L': 'large'}
# name suffix: (sizes, timm's resolution and tag, the images' side, the head's classes)
_EVA02_FILES = {
    '': (('Ti', 'S', 'B', 'L'), '224.mim_in22k', 224, 0),
    '-m38m': (('L',), '224.mim_m38m', 224, 0),
    '-in1k': (('Ti', 'S'), '336.mim_in22k_ft_in1k', 336, 1000),
    '-in22k-in1k': (('B', 'L'), '448.mim_in22k_ft_in22k_in1k', 448, 1000),
    '-m38m-in22k-in1k': (('L',), '448.mim_m38m_ft_in22k_in1k', 448, 1000),
}

# Perception Encoder (Bolya et al. 2025, PE core): CLIP-style, a patch embedding without
# bias and a LayerNorm before the
# blocks, a position table and, beside it, 2D RoPE in EVA-02's interleaved pairs with the
# columns' angles first and patch indices from 1 (G's from 0), scaled to the grid of
# each model's pretraining; the class token and the patches attention-pooled by 8 heads
# with an MLP 4 times the width; exact GELU, LayerNorms of epsilon 1e-5, images in
# [-1, 1]. G has no class token.
_PE = dict(rope='pe', rope_theta=10000., rope_offset=1., pre_norm=True, patch_bias=False,
           classifier='token_map', map_heads=8, activation='gelu', layer_norm_eps=1e-5)
# name: (SIZES key, patch, what differs, timm's model, its resolution)
_PE_SIZES = {
    'T': ('Ti', 16, dict(rope_grid=(24, 24), map_mlp_dim=768), 'tiny_patch16_384', 384),
    'S': ('S', 16, dict(rope_grid=(24, 24), map_mlp_dim=1536), 'small_patch16_384', 384),
    'B': ('B', 16, dict(rope_grid=(14, 14), map_mlp_dim=3072), 'base_patch16_224', 224),
    'L': ('L', 14, dict(rope_grid=(24, 24), map_mlp_dim=4096), 'large_patch14_336', 336),
    'G': ('G', 14, dict(hidden_size=1536, mlp_dim=8960, num_heads=16, num_layers=50,
                        rope_grid=(32, 32), rope_offset=0., classifier='map',
                        map_mlp_dim=6144), 'gigantic_patch14_448', 448),
}

# AIMv2 (Fini et al. 2025, "Multimodal Autoregressive Pre-training of Large Vision
# Encoders"), as timm builds its `aimv2_*` files: RMSNorms of epsilon 1e-5 everywhere,
# the patch embeddings' own among them; no bias in the attention or the SwiGLU MLP; no
# class token, the final norm of every token then their mean; OpenAI's pixels.
_AIMV2 = dict(normalization='rms', layer_norm_eps=1e-5, patch_norm=True, attention_bias='none',
              projection_bias=False, activation='swiglu', classifier='gap', **CLIP_PIXELS)
# size: (width, heads, MLP width: timm's int(width * mlp_ratio), timm's size); 24 blocks
_AIMV2_SIZES = {'L': (1024, 8, 2816, 'large'), 'H': (1536, 12, 4096, 'huge'),
                '1B': (2048, 16, 5632, '1b'), '3B': (3072, 24, 8192, '3b')}
# name suffix: (the images' side, timm's tag, sizes)
_AIMV2_FILES = {'': (224, 'apple_pt', ('L', 'H', '1B', '3B')),
                '-336': (336, 'apple_pt', ('L', 'H', '1B', '3B')),
                '-448': (448, 'apple_pt', ('L', 'H', '1B', '3B')),
                '-dist': (224, 'apple_pt_dist', ('L',)),
                '-336-dist': (336, 'apple_pt_dist', ('L',))}


@dataclasses.dataclass(frozen=True)
class TimmVariant:
  """A ViT studied today whose weights timm publishes: read with
  `checkpoint.load(path, name)` from timm's file of `timm_name`."""
  size: str  # a `SIZES` key
  patch: int
  fields: Mapping[str, Any]  # what differs from the published ViTs, preprocessing included
  timm_name: str  # timm's model and pretrained tag
  resolution: int  # the images' side it was trained at
  classes: int  # the outputs of the file's head: 0 where it has none


# SigLIP sees images in [-1, 1], as the published ViTs: no pixel statistics.
TIMM_VARIANTS = {
    'DINOv2-S_14': TimmVariant('S', 14, _DINOV2, 'vit_small_patch14_dinov2.lvd142m', 518, 0),
    'DINOv2-B_14': TimmVariant('B', 14, _DINOV2, 'vit_base_patch14_dinov2.lvd142m', 518, 0),
    'DINOv2-L_14': TimmVariant('L', 14, _DINOV2, 'vit_large_patch14_dinov2.lvd142m', 518, 0),
    'DINOv2-g_14': TimmVariant('g', 14, _DINOV2_GIANT, 'vit_giant_patch14_dinov2.lvd142m', 518, 0),
    'DINOv2-S_14-reg4': TimmVariant('S', 14, dict(_DINOV2, num_registers=4),
                                    'vit_small_patch14_reg4_dinov2.lvd142m', 518, 0),
    'DINOv2-B_14-reg4': TimmVariant('B', 14, dict(_DINOV2, num_registers=4),
                                    'vit_base_patch14_reg4_dinov2.lvd142m', 518, 0),
    'DINOv2-L_14-reg4': TimmVariant('L', 14, dict(_DINOV2, num_registers=4),
                                    'vit_large_patch14_reg4_dinov2.lvd142m', 518, 0),
    'DINOv2-g_14-reg4': TimmVariant('g', 14, dict(_DINOV2_GIANT, num_registers=4),
                                    'vit_giant_patch14_reg4_dinov2.lvd142m', 518, 0),
    'SigLIP-B_16': TimmVariant('B', 16, dict(classifier='map'),
                               'vit_base_patch16_siglip_224.webli', 224, 0),
    'CLIP-B_16': TimmVariant('B', 16, dict(pre_norm=True, patch_bias=False,
                                           activation='quick_gelu', layer_norm_eps=1e-5,
                                           **CLIP_PIXELS),
                             'vit_base_patch16_clip_quickgelu_224.openai', 224, 512),
    'DeiT-Ti_16': TimmVariant('Ti', 16, _DEIT, 'deit_tiny_patch16_224.fb_in1k', 224, 1000),
    'DeiT-S_16': TimmVariant('S', 16, _DEIT, 'deit_small_patch16_224.fb_in1k', 224, 1000),
    'DeiT-B_16': TimmVariant('B', 16, _DEIT, 'deit_base_patch16_224.fb_in1k', 224, 1000),
    'TIPSv2-B_14': TimmVariant('B', 14, _TIPSV2, 'vit_base_patch14_reg1_tipsv2.webli', 448, 0),
    'TIPSv2-L_14': TimmVariant('L', 14, _TIPSV2, 'vit_large_patch14_reg1_tipsv2.webli', 448, 0),
    'TIPSv2-So400m_14': TimmVariant('So400m', 14, _TIPSV2,
                                    'vit_so400m_patch14_reg1_tipsv2.webli', 448, 0),
    'TIPSv2-g_14': TimmVariant('g', 14, {**_DINOV2_GIANT, **_TIPSV2, 'activation': 'swiglu'},
                               'vit_giant_patch14_reg1_tipsv2.webli', 448, 0),
}


def _dinov3_variants() -> Dict[str, TimmVariant]:
  """DINOv3's sizes as timm publishes them (LVD-1689M weights, 256 px), each but
  the 7B also as its `_qkvb` file: the same weights with zero query and value
  biases."""
  table = {}
  for size, (base, fields, timm_name) in _DINOV3_SIZES.items():
    table[f'DINOv3-{size}_16'] = TimmVariant(base, 16, dict(_DINOV3, **fields),
                                             f'{timm_name}.lvd1689m', 256, 0)
    if size != '7B':
      table[f'DINOv3-{size}_16-qkvb'] = TimmVariant(
          base, 16, dict(_DINOV3, **fields, attention_bias='qv'),
          f'{timm_name}_qkvb.lvd1689m', 256, 0)
  return table


TIMM_VARIANTS.update(_dinov3_variants())


def _eva02_variants() -> Dict[str, TimmVariant]:
  """EVA-02's sizes as timm publishes them: the masked-image-modelling pretraining
  (headless, 224 px) and the ImageNet fine-tunes (336 or 448 px)."""
  table = {}
  for suffix, (sizes, tag, resolution, classes) in _EVA02_FILES.items():
    for size in sizes:
      mlp, fields = _EVA02_SIZES[size]
      table[f'EVA02-{size}_14{suffix}'] = TimmVariant(
          size, 14, dict(_EVA02, mlp_dim=mlp, **fields),
          f'eva02_{_EVA02_TIMM[size]}_patch14_{tag}', resolution, classes)
  return table


TIMM_VARIANTS.update(_eva02_variants())
TIMM_VARIANTS.update({
    f'PE-Core-{size}_{patch}': TimmVariant(base, patch, dict(_PE, **fields),
                                           f'vit_pe_core_{timm}.fb', resolution, 0)
    for size, (base, patch, fields, timm, resolution) in _PE_SIZES.items()})



def _aimv2_variants() -> Dict[str, TimmVariant]:
  """AIMv2's sizes as timm publishes them, headless, at 224, 336 and 448 px, and
  L's distilled files."""
  table = {}
  for suffix, (resolution, tag, sizes) in _AIMV2_FILES.items():
    for size in sizes:
      width, heads, mlp, timm = _AIMV2_SIZES[size]
      table[f'AIMv2-{size}_14{suffix}'] = TimmVariant(
          'L', 14, dict(_AIMV2, hidden_size=width, num_heads=heads, mlp_dim=mlp),
          f'aimv2_{timm}_patch14_{resolution}.{tag}', resolution, 0)
  return table


TIMM_VARIANTS.update(_aimv2_variants())


def _variants() -> dict:
  table = {}
  for variant in PUBLISHED:
    size, patch = variant.split('/')
    table[f'ViT-{size}_{patch}'] = _fields(size, int(patch))
  for variant in GAP_NOREP:
    size, patch = variant.split('/')
    table[f'ViT-{size}_{patch}-gap-norep'] = dict(_fields(size, int(patch)), classifier='gap')
  for name, (size, patch, stages) in HYBRID_PUBLISHED.items():
    table[name] = _fields(size, patch, stages)
  for name, variant in TIMM_VARIANTS.items():
    table[name] = dict(_fields(variant.size, variant.patch), **variant.fields)
  # The original code's test models: one block of width 10.
  testing = dict(_fields('Ti', 16), hidden_size=10, mlp_dim=10, num_heads=2, num_layers=1,
                 dropout_rate=0.1)
  table['testing'] = testing
  table['testing-unpooled'] = dict(testing, classifier='unpooled')
  return table


def layers(config: ml_collections.ConfigDict) -> Layers:
  """Embedded tokens, then the stream after each attention and each MLP branch.

  Args:
    config: a zoo config of the family.

  Returns:
    Its `Layers`.
  """
  stream, labels, branches = ['Transformer/encoderblock_0/input'], ['embedding'], []
  for i in range(config.num_layers):
    block = f'Transformer/encoderblock_{i}/'
    stream += [block + '+sa', block + '+mlp']
    labels += [f'block{i}/+sa', f'block{i}/+mlp']
    branches += [Branch(f'block{i}/attention', 'attention', block + 'input', block + 'sa'),
                 Branch(f'block{i}/mlp', 'mlp', block + '+sa', block + 'mlp')]
  return Layers(
      stream=tuple(stream), labels=tuple(labels),
      attention=tuple(range(1, len(stream), 2)), branches=tuple(branches),
      attention_weights=tuple(
          f'Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/{ATTENTION_WEIGHTS}'
          for i in range(config.num_layers)),
      head_outputs=tuple(
          f'Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/{HEAD_OUTPUTS}'
          for i in range(config.num_layers)),
      pre_logits='pre_logits',
      class_token=_has_token(config),
      registers=config.num_registers,
      embedding='embedding/kernel', patch_tokens=PATCH_EMBEDDING,
      position_embedding=('Transformer/posembed_input/pos_embedding'
                          if config.posemb == 'learn' and config.posemb_where != 'every_layer'
                          else None),
      architecture=HYBRID if config.resnet_layers is not None else TRANSFORMER)


def describe(config: ml_collections.ConfigDict) -> str:
  """The model's shape in words, for the report.

  Args:
    config: a zoo config of the family.

  Returns:
    The words.
  """
  head = ('class token, mean of the patches' if config.classifier == 'token_gap'
          else 'class token' if config.classifier.startswith('token') else config.classifier)
  if config.num_registers:
    head += f', {config.num_registers} registers'
  shape = (f'{config.num_layers} blocks, width {config.hidden_size}, {config.num_heads} heads, '
           f'patch {config.patch_size}')
  if config.resnet_layers is None:
    return f'{shape}, {head}'
  units = '-'.join(map(str, config.resnet_layers)) or 'root only'
  return f'ResNet stem ({units}), then {shape} of its features, {head}'



def interpolate_posembed(posemb: np.ndarray, old_grid: Tuple[int, int],
                         new_grid: Tuple[int, int]) -> np.ndarray:
  """Resizes grid position embeddings (1, gh*gw, D) to (1, nh*nw, D).

  Bilinear interpolation with corners kept on corners, as
  `scipy.ndimage.zoom(order=1)`; class-token rows are the caller's to keep apart.

  Args:
    posemb: (1, gh*gw, D) embeddings.
    old_grid: (gh, gw).
    new_grid: (nh, nw).

  Returns:
    The (1, nh*nw, D) embeddings.
  """
  grid = np.asarray(posemb)[0].reshape(tuple(old_grid) + (-1,))
  zoom = (new_grid[0] / old_grid[0], new_grid[1] / old_grid[1], 1)
  return scipy.ndimage.zoom(grid, zoom, order=1).reshape(1, new_grid[0] * new_grid[1], -1)


def _square_side(n: int) -> Optional[int]:
  side = math.isqrt(n)
  return side if side * side == n else None


def _split_posembed(n: int) -> Tuple[int, Tuple[int, int]]:
  """(extra rows, square grid) of a checkpoint posembed with n = g*g or 1 + g*g rows."""
  for extra in (0, 1):
    side = _square_side(n - extra)
    if side:
      return extra, (side, side)
  raise CheckpointError(f'The checkpoint position embeddings have {n} rows, which is neither '
                        'a square grid nor a class token plus a square grid; pass grid_shape.')


def _fit_posembed(posemb: np.ndarray, target: np.ndarray, has_token: bool,
                  grid_shape: Optional[Sequence[int]]) -> np.ndarray:
  old_extra, old_grid = _split_posembed(posemb.shape[1])
  new_extra = int(has_token)
  if grid_shape is None:
    side = _square_side(target.shape[1] - new_extra)
    if side is None:
      raise CheckpointError(
          f'The model has {target.shape[1] - new_extra} patches, not a square grid: pass '
          'grid_shape=(rows, cols) to load_pretrained.')
    grid_shape = (side, side)
  grid = posemb[:, old_extra:]
  if old_grid != tuple(grid_shape):
    grid = interpolate_posembed(grid, old_grid, tuple(grid_shape))
    log.info('Resized position embeddings from grid %s to %s.', old_grid, grid_shape)
  # A class-token row comes from the checkpoint when it has one, else from init.
  token = posemb[:, :1] if old_extra else np.asarray(target[:, :1])
  return np.concatenate([token, grid], axis=1) if new_extra else grid


def _resize_axis0(table: np.ndarray, length: int) -> np.ndarray:
  """Linear interpolation of `table` along its first axis to `length` entries,
  first and last kept (`scipy.ndimage.zoom(order=1)`)."""
  table = np.asarray(table)
  if table.shape[0] == length:
    return table
  zoom = (length / table.shape[0],) + (1,) * (table.ndim - 1)
  return scipy.ndimage.zoom(table, zoom, order=1)


def resize_patch_kernel(kernel: np.ndarray, size: Sequence[int]) -> np.ndarray:
  """A patch-embedding kernel for patches of another size: FlexiViT's
  pseudo-inverse resize (Beyer et al. 2023; big_vision's `resample_patchemb`,
  big_vision/models/proj/flexi/vit.py). With B the bilinear resize of a patch to
  `size` (half-pixel centres, no antialiasing, as `tf.image.resize` and the input
  pipeline), the new kernel w' solves B^T w' = w in least squares, so a patch
  resized by B gives the token the original patch gave: exactly when the patch
  grows, as nearly as B allows when it shrinks.

  Args:
    kernel: (h, w, C, D) kernel.
    size: the new (h, w).

  Returns:
    The (size[0], size[1], C, D) kernel.
  """
  old = tuple(kernel.shape[:2])
  if old == tuple(size):
    return kernel
  n = old[0] * old[1]
  basis = np.eye(n, dtype=np.float32).reshape(n, old[0], old[1], 1)
  # Row i: the i-th basis patch resized, i.e. B^T.
  resized = np.asarray(jax.image.resize(basis, (n, size[0], size[1], 1), 'bilinear',
                                        antialias=False), np.float64).reshape(n, -1)
  flat = np.asarray(kernel, np.float64).reshape(n, -1)
  return (np.linalg.pinv(resized) @ flat).reshape(*size, *kernel.shape[2:]).astype(kernel.dtype)


def fit_patches(fit: Fit) -> None:
  """A patch embedding of another patch size resized to the model's
  (`resize_patch_kernel`)."""
  kernel = 'embedding/kernel'
  old, new = fit.restored.get(kernel), fit.init.get(kernel)
  if old is not None and new is not None and old.shape[:2] != new.shape[:2]:
    log.info('Resized the patch embedding of %s from %s to %s patches.', fit.source,
             old.shape[:2], new.shape[:2])
    fit.restored[kernel] = resize_patch_kernel(np.asarray(old), new.shape[:2])


def fit_map_head(fit: Fit) -> None:
  """A MAP head that the checkpoint lacks starts from initialisation; one the new
  model (another classifier) has no place for is dropped."""
  if fit.config.classifier in ('map', 'token_map'):
    fit.from_init('MAPHead_0/')
  else:
    fit.drop([k for k in fit.restored if k.startswith('MAPHead_0/')],
             'the new head is not a MAP head')


def fit_pre_logits(fit: Fit) -> None:
  """`pre_logits` dropped without a representation size, initialised when the
  checkpoint has none."""
  if fit.config.representation_size is None:
    fit.drop([k for k in fit.restored if k.startswith('pre_logits/')], 'no representation_size')
  elif not any(k.startswith('pre_logits/') for k in fit.restored):
    log.info('%s has no pre_logits; they start from initialisation.', fit.source)
    fit.from_init('pre_logits/')


def fit_class_token(fit: Fit) -> None:
  """The class token and its `learn2d` position row kept only for a token head
  (initialised when the checkpoint lacks them)."""
  extra = [k for k in set(fit.restored) | set(fit.init)
           if k == 'cls' or k.endswith('/pos_embedding_extra')]
  if not _has_token(fit.config):
    fit.drop(sorted(extra), 'no class token (classifier ' + repr(fit.config.classifier) + ')')
  else:
    fit.restored.update({k: fit.init[k] for k in extra if k not in fit.restored and k in fit.init})


def fit_registers(fit: Fit) -> None:
  """Registers start from initialisation where the checkpoint has none (or
  another number), and are dropped where the model has none. With registers the
  class token enters after the position embedding, with no row of its own: a
  checkpoint's class-token row joins the class token, as timm converts DINOv2
  with registers (`_convert_dinov2` in timm/models/vision_transformer.py:
  cls_token + pos_embed[:, 0]), so the token the first block sees is unchanged."""
  restored, config = fit.restored, fit.config
  if 'registers' not in fit.init:
    fit.drop(['registers'], 'no registers (num_registers 0)')
    return
  if np.shape(restored.get('registers')) != np.shape(fit.init['registers']):
    log.info('%s has no %d registers; they start from initialisation.', fit.source,
             config.num_registers)
    restored['registers'] = fit.init['registers']
  table = 'Transformer/posembed_input/pos_embedding'
  if (_has_token(config) and table in restored and 'cls' in restored
      and _split_posembed(restored[table].shape[1])[0]):
    restored['cls'] = np.asarray(restored['cls']) + np.asarray(restored[table])[:, :1]
    log.info('%s: its class-token position row is folded into the class token, which the '
             'registers\' layout gives no row.', fit.source)


def fit_position_embeddings(fit: Fit) -> None:
  """Every learned position embedding resized to the new grid (`grid_shape`,
  inferred when square): 1-D tables bilinearly on the grid (with a class-token
  row for a token head without registers), the `learn2d` row and column tables
  along their axis, `relative` offset tables along the offsets."""
  class_row = _has_token(fit.config) and not fit.config.num_registers
  table_grid = fit.config.get('posemb_grid')  # the table's own grid, whatever the images'
  grid = tuple(table_grid) if table_grid else fit.grid_shape
  for key in set(fit.restored) & set(fit.init):
    if not key.startswith('Transformer/posembed_'):
      continue
    if key.endswith('/pos_embedding'):
      fit.restored[key] = _fit_posembed(fit.restored[key], fit.init[key], class_row, grid)
    elif key.endswith(('/pos_embedding_row', '/pos_embedding_col', '/relative_embedding')):
      fit.restored[key] = _resize_axis0(fit.restored[key], fit.init[key].shape[0])


def _has_token(config) -> bool:
  """Whether a model (its config, or the module) has a class token."""
  return config.classifier in ('token', 'token_gap', 'token_map', 'token_unpooled')


def _rotary(config: ml_collections.ConfigDict) -> bool:
  """Whether the model has rotary position embeddings: its files are timm's Eva's
  and transformers' DINOv3's (`eva_layouts`), not a ViT's (`vit_layouts`)."""
  return config.get('rope', 'none') != 'none'


def to_timm(flat: Flat, config: ml_collections.ConfigDict) -> Dict[str, np.ndarray]:
  """The family's `to_timm`: `eva_layouts.to_timm` for a RoPE ViT, else
  `vit_layouts.to_timm`."""
  if _rotary(config):
    return eva_layouts.to_timm(flat, config)
  # timm builds its RMSNorm ViTs (AIMv2's) with `SwiGLU`, DINOv2-g with `SwiGLUPacked`.
  return vit_layouts.to_timm(flat, pooled_norm=config.get('pooled_norm', False),
                             split_swiglu=config.get('normalization') == 'rms')


def timm_fields(state: Mapping[str, Any], config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """The family's `timm_fields`, of the layout of the named model (`_rotary`)."""
  return (eva_layouts if _rotary(config) else vit_layouts).timm_fields(state, config)


def _folder_layouts(hf_config: Mapping[str, Any]):
  """The layouts module of a `transformers` folder's model type."""
  for layouts in (eva_layouts, aimv2_layouts):
    if hf_config.get('model_type') in layouts.TRANSFORMERS_TYPES:
      return layouts
  return vit_layouts


def transformers_fields(hf_config: Mapping[str, Any]) -> Dict[str, Any]:
  """The family's `transformers_fields`, of the layout of the folder's model type."""
  return _folder_layouts(hf_config).transformers_fields(hf_config)


def from_transformers(state: Mapping[str, Any], hf_config: Mapping[str, Any]
                      ) -> Tuple[Dict[str, Any], Flat, Dict[str, Any]]:
  """The family's `from_transformers`, of the layout of the folder's model type."""
  return _folder_layouts(hf_config).from_transformers(state, hf_config)


def to_transformers(flat: Flat, config: ml_collections.ConfigDict, image_size: int,
                    model_type: Optional[str] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """The family's `to_transformers`, of the model's layout: `eva_layouts` for a RoPE
  ViT (`_rotary`), `aimv2_layouts` for one with RMSNorms, else `vit_layouts`."""
  layouts = (eva_layouts if _rotary(config) else aimv2_layouts
             if config.get('normalization') == 'rms' else vit_layouts)
  return layouts.to_transformers(flat, config, image_size, model_type)


# Megatron-style splits: attention by head, the MLP by hidden unit.
TENSOR_PARALLEL_RULES = (
    (r'(^|/)(query|key|value)/kernel$', -2),  # (D, heads, head_dim)
    (r'(^|/)(query|key|value)/bias$', -2),  # (heads, head_dim)
    (r'(^|/)out/kernel$', -3),  # (heads, head_dim, D)
    (r'(^|/)MlpBlock_\d+/Dense_0/kernel$', -1),  # (D, mlp)
    (r'(^|/)MlpBlock_\d+/Dense_0/bias$', -1),  # (mlp,)
    (r'(^|/)MlpBlock_\d+/Dense_1/kernel$', -2),  # (mlp, D)
)

FAMILY = Family(name='vit', title='ViT, hybrid', variants=_variants(), module=VisionTransformer,
                capabilities=frozenset({CLASSIFY, SCAN, TENSOR_PARALLEL}), layers=layers,
                describe=describe, head='head/',
                fit_rules=(fit_patches, fit_map_head, fit_pre_logits, fit_class_token,
                           fit_registers, fit_position_embeddings),
                tiny=('ViT-Ti_16', dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2,
                                        patch_size=8)),
                owns=vit_layouts.owns, to_published=vit_layouts.to_published,
                module_layout=vit_layouts.module_layout,
                to_timm=to_timm, timm_fields=timm_fields,
                transformers_types=(('vit', 'deit', 'vit_mae') + vit_layouts.DINOV2_TYPES
                                    + vit_layouts.TOWER_TYPES + eva_layouts.TRANSFORMERS_TYPES
                                    + aimv2_layouts.TRANSFORMERS_TYPES),
                transformers_fields=transformers_fields, from_transformers=from_transformers,
                to_transformers=to_transformers, tensor_parallel=TENSOR_PARALLEL_RULES,
                sequence_fields=('resnet_layers', 'skip_removed', 'pixel_mean', 'pixel_std',
                                 'posemb_grid', 'rope_grid'))
