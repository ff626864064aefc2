"""The original vit_jax's model classes, with its fields and calling conventions.

Each builds the project's own module (`vit.VisionTransformer`, `mixer.MlpMixer`,
`lit.LitModel`, and their parts) in its own scope, so the parameter tree and the
numbers are the project's: `VisionTransformer(num_classes=10,
**MODEL_CONFIGS['ViT-B_16'])` initialises the tree the published files hold, and
`model.apply(variables, inputs=x, train=False)` gives the logits
`vit_jax.models.get_model('ViT-B_16', 10)` gives. The fields the original nests
(`patches.size`, `transformer.*`, `resnet.*`) are mapped onto the project's
flat ones by `vit_fields`; the original's float32 compute is kept.
"""
from typing import Any, Callable, Dict, Optional, Tuple, Type

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models import lit, mixer, resnet, vit


def _square(size: Any, what: str) -> int:
  size = tuple(size)
  if len(size) != 2 or size[0] != size[1]:
    raise ValueError(f'{what} {size} is not square; the models here take square patches, '
                     'e.g. (16, 16).')
  return int(size[0])


# The original's `Encoder` fields, which its configs' `transformer` sets.
TRANSFORMER_FIELDS = ('num_layers', 'mlp_dim', 'num_heads', 'dropout_rate',
                      'attention_dropout_rate', 'add_position_embedding')


def vit_fields(patches: Any, transformer: Any, hidden_size: int, resnet: Any = None,
               representation_size: Optional[int] = None, classifier: str = 'token',
               **unused: Any) -> Dict[str, Any]:
  """The project's ViT fields of an original ViT config.

  Args:
    patches: `{'size': (p, p)}`.
    transformer: `{'mlp_dim', 'num_heads', 'num_layers', 'dropout_rate',
      'attention_dropout_rate', 'add_position_embedding'}` (False: no position
      embedding, the project's posemb 'none').
    hidden_size: the token width.
    resnet: `{'num_layers', 'width_factor'}` for a hybrid, or None.
    representation_size: the pre-logits width, or None.
    classifier: 'token', 'gap', 'unpooled' or 'token_unpooled'.
    **unused: the config's other fields (`model_name`).

  Returns:
    Keyword arguments of `vit.VisionTransformer` (but `num_classes`).

  Raises:
    ValueError: a config these models do not build.
  """
  del unused
  if transformer is None:
    raise ValueError('transformer=None (the ResNet features alone) is not built here; use a '
                     "BiT model, vit_jax.models.get_model('BiT-M-R50x1').")
  if classifier not in ('token', 'gap', 'unpooled', 'token_unpooled'):
    raise ValueError(f'Invalid classifier={classifier}')
  unknown = sorted(set(transformer) - set(TRANSFORMER_FIELDS))
  if unknown:
    raise ValueError(f'transformer.{unknown[0]} is no field of the original\'s Encoder; its '
                     f'fields are {", ".join(TRANSFORMER_FIELDS)}.')
  fields = dict(patch_size=_square(patches['size'], 'The patch size'), hidden_size=hidden_size,
                mlp_dim=transformer['mlp_dim'], num_heads=transformer['num_heads'],
                num_layers=transformer['num_layers'],
                dropout_rate=transformer.get('dropout_rate', 0.1),
                attention_dropout_rate=transformer.get('attention_dropout_rate', 0.1),
                classifier=classifier, representation_size=representation_size,
                posemb='learn' if transformer.get('add_position_embedding', True) else 'none')
  if resnet is not None:
    fields.update(resnet_layers=tuple(resnet['num_layers']), resnet_width=resnet['width_factor'])
  return fields


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
    module = resnet.BottleneckV1(self.features, _square(self.strides, 'The stride'))
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
                          _square(self.first_stride, 'The stride'))
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
    module = mixer.MlpMixer(self.num_classes, _square(self.patches['size'], 'The patch size'),
                            self.hidden_dim, self.num_blocks, self.tokens_mlp_dim,
                            self.channels_mlp_dim)
    nn.share_scope(self, module)
    return module(inputs, train=train)


class LitModel(lit.LitFiles, nn.Module):
  """The original's LiT image-text model: `get_model('LiT-B16B')`, with its
  `load_variables`, tokenizer and preprocessing (`lit.LitFiles`), called as
  `apply(variables, images=..., tokens=...)` -> (zimg, ztxt, out)."""
  image: Any
  text_model: str
  text: Any
  pp: Any
  out_dim: Tuple[Optional[int], Optional[int]]
  model_name: str

  @nn.compact
  def __call__(self, *, images=None, tokens=None):
    out_dim = (self.out_dim, self.out_dim) if isinstance(self.out_dim, int) else self.out_dim
    module = lit.LitModel(image=dict(vit_fields(**self.image), num_classes=out_dim[0]),
                          text_model=self.text_model,
                          text=dict(self.text or {}, num_classes=out_dim[1]),
                          model_name=self.model_name, pp=self.pp)
    nn.share_scope(self, module)
    return module(images=images, tokens=tokens)


def project_config(model_config: Any) -> Any:
  """The project's zoo config (`vit_jax.models.get_config`) of an original model config.

  Args:
    model_config: a `MODEL_CONFIGS` entry, or a config with its fields.

  Returns:
    The project's config of the same architecture.
  """
  from vit_jax import models  # pylint: disable=import-outside-toplevel
  name = model_config.get('model_name')
  if 'hidden_dim' in model_config:
    return models.get_config(
        name if name in models.MODELS else 'Mixer-B_16',
        patch_size=_square(model_config['patches']['size'], 'The patch size'),
        **{k: model_config[k] for k in ('hidden_dim', 'num_blocks', 'tokens_mlp_dim',
                                        'channels_mlp_dim')})
  fields = vit_fields(**model_config)
  if 'resnet_layers' not in fields:
    fields['resnet_layers'] = None
  return models.get_config(name if name in models.MODELS else 'ViT-B_16', **fields)
