"""The files of ViTs with rotary position embeddings (DINOv3, EVA-02, Perception
Encoder): timm's `Eva` state dicts (the class timm builds `vit_*_dinov3`, `eva02_*`
and `vit_pe_*` with) and `transformers`' `dinov3_vit` folders, to and from the
published layout. The `vit` family takes these layouts for a model whose `rope` is
set (`vit.FAMILY`)."""
import logging
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import ml_collections
import numpy as np

from vit_jax.models import vit_layouts
from vit_jax.models.conv import oihw
from vit_jax.models.family import CheckpointError, Flat

log = logging.getLogger(__name__)

TRANSFORMERS_TYPES = ('dinov3_vit',)

# `transformers`' names of a DINOv3ViTModel -> timm's Eva's; a layer's after
# 'layer.N.' (its MLP's in `_TRANSFORMERS_MLP`).
_TRANSFORMERS_TOP = {
    'embeddings.cls_token': 'cls_token', 'embeddings.register_tokens': 'reg_token',
    'embeddings.patch_embeddings.weight': 'patch_embed.proj.weight',
    'embeddings.patch_embeddings.bias': 'patch_embed.proj.bias',
    'norm.weight': 'norm.weight', 'norm.bias': 'norm.bias'}
_TRANSFORMERS_LAYER = {
    'norm1.weight': 'norm1.weight', 'norm1.bias': 'norm1.bias',
    'norm2.weight': 'norm2.weight', 'norm2.bias': 'norm2.bias',
    'attention.o_proj.weight': 'attn.proj.weight', 'attention.o_proj.bias': 'attn.proj.bias',
    'attention.q_proj.bias': 'attn.q_bias', 'attention.v_proj.bias': 'attn.v_bias',
    'layer_scale1.lambda1': 'gamma_1', 'layer_scale2.lambda1': 'gamma_2'}
# The MLP, plain (`DINOv3ViTMLP`) or gated (`DINOv3ViTGatedMLP`: silu(gate) * up).
_TRANSFORMERS_MLP = {
    False: {'mlp.up_proj.weight': 'mlp.fc1.weight', 'mlp.up_proj.bias': 'mlp.fc1.bias',
            'mlp.down_proj.weight': 'mlp.fc2.weight', 'mlp.down_proj.bias': 'mlp.fc2.bias'},
    True: {'mlp.gate_proj.weight': 'mlp.fc1_g.weight', 'mlp.gate_proj.bias': 'mlp.fc1_g.bias',
           'mlp.up_proj.weight': 'mlp.fc1_x.weight', 'mlp.up_proj.bias': 'mlp.fc1_x.bias',
           'mlp.down_proj.weight': 'mlp.fc2.weight', 'mlp.down_proj.bias': 'mlp.fc2.bias'}}
_QKV = ('q_proj', 'k_proj', 'v_proj')


def _blocks(flat: Flat) -> List[int]:
  """The indices of the encoder blocks a published-layout tree holds, in order."""
  return sorted({int(m[1]) for m in map(vit_layouts._BLOCK_PARAM.match, flat) if m})


def to_timm(flat: Flat, config: ml_collections.ConfigDict) -> Dict[str, np.ndarray]:
  """The timm `Eva` state dict (name -> array, PyTorch layout) of a RoPE ViT in the
  published layout, as timm's `vit_*_dinov3`, `eva02_*` and `vit_pe_*` models hold
  it: the query, key and value fused in `attn.qkv`, with their biases in
  `attn.qkv.bias` for Perception Encoder (`rope='pe'`, timm's `AttentionRope`), or
  else without a bias, the query's and value's
  as `q_bias` and `v_bias` (DINOv3's `_qkvb` files, EVA-02's T and S), or, with
  EVA-02's LayerNorm in the MLP (`mlp_norm`, its B and L), as three projections
  `q_proj`, `k_proj` (no bias) and `v_proj`; LayerScale as `gamma_1` and
  `gamma_2`; a SwiGLU MLP packed in `fc1` ([gate | input], timm's `GluMlp`) or, as
  timm builds DINOv3's and any with `mlp_norm`, as `fc1_g` and `fc1_x` (`SwiGLU`);
  the final LayerNorm as `fc_norm` with `pooled_norm`, else `norm`; attention
  pooling as `attn_pool` (`vit_layouts.map_head_to_timm`).

  Args:
    flat: the flat parameters, published layout.
    config: the model's config (`rope` set).

  Returns:
    The state dict's arrays.
  """
  registers = config.get('num_registers') or 0
  pe = config.rope == 'pe'  # timm's AttentionRope: the fused qkv with a bias or without
  for refused, why in (
      (config.attention_bias == 'qkv' and not pe,
       "timm's Eva attention has no key bias (DINOv3 and EVA-02 mask it to zero): export a "
       "model with attention_bias 'qv' or 'none'"),
      (config.attention_bias == 'qv' and pe,
       "timm's Perception Encoder has a bias on all of the query, key and value or on none: "
       "export a model with attention_bias 'qkv' or 'none'"),
      (config.posemb not in ('none', 'learn') or config.get('posemb_grid') is not None,
       "timm's Eva holds a learned position table of the images' grid or none beside its "
       "rotary embeddings: export a model with posemb 'learn' or 'none' and no posemb_grid"),
      (config.posemb == 'learn' and registers, "timm's Eva here adds its table to the class "
       'token and the patches, and this model has registers: export one without registers '
       "or with posemb='none'"),
      (config.classifier not in ('token', 'gap', 'token_gap', 'map', 'token_map'),
       "timm's Eva pools the class token, the patches' mean or by attention: export a model "
       "with classifier 'token', 'gap', 'token_gap', 'map' or 'token_map'"),
      (config.representation_size is not None, "timm's Eva has no pre-logits layer"),
      (config.get('normalization', 'layer') != 'layer' or config.get('patch_norm')
       or not config.get('projection_bias', True),
       "timm's Eva here has LayerNorms, none of the patch embeddings, and biased output "
       "projections and MLPs: export a model with normalization 'layer', patch_norm=False and "
       'projection_bias=True')):
    if refused:
      raise ValueError(why + '.')
  fused = not config.get('mlp_norm')
  packed = fused and config.rope != 'dinov3'
  out = {'patch_embed.proj.weight': oihw(flat['embedding/kernel'])}
  if 'embedding/bias' in flat:
    out['patch_embed.proj.bias'] = flat['embedding/bias']
  for name, timm in (('cls', 'cls_token'), ('registers', 'reg_token'),
                     ('Transformer/posembed_input/pos_embedding', 'pos_embed')):
    if name in flat:
      out[timm] = flat[name]
  if 'Transformer/pre_norm/scale' in flat:
    out.update(vit_layouts._layernorm_to_timm(flat, 'Transformer/pre_norm/', 'norm_pre.'))
  for i in _blocks(flat):
    p, t = f'Transformer/encoderblock_{i}/', f'blocks.{i}.'
    attention = p + 'MultiHeadDotProductAttention_1/'
    kernels = {n: flat[f'{attention}{n}/kernel'] for n in ('query', 'key', 'value')}
    kernels = {n: k.reshape(k.shape[0], -1).T for n, k in kernels.items()}
    biases = {n: flat[f'{attention}{n}/bias'].reshape(-1) for n in ('query', 'value')
              if f'{attention}{n}/bias' in flat}
    if not fused:
      out.update({f'{t}attn.{n[0]}_proj.weight': k for n, k in kernels.items()})
      out.update({f'{t}attn.{n[0]}_proj.bias': b for n, b in biases.items()})
    else:
      out[t + 'attn.qkv.weight'] = np.concatenate(list(kernels.values()))
      if not pe:
        out.update({f'{t}attn.{n[0]}_bias': b for n, b in biases.items()})
      elif f'{attention}key/bias' in flat:
        out[t + 'attn.qkv.bias'] = np.concatenate([
            flat[f'{attention}{n}/bias'].reshape(-1) for n in ('query', 'key', 'value')])
    out[t + 'attn.proj.weight'] = vit_layouts._out_projection(flat[attention + 'out/kernel'])
    out[t + 'attn.proj.bias'] = flat[attention + 'out/bias']
    out.update(vit_layouts._layernorm_to_timm(flat, p + 'LayerNorm_0/', t + 'norm1.'))
    out.update(vit_layouts._layernorm_to_timm(flat, p + 'LayerNorm_2/', t + 'norm2.'))
    out.update({f'{t}gamma_{n + 1}': flat[p + scale] for n, scale in enumerate(('ls1', 'ls2'))
                if p + scale in flat})
    # With EVA-02's `mlp.norm`, where it has one.
    out.update(vit_layouts._mlp_to_timm(flat, p + 'MlpBlock_3/', t + 'mlp.',
                                        config.activation == 'swiglu' and not packed))
  out.update(vit_layouts._layernorm_to_timm(
      flat, 'Transformer/encoder_norm/', 'fc_norm.' if config.get('pooled_norm') else 'norm.'))
  out.update(vit_layouts.map_head_to_timm(flat))
  if 'head/kernel' in flat:
    out['head.weight'], out['head.bias'] = flat['head/kernel'].T, flat['head/bias']
  return out


def timm_fields(state: Mapping[str, Any], config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """What a timm `Eva` state dict of a RoPE ViT fixes: the head (the class token or
  the patches' mean, and the final LayerNorm before the pooling or after it:
  `fc_norm`, timm's average pooling; or attention pooling, `attn_pool`, of the
  patches or of the class token and the patches), the classes, LayerScale, the
  registers, the query and value biases, the patch bias, the position table (and from it the image
  size; without one, one patch builds the tree), EVA-02's LayerNorm in the MLP and
  the LayerNorm before the blocks (`norm_pre`). Without `fc_norm` a state dict does
  not show whether the class token or the patches' mean is pooled: the named model
  says.

  Args:
    state: the state dict.
    config: the named model's zoo config.

  Returns:
    The config fields it fixes, and `image_size`.
  """
  token = 'cls_token' in state
  pooled_norm = 'fc_norm.weight' in state
  if 'attn_pool.latent' in state:
    if pooled_norm:
      raise CheckpointError('This timm Eva normalises what its attention pooling gives '
                            '(fc_norm after attn_pool), which these ViTs do not have.')
    classifier = 'token_map' if token else 'map'
  else:
    classifier = ('gap' if not token else 'token_gap' if pooled_norm
                  else config.classifier if config.classifier in ('token', 'token_gap')
                  else 'token')
  registers = np.shape(state['reg_token'])[1] if 'reg_token' in state else 0
  image_size = config.patch_size
  if 'pos_embed' in state:
    if registers:
      raise CheckpointError('This timm Eva holds registers and a position table, which the '
                            'RoPE ViTs here do not have together.')
    patches = np.shape(state['pos_embed'])[1] - token
    side = math.isqrt(patches)
    if side * side != patches:
      raise CheckpointError(f'pos_embed holds {patches} patch positions, not a square grid.')
    image_size = side * config.patch_size
  return dict(classifier=classifier, pooled_norm=pooled_norm, image_size=image_size,
              posemb='learn' if 'pos_embed' in state else 'none',
              num_classes=np.shape(state['head.weight'])[0] if 'head.weight' in state else 0,
              layer_scale_init=(vit_layouts.LAYER_SCALE_INIT if 'blocks.0.gamma_1' in state
                                else 0.),
              num_registers=registers,
              attention_bias=('qkv' if 'blocks.0.attn.qkv.bias' in state else 'qv'
                              if {'blocks.0.attn.q_bias', 'blocks.0.attn.q_proj.bias'}
                              & set(state) else 'none'),
              patch_bias='patch_embed.proj.bias' in state,
              mlp_norm='blocks.0.mlp.norm.weight' in state,
              pre_norm='norm_pre.weight' in state)


def transformers_fields(config: Mapping[str, Any]) -> Dict[str, Any]:
  """The ViT fields a `dinov3_vit` config.json sets, or a CheckpointError naming one
  these ViTs cannot express; the weights fix the registers and LayerScale.

  Args:
    config: the config.json.

  Returns:
    The fields.
  """
  gated = bool(config.get('use_gated_mlp', False))
  act = config.get('hidden_act', 'gelu')
  if gated and act != 'silu':
    raise CheckpointError(f'The config.json sets use_gated_mlp with hidden_act {act!r}: these '
                          'ViTs gate their MLP with silu (SwiGLU) only.')
  if not gated and act not in vit_layouts.TRANSFORMERS_ACTIVATIONS:
    raise CheckpointError(f'The config.json sets hidden_act {act!r}, which these ViTs do not '
                          'have; they have '
                          f'{", ".join(sorted(vit_layouts.TRANSFORMERS_ACTIVATIONS))}.')
  biases = {key: config.get(key, default) for key, default in (
      ('query_bias', True), ('key_bias', False), ('value_bias', True), ('proj_bias', True),
      ('mlp_bias', True))}
  if biases['key_bias'] or biases['query_bias'] != biases['value_bias'] or not (
      biases['proj_bias'] and biases['mlp_bias']):
    raise CheckpointError(
        'The config.json sets ' + ', '.join(f'{k} {v}' for k, v in biases.items()) + ': the '
        'DINOv3 ViTs here have no key bias, a bias on the query and value or on neither, and '
        'biases on the output projection and the MLP.')
  if config.get('num_channels', 3) != 3:
    raise CheckpointError(f'The config.json sets num_channels {config["num_channels"]}: these '
                          'ViTs read RGB images (3 channels).')
  return dict(hidden_size=vit_layouts._positive(config, 'hidden_size'),
              num_layers=vit_layouts._positive(config, 'num_hidden_layers'),
              num_heads=vit_layouts._positive(config, 'num_attention_heads'),
              mlp_dim=vit_layouts._positive(config, 'intermediate_size'),
              patch_size=vit_layouts._patch_side(config),
              activation='swiglu' if gated else vit_layouts.TRANSFORMERS_ACTIVATIONS[act],
              layer_norm_eps=vit_layouts._positive({'layer_norm_eps': 1e-5, **config},
                                                   'layer_norm_eps', float),
              rope='dinov3',
              rope_theta=vit_layouts._positive({'rope_theta': 100., **config}, 'rope_theta',
                                               float),
              posemb='none', attention_bias='qv' if biases['query_bias'] else 'none',
              classifier='token', resnet_layers=None)


def from_transformers(state: Mapping[str, np.ndarray], hf_config: Mapping[str, Any]
                      ) -> Tuple[Dict[str, np.ndarray], Flat, Dict[str, Any]]:
  """A `DINOv3ViTModel`'s weights under timm's Eva names, as `from_pretrained` builds
  it: with `query_bias` and `value_bias` false the file's biases are left out, and
  a bias missing where the config has one starts at zero; the masked-image-modelling
  token, unused on images, is not read.

  Args:
    state: the weights.
    hf_config: the folder's config.json.

  Returns:
    (timm's state dict, no extra parameters, no extra fields).
  """
  biased = hf_config.get('query_bias', True)
  names = {**_TRANSFORMERS_LAYER, **_TRANSFORMERS_MLP[bool(hf_config.get('use_gated_mlp'))]}
  out, qkv = {}, {}
  for key, value in state.items():
    # save_pretrained writes 'layer.N.', which from_pretrained reads as its module's
    # 'model.layer.N.' (its conversion mapping for dinov3_vit): either is read.
    layer = re.match(r'(?:model\.)?layer\.(\d+)\.(.+)$', key)
    if key in _TRANSFORMERS_TOP:
      if np.size(value):  # no registers: a (1, 0, width) tensor
        out[_TRANSFORMERS_TOP[key]] = value
    elif layer and layer[2] in names:
      if biased or not layer[2].endswith(('q_proj.bias', 'v_proj.bias')):
        out[f'blocks.{layer[1]}.{names[layer[2]]}'] = value
    elif layer and layer[2] in {f'attention.{p}.weight' for p in _QKV}:
      qkv[(int(layer[1]), layer[2].split('.')[1])] = value
    elif key != 'embeddings.mask_token':
      raise CheckpointError(f'The weights hold {key!r}, which a DINOv3 ViT of this project has '
                            'no place for.')
  for block in sorted({b for b, _ in qkv}):
    missing = [p for p in _QKV if (block, p) not in qkv]
    if missing:
      raise CheckpointError(f'The weights of layer {block} hold no {" or ".join(missing)} '
                            'weight, which transformers would start at random: the folder is '
                            'damaged.')
    out[f'blocks.{block}.attn.qkv.weight'] = np.concatenate([qkv[(block, p)] for p in _QKV])
    for part in ('q', 'v'):
      if biased and f'blocks.{block}.attn.{part}_bias' not in out:
        log.warning('The weights of layer %d hold no %s_proj bias: it starts at zero, as '
                    'transformers starts it.', block, part)
        out[f'blocks.{block}.attn.{part}_bias'] = np.zeros(len(qkv[(block, 'q_proj')]),
                                                           np.float32)
  return out, {}, {}


def to_transformers(flat: Flat, config: ml_collections.ConfigDict, image_size: int,
                    model_type: Optional[str] = None
                    ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
  """A headless class-token RoPE ViT as `transformers`' `DINOv3ViTModel`: its
  config.json and its weights under the files' names (`from_transformers`'
  inverse). A model without LayerScale is written with scales of one, a model
  without registers with none; the mask token, unused on images, is zeros.

  Args:
    flat: the model's parameters, flat, in the published layout.
    config: the model's config.
    image_size: the images' side in pixels.
    model_type: 'dinov3_vit', or None.

  Returns:
    (config.json, the weights).
  """
  if model_type not in (None, 'dinov3_vit'):
    raise CheckpointError(f"This ViT is written as model_type 'dinov3_vit', not {model_type!r}.")
  for field, allowed in (('classifier', ('token',)), ('num_classes', (0, None)),
                         ('patch_bias', (True,)), ('attention_bias', ('qv', 'none')),
                         ('rope', ('dinov3',)), ('posemb', ('none',)), ('pre_norm', (False,)),
                         ('mlp_norm', (False,)), ('pooled_norm', (False,)),
                         ('normalization', ('layer',)), ('projection_bias', (True,)),
                         ('patch_norm', (False,))):
    if config.get(field, allowed[0]) not in allowed:
      raise CheckpointError(f'The model has {field} {config.get(field)!r}, which transformers\' '
                            'DINOv3ViTModel does not have: it is a headless class-token ViT with '
                            'a patch bias, no key bias, DINOv3\'s rotary embeddings, no position '
                            'table and a LayerNorm of every token at the end.')
  state = to_timm(flat, config)
  gated = config.activation == 'swiglu'
  width = config.hidden_size
  top = {timm: name for name, timm in _TRANSFORMERS_TOP.items()}
  layer = {timm: name for name, timm in {**_TRANSFORMERS_LAYER,
                                         **_TRANSFORMERS_MLP[gated]}.items()}
  out = {'embeddings.mask_token': np.zeros((1, 1, width), np.float32)}
  if 'reg_token' not in state:
    out['embeddings.register_tokens'] = np.zeros((1, 0, width), np.float32)
  for key, value in state.items():
    block = re.match(r'blocks\.(\d+)\.(.+)$', key)
    if key in top:
      out[top[key]] = value
    elif block and block[2] == 'attn.qkv.weight':
      for part, piece in zip(_QKV, np.split(value, 3)):
        out[f'layer.{block[1]}.attention.{part}.weight'] = piece
    else:
      out[f'layer.{block[1]}.{layer[block[2]]}'] = value
  for i in _blocks(flat):
    for n in (1, 2):
      out.setdefault(f'layer.{i}.layer_scale{n}.lambda1', np.ones(width, np.float32))
  biased = config.attention_bias == 'qv'
  hf_config = {
      'model_type': 'dinov3_vit', 'architectures': ['DINOv3ViTModel'],
      **vit_layouts._written_sizes(config, image_size), 'intermediate_size': config.mlp_dim,
      'hidden_act': 'silu' if gated else vit_layouts._WRITTEN_ACTIVATIONS[config.activation],
      'use_gated_mlp': gated, 'rope_theta': config.rope_theta,
      'query_bias': biased, 'key_bias': False, 'value_bias': biased, 'proj_bias': True,
      'mlp_bias': True, 'layerscale_value': 1.0,
      'num_register_tokens': config.get('num_registers') or 0, 'attention_dropout': 0.}
  return hf_config, {k: np.asarray(v) for k, v in out.items()}
