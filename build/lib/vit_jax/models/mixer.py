"""MLP-Mixer (Tolstikhin et al. 2021) with the published parameter names.

Patches are embedded by a strided conv (`stem`); each `MixerBlock_{i}` adds a
token-mixing MLP across patches and then a channel-mixing MLP across channels,
both pre-LayerNorm; the head reads the mean over patches after
`pre_head_layer_norm`. Each block sows its input, the branch outputs
(`token_mlp`, `channel_mlp`) and the stream after each add (`+token_mlp`,
`+channel_mlp`).
"""
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from vit_jax.models import conv
from vit_jax.models.family import (MLP, Branch, CheckpointError, Family, Fit, Layers,
                                   sow_edited)

Dtype = Any


class MlpBlock(nn.Module):
  """Dense -> GELU -> Dense back to the input width, over the last axis."""
  mlp_dim: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    y = nn.gelu(nn.Dense(self.mlp_dim, dtype=self.dtype, name='Dense_0')(x))
    return nn.Dense(x.shape[-1], dtype=self.dtype, name='Dense_1')(y)


class MixerBlock(nn.Module):
  """x + token_mixing(LN(x)^T)^T, then x + channel_mixing(LN(x)); x is (B, N, C)."""
  tokens_mlp_dim: int
  channels_mlp_dim: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = sow_edited(self, 'input', x)
    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_0')(x)
    y = MlpBlock(self.tokens_mlp_dim, self.dtype, name='token_mixing')(y.swapaxes(1, 2))
    y = y.swapaxes(1, 2)
    y = sow_edited(self, 'token_mlp', y)
    x = x + y
    x = sow_edited(self, '+token_mlp', x)
    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_1')(x)
    y = MlpBlock(self.channels_mlp_dim, self.dtype, name='channel_mixing')(y)
    y = sow_edited(self, 'channel_mlp', y)
    x = x + y
    x = sow_edited(self, '+channel_mlp', x)
    return x


class MlpMixer(nn.Module):
  """Images (B, H, W, 3) in [-1, 1] -> logits (B, C), or the pre-logits
  (B, hidden_dim) with `num_classes` 0 or None."""
  num_classes: Optional[int]
  patch_size: int
  hidden_dim: int
  num_blocks: int
  tokens_mlp_dim: int
  channels_mlp_dim: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    del train  # No dropout in the published Mixers; one calling convention for the zoo.
    p = self.patch_size
    if images.shape[1] % p or images.shape[2] % p:
      raise ValueError(f'Image size {images.shape[1:3]} is not divisible by the patch size '
                       f'{p}; resize or crop the images to a multiple of {p} pixels.')
    x = nn.Conv(self.hidden_dim, (p, p), strides=(p, p), padding='VALID', dtype=self.dtype,
                conv_general_dilated=conv.conv_general_dilated,
                name='stem')(images.astype(self.dtype))
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    for i in range(self.num_blocks):
      x = MixerBlock(self.tokens_mlp_dim, self.channels_mlp_dim, self.dtype,
                     name=f'MixerBlock_{i}')(x)
    x = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='pre_head_layer_norm')(x)
    x = jnp.mean(x, axis=1)
    self.sow('intermediates', 'pre_logits', x)
    if self.num_classes:
      x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                   name='head')(x)
    return x.astype(jnp.float32)


# ---------------------------------------------------------------------------
# The family: published variants, sown layers, fine-tuning from a checkpoint.

# hidden size, blocks, token-mixing MLP size, channel-mixing MLP size
SIZES = {'S': (512, 8, 256, 2048), 'B': (768, 12, 384, 3072), 'L': (1024, 24, 512, 4096)}
PUBLISHED = ('S/32', 'S/16', 'B/32', 'B/16', 'L/32', 'L/16')


def layers(config: ml_collections.ConfigDict) -> Layers:
  """Embedded patches, then the stream after each token- and channel-mixing MLP.

  Args:
    config: a zoo config of the family.

  Returns:
    Its `Layers`.
  """
  stream, labels, branches = ['MixerBlock_0/input'], ['embedding'], []
  for i in range(config.num_blocks):
    block = f'MixerBlock_{i}/'
    stream += [block + '+token_mlp', block + '+channel_mlp']
    labels += [f'block{i}/+token', f'block{i}/+channel']
    branches += [Branch(f'block{i}/token mixing', 'token mixing', block + 'input',
                        block + 'token_mlp'),
                 Branch(f'block{i}/channel mixing', 'channel mixing', block + '+token_mlp',
                        block + 'channel_mlp')]
  return Layers(stream=tuple(stream), labels=tuple(labels), attention=(),
                branches=tuple(branches), attention_weights=(), pre_logits='pre_logits',
                class_token=False, embedding='stem/kernel', architecture=MLP)


def describe(config: ml_collections.ConfigDict) -> str:
  """The model's shape in words, for the report.

  Args:
    config: a zoo config of the family.

  Returns:
    The words.
  """
  return f'{config.num_blocks} blocks, width {config.hidden_dim}, patch {config.patch_size}'


def fit_patches(fit: Fit) -> None:
  """Refuses a checkpoint whose number of patches differs from the model's: the
  token-mixing MLP's first kernel is (patches, tokens_mlp_dim), so unlike ViT
  position embeddings it has no resolution-free form to resize.

  Args:
    fit: the checkpoint being fitted.

  Raises:
    CheckpointError: the patches differ.
  """
  key = 'MixerBlock_0/token_mixing/Dense_0/kernel'
  old, new = fit.restored.get(key), fit.init.get(key)
  if old is not None and new is not None and old.shape[0] != new.shape[0]:
    raise CheckpointError(
        f'{fit.source} was trained on {old.shape[0]} patches and the model has '
        f'{new.shape[0]}: a Mixer\'s token-mixing MLP fixes the number of patches. '
        'Fine-tune at the checkpoint\'s resolution (image size / patch size must give the '
        'same grid).')


FAMILY = Family(
    name='mixer', title='MLP-Mixer',
    variants={f'Mixer-{size}_{patch}': dict(zip(
        ('patch_size', 'hidden_dim', 'num_blocks', 'tokens_mlp_dim', 'channels_mlp_dim'),
        (int(patch),) + SIZES[size]))
              for size, patch in (v.split('/') for v in PUBLISHED)},
    module=MlpMixer, layers=layers, describe=describe, head='head/',
    tiny=('Mixer-B_16', dict(patch_size=8, hidden_dim=32, num_blocks=2, tokens_mlp_dim=8,
                             channels_mlp_dim=64)),
    fit_rules=(fit_patches,))
