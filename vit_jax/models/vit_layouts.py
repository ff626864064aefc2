"""ViT and hybrid parameter files in other layouts: current-Flax block names and
big_vision checkpoints read into the published layout, the export to timm's
`state_dict` names, and Hugging Face `transformers`' ViT, DINOv2, CLIP and SigLIP
image-tower files read (ViT and DINOv2 written too). The `vit` family's `owns`,
`to_published`, `to_timm`, `transformers_fields`, `from_transformers` and
`to_transformers`."""
import logging
import math
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import ml_collections
import numpy as np

from vit_jax.models.conv import oihw
from vit_jax.models.family import CheckpointError, Flat

log = logging.getLogger(__name__)

# Current Flax auto-names the parts of an encoder block per type; the published
# files were written when the counter ran over all children of the block.
_CURRENT_TO_PUBLISHED = {
    'LayerNorm_1': 'LayerNorm_2',
    'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
    'MlpBlock_0': 'MlpBlock_3',
}
_BLOCK = re.compile(r'encoderblock_\d+$')
_BLOCK_PARAM = re.compile(r'Transformer/encoderblock_(\d+)/')


# An encoder at the root of a ViT file, under big_vision's 'params/', or as the
# image tower 'img/' of a two-tower file.
_ENCODER = re.compile(r'(params/)?(img/)?Transformer/')


def owns(flat: Flat) -> bool:
  """Whether a flat tree is a ViT's or hybrid's, in any layout `to_published`
  reads: an encoder under 'Transformer/' (at the root, under big_vision's
  'params/', or as the image tower 'img/'), and no LiT temperature 't' at the
  root (a LiT file is the `lit` family's).

  Args:
    flat: a flat '/'-keyed tree.

  Returns:
    Whether it is.
  """
  return 't' not in flat and any(_ENCODER.match(k) for k in flat)


def to_published(flat: Flat) -> Flat:
  """A ViT file in any layout this module reads (big_vision, current-Flax names) in
  the published layout; other files are returned as they are.

  Args:
    flat: a flat '/'-keyed tree.

  Returns:
    The tree in the published layout.
  """
  return published_names(from_big_vision(flat))


def published_names(flat: Flat) -> Flat:
  """Renames encoder-block children written with current Flax auto-names
  (`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`) to the
  published ones; trees already in the published form are returned as they are.

  Args:
    flat: a flat '/'-keyed tree.

  Returns:
    The tree in the published layout.
  """
  if not any('/MultiHeadDotProductAttention_0/' in k for k in flat):
    return dict(flat)
  renamed = {}
  for key, value in flat.items():
    parts = key.split('/')
    for i in range(1, len(parts)):
      if _BLOCK.match(parts[i - 1]):
        parts[i] = _CURRENT_TO_PUBLISHED.get(parts[i], parts[i])
    renamed['/'.join(parts)] = value
  return renamed


def from_big_vision(flat: Flat) -> Flat:
  """A big_vision ViT checkpoint (its `vit_i1k` baselines, SigLIP image towers,
  FlexiViT) in our layout; other files are returned as they are.

  big_vision writes whole checkpoints under 'params/' (the image tower of a
  two-tower model under 'params/img/'), keeps the learned position embedding at
  the root without a class-token row (it prepends the class token after adding
  it), may scan the blocks into one 'Transformer/encoderblock' with the layer
  axis first, and names block children as current Flax does.

  Args:
    flat: a flat '/'-keyed tree.

  Returns:
    The tree in our layout.
  """
  flat = dict(flat)
  for prefix in ('params/', 'img/'):
    inner = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
    if inner and (prefix == 'params/' or any(k.startswith('img/embedding/') for k in flat)):
      flat = inner
  scanned = {k: v for k, v in flat.items() if k.startswith('Transformer/encoderblock/')}
  for key, value in scanned.items():
    del flat[key]
    rest = key[len('Transformer/encoderblock/'):]
    for i, layer in enumerate(value):
      flat[f'Transformer/encoderblock_{i}/{rest}'] = layer
  if 'pos_embedding' in flat:
    posemb = flat.pop('pos_embedding')
    if 'cls' in flat:  # the class token enters after the embedding: its row is zero
      posemb = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
    flat['Transformer/posembed_input/pos_embedding'] = posemb
  return flat


def module_layout(flat: Flat, config: ml_collections.ConfigDict) -> Flat:
  """A published-layout file in the tree of `config`'s module: with `scan_layers`
  the per-block parameters stacked along a new first axis under
  'Transformer/encoderblock/' (what `from_big_vision` unstacks).

  Args:
    flat: a flat tree in the published layout.
    config: the model's zoo config.

  Returns:
    The flat tree of its module.
  """
  if not config.get('scan_layers'):
    return dict(flat)
  blocks = {int(m.group(1)) for m in map(_BLOCK_PARAM.match, flat) if m}
  if blocks - set(range(config.num_layers)):
    raise CheckpointError(f'The checkpoint holds {max(blocks) + 1} blocks, more than the '
                          f"model's {config.num_layers}: set num_layers to match it.")
  stacked = {k: v for k, v in flat.items() if not _BLOCK_PARAM.match(k)}
  for i in range(config.num_layers):
    prefix = f'Transformer/encoderblock_{i}/'
    block = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
    if not block:
      raise CheckpointError(f'The checkpoint has no {prefix}: it holds fewer than the '
                            f"model's {config.num_layers} blocks.")
    for rest, value in block.items():
      stacked.setdefault(f'Transformer/encoderblock/{rest}', []).append(value)
  return {k: np.stack(v) if isinstance(v, list) else v for k, v in stacked.items()}


def to_timm(flat: Flat, pooled_norm: bool = False, split_swiglu: bool = False
            ) -> Dict[str, np.ndarray]:
  """The timm `state_dict` (name -> float32 array, PyTorch layout) of a ViT or
  hybrid in the published layout: what timm's own `.npz` loader makes of it. A
  norm, projection or patch embedding without a bias has none in timm's either
  (AIMv2's RMSNorms and `proj_bias=False`); the patch embeddings' own norm
  (`patch_norm`) is `patch_embed.norm`.

  Args:
    flat: the flat parameters, published layout.
    pooled_norm: the model's final LayerNorm comes after the pooling: timm's
      `fc_norm`, else `norm`.
    split_swiglu: a SwiGLU MLP's first layer as timm's `SwiGLU` holds it, `fc1_g`
      and `fc1_x` (AIMv2's); else packed in `fc1` (`SwiGLUPacked`, DINOv2-g's).

  Returns:
    The state dict's arrays.
  """
  if any(k.startswith('pre_logits/') for k in flat):
    raise ValueError('timm ViTs have no pre_logits (representation) layer; export a model '
                     'without representation_size.')
  if any(k.startswith('attention_pool/') for k in flat):
    raise ValueError("timm ViTs have no AIMv2 attention pooling (timm's AIMv2 pools the "
                     "tokens' mean); export a model with classifier 'gap', or write it for "
                     "transformers (format='transformers').")
  posembs = {k for k in flat if k.startswith('Transformer/posembed')}
  if posembs != {'Transformer/posembed_input/pos_embedding'}:
    raise ValueError('timm ViTs take one learned 1-D position embedding at the input '
                     '(posemb="learn", posemb_where="input") only.')
  out = {}
  if 'conv_root/kernel' in flat:
    out.update(_hybrid_backbone_to_timm(flat))
  out['patch_embed.proj.weight'] = oihw(flat['embedding/kernel'])
  if 'embedding/bias' in flat:
    out['patch_embed.proj.bias'] = flat['embedding/bias']
  if 'patch_norm/scale' in flat:
    out.update(_layernorm_to_timm(flat, 'patch_norm/', 'patch_embed.norm.'))
  if 'cls' in flat:
    out['cls_token'] = flat['cls']
  if 'registers' in flat:  # timm's no_embed_class: the position table holds the patches only
    out['reg_token'] = flat['registers']
  out['pos_embed'] = flat['Transformer/posembed_input/pos_embedding']
  if 'Transformer/pre_norm/scale' in flat:
    out.update(_layernorm_to_timm(flat, 'Transformer/pre_norm/', 'norm_pre.'))
  blocks = sorted({int(k.split('/')[1].split('_')[1]) for k in flat
                   if k.startswith('Transformer/encoderblock_')})
  for i in blocks:
    p, t = f'Transformer/encoderblock_{i}/', f'blocks.{i}.'
    out.update(_attention_to_timm(flat, p + 'MultiHeadDotProductAttention_1/', t + 'attn.'))
    out.update(_layernorm_to_timm(flat, p + 'LayerNorm_0/', t + 'norm1.'))
    out.update(_layernorm_to_timm(flat, p + 'LayerNorm_2/', t + 'norm2.'))
    out.update(_mlp_to_timm(flat, p + 'MlpBlock_3/', t + 'mlp.', split_swiglu))
    out.update({f'{t}{scale}.gamma': flat[p + scale] for scale in ('ls1', 'ls2')
                if p + scale in flat})
  out.update(_layernorm_to_timm(flat, 'Transformer/encoder_norm/',
                                'fc_norm.' if pooled_norm else 'norm.'))
  out.update(map_head_to_timm(flat))
  if 'head/kernel' in flat:
    out['head.weight'], out['head.bias'] = flat['head/kernel'].T, flat['head/bias']
  return out


# LayerScale's starting value in timm's files that have it (DINOv2's; CaiT and DeiT III
# start at 1e-5 or 1e-6): a loaded file's scales replace it.
LAYER_SCALE_INIT = 1e-5


def timm_fields(state: Mapping[str, Any], config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """What a timm ViT or hybrid state dict fixes: the head (class token, attention
  pooling or the tokens' mean; with `fc_norm`, the final LayerNorm after the
  patches' mean, `pooled_norm`), the classes, LayerScale (`ls1.gamma`, `ls2.gamma`)
  or none, the registers (`reg_token`), CLIP's LayerNorm before the blocks
  (`norm_pre`) or none, the patch embeddings' norm (`patch_embed.norm`, AIMv2's) or
  none, the projections' biases (`attn.proj.bias`, timm's `proj_bias`) or none, and
  the image size of its position embeddings on `config`'s patch grid. What a state
  dict does not show (the MLP's activation, the kind of norm and its epsilon, the
  pixel statistics) comes from the named model.

  Args:
    state: the state dict.
    config: the named model's zoo config.

  Returns:
    The config fields it fixes, and `image_size`.
  """
  pooled_norm = 'fc_norm.weight' in state
  if pooled_norm and 'attn_pool.latent' in state:
    raise CheckpointError(
        'This timm ViT normalises what its attention pooling gives (fc_norm after attn_pool), '
        'which these ViTs do not have: they normalise the tokens before attention pooling.')
  if 'dist_token' in state:
    raise CheckpointError(
        "This is a distilled DeiT (dist_token): its logits average a class-token head and a "
        'distillation-token head (head_dist), which these ViTs do not have. Load the plain DeiT '
        "weights (timm's deit_*_patch16_224, not deit_*_distilled_*) as DeiT-*_16.")
  classifier = ('token_gap' if 'cls_token' in state and pooled_norm else 'token'
                if 'cls_token' in state else 'map' if 'attn_pool.latent' in state else 'gap')
  registers = np.shape(state['reg_token'])[1] if 'reg_token' in state else 0
  rows = np.shape(state['pos_embed'])[1]
  if registers and math.isqrt(rows) ** 2 != rows:
    raise CheckpointError(
        'This timm ViT adds position embeddings to its registers (no_embed_class=False), where '
        'these ViTs add them to the patches only, as DINOv2 with registers does: only timm ViTs '
        'with registers built with no_embed_class=True load.')
  tokens = rows - (classifier in ('token', 'token_gap') and not registers)
  grid = math.isqrt(tokens)
  if grid * grid != tokens:
    raise CheckpointError(f'pos_embed holds {tokens} patch positions, not a square grid.')
  # Hybrids embed the ResNet's features: the root (stride 4), then stride 2 per stage
  # after the first.
  stride = config.patch_size if config.resnet_layers is None else (
      config.patch_size * 4 * 2 ** max(len(config.resnet_layers) - 1, 0))
  return dict(classifier=classifier, image_size=grid * stride,
              num_classes=np.shape(state['head.weight'])[0] if 'head.weight' in state else 0,
              layer_scale_init=LAYER_SCALE_INIT if 'blocks.0.ls1.gamma' in state else 0.,
              num_registers=registers, pre_norm='norm_pre.weight' in state,
              patch_bias='patch_embed.proj.bias' in state, pooled_norm=pooled_norm,
              mlp_norm='blocks.0.mlp.norm.weight' in state,
              patch_norm='patch_embed.norm.weight' in state,
              projection_bias='blocks.0.attn.proj.bias' in state)


def map_head_to_timm(flat: Flat) -> Dict[str, np.ndarray]:
  """The attention pooling (`MAPHead_0`) as timm's `attn_pool` (`AttentionPoolLatent`:
  `latent`, `q`, the fused `kv`, `proj`, `norm`, `mlp`); nothing for a model
  without one.

  Args:
    flat: the flat parameters, published layout.

  Returns:
    The state dict's arrays of the pooling.
  """
  if 'MAPHead_0/probe' not in flat:
    return {}
  p, t = 'MAPHead_0/', 'attn_pool.'
  attention = p + 'MultiHeadDotProductAttention_0/'
  heads = lambda name: flat[f'{attention}{name}/kernel'].reshape(
      flat[f'{attention}{name}/kernel'].shape[0], -1).T
  out = {t + 'latent': flat[p + 'probe'], t + 'q.weight': heads('query'),
         t + 'q.bias': flat[attention + 'query/bias'].reshape(-1),
         t + 'kv.weight': np.concatenate([heads('key'), heads('value')]),
         t + 'kv.bias': np.concatenate([flat[attention + f'{n}/bias'].reshape(-1)
                                        for n in ('key', 'value')]),
         t + 'proj.weight': _out_projection(flat[attention + 'out/kernel']),
         t + 'proj.bias': flat[attention + 'out/bias']}
  out.update(_layernorm_to_timm(flat, p + 'LayerNorm_0/', t + 'norm.'))
  out.update(_mlp_to_timm(flat, p + 'MlpBlock_0/', t + 'mlp.'))
  return out


def _out_projection(kernel: np.ndarray) -> np.ndarray:
  """(heads, head_dim, D) attention output kernel -> (D, heads * head_dim) Linear weight."""
  return kernel.reshape(-1, kernel.shape[-1]).T


def _attention_to_timm(flat, p, t):
  """An attention layer as timm's `Attention`: the fused `qkv` (its bias where all
  three projections have one) and `proj` (its bias where it has one)."""
  names = ('query', 'key', 'value')
  biased = [f'{p}{n}/bias' in flat for n in names]
  if any(biased) and not all(biased):
    raise ValueError("timm's ViT attention has a bias on all of the query, key and value or on "
                     "none: export a model with attention_bias 'qkv' or 'none'.")
  kernels = [flat[f'{p}{n}/kernel'] for n in names]
  out = {t + 'qkv.weight': np.concatenate([k.reshape(k.shape[0], -1).T for k in kernels]),
         t + 'proj.weight': _out_projection(flat[p + 'out/kernel'])}
  if all(biased):
    out[t + 'qkv.bias'] = np.concatenate([flat[f'{p}{n}/bias'].reshape(-1) for n in names])
  if p + 'out/bias' in flat:
    out[t + 'proj.bias'] = flat[p + 'out/bias']
  return out


def _layernorm_to_timm(flat, p, t):
  """A LayerNorm (`scale`, `bias`) or RMSNorm (`scale`) as timm's (`weight`, `bias`)."""
  out = {t + 'weight': flat[p + 'scale']}
  if p + 'bias' in flat:
    out[t + 'bias'] = flat[p + 'bias']
  return out


def _mlp_to_timm(flat, p, t, split_swiglu: bool = False):
  """An `MlpBlock` as timm's `Mlp`: `fc1`, `fc2` (with their biases where they
  have them), and `norm` where it has one; with `split_swiglu`, a SwiGLU's first
  layer [gate | input] as timm's `SwiGLU` holds it, `fc1_g` and `fc1_x`."""
  out = {}
  for r in range(2):
    out[f'{t}fc{r + 1}.weight'] = flat[f'{p}Dense_{r}/kernel'].T
    if f'{p}Dense_{r}/bias' in flat:
      out[f'{t}fc{r + 1}.bias'] = flat[f'{p}Dense_{r}/bias']
  if split_swiglu:
    for kind in ('weight', 'bias'):
      if f'{t}fc1.{kind}' in out:
        out[f'{t}fc1_g.{kind}'], out[f'{t}fc1_x.{kind}'] = np.split(out.pop(f'{t}fc1.{kind}'), 2)
  if f'{p}norm/scale' in flat:
    out.update(_layernorm_to_timm(flat, f'{p}norm/', f'{t}norm.'))
  return out


def _hybrid_backbone_to_timm(flat):
  """The hybrid's ResNet under timm's `patch_embed.backbone`."""
  stages = sorted({k.split('/')[0] for k in flat if re.match(r'block\d+/', k)})
  stem = 'patch_embed.backbone.' + ('stem.' if stages else '')
  out = {stem + 'conv.weight': oihw(flat['conv_root/kernel']),
         stem + 'norm.weight': flat['gn_root/scale'], stem + 'norm.bias': flat['gn_root/bias']}
  for key, value in flat.items():
    m = re.match(r'block(\d+)/unit(\d+)/(conv|gn)(\d|_proj)/(kernel|scale|bias)$', key)
    if not m:
      continue
    stage, unit, kind, index, name = m.groups()
    t = f'patch_embed.backbone.stages.{int(stage) - 1}.blocks.{int(unit) - 1}.'
    module = ('downsample.' + ('conv' if kind == 'conv' else 'norm') if index == '_proj'
              else ('conv' if kind == 'conv' else 'norm') + index)
    out[f'{t}{module}.{"weight" if name != "bias" else "bias"}'] = (
        oihw(value) if name == 'kernel' else value)
  return out


# Hugging Face `transformers` ViT folders (`vit_jax.files.hf_files`): `hidden_act` -> the
# ViT's `activation`, and the one each activation is written as.
TRANSFORMERS_ACTIVATIONS = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh',
                            'gelu_pytorch_tanh': 'gelu_tanh', 'quick_gelu': 'quick_gelu'}
_WRITTEN_ACTIVATIONS = {'gelu': 'gelu', 'gelu_tanh': 'gelu_pytorch_tanh',
                        'quick_gelu': 'quick_gelu'}
# The model types read as ViTs: DINOv2's, with and without registers, besides 'vit'.
DINOV2_TYPES = ('dinov2', 'dinov2_with_registers')
# A layer's names in the files (after 'encoder.layer.N.') -> timm's: a ViT's, and
# DINOv2's (its LayerScale, `lambda1`, as timm's `gamma`).
_TRANSFORMERS_LAYER = {'attention.output.dense': 'attn.proj', 'layernorm_before': 'norm1',
                       'layernorm_after': 'norm2', 'intermediate.dense': 'mlp.fc1',
                       'output.dense': 'mlp.fc2'}
_DINOV2_LAYER = {'attention.output.dense': 'attn.proj', 'norm1': 'norm1', 'norm2': 'norm2',
                 'mlp.fc1': 'mlp.fc1', 'mlp.fc2': 'mlp.fc2', 'layer_scale1': 'ls1.gamma',
                 'layer_scale2': 'ls2.gamma'}
# DINOv2 ViT-g's SwiGLU MLP (`use_swiglu_ffn`): its first layer packed [gate | up].
_SWIGLU_LAYER = {'mlp.weights_in': 'mlp.fc1', 'mlp.weights_out': 'mlp.fc2'}
_READ_LAYER = {**_TRANSFORMERS_LAYER, **_DINOV2_LAYER, **_SWIGLU_LAYER}  # reading takes any
# CLIP's, SigLIP's, SigLIP 2's and MetaCLIP 2's image towers, alone (`clip_vision_model`,
# ...) or in their two-tower folders (`clip`, `siglip`, `siglip2`, `metaclip_2`: the image
# tower is read). MetaCLIP 2's tower is CLIP's, under its own names of classes.
TWO_TOWER_TYPES = ('clip', 'siglip', 'siglip2', 'metaclip_2')
CLIP_TOWERS = ('clip_vision_model', 'metaclip_2_vision_model')
TOWER_TYPES = tuple(f'{kind}_vision_model' for kind in TWO_TOWER_TYPES) + TWO_TOWER_TYPES
# Their names (without 'vision_model.') -> timm's; a layer's after 'encoder.layers.N.'.
_TOWER_TOP = {
    'embeddings.patch_embedding.weight': 'patch_embed.proj.weight',
    'embeddings.patch_embedding.bias': 'patch_embed.proj.bias',
    'pre_layrnorm.weight': 'norm_pre.weight', 'pre_layrnorm.bias': 'norm_pre.bias',
    'post_layernorm.weight': 'norm.weight', 'post_layernorm.bias': 'norm.bias',
    'head.probe': 'attn_pool.latent', 'head.attention.out_proj.weight': 'attn_pool.proj.weight',
    'head.attention.out_proj.bias': 'attn_pool.proj.bias',
    'head.layernorm.weight': 'attn_pool.norm.weight', 'head.layernorm.bias': 'attn_pool.norm.bias',
    'head.mlp.fc1.weight': 'attn_pool.mlp.fc1.weight', 'head.mlp.fc1.bias': 'attn_pool.mlp.fc1.bias',
    'head.mlp.fc2.weight': 'attn_pool.mlp.fc2.weight', 'head.mlp.fc2.bias': 'attn_pool.mlp.fc2.bias'}
_TOWER_LAYER = {'layer_norm1': 'norm1', 'layer_norm2': 'norm2', 'self_attn.out_proj': 'attn.proj',
                'mlp.fc1': 'mlp.fc1', 'mlp.fc2': 'mlp.fc2'}
# The other tower's weights in a two-tower folder, and its own scalars.
_OTHER_TOWER = re.compile(r'^(text_model\.|text_projection\.|logit_scale$|logit_bias$)')
_TRANSFORMERS_TOP = {
    'embeddings.cls_token': 'cls_token', 'embeddings.position_embeddings': 'pos_embed',
    'embeddings.patch_embeddings.projection.weight': 'patch_embed.proj.weight',
    'embeddings.patch_embeddings.projection.bias': 'patch_embed.proj.bias',
    'layernorm.weight': 'norm.weight', 'layernorm.bias': 'norm.bias',
    'classifier.weight': 'head.weight', 'classifier.bias': 'head.bias'}


def _positive(config: Mapping[str, Any], key: str, kind: type = int) -> Any:
  """config[key] as a positive number of `kind`, or a CheckpointError naming the key."""
  value = config.get(key)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or (
      kind is int and value != int(value)) or value <= 0:
    raise CheckpointError(f'The config.json has {key} {value!r}, where a transformers ViT has '
                          f'a positive {kind.__name__}: the folder is damaged or of another '
                          'model.')
  return kind(value)


def transformers_fields(config: Mapping[str, Any]) -> Dict[str, Any]:
  """The ViT fields a transformers config.json sets (`vit`, `vit_mae`'s encoder,
  `dinov2`, `dinov2_with_registers`, and CLIP's, SigLIP's and SigLIP 2's image
  towers: `TOWER_TYPES`, a two-tower folder's from its `vision_config`), or a
  CheckpointError naming one these ViTs cannot express. What the weights fix (the head, LayerScale,
  registers, CLIP's LayerNorm before the blocks, the patch bias) is read from them.

  Args:
    config: the config.json.

  Returns:
    The fields.
  """
  kind = config.get('model_type')
  if kind == 'deit':
    raise CheckpointError(
        "The config.json is a transformers 'deit' model, which always has a distillation "
        'token beside the class token; these ViTs do not. The plain DeiT weights (such as '
        "facebook/deit-base-patch16-224) are 'vit' folders and load.")
  if kind in TWO_TOWER_TYPES:  # the image tower's config
    tower = config.get('vision_config')
    if not isinstance(tower, dict):
      raise CheckpointError(f'The config.json of this {kind} model has vision_config {tower!r}, '
                            'where the image tower\'s config belongs: the folder is damaged.')
    config = {**tower, 'model_type': f'{kind}_vision_model'}
    kind = config['model_type']
  siglip = kind in ('siglip_vision_model', 'siglip2_vision_model')
  if siglip and config.get('vision_use_head') is False:
    raise CheckpointError('The config.json sets vision_use_head false: this SigLIP image tower '
                          'has no attention-pooling head, and these SigLIP ViTs pool with one.')
  # SigLIP 2 resizes its square table to each image's grid: the model's posemb_grid.
  table = {'posemb_grid': (_square_grid(config),) * 2} if kind == 'siglip2_vision_model' else {}
  default_act = 'quick_gelu' if kind in CLIP_TOWERS else (
      'gelu_pytorch_tanh' if siglip else 'gelu')
  act = config.get('hidden_act', default_act)
  swiglu = kind in DINOV2_TYPES and bool(config.get('use_swiglu_ffn'))  # reads no hidden_act
  if act not in TRANSFORMERS_ACTIVATIONS and not swiglu:
    raise CheckpointError(f'The config.json sets hidden_act {act!r}, which these ViTs do not '
                          f'have; they have {", ".join(sorted(TRANSFORMERS_ACTIVATIONS))}.')
  if kind == 'vit' and config.get('pooler_act', 'tanh') != 'tanh':
    raise CheckpointError(f'The config.json sets pooler_act {config["pooler_act"]!r}: the '
                          "pre-logits layer that ViTModel's pooler becomes here is tanh's.")
  if config.get('num_channels', 3) != 3:
    raise CheckpointError(f'The config.json sets num_channels {config["num_channels"]}: these '
                          'ViTs read RGB images (3 channels).')
  hidden_size = _positive(config, 'hidden_size')
  if kind in DINOV2_TYPES:
    mlp_dim = hidden_size * _positive(config, 'mlp_ratio', float)
    if swiglu:
      mlp_dim = _swiglu_units(hidden_size, _positive(config, 'mlp_ratio', float))
    elif mlp_dim != int(mlp_dim):
      raise CheckpointError(f'The config.json sets mlp_ratio {config["mlp_ratio"]}, which makes '
                            f'an MLP of {mlp_dim} units: the folder is damaged.')
    defaults = {'layer_norm_eps': 1e-6}
  else:
    mlp_dim = _positive(config, 'intermediate_size')
    defaults = {'layer_norm_eps': 1e-5 if kind in CLIP_TOWERS else (
        1e-6 if siglip else 1e-12)}
  return dict(hidden_size=hidden_size,
              num_layers=_positive(config, 'num_hidden_layers'),
              num_heads=_positive(config, 'num_attention_heads'),
              mlp_dim=int(mlp_dim),
              patch_size=_patch_side(config),
              activation='swiglu' if swiglu else TRANSFORMERS_ACTIVATIONS[act],
              layer_norm_eps=_positive({**defaults, **config}, 'layer_norm_eps', float),
              resnet_layers=None, **table)


def _patch_side(config: Mapping[str, Any]) -> int:
  """The config's `patch_size`: a number, or [height, width] as some configs write
  it (transformers takes both); a patch that is not square is refused."""
  value = config.get('patch_size')
  if isinstance(value, (list, tuple)) and len(value) == 2:
    if value[0] != value[1]:
      raise CheckpointError(f'The config.json sets patch_size {list(value)}: these ViTs cut '
                            'images into square patches.')
    value = value[0]
  return _positive({'patch_size': value}, 'patch_size')


def _square_grid(config: Mapping[str, Any]) -> int:
  """The side of a SigLIP 2 tower's square grid of position embeddings
  (`num_patches` of them), which it resizes to each image's patches; a count that
  is not a square is refused."""
  rows = _positive({'num_patches': 256, **config}, 'num_patches')
  if math.isqrt(rows) ** 2 != rows:
    raise CheckpointError(f'The config.json sets num_patches {rows}, not a square grid of '
                          'position embeddings, which these ViTs hold.')
  return math.isqrt(rows)


def from_transformers(state: Mapping[str, np.ndarray], hf_config: Mapping[str, Any]
                      ) -> Tuple[Dict[str, np.ndarray], Flat, Dict[str, Any]]:
  """A transformers ViT's or DINOv2's weights (the files' names, with or without
  the backbone's prefix, 'vit.' or 'dinov2.'; a ViT-MAE's encoder, its decoder left
  out), or a CLIP or SigLIP image tower's
  (`_tower_to_timm`), under timm's names; `ViTModel`'s pooler (dense and tanh on the class token)
  as the pre-logits layer, which timm has no place for; and DINOv2 with registers'
  class-token position embedding added to the class token, as timm's conversion
  does (its registers have none, nor the class token then).

  As `from_pretrained` builds the model: with `qkv_bias` false in the config the
  query, key and value have no bias, whatever the weights hold (zeros here); a
  bias missing where its layer has one starts at zero, said in a warning
  (`_init_weights` zeroes every Linear's bias), and a missing weight is refused
  (it would start random).

  Args:
    state: the weights.
    hf_config: the folder's config.json.

  Returns:
    (timm's state dict, the pre-logits parameters or none, the field they fix:
    `representation_size`, the pooler's width, or none).
  """
  if any(re.match(r'(vision_model\.)?encoder\.layers\.', k) for k in state):
    out = _tower_to_timm(state)
    kind = str(hf_config.get('model_type'))
    _check_embeddings(out, with_class_token=kind.startswith(('clip', 'metaclip_2')))
    return out, {}, {}
  biased = hf_config.get('qkv_bias', True) is not False
  out, qkv, pooler = {}, {}, {}
  for key, value in state.items():
    name = re.sub(r'^(vit|dinov2|dinov2_with_registers)\.', '', key)
    layer = re.match(r'encoder\.layer\.(\d+)\.(.+)\.(weight|bias|lambda1)$', name)
    if name in _TRANSFORMERS_TOP:
      out[_TRANSFORMERS_TOP[name]] = value
    elif layer and layer[2].startswith('attention.attention.'):
      if biased or layer[3] != 'bias':  # qkv_bias false: transformers leaves the file's out
        qkv[(int(layer[1]), layer[2].split('.')[-1], layer[3])] = value
    elif layer and layer[2] in _READ_LAYER:
      timm = _READ_LAYER[layer[2]]
      out[f'blocks.{layer[1]}.{timm}' + ('' if timm.endswith('gamma') else f'.{layer[3]}')] = value
    elif name == 'pooler.dense.weight':
      pooler['pre_logits/kernel'] = np.asarray(value).T
    elif name == 'pooler.dense.bias':
      pooler['pre_logits/bias'] = np.asarray(value)
    elif name == 'embeddings.register_tokens':
      out['reg_token'] = value
    elif name != 'embeddings.mask_token' and not key.startswith('decoder.'):
      # Neither masked image modelling's mask token nor MAE's decoder acts on whole images.
      raise CheckpointError(f'The weights hold {key!r}, which a transformers ViT of this '
                            'project has no place for.')
  if 'head.weight' in out and 'blocks.0.ls1.gamma' in out:
    raise CheckpointError(
        "The weights are a Dinov2ForImageClassification's, whose head reads the class token "
        "beside the patches' mean, which these ViTs' heads do not: load the folder of its "
        'backbone (Dinov2Model) and fine-tune a new head.')
  _check_embeddings(out, with_class_token=True)
  if 'reg_token' in out:
    positions = np.asarray(out['pos_embed'])
    out['cls_token'] = np.asarray(out['cls_token']) + positions[:, :1]
    out['pos_embed'] = positions[:, 1:]
  out.update(_joined_qkv(qkv, ('query', 'key', 'value')))
  if pooler and 'pre_logits/kernel' not in pooler:
    raise CheckpointError('The weights hold pooler.dense.bias but no pooler.dense.weight, which '
                          'transformers would start at random: the folder is damaged.')
  if pooler and 'pre_logits/bias' not in pooler:
    log.warning('The weights hold no pooler.dense.bias: it starts at zero, as transformers '
                'starts it.')
    pooler['pre_logits/bias'] = np.zeros(pooler['pre_logits/kernel'].shape[1], np.float32)
  fields = {'representation_size': int(pooler['pre_logits/bias'].shape[0])} if pooler else {}
  return out, pooler, fields


def _check_embeddings(out: Mapping[str, Any], with_class_token: bool) -> None:
  """Refuses weights without the embeddings `from_pretrained` would start at random:
  the patch embedding's kernel, the position embeddings, and the class token of a
  model that has one."""
  needed = {'patch_embed.proj.weight': 'patch embedding', 'pos_embed': 'position embeddings',
            **({'cls_token': 'class token'} if with_class_token else {})}
  missing = [what for key, what in needed.items() if key not in out]
  if missing:
    raise CheckpointError(f'The weights hold no {" or ".join(missing)}, which transformers '
                          'would start at random: the folder is damaged or incomplete; '
                          'download it again.')


def _tower_to_timm(state: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """A CLIP, SigLIP or SigLIP 2 image tower's weights (a two-tower folder's text
  tower left out) under timm's names: CLIP's class embedding as the class token,
  its visual projection as a head without bias (as timm's CLIP files hold it),
  SigLIP's attention-pooling head as timm's `attn_pool`, SigLIP 2's linear patch
  embedding as the patch convolution."""
  out, qkv = {}, {}
  for key, value in state.items():
    name = key[len('vision_model.'):] if key.startswith('vision_model.') else key
    layer = re.match(r'encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$', name)
    value = np.asarray(value)
    if _OTHER_TOWER.match(key):
      continue
    if name == 'embeddings.patch_embedding.weight' and value.ndim == 2:
      out['patch_embed.proj.weight'] = _linear_patches_as_kernel(value)
    elif name in _TOWER_TOP:
      out[_TOWER_TOP[name]] = value
    elif name == 'embeddings.class_embedding':
      out['cls_token'] = value.reshape(1, 1, -1)
    elif name == 'embeddings.position_embedding.weight':
      out['pos_embed'] = value[None]
    elif name == 'visual_projection.weight':
      out['head.weight'], out['head.bias'] = value, np.zeros(value.shape[0], value.dtype)
    elif name in ('head.attention.in_proj_weight', 'head.attention.in_proj_bias'):
      kind = name.split('_')[-1]
      query, key_value = np.split(value, [value.shape[0] // 3])
      out[f'attn_pool.q.{kind}'], out[f'attn_pool.kv.{kind}'] = query, key_value
    elif layer and layer[2] in ('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj'):
      qkv[(int(layer[1]), layer[2][len('self_attn.')], layer[3])] = value
    elif layer and layer[2] in _TOWER_LAYER:
      out[f'blocks.{layer[1]}.{_TOWER_LAYER[layer[2]]}.{layer[3]}'] = value
    elif name != 'embeddings.position_ids':  # a buffer of older files: 0, 1, ...
      raise CheckpointError(f'The weights hold {key!r}, which a CLIP or SigLIP image tower of '
                            'this project has no place for.')
  out.update(_joined_qkv(qkv, tuple('qkv')))
  return out


def _linear_patches_as_kernel(weight: np.ndarray) -> np.ndarray:
  """SigLIP 2's patch embedding, a linear layer on each patch flattened as (row,
  column, channel) (`Siglip2ImageProcessor`'s patches), as the convolution kernel
  (out, channel, row, column) of timm's name."""
  width, inputs = weight.shape
  side = math.isqrt(inputs // 3)
  if 3 * side * side != inputs:
    raise CheckpointError(f'The patch embedding takes {inputs} numbers per patch, not the '
                          'RGB values of a square patch.')
  return weight.reshape(width, side, side, 3).transpose(0, 3, 1, 2)


def _joined_qkv(qkv: Mapping[Tuple[int, str, str], np.ndarray], parts: Tuple[str, ...]
                ) -> Dict[str, np.ndarray]:
  """timm's fused `blocks.N.attn.qkv.{weight,bias}` from the separate query, key
  and value projections, {(block, part, 'weight' or 'bias'): array}, `parts` naming
  them in that order; a bias absent from any of the three stays absent (timm's
  qkv_bias=False)."""
  out = {}
  for block in sorted({b for b, _, _ in qkv}):
    weights = [qkv.get((block, part, 'weight')) for part in parts]
    if any(w is None for w in weights):
      missing = [p for p, w in zip(parts, weights) if w is None]
      raise CheckpointError(f'The weights of layer {block} hold no {" or ".join(missing)} '
                            'projection weight, which transformers would start at random: the '
                            'folder is damaged.')
    out[f'blocks.{block}.attn.qkv.weight'] = np.concatenate(weights)
    biases = [qkv.get((block, part, 'bias')) for part in parts]
    if any(b is not None for b in biases):  # none at all: timm's qkv_bias=False
      missing = [p for p, b in zip(parts, biases) if b is None]
      if missing:
        log.warning('The weights of layer %d hold no %s bias: it starts at zero, as '
                    'transformers starts it.', block, ' or '.join(missing))
      out[f'blocks.{block}.attn.qkv.bias'] = np.concatenate(
          [b if b is not None else np.zeros(len(w), np.float32) for b, w in zip(biases, weights)])
  return out


def to_transformers(flat: Flat, config: ml_collections.ConfigDict, image_size: int,
                    model_type: Optional[str] = None
                    ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
  """A ViT (its published parameters) as the transformers model its fields make
  (`_written_kind`): a class-token ViT as `ViTForImageClassification`, a headless
  one with a pre-logits layer as `ViTModel` (the layer as its pooler, dense and
  tanh on the class token), a headless one with LayerScale as `Dinov2Model` (with registers
  `Dinov2WithRegistersModel`), CLIP's image tower as `CLIPVisionModel` (with a head,
  `CLIPVisionModelWithProjection`), a headless attention-pooling one as
  `SiglipVisionModel`, or with `model_type='siglip2_vision_model'` (or a square
  `posemb_grid`, a table resized to each image's grid) as SigLIP 2's
  `Siglip2VisionModel`: its config.json and its weights under the files' names.

  Args:
    flat: the model's parameters, flat, in the published layout.
    config: the model's config.
    image_size: the images' side in pixels.
    model_type: the `model_type` to write, where the model can be more than one:
      'siglip2_vision_model' for an attention-pooling ViT; None, the one its
      fields make.

  Returns:
    (config.json, the weights).

  Raises:
    CheckpointError: a ViT transformers' cannot express, or a `model_type` it is
      not written as, named.
  """
  kind = _written_kind(config)
  if kind == 'siglip' and config.get('posemb_grid') is not None:
    # A table resized to each image's grid: SigLIP 2's tower, of a square table.
    if model_type not in (None, 'siglip2_vision_model') or len(set(config.posemb_grid)) != 1:
      raise CheckpointError(f'The model resizes its {list(config.posemb_grid)} position table '
                            "to each image's grid, which SigLIP 2's tower alone does, of a "
                            "square table: write it as model_type 'siglip2_vision_model'.")
    model_type = 'siglip2_vision_model'
  pooler = {k: v for k, v in flat.items() if k.startswith('pre_logits/')}
  state = to_timm({k: v for k, v in flat.items() if k not in pooler})
  written = ((f'{kind}_vision_model' if kind in TWO_TOWER_TYPES else kind),
             *_ALSO_WRITTEN_AS.get(kind, ()))
  if model_type not in (None, *written):
    raise CheckpointError(f'This ViT is written as model_type {" or ".join(map(repr, written))}, '
                          f'not {model_type!r}.')
  if model_type == 'siglip2_vision_model':
    return _as_siglip2(*_as_tower(state, config, image_size, kind))
  if model_type == 'metaclip_2_vision_model':
    return _as_metaclip2(*_as_tower(state, config, image_size, kind))
  if kind in ('clip', 'siglip'):
    return _as_tower(state, config, image_size, kind)
  dinov2 = kind == 'dinov2'
  names = _DINOV2_LAYER if dinov2 else _TRANSFORMERS_LAYER
  if config.activation == 'swiglu':  # its MLP's layers under their own names
    names = {**{k: v for k, v in names.items() if not k.startswith('mlp.')}, **_SWIGLU_LAYER}
  prefix = '' if dinov2 or pooler else 'vit.'  # ViTModel's names are the backbone's
  top = {timm: (prefix + name if not name.startswith('classifier') else name)
         for name, timm in _TRANSFORMERS_TOP.items()}
  layer = {timm: name for name, timm in names.items()}
  out = {}
  for key, value in state.items():
    block = re.match(r'blocks\.(\d+)\.(.+?)(?:\.(weight|bias))?$', key)
    if key in top:
      out[top[key]] = value
    elif key == 'reg_token':
      out['embeddings.register_tokens'] = value
    elif block and block[2] == 'attn.qkv':
      for part, piece in zip(('query', 'key', 'value'), np.split(value, 3)):
        out[f'{prefix}encoder.layer.{block[1]}.attention.attention.{part}.{block[3]}'] = piece
    elif block and block[2] in layer:
      end = 'lambda1' if block[2].endswith('gamma') else block[3]
      out[f'{prefix}encoder.layer.{block[1]}.{layer[block[2]]}.{end}'] = value
    else:
      raise CheckpointError(f"{key} of timm's ViT has no place in a transformers ViT.")
  hf_config = {**_written_sizes(config, image_size), 'qkv_bias': True,
               'hidden_dropout_prob': 0., 'attention_probs_dropout_prob': 0.}
  if dinov2:
    return _as_dinov2(hf_config, out, config)
  if pooler:
    out['pooler.dense.weight'] = np.asarray(pooler['pre_logits/kernel']).T
    out['pooler.dense.bias'] = np.asarray(pooler['pre_logits/bias'])
    hf_config.update({'model_type': 'vit', 'architectures': ['ViTModel'],
                      'intermediate_size': config.mlp_dim,
                      'pooler_output_size': config.representation_size, 'pooler_act': 'tanh'})
    return hf_config, out
  classes = config.num_classes
  hf_config.update({
      'model_type': 'vit', 'architectures': ['ViTForImageClassification'],
      'intermediate_size': config.mlp_dim,
      'id2label': {str(i): f'LABEL_{i}' for i in range(classes)},
      'label2id': {f'LABEL_{i}': i for i in range(classes)}})
  return hf_config, out


# The model types a written kind may also be written as (`to_transformers`' model_type):
# SigLIP's tower as SigLIP 2's, which computes the same function at its own grid, and
# CLIP's as MetaCLIP 2's, the same architecture.
_ALSO_WRITTEN_AS = {'siglip': ('siglip2_vision_model',), 'clip': ('metaclip_2_vision_model',)}
# What each written kind of model must have (beyond its kind's own fields), and
# the kinds as a sentence for a refusal.
_PLAIN_MLP = tuple(_WRITTEN_ACTIVATIONS)  # SwiGLU is DINOv2's alone
_WRITTEN = {
    'vit': dict(classifier=('token',), num_registers=(0,), layer_scale_init=(0.,),
                activation=_PLAIN_MLP),
    'dinov2': dict(classifier=('token',), num_classes=(0,)),
    'clip': dict(classifier=('token',), num_registers=(0,), layer_scale_init=(0.,),
                 patch_bias=(False,), activation=_PLAIN_MLP),
    'siglip': dict(num_classes=(0,), num_registers=(0,), layer_scale_init=(0.,),
                   patch_bias=(True,), activation=_PLAIN_MLP)}
_WRITTEN_KINDS = (
    'written are a class-token ViT without registers, LayerScale or a pre-logits layer (as '
    'ViTForImageClassification), or headless with one (ViTModel, the layer its pooler); a '
    'headless class-token ViT with LayerScale, with or without registers, its MLP GELU '
    'or SwiGLU (Dinov2Model); a class-token ViT with CLIP\'s LayerNorm before the blocks and '
    'no patch bias (CLIPVisionModel, with a head CLIPVisionModelWithProjection); a headless '
    'attention-pooling ViT (SiglipVisionModel)')


def _written_sizes(config: ml_collections.ConfigDict, image_size: int) -> Dict[str, Any]:
  """The config.json fields every written kind shares: sizes, activation, epsilon."""
  return {'hidden_size': config.hidden_size, 'num_hidden_layers': config.num_layers,
          'num_attention_heads': config.num_heads,
          # DINOv2's SwiGLU reads no hidden_act: 'gelu', as its published configs say.
          'hidden_act': _WRITTEN_ACTIVATIONS.get(config.activation, 'gelu'),
          'layer_norm_eps': config.layer_norm_eps, 'image_size': image_size,
          'patch_size': config.patch_size, 'num_channels': 3}


def _written_kind(config: ml_collections.ConfigDict) -> str:
  """The transformers model a ViT is written as ('vit', 'dinov2', 'clip' or
  'siglip'), or a CheckpointError naming the field none of them has."""
  kind = ('siglip' if config.get('classifier') == 'map' else 'clip' if config.get('pre_norm')
          else 'dinov2' if config.get('layer_scale_init') else 'vit')
  common = dict(representation_size=(None,), resnet_layers=(None,), posemb=('learn',),
                pre_norm=(kind == 'clip',), patch_bias=(True,), posemb_grid=(None,),
                mlp_norm=(False, None), pooled_norm=(False, None), map_heads=(None,),
                map_mlp_dim=(None,), projection_bias=(True, None), patch_norm=(False, None))
  if kind == 'siglip':  # SigLIP 2's tower resizes its table (`to_transformers`)
    common.pop('posemb_grid')
  if kind == 'vit' and not config.get('num_classes'):  # ViTModel, the layer its pooler
    common.pop('representation_size')
  for field, allowed in {**common, **_WRITTEN[kind]}.items():
    if config.get(field) not in allowed:
      raise CheckpointError(f'The model has {field} {config.get(field)!r}, which transformers\' '
                            f'{kind} models do not have: {_WRITTEN_KINDS}.')
  return kind


def _as_tower(state: Mapping[str, np.ndarray], config: ml_collections.ConfigDict,
              image_size: int, kind: str) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
  """A CLIP or SigLIP image tower's config.json and weights (`_tower_to_timm`'s
  inverse); CLIP's head, its visual projection, has no bias, so a nonzero one is
  refused."""
  top = {timm: name for name, timm in _TOWER_TOP.items()}
  layer = {timm: name for name, timm in _TOWER_LAYER.items()}
  projection = 'head.weight' in state
  if projection and np.any(np.asarray(state['head.bias'])):
    raise CheckpointError('The model\'s head has a nonzero bias, which CLIP\'s visual '
                          'projection does not have: it is not written as CLIP.')
  prefix = 'vision_model.' if projection else ''
  out = {}
  for key, value in state.items():
    block = re.match(r'blocks\.(\d+)\.(.+)\.(weight|bias)$', key)
    value = np.asarray(value)
    if key in top:
      out[prefix + top[key]] = value
    elif key == 'cls_token':
      out[prefix + 'embeddings.class_embedding'] = value.reshape(-1)
    elif key == 'pos_embed':
      out[prefix + 'embeddings.position_embedding.weight'] = value[0]
    elif key == 'head.weight':
      out['visual_projection.weight'] = value
    elif key in ('attn_pool.q.weight', 'attn_pool.q.bias'):
      end = key.split('.')[-1]
      out[f'head.attention.in_proj_{end}'] = np.concatenate(
          [value, np.asarray(state[f'attn_pool.kv.{end}'])])
    elif block and block[2] == 'attn.qkv':
      for part, piece in zip('qkv', np.split(value, 3)):
        out[f'{prefix}encoder.layers.{block[1]}.self_attn.{part}_proj.{block[3]}'] = piece
    elif block and block[2] in layer:
      out[f'{prefix}encoder.layers.{block[1]}.{layer[block[2]]}.{block[3]}'] = value
    elif key not in ('head.bias', 'attn_pool.kv.weight', 'attn_pool.kv.bias'):
      raise CheckpointError(f"{key} of timm's ViT has no place in a transformers {kind} tower.")
  architecture = ('CLIPVisionModelWithProjection' if projection else 'CLIPVisionModel'
                  ) if kind == 'clip' else 'SiglipVisionModel'
  hf_config = {
      'model_type': f'{kind}_vision_model', 'architectures': [architecture],
      **_written_sizes(config, image_size), 'intermediate_size': config.mlp_dim,
      'attention_dropout': 0.,
      **({'projection_dim': config.num_classes} if projection else {}),
      **({'vision_use_head': True} if kind == 'siglip' else {})}
  return hf_config, out


def _as_metaclip2(hf_config: Dict[str, Any], weights: Dict[str, np.ndarray]
                  ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
  """A CLIP image tower's config.json and weights as MetaCLIP 2's: the same weights,
  under MetaCLIP 2's model type and classes."""
  architecture = hf_config['architectures'][0].replace('CLIP', 'MetaClip2')
  return {**hf_config, 'model_type': 'metaclip_2_vision_model',
          'architectures': [architecture]}, weights


def _as_siglip2(hf_config: Dict[str, Any], weights: Dict[str, np.ndarray]
                ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
  """A SigLIP image tower's config.json and weights as SigLIP 2's: its position
  embeddings as `num_patches`, its patch kernel as the linear layer on flattened
  patches (`_linear_patches_as_kernel`'s inverse)."""
  kernel = weights['embeddings.patch_embedding.weight']
  weights['embeddings.patch_embedding.weight'] = kernel.transpose(0, 2, 3, 1).reshape(
      kernel.shape[0], -1)
  rows = weights['embeddings.position_embedding.weight'].shape[0]
  del hf_config['image_size']
  hf_config.update(model_type='siglip2_vision_model', architectures=['Siglip2VisionModel'],
                   num_patches=rows)
  return hf_config, weights


def _swiglu_units(width: int, mlp_ratio: float) -> int:
  """The units of `Dinov2SwiGLUFFN` (`mlp_dim`): two thirds of `mlp_ratio` times the
  width, rounded up to a multiple of 8."""
  return (int(int(width * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def _mlp_ratio(config: ml_collections.ConfigDict) -> int:
  """Dinov2Model's `mlp_ratio` (a whole number, as `transformers`' config takes it) for
  the model's MLP: its units over the width; for SwiGLU, the ratio whose
  `_swiglu_units` are its units. A model no ratio gives is refused."""
  width, units = config.hidden_size, config.mlp_dim
  if config.activation != 'swiglu':
    if units % width:
      raise CheckpointError(f'The model\'s MLP has {units} units, not a whole multiple of its '
                            f'width {width}, as Dinov2Model\'s mlp_ratio is.')
    return units // width
  ratios = [r for r in range(1, 2 * units // width + 2) if _swiglu_units(width, r) == units]
  if not ratios:
    raise CheckpointError(f'The model\'s SwiGLU MLP has {units} units, which no whole mlp_ratio '
                          f'of Dinov2Model makes at width {width} (two thirds of the ratio '
                          'times the width, rounded up to a multiple of 8): '
                          f'{", ".join(str(_swiglu_units(width, r)) for r in (2, 3, 4))} are.')
  return ratios[0]


def _as_dinov2(hf_config: Dict[str, Any], weights: Dict[str, np.ndarray],
               config: ml_collections.ConfigDict
               ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
  """A DINOv2 config.json and weights: with registers, the class token's position
  embedding is a row of zeros (these ViTs add the class token's to the token);
  the masked-image-modelling token, unused on images, zeros."""
  registers = config.get('num_registers') or 0
  width = config.hidden_size
  ratio = _mlp_ratio(config)
  if registers:
    positions = weights['embeddings.position_embeddings']
    weights['embeddings.position_embeddings'] = np.concatenate(
        [np.zeros_like(positions[:, :1]), positions], axis=1)
  weights['embeddings.mask_token'] = np.zeros((1, width), np.float32)
  kind = 'dinov2_with_registers' if registers else 'dinov2'
  hf_config.update({
      'model_type': kind,
      'architectures': ['Dinov2WithRegistersModel' if registers else 'Dinov2Model'],
      'mlp_ratio': ratio, 'layerscale_value': 1.0, 'use_swiglu_ffn': config.activation == 'swiglu',
      **({'num_register_tokens': registers} if registers else {})})
  return hf_config, weights
