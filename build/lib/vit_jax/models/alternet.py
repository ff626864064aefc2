"""AlterNet (Park & Kim 2022): a pre-activation ResNet whose stages end in
alternating convolution and multi-head self-attention (MSA) blocks.

In a stage of n blocks with m MSA blocks the last 2m blocks alternate
[conv, MSA] (the authors' rule), so AlterNet-50's stages of (3, 4, 6, 4) blocks
with (0, 1, 3, 2) MSAs read C C C | C C C M | C M C M C M | C M C M. An MSA block
attends within non-overlapping windows with a learned relative-position bias
(the authors' `LocalAttention`). Departures from the authors' PyTorch code:
GroupNorm (32 groups) replaces BatchNorm, so training needs no running
statistics; and without the stem's max-pool (`stem_pool=False`, for 28-32 px
images) the stem keeps its 7x7/2 conv where the authors use a 3x3/1 conv.
Every block sows its `shortcut`, `residual` branch and `output`; the stem sows `stem`.
"""
import functools
from typing import Any, Optional, Sequence, Tuple

import einops
import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax.models import conv
from vit_jax.models.family import (HYBRID, Branch, Family, Layers, sow_edited,
                                   stage_starts)
from vit_jax.models.resnet import GroupNorm

Dtype = Any
BLOCKS = ('basic', 'bottleneck')
_conv_init = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')


def block_kinds(depth: int, num_msa: int) -> Tuple[str, ...]:
  """'conv' or 'msa' for each block of a stage: the last 2 * num_msa blocks
  alternate conv, MSA.

  Args:
    depth: the stage's blocks.
    num_msa: its MSA blocks.

  Returns:
    Each block's kind.
  """
  if 2 * num_msa > depth:
    raise ValueError(f'A stage of {depth} blocks holds at most {depth // 2} MSA blocks '
                     f'(each follows a conv block), not {num_msa}.')
  return ('conv',) * (depth - 2 * num_msa) + ('conv', 'msa') * num_msa


def relative_offsets(window: int) -> np.ndarray:
  """(w*w, w*w, 2) row and column offsets key - query of the positions of a
  w x w window, flattened row-major.

  Args:
    window: w, the window's side.

  Returns:
    The offsets.
  """
  positions = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing='ij'), -1)
  positions = positions.reshape(-1, 2)
  return positions[None, :, :] - positions[:, None, :]


class WindowAttention(nn.Module):
  """Multi-head attention within non-overlapping window x window patches of a
  (B, H, W, C) map, plus a learned bias per (row, column) offset of key from
  query, shared by the heads: a (2 * window - 1)^2 table. A map smaller than
  the window is one window; a map that the window does not divide is zero-padded
  and the padded keys are masked out."""
  features: int
  num_heads: int
  head_dim: int = 64
  window: int = 7
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    b, h, w, _ = x.shape
    size = min(self.window, h, w)
    pad_h, pad_w = -h % size, -w % size
    x = jnp.pad(x, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
    windows = einops.rearrange(x, 'b (nh p) (nw q) c -> (b nh nw) (p q) c', p=size, q=size)
    dense = lambda name, bias=False: nn.DenseGeneral(
        (self.num_heads, self.head_dim), use_bias=bias, dtype=self.dtype, name=name)
    query, key, value = (dense(n)(windows) for n in ('query', 'key', 'value'))

    table = self.param('relative_position_bias', nn.initializers.normal(stddev=0.02),
                       (2 * self.window - 1, 2 * self.window - 1))
    index = relative_offsets(size) + self.window - 1
    bias = table[index[..., 0], index[..., 1]]
    if pad_h or pad_w:
      valid = np.pad(np.ones((h, w), bool), ((0, pad_h), (0, pad_w)))
      valid = einops.rearrange(valid, '(nh p) (nw q) -> (nh nw) (p q)', p=size, q=size)
      # One mask per window position, repeated over the batch (windows are batch-major).
      mask = np.tile(valid, (b, 1))[:, None, None, :]
      bias = jnp.where(mask, bias, jnp.finfo(jnp.float32).min)

    logits = jnp.einsum('nqhd,nkhd->nhqk', query, key).astype(jnp.float32)
    weights = nn.softmax(logits * self.head_dim**-0.5 + bias, axis=-1).astype(self.dtype)
    out = jnp.einsum('nhqk,nkhd->nqhd', weights, value)
    out = nn.DenseGeneral(self.features, axis=(-2, -1), dtype=self.dtype, name='out')(out)
    out = einops.rearrange(out, '(b nh nw) (p q) c -> b (nh p) (nw q) c', b=b,
                           nh=(h + pad_h) // size, p=size, q=size)
    return out[:, :h, :w]


class Block(nn.Module):
  """A pre-activation residual block: conv (basic or bottleneck) or MSA.

  The input is normalised and activated (relu before convs, exact GELU before the
  MSA, as the authors); a shortcut that changes shape is a strided 1x1 conv of that
  activated input. The MSA branch is a 1x1 conv to the block width, a norm and
  window attention out to the stage width. Stochastic depth drops the whole
  branch per example with probability `drop_path`.
  """
  kind: str  # 'conv' or 'msa'
  block: str  # 'basic' or 'bottleneck'
  features: int  # the stage width; bottleneck outputs are 4x wider
  strides: int = 1
  num_heads: int = 1
  head_dim: int = 64
  window: int = 7
  drop_path: float = 0.
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = False):
    expansion = 4 if self.block == 'bottleneck' else 1
    out = self.features * expansion
    conv_ = lambda features, kernel, strides=1, name=None: nn.Conv(
        features, (kernel, kernel), strides, padding=[(kernel // 2, kernel // 2)] * 2,
        use_bias=False, kernel_init=_conv_init, dtype=self.dtype,
        conv_general_dilated=conv.conv_general_dilated, name=name)
    norm = lambda name: GroupNorm(32, 1e-5, self.dtype, 'scale', 'bias', name=name)
    activation = functools.partial(nn.gelu, approximate=False) if self.kind == 'msa' else nn.relu

    y = activation(norm('norm1')(x))
    shortcut = x
    if self.strides != 1 or x.shape[-1] != out:
      shortcut = conv_(out, 1, self.strides, name='proj')(y)
    if self.kind == 'msa':
      y = norm('norm2')(conv_(x.shape[-1] // expansion, 1, name='conv1')(y))
      y = WindowAttention(out, self.num_heads, self.head_dim, self.window, self.dtype,
                          name='attention')(y)
    elif self.block == 'bottleneck':
      y = conv_(self.features, 1, name='conv1')(y)
      y = conv_(self.features, 3, self.strides, name='conv2')(nn.relu(norm('norm2')(y)))
      y = conv_(out, 1, name='conv3')(nn.relu(norm('norm3')(y)))
    else:
      y = conv_(self.features, 3, self.strides, name='conv1')(y)
      y = conv_(out, 3, name='conv2')(nn.relu(norm('norm2')(y)))
    self.sow('intermediates', 'shortcut', shortcut)
    y = sow_edited(self, 'residual', y)
    y = nn.Dropout(self.drop_path, broadcast_dims=(1, 2, 3))(y, deterministic=not train)
    x = sow_edited(self, 'output', shortcut + y)
    return x


class AlterNet(nn.Module):
  """Images (B, H, W, 3) in [-1, 1] -> logits (B, C), or the pre-logits with
  `num_classes` 0 or None.

  Stem (`stem_conv`, 7x7/2, then a 3x3/2 max-pool unless `stem_pool` is False), stages
  `stage{s}_unit{u}` of widths `width` * 2^s (the first unit of stages after the
  first strides 2), then norm, relu, global mean and a zero-initialised dense
  `head`. Stochastic depth grows linearly over all blocks to `stochastic_depth`.
  """
  num_classes: Optional[int]
  num_layers: Sequence[int]
  num_msa: Sequence[int]
  num_heads: Sequence[int]
  block: str = 'bottleneck'
  width: int = 64
  head_dim: int = 64
  window: int = 7
  stem_pool: bool = True
  stochastic_depth: float = 0.
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    if self.block not in BLOCKS:
      raise ValueError(f'Unknown block {self.block!r}; use one of {BLOCKS}.')
    if not len(self.num_layers) == len(self.num_msa) == len(self.num_heads):
      raise ValueError(f'num_layers {self.num_layers}, num_msa {self.num_msa} and num_heads '
                       f'{self.num_heads} need one entry per stage.')
    x = nn.Conv(self.width, (7, 7), 2, padding=[(3, 3), (3, 3)], use_bias=False,
                kernel_init=_conv_init, dtype=self.dtype,
                name='stem_conv')(images.astype(self.dtype))
    if self.stem_pool:
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=[(1, 1), (1, 1)])
    x = sow_edited(self, 'stem', x)
    total, index = sum(self.num_layers), 0
    for s, (depth, msa, heads) in enumerate(zip(self.num_layers, self.num_msa, self.num_heads)):
      for u, kind in enumerate(block_kinds(depth, msa)):
        x = Block(kind, self.block, self.width * 2**s, 2 if (u == 0 and s > 0) else 1, heads,
                  self.head_dim, self.window, self.stochastic_depth * index / max(total - 1, 1),
                  self.dtype, name=f'stage{s + 1}_unit{u + 1}')(x, train)
        index += 1
    x = nn.relu(GroupNorm(32, 1e-5, self.dtype, 'scale', 'bias', name='norm')(x))
    x = jnp.mean(x, axis=(1, 2))
    self.sow('intermediates', 'pre_logits', x)
    if self.num_classes:
      x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                   name='head')(x)
    return x.astype(jnp.float32)


# ---------------------------------------------------------------------------
# The family: the authors' variants and the sown layers.

HEADS = (3, 6, 12, 24)
VARIANTS = {  # depth: (block, blocks per stage, MSA blocks per stage)
    18: ('basic', (2, 2, 2, 2), (0, 1, 1, 1)),
    34: ('basic', (3, 4, 6, 4), (0, 1, 3, 2)),
    50: ('bottleneck', (3, 4, 6, 4), (0, 1, 3, 2)),
    101: ('bottleneck', (3, 4, 23, 4), (0, 1, 3, 2)),
    152: ('bottleneck', (3, 8, 36, 4), (0, 1, 3, 2)),
}


def layers(config: ml_collections.ConfigDict) -> Layers:
  """The stem output, then each block's output; the MSA blocks are the attention.

  Args:
    config: a zoo config of the family.

  Returns:
    Its `Layers`.
  """
  units, kinds, stage_of = [], [], []
  for s, (depth, msa) in enumerate(zip(config.num_layers, config.num_msa)):
    for u, kind in enumerate(block_kinds(depth, msa)):
      units.append(f'stage{s + 1}_unit{u + 1}')
      kinds.append('attention' if kind == 'msa' else 'conv')
      stage_of.append(s + 1)
  return Layers(
      stream=('stem',) + tuple(f'{u}/output' for u in units),
      labels=('stem',) + tuple(units),
      attention=tuple(i + 1 for i, kind in enumerate(kinds) if kind == 'attention'),
      branches=tuple(Branch(u, kind, f'{u}/shortcut', f'{u}/residual')
                     for u, kind in zip(units, kinds)),
      attention_weights=(), pre_logits='pre_logits', class_token=False,
      stages=stage_starts([0] + stage_of), branch_stages=stage_starts(stage_of),
      architecture=HYBRID)


def describe(config: ml_collections.ConfigDict) -> str:
  """The model's shape in words, for the report.

  Args:
    config: a zoo config of the family.

  Returns:
    The words.
  """
  return (f'{config.block} blocks {"-".join(map(str, config.num_layers))} per stage '
          f'({sum(config.num_msa)} with attention), width {config.width}')


FAMILY = Family(
    name='alternet', title='AlterNet',
    variants={f'AlterNet-{depth}': dict(block=block, num_layers=stages, num_msa=msa,
                                        num_heads=HEADS, width=64, head_dim=64, window=7,
                                        stem_pool=True, stochastic_depth=0.)
              for depth, (block, stages, msa) in VARIANTS.items()},
    module=AlterNet, layers=layers, describe=describe, head='head/',
    # Basic blocks, stages of 1 and 2 blocks, the second ending in an MSA block; no
    # max-pool, so 32 px images give 16x16 and 8x8 maps (the 7x7 windows pad the 8x8).
    tiny=('AlterNet-18', dict(block='basic', num_layers=(1, 2), num_msa=(0, 1),
                              num_heads=(1, 2), width=32, head_dim=16, stem_pool=False)),
    sequence_fields=('num_layers', 'num_msa', 'num_heads'))
