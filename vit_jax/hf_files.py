"""Hugging Face `transformers` folders (`config.json` beside `model.safetensors`, as
`save_pretrained` writes them and the Hub serves them) read as this project's
parameters, with no PyTorch and no `transformers`: the folder's config names the
model, its weights are renamed to timm's names and read as timm files are
(`timm_files.published_from_timm`), and `preprocessor_config.json`'s pixel
statistics become the model's.

Model types read: `vit` (`ViTModel`, its pooler as the pre-logits layer, and
`ViTForImageClassification`). Anything the project's ViT cannot express (another
activation, other than 3 channels) is refused in one sentence naming it. `write`
is the other way: a class-token ViT as a folder `transformers` loads.
"""
import json
import os
import re
from typing import Any, Callable, Dict, Mapping, Tuple

import numpy as np
from safetensors.numpy import save_file

from vit_jax import models
from vit_jax.models.family import CheckpointError, Flat
from vit_jax.timm_files import published_from_timm, read_state_dict, to_timm

CONFIG = 'config.json'
PREPROCESSOR = 'preprocessor_config.json'
# transformers' `hidden_act` -> the ViT's `activation` (`models.vit.ACTIVATIONS`).
ACTIVATIONS = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh',
               'quick_gelu': 'quick_gelu'}
# A ViT layer's legacy names (those of the files) -> timm's, after 'encoder.layer.N.'.
_VIT_LAYER = {'attention.output.dense': 'attn.proj', 'layernorm_before': 'norm1',
              'layernorm_after': 'norm2', 'intermediate.dense': 'mlp.fc1',
              'output.dense': 'mlp.fc2'}
_VIT_TOP = {'embeddings.cls_token': 'cls_token', 'embeddings.position_embeddings': 'pos_embed',
            'embeddings.patch_embeddings.projection.weight': 'patch_embed.proj.weight',
            'embeddings.patch_embeddings.projection.bias': 'patch_embed.proj.bias',
            'layernorm.weight': 'norm.weight', 'layernorm.bias': 'norm.bias',
            'classifier.weight': 'head.weight', 'classifier.bias': 'head.bias'}


def _json(path: str) -> Dict[str, Any]:
  """A JSON object from `path`, or a CheckpointError saying what the file is instead."""
  try:
    with open(path, encoding='utf-8') as f:
      data = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise CheckpointError(f'{path} is not readable JSON ({e}): the folder is damaged; download '
                          'it again.') from None
  if not isinstance(data, dict):
    raise CheckpointError(f'{path} holds no JSON object: the folder is damaged; download it '
                          'again.')
  return data


def _number(config: Mapping[str, Any], key: str, kind: type = int) -> Any:
  """config[key] as a number of `kind`, or a CheckpointError naming the key."""
  value = config.get(key)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or (
      kind is int and value != int(value)) or value <= 0:
    raise CheckpointError(f'The config.json has {key} {value!r}, where a transformers ViT has '
                          f'a positive {kind.__name__}: the folder is damaged or of another '
                          'model.')
  return kind(value)


def is_folder(path: str) -> bool:
  """Whether `path` is a `transformers` model folder: a `config.json` naming a
  `model_type`.

  Args:
    path: a file or folder.

  Returns:
    Whether it is one.
  """
  config = os.path.join(path, CONFIG)
  if not os.path.isdir(path) or not os.path.isfile(config):
    return False
  return 'model_type' in _json(config)


def _vit_fields(config: Mapping[str, Any]) -> Dict[str, Any]:
  """The ViT's fields a `vit` config.json sets, or a CheckpointError naming one it
  cannot express."""
  act = config.get('hidden_act', 'gelu')
  if act not in ACTIVATIONS:
    raise CheckpointError(f'The config.json sets hidden_act {act!r}, which these ViTs do not '
                          f'have; they have {", ".join(sorted(ACTIVATIONS))}.')
  if config.get('num_channels', 3) != 3:
    raise CheckpointError(f'The config.json sets num_channels {config["num_channels"]}: these '
                          'ViTs read RGB images (3 channels).')
  return dict(hidden_size=_number(config, 'hidden_size'),
              num_layers=_number(config, 'num_hidden_layers'),
              num_heads=_number(config, 'num_attention_heads'),
              mlp_dim=_number(config, 'intermediate_size'),
              patch_size=_number(config, 'patch_size'), activation=ACTIVATIONS[act],
              layer_norm_eps=_number({'layer_norm_eps': 1e-12, **config}, 'layer_norm_eps',
                                     float))


def _vit_to_timm(state: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """A `vit` state dict (legacy names, with or without the 'vit.' prefix) under
  timm's names, its pooler left out (`_vit_pooler`)."""
  out, qkv = {}, {}
  for key, value in state.items():
    name = key[len('vit.'):] if key.startswith('vit.') else key
    layer = re.match(r'encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$', name)
    if name in _VIT_TOP:
      out[_VIT_TOP[name]] = value
    elif layer and layer[2].startswith('attention.attention.'):
      qkv[(int(layer[1]), layer[2].split('.')[-1], layer[3])] = value
    elif layer and layer[2] in _VIT_LAYER:
      out[f'blocks.{layer[1]}.{_VIT_LAYER[layer[2]]}.{layer[3]}'] = value
    elif not (name.startswith('pooler.') or name == 'embeddings.mask_token'):
      raise CheckpointError(f'The state dict holds {key!r}, which a transformers ViT of this '
                            'project has no place for.')
  for block in sorted({b for b, _, _ in qkv}):
    for kind in ('weight', 'bias'):
      parts = [qkv.get((block, part, kind)) for part in ('query', 'key', 'value')]
      if all(p is not None for p in parts):
        out[f'blocks.{block}.attn.qkv.{kind}'] = np.concatenate(parts)
  return out


def _vit_pooler(state: Mapping[str, np.ndarray]) -> Flat:
  """ViTModel's pooler (dense and tanh on the class token) as the pre-logits layer."""
  prefix = 'vit.pooler.dense.' if 'vit.pooler.dense.weight' in state else 'pooler.dense.'
  if prefix + 'weight' not in state:
    return {}
  return {'pre_logits/kernel': np.asarray(state[prefix + 'weight']).T,
          'pre_logits/bias': np.asarray(state[prefix + 'bias'])}


READERS: Dict[str, Tuple[Callable, Callable, Callable]] = {
    'vit': (_vit_fields, _vit_to_timm, _vit_pooler)}


def _pixel_fields(folder: str) -> Dict[str, Any]:
  """`preprocessor_config.json`'s mean and std as the model's pixel statistics."""
  path = os.path.join(folder, PREPROCESSOR)
  if not os.path.isfile(path):
    return {}
  pre = _json(path)
  if 'image_mean' not in pre or 'image_std' not in pre:
    return {}
  for key in ('image_mean', 'image_std'):
    value = pre[key]
    if not (isinstance(value, list) and len(value) == 3 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)):
      raise CheckpointError(f'{path} has {key} {value!r}, where three numbers (one per RGB '
                            'channel) belong: the folder is damaged; download it again.')
  return dict(pixel_mean=tuple(float(x) for x in pre['image_mean']),
              pixel_std=tuple(float(x) for x in pre['image_std']))


def check_fits(folder: str, config: Mapping[str, Any]) -> None:
  """Refuses a folder whose model computes another function than `config`'s would
  with its weights (another activation, LayerNorm epsilon, size or pixel
  statistics), naming each field and the folder's value, before any weight is read:
  fine-tuning from it would otherwise train a model that is not the folder's.

  Args:
    folder: a `transformers` folder (`is_folder`).
    config: the model config its weights are fitted to.

  Raises:
    CheckpointError: the fields that differ.
  """
  hf_config = _json(os.path.join(folder, CONFIG))
  kind = hf_config['model_type']
  if kind not in READERS:
    raise CheckpointError(f'{folder} holds a transformers {kind!r} model; these are read: '
                          f'{", ".join(sorted(READERS))}.')
  theirs = {**READERS[kind][0](hf_config), **_pixel_fields(folder)}
  # No pixel statistics: images in [-1, 1] as they come, i.e. mean 0.5 and std 0.5.
  ours = {**dict(pixel_mean=(0.5,) * 3, pixel_std=(0.5,) * 3),
          **{k: v for k, v in config.items() if v is not None}}
  differ = []
  for field, value in theirs.items():
    mine = ours.get(field)
    same = value == mine if isinstance(value, str) else (
        mine is not None and np.shape(mine) == np.shape(value)
        and np.allclose(value, mine, rtol=1e-6, atol=0))
    if not same:
      differ.append(f"{field} {value!r} (the recipe's model has {mine!r})")
  if differ:
    raise CheckpointError(f'{folder} holds a model with ' + ', '.join(differ) + ': set the '
                          'recipe\'s model fields to the folder\'s (--config.model.<field>) to '
                          'fine-tune from it.')


def read(folder: str, weights: str) -> Tuple[str, Dict[str, Any], Flat]:
  """A `transformers` folder as (model name, its fields, flat parameters in the
  published layout).

  Args:
    folder: the folder (`is_folder`).
    weights: its weights file (`checkpoint.weights_file`).

  Returns:
    (a model name of the zoo, the fields that make it the folder's model, the
    parameters).

  Raises:
    CheckpointError: a model type, or a field of it, that the project cannot express.
  """
  config = _json(os.path.join(folder, CONFIG))
  kind = config['model_type']
  if kind not in READERS:
    raise CheckpointError(f'{folder} holds a transformers {kind!r} model; these are read: '
                          f'{", ".join(sorted(READERS))}.')
  fields_of, to_timm, extra = READERS[kind]
  fields = fields_of(config)
  pixels = _pixel_fields(folder)  # checked, as the config is, before the weights are read
  name = _zoo_name(kind, fields)
  state = read_state_dict(weights)
  timm_state = to_timm(state)
  flat = published_from_timm(timm_state, name, **fields)
  # What the weights fix (the head, the classes), as a timm file's do.
  fixed = models.FAMILIES[kind].timm_fields(timm_state, models.get_config(name, **fields))
  fixed.pop('image_size')
  added = extra(state)
  if added:
    fixed['representation_size'] = int(added['pre_logits/bias'].shape[0])
  return name, {**fields, **fixed, **pixels}, {**flat, **added}


def _zoo_name(kind: str, fields: Mapping[str, Any]) -> str:
  """The zoo's name of the model of these sizes (any of the family where none has
  them: the fields make the model)."""
  sizes = ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim', 'patch_size')
  plain = [name for name in models.FAMILIES[kind].variants
           if not models.get_config(name).get('resnet_layers')]
  for name in plain:
    config = models.get_config(name)
    if all(config.get(k) == fields[k] for k in sizes):
      return name
  return plain[0]


def _vit_from_timm(state: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """timm's ViT state dict under the names of transformers' ViT files (the inverse
  of `_vit_to_timm`), for `ViTForImageClassification`."""
  top = {timm: 'vit.' + name if not name.startswith('classifier') else name
         for name, timm in _VIT_TOP.items()}
  layer = {timm: hf for hf, timm in _VIT_LAYER.items()}
  out = {}
  for key, value in state.items():
    block = re.match(r'blocks\.(\d+)\.(.+)\.(weight|bias)$', key)
    if key in top:
      out[top[key]] = value
    elif block and block[2] == 'attn.qkv':
      prefix = f'vit.encoder.layer.{block[1]}.attention.attention.'
      for part, piece in zip(('query', 'key', 'value'), np.split(value, 3)):
        out[f'{prefix}{part}.{block[3]}'] = piece
    elif block and block[2] in layer:
      out[f'vit.encoder.layer.{block[1]}.{layer[block[2]]}.{block[3]}'] = value
    else:
      raise CheckpointError(f'{key} of timm\'s ViT has no place in a transformers ViT.')
  return out


def write(folder: str, params: Mapping[str, Any], config: Mapping[str, Any],
          image_size: int) -> None:
  """Writes a ViT as a `transformers` folder that `ViTForImageClassification.
  from_pretrained` (and `AutoModelForImageClassification`) loads with the same
  logits: `config.json`, `model.safetensors` and `preprocessor_config.json`.

  Args:
    folder: the folder to write (made if missing).
    params: the model's parameters.
    config: its model config (`models.get_config`).
    image_size: the images' side in pixels.

  Raises:
    CheckpointError: a model transformers' ViT cannot express, named (another
      family, a head other than the class token's, registers, LayerScale, a
      pre-logits layer, a LayerNorm before the blocks).
  """
  unsupported = {'family': ('vit',), 'classifier': ('token',), 'num_registers': (0,),
                 'layer_scale_init': (0., 0), 'representation_size': (None,),
                 'pre_norm': (False,), 'resnet_layers': (None,), 'posemb': ('learn',),
                 'patch_bias': (True,)}
  for field, allowed in unsupported.items():
    if config.get(field) not in allowed:
      raise CheckpointError(f'The model has {field} {config.get(field)!r}, which transformers\' '
                            'ViT does not have; only a class-token ViT without registers, '
                            'LayerScale or a pre-logits layer is written.')
  activation = {ours: theirs for theirs, ours in ACTIVATIONS.items()
                if theirs in ('gelu', 'gelu_pytorch_tanh', 'quick_gelu')}[config['activation']]
  state = to_timm(params, config['name'])
  os.makedirs(folder, exist_ok=True)
  save_file({k: np.ascontiguousarray(v, np.float32) for k, v in _vit_from_timm(state).items()},
            os.path.join(folder, 'model.safetensors'), metadata={'format': 'pt'})
  classes = config['num_classes']
  hf_config = {
      'model_type': 'vit', 'architectures': ['ViTForImageClassification'],
      'hidden_size': config['hidden_size'], 'num_hidden_layers': config['num_layers'],
      'num_attention_heads': config['num_heads'], 'intermediate_size': config['mlp_dim'],
      'hidden_act': activation, 'layer_norm_eps': config['layer_norm_eps'],
      'image_size': image_size, 'patch_size': config['patch_size'], 'num_channels': 3,
      'qkv_bias': True, 'hidden_dropout_prob': 0., 'attention_probs_dropout_prob': 0.,
      'id2label': {str(i): f'LABEL_{i}' for i in range(classes)},
      'label2id': {f'LABEL_{i}': i for i in range(classes)}}
  with open(os.path.join(folder, CONFIG), 'w') as f:
    json.dump(hf_config, f, indent=2)
  mean = config.get('pixel_mean') or (0.5,) * 3  # none: [-1, 1] images, mean and std 0.5
  std = config.get('pixel_std') or (0.5,) * 3
  with open(os.path.join(folder, PREPROCESSOR), 'w') as f:
    json.dump({'image_processor_type': 'ViTImageProcessor', 'do_resize': True,
               'size': {'height': image_size, 'width': image_size}, 'do_rescale': True,
               'rescale_factor': 1 / 255, 'do_normalize': True, 'image_mean': list(mean),
               'image_std': list(std)}, f, indent=2)
