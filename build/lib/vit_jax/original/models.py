"""The original vit_jax's model classes, with its fields and calling conventions.

Each builds the project's own module (`vit.VisionTransformer`, `mixer.MlpMixer`,
`lit.LitModel`, and their parts) in its own scope, so the parameter tree and the
numbers are the project's: `VisionTransformer(num_classes=10,
**MODEL_CONFIGS['ViT-B_16'])` initialises the tree the published files hold, and
`model.apply(variables, inputs=x, train=False)` gives the logits
`vit_jax.models.get_model('ViT-B_16', 10)` gives. The fields the original nests
(`patches.size`, `transformer.*`, `resnet.*`) are mapped onto the project's
flat ones by `fields.vit_fields`; the original's float32 compute is kept.
"""
from typing import Any, Callable, Optional, Tuple, Type

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.configs import models as model_configs  # noqa: F401  (an original name)
from vit_jax.models import lit, mixer, resnet, vit
from vit_jax.original import lit_method
from vit_jax.original.fields import square, vit_fields

# The original's names at `vit_jax.models` (the rest are the project's own:
# `get_model`, ...).
ORIGINAL_NAMES = ('AddPositionEmbs', 'Encoder', 'Encoder1DBlock', 'LitModel', 'MlpBlock',
                  'MlpMixer', 'VisionTransformer', 'model_configs')


class IdentityLayer(nn.Module):
  """Returns its input: the original's parameterless `pre_logits` without a
  representation layer."""

  @nn.compact
  def __call__(self, x):
    return x


class AddPositionEmbs(nn.Module):
  """Adds a learned (1, T, D) `pos_embedding`, initialised by `posemb_init`."""
  posemb_init: Callable[..., Any]
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs):
    if inputs.ndim != 3:
      raise ValueError(f'AddPositionEmbs takes (batch, tokens, width) inputs, not {inputs.shape}.')
    if jnp.dtype(self.param_dtype) != jnp.float32:
      raise ValueError(f'The position embedding is kept in float32 here, not {self.param_dtype}.')
    module = vit.AddPositionEmbs(grid=(inputs.shape[1], 1), posemb_init=self.posemb_init)
    nn.share_scope(self, module)
    return module(inputs)


class MlpBlock(nn.Module):
  """Dense -> GELU -> dropout -> Dense -> dropout (the project's `vit.MlpBlock`)."""
  mlp_dim: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  out_dim: Optional[int] = None
  dropout_rate: float = 0.1
  kernel_init: Callable[..., Any] = nn.initializers.xavier_uniform()
  bias_init: Callable[..., Any] = nn.initializers.normal(stddev=1e-6)

  @nn.compact
  def __call__(self, inputs, *, deterministic: bool):
    if self.out_dim not in (None, inputs.shape[-1]):
      raise ValueError(f'MlpBlock here returns the input width {inputs.shape[-1]}; '
                       f'out_dim={self.out_dim} is not supported.')
    module = vit.MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype)
    nn.share_scope(self, module)
    return module(inputs, train=not deterministic)


class Encoder1DBlock(nn.Module):
  """One pre-LN transformer block (the project's `vit.Encoder1DBlock`)."""
  mlp_dim: int
  num_heads: int
  dtype: Any = jnp.float32
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, inputs, *, deterministic: bool):
    module = vit.Encoder1DBlock(self.mlp_dim, self.num_heads, self.dropout_rate,
                                self.attention_dropout_rate, dtype=self.dtype)
    nn.share_scope(self, module)
    return module(inputs, train=not deterministic)


class Encoder(nn.Module):
  """Position embeddings, `num_layers` blocks and the final LayerNorm (the project's
  `vit.Encoder`) on (B, T, D) tokens."""
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  add_position_embedding: bool = True

  @nn.compact
  def __call__(self, x, *, train: bool):
    module = vit.Encoder(vit.EncoderSpec(
        self.num_layers, self.mlp_dim, self.num_heads, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        posemb='learn' if self.add_position_embedding else 'none'), (x.shape[1], 1))
    nn.share_scope(self, module)
    return module(x, train=train)


class ResidualUnit(nn.Module):
  """The hybrids' bottleneck unit (the project's `resnet.BottleneckV1`)."""
  features: int
  strides: Any = (1, 1)

  @nn.compact
  def __call__(self, x):
    module = resnet.BottleneckV1(self.features, square(self.strides, 'The stride'))
    nn.share_scope(self, module)
    return module(x)


class ResNetStage(nn.Module):
  """`block_size` units of width `nout`, the first striding (`resnet.Stage`)."""
  block_size: int
  nout: int
  first_stride: Any

  @nn.compact
  def __call__(self, x):
    module = resnet.Stage(resnet.BottleneckV1, 'unit{}', self.block_size, self.nout,
                          square(self.first_stride, 'The stride'))
    nn.share_scope(self, module)
    return module(x)


class VisionTransformer(nn.Module):
  """The original's ViT and hybrid: `VisionTransformer(num_classes=10,
  **MODEL_CONFIGS['ViT-B_16'])`, called as `apply(variables, inputs, train=...)`."""
  num_classes: int
  patches: Any
  transformer: Any
  hidden_size: int
  resnet: Optional[Any] = None
  representation_size: Optional[int] = None
  classifier: str = 'token'
  head_bias_init: float = 0.
  encoder: Type[nn.Module] = Encoder
  model_name: Optional[str] = None

  @nn.compact
  def __call__(self, inputs, *, train: bool):
    if self.encoder is not Encoder:
      raise ValueError('Only the default encoder (vit_jax.models.Encoder) is built here; for '
                       'another architecture use the fields of vit_jax.models.get_model.')
    module = vit.VisionTransformer(
        num_classes=self.num_classes, head_bias_init=self.head_bias_init,
        **vit_fields(self.patches, self.transformer, self.hidden_size, self.resnet,
                     self.representation_size, self.classifier))
    nn.share_scope(self, module)
    return module(inputs, train=train)


class MlpMixer(nn.Module):
  """The original's MLP-Mixer: `MlpMixer(num_classes=10, **MODEL_CONFIGS['Mixer-B_16'])`."""
  patches: Any
  num_classes: int
  num_blocks: int
  hidden_dim: int
  tokens_mlp_dim: int
  channels_mlp_dim: int
  model_name: Optional[str] = None

  @nn.compact
  def __call__(self, inputs, *, train: bool):
    module = mixer.MlpMixer(self.num_classes, square(self.patches['size'], 'The patch size'),
                            self.hidden_dim, self.num_blocks, self.tokens_mlp_dim,
                            self.channels_mlp_dim)
    nn.share_scope(self, module)
    return module(inputs, train=train)


class LitModel(nn.Module):
  """The original's LiT image-text model: `get_model('LiT-B16B')`, with its
  `load_variables`, tokenizer and preprocessing (`vit_jax.original.lit`), called as
  `apply(variables, images=..., tokens=...)` -> (zimg, ztxt, out)."""
  image: Any
  text_model: str
  text: Any
  pp: Any
  out_dim: Tuple[Optional[int], Optional[int]]
  model_name: str

  load_variables = lit_method('load_variables')
  vocab_path = property(lit_method('vocab_path'))
  get_tokenizer = lit_method('get_tokenizer')
  get_image_preprocessing = lit_method('get_image_preprocessing')
  get_pp = lit_method('get_pp')

  @nn.compact
  def __call__(self, *, images=None, tokens=None):
    out_dim = (self.out_dim, self.out_dim) if isinstance(self.out_dim, int) else self.out_dim
    module = lit.LitModel(image=dict(vit_fields(**self.image), num_classes=out_dim[0]),
                          text_model=self.text_model,
                          text=dict(self.text or {}, num_classes=out_dim[1]),
                          model_name=self.model_name, pp=self.pp)
    nn.share_scope(self, module)
    return module(images=images, tokens=tokens)
