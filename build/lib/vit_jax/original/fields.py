"""The original vit_jax's model configs read as the project's: the fields it nests
(`patches.size`, `transformer.*`, `resnet.*`) mapped onto the project's flat ones.
"""
from typing import Any, Dict, Optional

from vit_jax import models


def square(size: Any, what: str) -> int:
  """`size`, a square (p, p), as p; else a ValueError naming `what`."""
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
  fields = dict(patch_size=square(patches['size'], 'The patch size'), hidden_size=hidden_size,
                mlp_dim=transformer['mlp_dim'], num_heads=transformer['num_heads'],
                num_layers=transformer['num_layers'],
                dropout_rate=transformer.get('dropout_rate', 0.1),
                attention_dropout_rate=transformer.get('attention_dropout_rate', 0.1),
                classifier=classifier, representation_size=representation_size,
                posemb='learn' if transformer.get('add_position_embedding', True) else 'none')
  if resnet is not None:
    fields.update(resnet_layers=tuple(resnet['num_layers']), resnet_width=resnet['width_factor'])
  return fields


def project_config(model_config: Any) -> Any:
  """The project's zoo config (`vit_jax.models.get_config`) of an original model config.

  Args:
    model_config: a `MODEL_CONFIGS` entry, or a config with its fields.

  Returns:
    The project's config of the same architecture.
  """
  name = model_config.get('model_name')
  if 'hidden_dim' in model_config:
    return models.get_config(
        name if name in models.MODELS else 'Mixer-B_16',
        patch_size=square(model_config['patches']['size'], 'The patch size'),
        **{k: model_config[k] for k in ('hidden_dim', 'num_blocks', 'tokens_mlp_dim',
                                        'channels_mlp_dim')})
  fields = vit_fields(**model_config)
  if 'resnet_layers' not in fields:
    fields['resnet_layers'] = None
  return models.get_config(name if name in models.MODELS else 'ViT-B_16', **fields)
