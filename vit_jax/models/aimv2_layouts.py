"""AIMv2's `transformers` folders (`aimv2_vision_model`, and `aimv2`'s image tower)
to and from the published layout: the trunk through timm's names of the same
model (its `aimv2_*` files: `vit_layouts.to_timm`), the attention pooling head
(`use_head`, the `attention_pool` classifier) beside them in the published layout.
The `vit` family takes this layout for a folder of these types and a model with
RMSNorms (`vit.FAMILY`)."""
import logging
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import ml_collections
import numpy as np

from vit_jax.models import vit_layouts
from vit_jax.models.family import CheckpointError, Flat

log = logging.getLogger(__name__)

TRANSFORMERS_TYPES = ('aimv2_vision_model', 'aimv2')

# `transformers`' names of an Aimv2VisionModel (without 'vision_model.') -> timm's; a
# layer's after 'encoder.layers.N.'.
_TOP = {'embeddings.patch_embed.weight': 'patch_embed.proj.weight',
        'embeddings.patch_embed.bias': 'patch_embed.proj.bias',
        'embeddings.rms_norm.weight': 'patch_embed.norm.weight', 'rms_norm.weight': 'norm.weight'}
_LAYER = {'rms_norm1': 'norm1', 'rms_norm2': 'norm2', 'attention.out_proj': 'attn.proj',
          'ffn.gate_proj': 'mlp.fc1_g', 'ffn.up_proj': 'mlp.fc1_x', 'ffn.down_proj': 'mlp.fc2'}
_QKV = {'attention.q_proj': 'q', 'attention.k_proj': 'k', 'attention.v_proj': 'v'}
# The other tower's weights in an `aimv2` folder, and its own scalar.
_OTHER_TOWER = re.compile(r'^(text_model\.|text_projection\.|logit_scale$)')
_POOL = 'attention_pool/'  # the published names of `vit.AttentionPool`


def _tower_config(config: Mapping[str, Any]) -> Dict[str, Any]:
  """The image tower's config: the folder's, or an `aimv2` folder's `vision_config`."""
  if config.get('model_type') != 'aimv2':
    return dict(config)
  tower = config.get('vision_config')
  if not isinstance(tower, dict):
    raise CheckpointError(f'The config.json of this aimv2 model has vision_config {tower!r}, '
                          "where the image tower's config belongs: the folder is damaged.")
  return {**tower, 'model_type': 'aimv2_vision_model'}


def transformers_fields(config: Mapping[str, Any]) -> Dict[str, Any]:
  """The ViT fields an AIMv2 config.json sets, with `Aimv2VisionConfig`'s defaults
  where it is silent, or a CheckpointError naming one these ViTs cannot express:
  with `use_head` (its default) AIMv2's attention pooling, else the tokens' mean.

  Args:
    config: the config.json.

  Returns:
    The fields.
  """
  config = _tower_config(config)
  positive = lambda key, default, kind=int: vit_layouts._positive(
      {key: default, **config}, key, kind)
  for key, default, theirs in (('hidden_act', 'silu', 'a SwiGLU MLP (silu)'),
                               ('num_channels', 3, 'RGB images (3 channels)'),
                               ('is_native', False, "a learned position table (AIMv2's "
                                "native-resolution files add a fixed sine-cosine one)")):
    if config.get(key, default) != default:
      raise CheckpointError(f'The config.json sets {key} {config[key]!r}, where these AIMv2 '
                            f'ViTs have {theirs}.')
  qkv_bias, mlp_bias = (bool(config.get(key, False)) for key in ('qkv_bias', 'mlp_bias'))
  if qkv_bias != mlp_bias:
    raise CheckpointError(f'The config.json sets qkv_bias {qkv_bias} and mlp_bias {mlp_bias}: '
                          'these ViTs give the attention\'s output projection and the MLP a '
                          'bias together or neither (timm\'s proj_bias).')
  return dict(hidden_size=positive('hidden_size', 1024),
              num_layers=positive('num_hidden_layers', 24),
              num_heads=positive('num_attention_heads', 8),
              mlp_dim=positive('intermediate_size', 2816),
              patch_size=vit_layouts._patch_side({'patch_size': 14, **config}),
              activation='swiglu', normalization='rms', patch_norm=True,
              layer_norm_eps=positive('rms_norm_eps', 1e-5, float),
              attention_bias='qkv' if qkv_bias else 'none', projection_bias=qkv_bias,
              classifier='attention_pool' if config.get('use_head', True) is not False
              else 'gap', resnet_layers=None)


def from_transformers(state: Mapping[str, np.ndarray], hf_config: Mapping[str, Any]
                      ) -> Tuple[Dict[str, np.ndarray], Flat, Dict[str, Any]]:
  """An AIMv2 image tower's weights (an `aimv2` folder's text tower left out) under
  timm's names, its visual projection as a head without bias; the attention
  pooling head in the published layout, as `from_pretrained` builds the model: with
  `use_head` (its default) the head is read, and refused where the weights lack it
  (it would start at random); without, the weights' head is left out, as
  `from_pretrained` leaves it.

  Args:
    state: the weights.
    hf_config: the folder's config.json.

  Returns:
    (timm's state dict, the attention pooling's parameters or none, the field they
    fix: `classifier` 'attention_pool', or none).
  """
  fields = transformers_fields(hf_config)  # with use_head, classifier 'attention_pool'
  use_head = fields['classifier'] == 'attention_pool'
  out, qkv, head = {}, {}, {}
  for key, value in state.items():
    name = key[len('vision_model.'):] if key.startswith('vision_model.') else key
    layer = re.match(r'encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$', name)
    value = np.asarray(value)
    if _OTHER_TOWER.match(key) or name == 'embeddings.position_ids':
      continue
    if name in _TOP:
      out[_TOP[name]] = value
    elif name == 'embeddings.position_embedding.weight':
      out['pos_embed'] = value[None]
    elif name == 'visual_projection.weight':
      out['head.weight'], out['head.bias'] = value, np.zeros(value.shape[0], value.dtype)
    elif name.startswith('head.'):
      head[name] = value
    elif layer and layer[2] in _QKV:
      qkv[(int(layer[1]), _QKV[layer[2]], layer[3])] = value
    elif layer and layer[2] in _LAYER:
      out[f'blocks.{layer[1]}.{_LAYER[layer[2]]}.{layer[3]}'] = value
    else:
      raise CheckpointError(f'The weights hold {key!r}, which an AIMv2 image tower of this '
                            'project has no place for.')
  out.update(vit_layouts._joined_qkv(qkv, tuple('qkv')))
  vit_layouts._check_embeddings(out, with_class_token=False)
  if not use_head:
    if head:
      log.warning('The config.json sets use_head false: the weights\' attention pooling head '
                  '(%s) is left out, as transformers leaves it.', ', '.join(sorted(head)))
    return out, {}, {}
  return out, _pool_params(head, fields['num_heads']), {'classifier': 'attention_pool'}


def _pool_params(head: Mapping[str, np.ndarray], heads: int) -> Flat:
  """`Aimv2AttentionPoolingHead`'s weights as `vit.AttentionPool`'s parameters; a
  missing weight (or bias of the output projection) is refused: `from_pretrained`
  would start it at random."""
  needed = ('head.cls_token', 'head.k_proj.weight', 'head.v_proj.weight',
            'head.output_proj.weight', 'head.output_proj.bias')
  missing = [name for name in needed if name not in head]
  if missing:
    raise CheckpointError(f'The config.json gives the tower an attention pooling head '
                          f'(use_head), and the weights lack {", ".join(missing)}, which '
                          'transformers would start at random: the folder is damaged or '
                          'incomplete.')
  width = head['head.cls_token'].shape[-1]
  split = (heads, width // heads)
  flat = {_POOL + 'query': head['head.cls_token'].reshape(1, 1, width),
          _POOL + 'out/kernel': head['head.output_proj.weight'].T.reshape(*split, width),
          _POOL + 'out/bias': head['head.output_proj.bias']}
  for name in ('key', 'value'):
    flat[f'{_POOL}{name}/kernel'] = head[f'head.{name[0]}_proj.weight'].T.reshape(width, *split)
    if f'head.{name[0]}_proj.bias' in head:
      flat[f'{_POOL}{name}/bias'] = head[f'head.{name[0]}_proj.bias'].reshape(split)
  return flat


def to_transformers(flat: Flat, config: ml_collections.ConfigDict, image_size: int,
                    model_type: Optional[str] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """An AIMv2 ViT as `transformers`' `Aimv2VisionModel` (`aimv2_vision_model`):
  config.json and weights; `AutoModel` loads them with the same outputs (the tokens
  as `last_hidden_state`, the attention pooling's as `pooler_output`). The folder
  holds no pooling of the patches' mean: a `gap` model reads back as one, its mean
  taken here. A model that folder cannot hold is refused, naming the field.

  Args:
    flat: the flat parameters, published layout.
    config: the model's config (RMSNorms).
    image_size: the images' side in pixels.
    model_type: 'aimv2_vision_model' or None.

  Returns:
    (config.json, the weights under the files' names).
  """
  if model_type not in (None, 'aimv2_vision_model'):
    raise CheckpointError(f'An AIMv2 ViT is written as aimv2_vision_model, not {model_type!r}.')
  allowed = dict(activation=('swiglu',), normalization=('rms',), patch_norm=(True,),
                 classifier=('gap', 'unpooled', 'attention_pool'), posemb=('learn',),
                 posemb_grid=(None,), num_classes=(0, None), num_registers=(0,),
                 layer_scale_init=(0.,), pre_norm=(False,), patch_bias=(True,),
                 resnet_layers=(None,),
                 representation_size=(None,), mlp_norm=(False,), pooled_norm=(False,),
                 rope=('none',), map_heads=(None, config.num_heads),
                 attention_bias=('qkv',) if config.projection_bias else ('none',))
  for field, values in allowed.items():
    if config.get(field) not in values:
      raise CheckpointError(
          f"The model has {field} {config.get(field)!r}, which transformers' "
          'Aimv2VisionModel does not have: it holds a headless AIMv2 ViT (RMSNorms, the patch '
          'embeddings\' among them; SwiGLU; a learned position table; the tokens, or AIMv2\'s '
          'attention pooling), with biases on every projection or none.')
  timm = vit_layouts.to_timm({k: v for k, v in flat.items() if not k.startswith(_POOL)},
                             split_swiglu=True)
  top = {t: name for name, t in _TOP.items()}
  layer = {t: name for name, t in _LAYER.items()}
  layer.update({f'attn.{t}_proj': name for name, t in _QKV.items()})
  weights = {'embeddings.position_embedding.weight': timm.pop('pos_embed')[0]}
  for key, value in timm.items():
    if key in top:
      weights[top[key]] = value
      continue
    block = re.match(r'blocks\.(\d+)\.(.+)\.(weight|bias)$', key)
    if block[2] == 'attn.qkv':
      for part, name in zip(np.split(value, 3), ('q_proj', 'k_proj', 'v_proj')):
        weights[f'encoder.layers.{block[1]}.attention.{name}.{block[3]}'] = part
    else:
      weights[f'encoder.layers.{block[1]}.{layer[block[2]]}.{block[3]}'] = value
  if config.classifier == 'attention_pool':
    width = config.hidden_size
    weights['head.cls_token'] = flat[_POOL + 'query'].reshape(1, 1, width)
    weights['head.output_proj.weight'] = flat[_POOL + 'out/kernel'].reshape(-1, width).T
    weights['head.output_proj.bias'] = flat[_POOL + 'out/bias']
    for name in ('key', 'value'):
      weights[f'head.{name[0]}_proj.weight'] = flat[f'{_POOL}{name}/kernel'].reshape(width, -1).T
      if f'{_POOL}{name}/bias' in flat:
        weights[f'head.{name[0]}_proj.bias'] = flat[f'{_POOL}{name}/bias'].reshape(-1)
  hf_config = {'model_type': 'aimv2_vision_model', 'architectures': ['Aimv2VisionModel'],
               'hidden_size': config.hidden_size, 'intermediate_size': config.mlp_dim,
               'num_hidden_layers': config.num_layers, 'num_attention_heads': config.num_heads,
               'num_channels': 3, 'image_size': image_size, 'patch_size': config.patch_size,
               'hidden_act': 'silu', 'rms_norm_eps': config.layer_norm_eps,
               'qkv_bias': bool(config.projection_bias), 'mlp_bias': bool(config.projection_bias),
               'use_head': config.classifier == 'attention_pool', 'is_native': False}
  return hf_config, {k: np.asarray(v) for k, v in weights.items()}
