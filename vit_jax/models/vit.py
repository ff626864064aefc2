"""Vision Transformer and hybrid ResNet+ViT, with the published parameter names.

Each encoder block sows its input, the attention branch output (`sa`), the
residual after it (`+sa`), the MLP branch output (`mlp`) and the residual after
it (`+mlp`); the attention module sows its weights (B, heads, N, N). Nothing is
kept unless `intermediates` is mutable in `apply`.
"""
import logging
import math
from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import scipy.ndimage

from vit_jax.models import conv
from vit_jax.models.attention import ATTENTION_IMPLS, ATTENTION_WEIGHTS, MultiHeadAttention
from vit_jax.models.family import Branch, CheckpointError, Family, Flat, Layers
from vit_jax.models.resnet import ResNetV1

Dtype = Any
CLASSIFIERS = ('token', 'gap', 'unpooled', 'token_unpooled')
POSEMBS = ('learn', 'sincos2d', 'none')
# What a rematerialised encoder block keeps from its forward pass for the
# backward one: 'full' keeps only its input, 'dots' also the outputs of its
# weight matmuls (not the attention products, which are recomputed).
REMAT_POLICIES = {'none': None, 'full': jax.checkpoint_policies.nothing_saveable,
                  'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def sincos2d_posembed(grid: Tuple[int, int], width: int, temperature: float = 10_000.) -> np.ndarray:
  """Fixed 2-D sine-cosine position embeddings (N, width): a quarter of the
  channels each for sin(x), cos(x), sin(y), cos(y) at geometric frequencies."""
  if width % 4:
    raise ValueError(f'sincos2d position embeddings need a width divisible by 4, got {width}.')
  y, x = np.mgrid[:grid[0], :grid[1]]
  omega = 1. / temperature**(np.arange(width // 4) / max(width // 4 - 1, 1))
  y = y.reshape(-1, 1) * omega
  x = x.reshape(-1, 1) * omega
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


class AddPositionEmbs(nn.Module):
  """Adds learned (N(0, 0.02)) or fixed sin-cos position embeddings.

  Inputs are (B, T, D) with T = extra + gh * gw: the `extra` leading tokens
  (the class token) get a learned row, or zeros for sin-cos.
  """
  grid: Tuple[int, int]
  kind: str = 'learn'

  @nn.compact
  def __call__(self, x):
    extra = x.shape[1] - self.grid[0] * self.grid[1]
    if self.kind == 'learn':
      pe = self.param('pos_embedding', nn.initializers.normal(stddev=0.02), (1,) + x.shape[1:])
    else:
      grid_pe = sincos2d_posembed(self.grid, x.shape[-1])
      pe = np.concatenate([np.zeros((extra, x.shape[-1]), np.float32), grid_pe])[None]
    return x + jnp.asarray(pe, x.dtype)


class MlpBlock(nn.Module):
  """Dense -> tanh-GELU -> dropout -> Dense back to the input width -> dropout."""
  mlp_dim: int
  dropout_rate: float = 0.
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool):
    dense = lambda features, name: nn.Dense(
        features, dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6), name=name)
    y = nn.gelu(dense(self.mlp_dim, 'Dense_0')(x))
    y = nn.Dropout(self.dropout_rate)(y, deterministic=not train)
    y = dense(x.shape[-1], 'Dense_1')(y)
    return nn.Dropout(self.dropout_rate)(y, deterministic=not train)


class Encoder1DBlock(nn.Module):
  """Pre-LN transformer block: x + attn(LN(x)), then x + mlp(LN(x)).

  `drop_path` is the stochastic-depth rate: each branch is dropped for whole
  examples (the mask broadcasts over tokens and channels) and rescaled.
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  drop_path: float = 0.
  attention_impl: str = 'auto'
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = False):
    drop_path = nn.Dropout(self.drop_path, broadcast_dims=(1, 2))
    self.sow('intermediates', 'input', x)

    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_0')(x)
    y = MultiHeadAttention(self.num_heads, self.attention_dropout_rate, self.attention_impl,
                           self.dtype, name='MultiHeadDotProductAttention_1')(y, train=train)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=not train)
    self.sow('intermediates', 'sa', y)
    x = x + drop_path(y, deterministic=not train)
    self.sow('intermediates', '+sa', x)

    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_2')(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, name='MlpBlock_3')(y, train=train)
    self.sow('intermediates', 'mlp', y)
    x = x + drop_path(y, deterministic=not train)
    self.sow('intermediates', '+mlp', x)
    return x


class Encoder(nn.Module):
  """Position embeddings, dropout, `num_layers` blocks and the final LayerNorm.

  Stochastic depth grows linearly from 0 at the first block to `stochastic_depth`
  at the last. `remat` (a `REMAT_POLICIES` key) recomputes each block's
  activations in the backward pass instead of storing them; parameter names
  are unchanged.
  """
  grid: Tuple[int, int]
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  stochastic_depth: float = 0.
  posemb: str = 'learn'
  attention_impl: str = 'auto'
  remat: str = 'none'
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool):
    if self.posemb != 'none':
      x = AddPositionEmbs(self.grid, self.posemb, name='posembed_input')(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    block = Encoder1DBlock
    if self.remat != 'none':
      # static_argnums counts `self`: `train` (index 2) selects the program.
      block = nn.remat(block, policy=REMAT_POLICIES[self.remat], static_argnums=(2,))
    for i in range(self.num_layers):
      x = block(
          self.mlp_dim, self.num_heads, self.dropout_rate, self.attention_dropout_rate,
          drop_path=self.stochastic_depth * i / max(self.num_layers - 1, 1),
          attention_impl=self.attention_impl, dtype=self.dtype,
          name=f'encoderblock_{i}')(x, train)
    return nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='encoder_norm')(x)


class VisionTransformer(nn.Module):
  """ViT, or with `resnet_layers` set the hybrid ResNet+ViT.

  Images (B, H, W, 3) in [-1, 1] -> logits (B, C) for the `token` and `gap`
  heads, per-token logits (B, N, C) for `unpooled` and (B, N+1, C) for
  `token_unpooled`; with `num_classes` 0 or None, the (pre-)logits features.
  `attention_impl` (`ATTENTION_IMPLS`) and `remat` (`REMAT_POLICIES`) change how,
  not what, it computes.
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
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    for field, valid in (('classifier', CLASSIFIERS), ('posemb', POSEMBS),
                         ('attention_impl', ATTENTION_IMPLS), ('remat', REMAT_POLICIES)):
      if getattr(self, field) not in valid:
        raise ValueError(f'Unknown {field} {getattr(self, field)!r}; use one of {tuple(valid)}.')
    x = images.astype(self.dtype)
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
                conv_general_dilated=conv.conv_general_dilated, name='embedding')(x)
    b, gh, gw, d = x.shape
    x = x.reshape(b, gh * gw, d)
    if self.classifier in ('token', 'token_unpooled'):
      cls = self.param('cls', nn.initializers.zeros, (1, 1, d))
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (b, 1, 1)), x], axis=1)

    x = Encoder((gh, gw), self.num_layers, self.mlp_dim, self.num_heads, self.dropout_rate,
                self.attention_dropout_rate, self.stochastic_depth, self.posemb,
                self.attention_impl, self.remat, self.dtype, name='Transformer')(x, train=train)

    if self.classifier == 'token':
      x = x[:, 0]
    elif self.classifier == 'gap':
      x = jnp.mean(x, axis=1)
    if self.representation_size is not None:
      x = jnp.tanh(nn.Dense(self.representation_size, dtype=self.dtype, name='pre_logits')(x))
    self.sow('intermediates', 'pre_logits', x)
    if self.num_classes:
      x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                   name='head')(x)
    return x.astype(jnp.float32)


# ---------------------------------------------------------------------------
# The family: published variants, sown layers, fine-tuning from a checkpoint.

# hidden size, MLP size, heads, layers
SIZES = {
    'Ti': (192, 768, 3, 12),
    'S': (384, 1536, 6, 12),
    'B': (768, 3072, 12, 12),
    'L': (1024, 4096, 16, 24),
    'H': (1280, 5120, 16, 32),
}
PUBLISHED = ('Ti/16', 'S/16', 'S/32', 'B/8', 'B/16', 'B/32', 'L/16', 'L/32', 'H/14')
# name: (ViT size, patch size on the ResNet features, ResNet stage depths)
HYBRID_PUBLISHED = {
    'R50+ViT-B_16': ('B', 1, (3, 4, 9)),
    'R26+ViT-S_32': ('S', 1, (2, 2, 2, 2)),
    'R26+ViT-B_32': ('B', 1, (2, 2, 2, 2)),
    'R50+ViT-L_32': ('L', 1, (3, 4, 6, 3)),
    'R+ViT-Ti_16': ('Ti', 8, ()),
}
POSEMBED = 'Transformer/posembed_input/pos_embedding'


def _fields(size: str, patch: int, resnet_layers=None) -> dict:
  hidden, mlp, heads, layers = SIZES[size]
  return dict(patch_size=patch, hidden_size=hidden, mlp_dim=mlp, num_heads=heads,
              num_layers=layers, classifier='token', representation_size=None, posemb='learn',
              dropout_rate=0., attention_dropout_rate=0., stochastic_depth=0.,
              resnet_layers=resnet_layers, resnet_width=1, attention_impl='auto', remat='none')


def _variants() -> dict:
  table = {}
  for variant in PUBLISHED:
    size, patch = variant.split('/')
    table[f'ViT-{size}_{patch}'] = _fields(size, int(patch))
  for name, (size, patch, stages) in HYBRID_PUBLISHED.items():
    table[name] = _fields(size, patch, stages)
  return table


def layers(config: ml_collections.ConfigDict) -> Layers:
  """Embedded tokens, then the stream after each attention and each MLP branch."""
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
      pre_logits='pre_logits',
      class_token=config.classifier in ('token', 'token_unpooled'))


def interpolate_posembed(posemb: np.ndarray, old_grid: Tuple[int, int],
                         new_grid: Tuple[int, int]) -> np.ndarray:
  """Resizes grid position embeddings (1, gh*gw, D) to (1, nh*nw, D).

  Bilinear interpolation with corners kept on corners, as
  `scipy.ndimage.zoom(order=1)`; class-token rows are the caller's to keep apart.
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
    logging.info('Resized position embeddings from grid %s to %s.', old_grid, grid_shape)
  # A class-token row comes from the checkpoint when it has one, else from init.
  token = posemb[:, :1] if old_extra else np.asarray(target[:, :1])
  return np.concatenate([token, grid], axis=1) if new_extra else grid


def fit_checkpoint(restored: Flat, init: Flat, config: ml_collections.ConfigDict,
                   grid_shape: Optional[Sequence[int]], source: str) -> Flat:
  """`pre_logits` dropped without a representation size (or initialised when the
  checkpoint has none), the class token kept only for token heads, position
  embeddings resized to the new grid (`grid_shape`, inferred when square)."""
  restored = dict(restored)
  has_token = config.classifier in ('token', 'token_unpooled')
  if config.representation_size is None:
    restored = {k: v for k, v in restored.items() if not k.startswith('pre_logits/')}
  elif not any(k.startswith('pre_logits/') for k in restored):
    logging.info('%s has no pre_logits; they start from initialisation.', source)
    restored.update({k: v for k, v in init.items() if k.startswith('pre_logits/')})
  if not has_token:
    restored.pop('cls', None)
  elif 'cls' not in restored and 'cls' in init:
    restored['cls'] = init['cls']
  if POSEMBED in restored and POSEMBED in init:
    restored[POSEMBED] = _fit_posembed(restored[POSEMBED], init[POSEMBED], has_token, grid_shape)
  return restored


FAMILY = Family(name='vit', variants=_variants(), module=VisionTransformer, layers=layers,
                head='head/', fit_checkpoint=fit_checkpoint, sequence_fields=('resnet_layers',))
