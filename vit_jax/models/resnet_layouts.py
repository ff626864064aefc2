"""BiT parameter files in other layouts: the export of the published layout to timm's
ResNetV2 `state_dict` names, and what such a state dict fixes of the model (the
`bit` family's `to_timm` and `timm_fields`); Hugging Face `transformers` BiT
folders (`BitForImageClassification`, `BitModel`) read and written through timm's
names (`transformers_fields`, `from_transformers`, `to_transformers`)."""
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import ml_collections
import numpy as np

from vit_jax.models.conv import oihw
from vit_jax.models.family import CheckpointError, Flat


def to_timm(flat: Flat) -> Dict[str, np.ndarray]:
  """A BiT tree in the published layout as timm's ResNetV2 `state_dict`.

  Args:
    flat: the flat parameters, published layout.

  Returns:
    The state dict's arrays.
  """
  out = {'stem.conv.weight': oihw(flat['resnet/root_block/standardized_conv2d/kernel']),
         'norm.weight': flat['resnet/group_norm/gamma'],
         'norm.bias': flat['resnet/group_norm/beta']}
  if 'resnet/head/conv2d/kernel' in flat:
    out['head.fc.weight'] = oihw(flat['resnet/head/conv2d/kernel'])
    out['head.fc.bias'] = flat['resnet/head/conv2d/bias']
  names = {'a': '1', 'b': '2', 'c': '3'}
  for key, value in flat.items():
    m = re.match(r'resnet/block(\d+)/unit(\d+)/(a|b|c)/(proj/)?(standardized_conv2d/kernel|'
                 r'group_norm/gamma|group_norm/beta)$', key)
    if not m:
      continue
    stage, unit, part, proj, leaf = m.groups()
    t = f'stages.{int(stage) - 1}.blocks.{int(unit) - 1}.'
    if proj:
      out[t + 'downsample.conv.weight'] = oihw(value)
    elif leaf.endswith('kernel'):
      out[f'{t}conv{names[part]}.weight'] = oihw(value)
    else:
      out[f'{t}norm{names[part]}.{"weight" if leaf.endswith("gamma") else "bias"}'] = value
  return out


def timm_fields(state: Mapping[str, Any], config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """What a timm ResNetV2 state dict fixes: its classes (none without `head.fc`); its
  parameters are the same at any image size.

  Args:
    state: the state dict.
    config: the named model's zoo config.

  Returns:
    {'image_size', 'num_classes'}.
  """
  del config
  return dict(image_size=224, num_classes=(np.shape(state['head.fc.weight'])[0]
                                           if 'head.fc.weight' in state else 0))


# transformers' BiT (`model_type` 'bit') is timm's ResNetV2 under other names: the
# stem, stages and final norm under 'bit.' ('embedder.convolution' for 'stem.conv',
# 'layers' for 'blocks'), the head a linear layer 'classifier.1'.
TRANSFORMERS_TYPES = ('bit',)
# BitConfig's fields that fix the function beyond the sizes, and the only values
# this project's BiT has: pre-activation units, ReLU, 32 groups, zero padding of
# kernel // 2 on both sides (None: transformers' static padding, as timm's BiT),
# the stem's pool without TensorFlow's one-sided padding.
_FIXED = {'layer_type': 'preactivation', 'hidden_act': 'relu', 'num_groups': 32,
          'global_padding': None, 'embedding_dynamic_padding': False, 'num_channels': 3}
_WHY = {'layer_type': 'a post-activation unit (the backbone of ViT hybrids in transformers)',
        'global_padding': "TensorFlow's 'SAME' padding, one-sided at stride 2",
        'embedding_dynamic_padding': "TensorFlow's 'SAME' padding before the stem's pool"}


def _sizes(config: Mapping[str, Any], key: str) -> Tuple[int, ...]:
  """config[key] as a tuple of positive integers, or a CheckpointError naming it."""
  value = config.get(key)
  if not (isinstance(value, list) and value and all(
      isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value)):
    raise CheckpointError(f'The config.json has {key} {value!r}, where a transformers BiT has a '
                          'list of positive integers: the folder is damaged or of another model.')
  return tuple(value)


def transformers_fields(config: Mapping[str, Any]) -> Dict[str, Any]:
  """The BiT fields a transformers `bit` config.json sets, or a CheckpointError
  naming one this project's BiT cannot express: the units of each stage
  (`depths`) and the width (`embedding_size` / 64, the stages' `hidden_sizes` times
  `width_factor` following from it as 256, 512, ... times it). `drop_path_rate`,
  a regulariser of training, changes no output.

  Args:
    config: the config.json.

  Returns:
    The fields.
  """
  for key, value in _FIXED.items():
    if config.get(key, value) != value:
      why = f' ({_WHY[key]})' if key in _WHY else ''
      raise CheckpointError(f'The config.json sets {key} {config[key]!r}{why}, which this '
                            f'project\'s BiT does not have: it has {key} {value!r}.')
  depths, hidden = _sizes(config, 'depths'), _sizes(config, 'hidden_sizes')
  embedding = config.get('embedding_size', 64)
  factor = config.get('width_factor', 1)
  if not isinstance(embedding, int) or isinstance(embedding, bool) or embedding % 32:
    raise CheckpointError(f'The config.json sets embedding_size {embedding!r}; this project\'s '
                          'BiT has a multiple of 32 stem channels (32 whole GroupNorm groups).')
  width = embedding / 64
  expected = [int(256 * width * 2**s) for s in range(len(depths))]
  if not isinstance(factor, int) or [h * factor for h in hidden] != expected:
    raise CheckpointError(
        f'The config.json sets hidden_sizes {list(hidden)} with width_factor {factor!r} after a '
        f'stem of {embedding} channels; this project\'s BiT widens its stages as '
        f'{expected}, four times the stem\'s channels and doubling.')
  stride = 4 * 2 ** (len(depths) - 1)
  if config.get('output_stride', 32) < stride:
    raise CheckpointError(f'The config.json sets output_stride {config["output_stride"]}, which '
                          f'dilates the last stages; this project\'s BiT strides to {stride}.')
  return dict(num_layers=depths, width_factor=width, root_pool=True)


def from_transformers(state: Mapping[str, np.ndarray], hf_config: Mapping[str, Any]
                      ) -> Tuple[Dict[str, np.ndarray], Flat, Dict[str, Any]]:
  """A transformers BiT's weights (`BitForImageClassification`'s, or `BitModel`'s
  without the 'bit.' prefix) under timm's ResNetV2 names, its linear head as timm's
  1x1 convolution.

  Args:
    state: the weights.
    hf_config: the folder's config.json (its fields are `transformers_fields`').

  Returns:
    (timm's state dict, no extra parameters, no extra fields).
  """
  del hf_config
  out = {}
  for key, value in state.items():
    name = key[len('bit.'):] if key.startswith('bit.') else key
    unit = re.match(r'encoder\.stages\.(\d+)\.layers\.(\d+)\.'
                    r'(conv[123]\.weight|norm[123]\.(?:weight|bias)|downsample\.conv\.weight)$',
                    name)
    if name == 'embedder.convolution.weight':
      out['stem.conv.weight'] = value
    elif name in ('norm.weight', 'norm.bias'):
      out[name] = value
    elif unit:
      out[f'stages.{unit[1]}.blocks.{unit[2]}.{unit[3]}'] = value
    elif key == 'classifier.1.weight':
      out['head.fc.weight'] = np.asarray(value)[:, :, None, None]
    elif key == 'classifier.1.bias':
      out['head.fc.bias'] = value
    else:
      raise CheckpointError(f'The weights hold {key!r}, which a transformers BiT of this project '
                            'has no place for.')
  return out, {}, {}


def to_transformers(flat: Flat, config: ml_collections.ConfigDict, image_size: int,
                    model_type: Optional[str] = None
                    ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
  """A BiT (its published parameters, through timm's names: `to_timm`) as
  `BitForImageClassification` (headless: `BitModel`): its config.json and its
  weights under the files' names.

  Args:
    flat: the model's parameters, flat, in the published layout.
    config: the model's config.
    image_size: the images' side in pixels (BiT's weights hold none).
    model_type: 'bit' or None (BiT is written as nothing else).

  Returns:
    (config.json, the weights).

  Raises:
    CheckpointError: a BiT transformers' cannot express, or another `model_type`.
  """
  del image_size
  if model_type not in (None, 'bit'):
    raise CheckpointError(f"A BiT is written as model_type 'bit', not {model_type!r}.")
  if not config.root_pool:
    raise CheckpointError('The model has root_pool False, which transformers\' BiT does not '
                          'have: its stem always pools.')
  classes = config.num_classes or 0
  out = {}
  for key, value in to_timm(flat).items():
    if key == 'head.fc.weight':
      out['classifier.1.weight'] = np.asarray(value)[:, :, 0, 0]
    elif key == 'head.fc.bias':
      out['classifier.1.bias'] = value
    else:
      name = 'embedder.convolution.weight' if key == 'stem.conv.weight' else (
          key.replace('stages.', 'encoder.stages.').replace('.blocks.', '.layers.'))
      out[('bit.' if classes else '') + name] = value
  stages = len(config.num_layers)
  hf_config = {**_FIXED, 'model_type': 'bit',
               'architectures': ['BitForImageClassification' if classes else 'BitModel'],
               'embedding_size': int(64 * config.width_factor),
               'hidden_sizes': [int(256 * config.width_factor * 2**s) for s in range(stages)],
               'depths': list(config.num_layers), 'width_factor': 1, 'drop_path_rate': 0.,
               'output_stride': max(32, 4 * 2 ** (stages - 1))}
  if classes:
    hf_config.update({'id2label': {str(i): f'LABEL_{i}' for i in range(classes)},
                      'label2id': {f'LABEL_{i}': i for i in range(classes)}})
  return hf_config, out
