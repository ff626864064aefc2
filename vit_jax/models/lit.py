"""LiT (Locked-image text Tuning, Zhai et al. 2022): a ViT image tower and a text
tower embedding images and texts into one space, with the parameter names of the
published `gs://vit_models/lit/*.npz` files.

The text tower is BERT (Base or Large, flaxformer's `BertEncoder` names: what
the LiT-B16B and LiT-L16L files hold) reading the `[CLS]` token, or a small
pre-LN transformer (the ViT encoder) reading the last token, which the
SentencePiece tokenizer makes its end-of-sequence token. Both towers run for
inference only (no dropout): LiT's published models are used frozen.
"""
from typing import Any, Dict, Mapping, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from vit_jax import original
from vit_jax.models import vit
from vit_jax.models.family import ZERO_SHOT, Family, override

LIT_DIR = 'gs://vit_models/lit'  # the published LiT files: <model name>.npz and vocabularies

Dtype = Any

# BERT sizes: hidden, intermediate, layers, heads; the vocabulary, position and
# segment tables are BERT's (30,522 WordPiece tokens, 512 positions, 2 segments).
# 'testing' is a small BERT for tests and examples, as the zoo's 'testing' ViT.
BERT_SIZES = {'base': (768, 3072, 12, 12), 'large': (1024, 4096, 24, 16),
              'testing': (16, 32, 2, 2)}
BERT_VOCAB, BERT_POSITIONS, BERT_SEGMENTS = 30_522, 512, 2
TEXT_MODELS = ('bert', 'text_transformer')
TOKENIZERS = {'bert': '.txt', 'sentencepiece': '.model'}  # vocabulary file suffix


class BertSelfAttention(nn.Module):
  """`query`, `key`, `value` as (D, heads * D/heads) kernels (flaxformer stores
  them 2-D); returns (B, L, heads, D/heads). Masked keys get a -1e10 logit."""
  num_heads: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, bias):
    b, length, width = x.shape
    heads = (self.num_heads, width // self.num_heads)
    q, k, v = (nn.Dense(width, dtype=self.dtype, name=name)(x).reshape(b, length, *heads)
               for name in ('query', 'key', 'value'))
    q = q / jnp.sqrt(heads[1]).astype(self.dtype)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) + bias
    weights = nn.softmax(logits.astype(jnp.float32), axis=-1).astype(self.dtype)
    return jnp.einsum('bhqk,bkhd->bqhd', weights, v)


class AttentionBlock(nn.Module):
  """LN(x + Dense(attention(x))): flaxformer's post-LN attention block."""
  num_heads: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, bias):
    b, length, width = x.shape
    y = BertSelfAttention(self.num_heads, self.dtype, name='attention_layer')(x, bias)
    y = nn.Dense(width, dtype=self.dtype, name='dense_layer')(y.reshape(b, length, width))
    return nn.LayerNorm(1e-12, dtype=self.dtype, name='layer_norm')(x + y)


class Mlp(nn.Module):
  """gelu(Dense(x)), the tanh-approximated GELU as flaxformer's `nn.gelu`."""
  features: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    return nn.gelu(nn.Dense(self.features, dtype=self.dtype, name='dense_layer')(x))


class MlpBlock(nn.Module):
  """LN(x + Dense(Mlp(x))): flaxformer's post-LN MLP block."""
  intermediate_dim: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    y = Mlp(self.intermediate_dim, self.dtype, name='mlp')(x)
    y = nn.Dense(x.shape[-1], dtype=self.dtype, name='dense_layer')(y)
    return nn.LayerNorm(1e-12, dtype=self.dtype, name='layer_norm')(x + y)


class BertLayer(nn.Module):
  """One encoder layer: the attention block, then the MLP block."""
  intermediate_dim: int
  num_heads: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, bias):
    x = AttentionBlock(self.num_heads, self.dtype, name='attention_block')(x, bias)
    return MlpBlock(self.intermediate_dim, self.dtype, name='mlp_block')(x)


class LayerSequence(nn.Module):
  """`layers_0` ... `layers_{n-1}` in turn."""
  num_layers: int
  intermediate_dim: int
  num_heads: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, bias):
    for i in range(self.num_layers):
      x = BertLayer(self.intermediate_dim, self.num_heads, self.dtype, name=f'layers_{i}')(x, bias)
    return x


class EncoderBlock(nn.Module):
  """flaxformer's `encoder_block`, holding only its `layer_sequence`."""
  layer_sequence: LayerSequence

  def __call__(self, x, bias):
    return self.layer_sequence(x, bias)


class Embedder(nn.Module):
  """The sum of the token, position and segment embeddings."""
  hidden_size: int

  @nn.compact
  def __call__(self, tokens):
    b, length = tokens.shape
    init = nn.initializers.truncated_normal(0.02)
    positions = jnp.broadcast_to(jnp.arange(length), (b, length))
    return sum(nn.Embed(rows, self.hidden_size, embedding_init=init, name=f'embedders_{key}')(ids)
               for key, rows, ids in (('token_ids', BERT_VOCAB, tokens),
                                      ('position_ids', BERT_POSITIONS, positions),
                                      ('segment_ids', BERT_SEGMENTS, jnp.zeros_like(tokens))))


class BertEncoder(nn.Module):
  """BERT encoder (flaxformer's `BertEncoder`): summed token, position and segment
  embeddings, LayerNorm, then post-LN layers. (B, L) ids -> (B, L, D); id 0 is
  padding, masked out of attention as the original's `input_mask` masks it."""
  size: str = 'base'
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, tokens):
    hidden, intermediate, layers, heads = BERT_SIZES[self.size]
    x = Embedder(hidden, name='embedder')(tokens)
    x = nn.LayerNorm(1e-12, dtype=self.dtype, name='layer_norm')(x.astype(self.dtype))
    keep = tokens != 0
    mask = keep[:, None, :, None] & keep[:, None, None, :]  # (B, 1, L, L), as flaxformer's
    bias = jnp.where(mask, 0., -1e10).astype(self.dtype)
    layer_sequence = LayerSequence(layers, intermediate, heads, self.dtype, parent=None)
    return EncoderBlock(layer_sequence, name='encoder_block')(x, bias)


class BertModel(nn.Module):
  """The BERT text tower: (the `[CLS]` token's encoding projected by `head`, `out`
  with the encoder's output `transformed`, `pre_logits` and `logits`)."""
  config: str = 'base'
  num_classes: Optional[int] = None
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, tokens):
    out = {}
    x = out['transformed'] = BertEncoder(self.config, self.dtype, name='BertEncoder_0')(tokens)
    x = out['pre_logits'] = x[:, 0]
    if self.num_classes:
      x = out['logits'] = nn.Dense(self.num_classes, dtype=self.dtype, name='head')(x)
    return x, out


class TextTransformer(nn.Module):
  """The small text tower: token embedding, a learned position table as long as
  the token sequence, the ViT encoder, and the last token projected by `head`;
  returns (that projection, `out` with `embedded`, `pre_logits` and `logits`)."""
  num_classes: int
  width: int = 512
  num_layers: int = 12
  mlp_dim: int = 2048
  num_heads: int = 8
  vocab_size: int = 32_000
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, tokens):
    out = {}
    x = out['embedded'] = nn.Embed(self.vocab_size, self.width, name='Embed_0')(
        tokens).astype(self.dtype)
    length = x.shape[1]
    x = x + self.param('pos_embedding', nn.initializers.normal(stddev=self.width ** -0.5),
                       (1, length, self.width)).astype(self.dtype)
    spec = vit.EncoderSpec(self.num_layers, self.mlp_dim, self.num_heads, posemb='none',
                           dtype=self.dtype)
    x = vit.Encoder(spec, (1, length), name='Encoder_0')(x, train=False)
    x = out['pre_logits'] = x[:, -1]
    x = out['logits'] = nn.Dense(self.num_classes, dtype=self.dtype, name='head')(x)
    return x, out


class LitModel(nn.Module):
  """Images (B, H, W, 3) in [-1, 1] and/or token ids (B, L) -> (zimg, ztxt, out):
  L2-normalised embeddings (None for an input not given) and `out` with `t`, the
  learned temperature exp(t) that scales the similarities, each tower's
  embedding norm, and the text tower's `out` under 'txt/'. `image` holds the ViT tower's fields (`num_classes` its head's
  width, None for no head); `text` the text tower's. `model_name` and `pp`
  (`tokenizer_name`, `size`, `max_len`) give its files and preprocessing, through
  the original vit_jax's methods (`load_variables`, `vocab_path`, `get_tokenizer`,
  `get_image_preprocessing`, `get_pp`: `vit_jax.original.lit`)."""
  image: Mapping[str, Any]
  text_model: str
  text: Mapping[str, Any]
  dtype: Dtype = jnp.float32
  model_name: Optional[str] = None
  pp: Optional[Mapping[str, Any]] = None

  load_variables = original.lit_method('load_variables')
  vocab_path = property(original.lit_method('vocab_path'))
  get_tokenizer = original.lit_method('get_tokenizer')
  get_image_preprocessing = original.lit_method('get_image_preprocessing')
  get_pp = original.lit_method('get_pp')

  @nn.compact
  def __call__(self, *, images=None, tokens=None):
    out: Dict[str, Any] = {}
    zimg = ztxt = None
    if tokens is not None:
      tower = {'bert': BertModel, 'text_transformer': TextTransformer}[self.text_model]
      ztxt, tower_out = tower(**self.text, dtype=self.dtype, name='txt')(tokens)
      out.update({f'txt/{k}': v for k, v in tower_out.items()})
      ztxt = ztxt.astype(jnp.float32)
      out['txt/norm'] = jnp.linalg.norm(ztxt, axis=1, keepdims=True)
      ztxt = out['txt/normalized'] = ztxt / (out['txt/norm'] + 1e-8)
    if images is not None:
      zimg = vit.VisionTransformer(**self.image, dtype=self.dtype, name='img')(images)
      out['img/norm'] = jnp.linalg.norm(zimg, axis=1, keepdims=True)
      zimg = out['img/normalized'] = zimg / (out['img/norm'] + 1e-8)
    out['t'] = jnp.exp(self.param('t', nn.initializers.zeros, (1,), jnp.float32))
    return zimg, ztxt, out


def _lit(image: str, out_dim: Tuple[Optional[int], int], text_model: str,
         text: Mapping[str, Any], tokenizer: str) -> dict:
  return dict(image_model=image, out_dim=out_dim, text_model=text_model, text=dict(text),
              tokenizer=tokenizer, image_size=224, max_len=16)


def _small_text(width: int, heads: int) -> dict:
  return dict(width=width, num_layers=12, mlp_dim=4 * width, num_heads=heads, vocab_size=16_000)


# The original code's LiT models (its configs/models.py), and a tiny one for tests.
VARIANTS = {
    'LiT-B16B': _lit('ViT-B_16', (768, 768), 'bert', {'config': 'base'}, 'bert'),
    'LiT-B16B_2': _lit('ViT-B_16', (None, 768), 'bert', {'config': 'base'}, 'bert'),
    'LiT-L16L': _lit('ViT-L_16', (None, 1024), 'bert', {'config': 'large'}, 'bert'),
    'LiT-L16S': _lit('ViT-L_16', (None, 1024), 'text_transformer', _small_text(384, 6),
                     'sentencepiece'),
    'LiT-L16Ti': _lit('ViT-L_16', (None, 1024), 'text_transformer', _small_text(192, 3),
                      'sentencepiece'),
    'LiT-testing': dict(_lit('testing', (8, 8), 'bert', {'config': 'testing'}, 'bert'),
                        image_size=32),
}


def make_config(config: Dict[str, Any], overrides: Mapping[str, Any]) -> Dict[str, Any]:
  """A LiT variant's config (`Family.make_config`): `image` holds the image tower's
  fields (its zoo config but `family`, `name`, `dtype`); `image` and `text`
  overrides update those dicts, the other fields are replaced.

  Args:
    config: the variant's fields with `family`, `name` and `dtype`, or a config
      made here before (whose `image` is kept).
    overrides: fields to set.

  Returns:
    The config's fields.

  Raises:
    ValueError: an unknown field, text model or tokenizer.
  """
  if 'image' not in config:  # a variant's fields, not a config made here
    config['image'] = dict(vit.FAMILY.variants[config['image_model']], **vit.FAMILY.defaults)
    config['model_name'] = config['name']  # its files' names (`vit_jax.original.lit`)
  config = override(config, overrides, nested=('image', 'text'))
  if config['text_model'] not in TEXT_MODELS or config['tokenizer'] not in TOKENIZERS:
    raise ValueError(f'{config["name"]}: text_model must be one of {TEXT_MODELS} and tokenizer '
                     f'one of {tuple(TOKENIZERS)}.')
  return config


def build(image: Mapping[str, Any], out_dim: Tuple[Optional[int], int], text_model: str,
          text: Mapping[str, Any], dtype: Any, tokenizer: str = 'bert', image_size: int = 224,
          max_len: int = 16, model_name: Optional[str] = None, **unused: Any) -> LitModel:
  """The LitModel of a LiT config's fields (`Family.module`).

  Args:
    image: the image tower's fields.
    out_dim: the embedding widths of the image and text towers (None: no head).
    text_model: 'bert' or 'text_transformer'.
    text: the text tower's fields.
    dtype: the compute dtype.
    tokenizer: 'bert' or 'sentencepiece'.
    image_size: the images' side.
    max_len: the token sequence's length.
    model_name: the published name, for the files (`vit_jax.original.lit`).
    **unused: the fields that shape no module.

  Returns:
    The module.
  """
  del unused
  image = dict(image, num_classes=out_dim[0])
  for key in vit.FAMILY.sequence_fields:
    if image.get(key) is not None:
      image[key] = tuple(tuple(v) if isinstance(v, list) else v for v in image[key])
  return LitModel(image=image, text_model=text_model, text=dict(text, num_classes=out_dim[1]),
                  dtype=dtype, model_name=model_name,
                  pp=ml_collections.FrozenConfigDict(dict(
                      tokenizer_name=tokenizer, size=image_size, max_len=max_len)))


def text_vocabulary(params: Mapping[str, Any]) -> int:
  """The number of token embeddings of a LiT parameter tree's text tower.

  Args:
    params: a LiT parameter tree.

  Returns:
    The vocabulary size.
  """
  text = params['txt']
  table = (text['BertEncoder_0']['embedder']['embedders_token_ids'] if 'BertEncoder_0' in text
           else text['Embed_0'])
  return table['embedding'].shape[0]


def is_two_tower(flat: Mapping[str, Any]) -> bool:
  """Whether a flat '/'-keyed tree is a LiT model's: both towers and `t` at its root.

  Args:
    flat: a flat '/'-keyed tree.

  Returns:
    Whether it is two-tower.
  """
  return 't' in flat and {'img', 'txt'} <= {key.split('/')[0] for key in flat}


FAMILY = Family(
    name='lit', title='LiT', variants=VARIANTS, module=build,
    describe=lambda config: (f'{config.image_model} image tower, {config.text_model} text '
                             'tower'),
    tiny=('LiT-testing', {}), capabilities=frozenset({ZERO_SHOT}), defaults={},
    make_config=make_config, owns=is_two_tower)
