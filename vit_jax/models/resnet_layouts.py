"""BiT parameter files in other layouts: the export of the published layout to timm's
ResNetV2 `state_dict` names, and what such a state dict fixes of the model. The `bit`
family's `to_timm` and `timm_fields`."""
import re
from typing import Any, Dict, Mapping

import ml_collections
import numpy as np

from vit_jax.models.conv import oihw
from vit_jax.models.family import Flat


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
