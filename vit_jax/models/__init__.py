"""The model zoo: published ViT, hybrid and BiT variants by name.

    model = get_model('ViT-B_16', num_classes=10)
    variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)))
    logits, inter = apply_with_intermediates(model, variables, images)
"""
from typing import Any, Dict, Iterable, List, Optional, Tuple

import flax
import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from vit_jax.models.attention import ATTENTION_WEIGHTS
from vit_jax.models.resnet import ResNetV2
from vit_jax.models.vit import VisionTransformer

# hidden size, MLP size, heads, layers
VIT_SIZES = {
    'Ti': (192, 768, 3, 12),
    'S': (384, 1536, 6, 12),
    'B': (768, 3072, 12, 12),
    'L': (1024, 4096, 16, 24),
    'H': (1280, 5120, 16, 32),
}
VIT_PUBLISHED = ('Ti/16', 'S/16', 'S/32', 'B/8', 'B/16', 'B/32', 'L/16', 'L/32', 'H/14')
# name: (ViT size, patch size on the ResNet features, ResNet stage depths)
HYBRID_PUBLISHED = {
    'R50+ViT-B_16': ('B', 1, (3, 4, 9)),
    'R26+ViT-S_32': ('S', 1, (2, 2, 2, 2)),
    'R26+ViT-B_32': ('B', 1, (2, 2, 2, 2)),
    'R50+ViT-L_32': ('L', 1, (3, 4, 6, 3)),
    'R+ViT-Ti_16': ('Ti', 8, ()),
}
BIT_DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
BIT_PUBLISHED = ((50, 1), (50, 3), (101, 1), (101, 3), (152, 2), (152, 4))


def _vit_config(size: str, patch: int, resnet_layers=None) -> Dict[str, Any]:
  hidden, mlp, heads, layers = VIT_SIZES[size]
  return dict(family='vit', patch_size=patch, hidden_size=hidden, mlp_dim=mlp, num_heads=heads,
              num_layers=layers, classifier='token', representation_size=None, posemb='learn',
              dropout_rate=0., attention_dropout_rate=0., stochastic_depth=0.,
              resnet_layers=resnet_layers, resnet_width=1, attention_impl='auto', remat='none')


def _registry() -> Dict[str, Dict[str, Any]]:
  table = {}
  for variant in VIT_PUBLISHED:
    size, patch = variant.split('/')
    table[f'ViT-{size}_{patch}'] = _vit_config(size, int(patch))
  for name, (size, patch, stages) in HYBRID_PUBLISHED.items():
    table[name] = _vit_config(size, patch, stages)
  for depth, width in BIT_PUBLISHED:
    for upstream in ('S', 'M'):
      table[f'BiT-{upstream}-R{depth}x{width}'] = dict(
          family='bit', num_layers=BIT_DEPTHS[depth], width_factor=width, root_pool=True)
  return table


MODELS = _registry()


def list_models() -> List[str]:
  """The published model names `get_model` knows."""
  return sorted(MODELS)


def get_config(name: str, **overrides) -> ml_collections.ConfigDict:
  """The architecture of a published model, with fields overridden by keyword.

  `name` is a published name ('ViT-B_16', 'R50+ViT-B_16', 'BiT-M-R50x1'); a '/'
  may stand for the '_' ('ViT-B/16'). Besides the architecture fields, every
  model takes `num_classes` and `dtype` (the compute dtype; parameters stay
  float32).
  """
  key = name.replace('/', '_')
  if key not in MODELS:
    raise ValueError(f'Unknown model {name!r}. Known models: {", ".join(list_models())}.')
  config = dict(MODELS[key], name=key, num_classes=1000, dtype='float32')
  settable = set(config) - {'family', 'name'}
  unknown = sorted(set(overrides) - settable)
  if unknown:
    raise ValueError(f'{key} has no field(s) {unknown}; the fields you can set are: '
                     f'{", ".join(sorted(settable))}.')
  config.update(overrides)
  return ml_collections.ConfigDict(config)


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
  """The Flax module of a model config from `get_config`."""
  kwargs = {k: v for k, v in config.items() if k not in ('family', 'name')}
  kwargs['dtype'] = jnp.dtype(kwargs['dtype'])
  if config.family == 'vit':
    if kwargs['resnet_layers'] is not None:
      kwargs['resnet_layers'] = tuple(kwargs['resnet_layers'])
    return VisionTransformer(**kwargs)
  kwargs['num_layers'] = tuple(kwargs['num_layers'])
  return ResNetV2(**kwargs)


def get_model(name: str, num_classes: Optional[int] = 1000, **overrides) -> nn.Module:
  """The Flax module of a published model, e.g. `get_model('ViT-B_16', 10)`."""
  return build_model(get_config(name, num_classes=num_classes, **overrides))


def apply_with_intermediates(model: nn.Module, variables, images, *, train: bool = False,
                             rngs=None, names: Optional[Iterable[str]] = None
                             ) -> Tuple[Any, Dict[str, Any]]:
  """Runs `model` and returns (output, {path: array}) of what it sowed.

  Paths are '/'-joined module paths ending in the sown name, e.g.
  'Transformer/encoderblock_3/+sa',
  'Transformer/encoderblock_3/MultiHeadDotProductAttention_1/attention_weights',
  'resnet/block2/unit03/output'. `names` keeps only the paths listed; under
  `jax.jit` the unkept ones are never materialised. Attention weights exist
  only on the explicit attention path, which runs when they are asked for
  (`names` None or naming one); otherwise the fused path runs.
  """
  wants_weights = names is None or any(n.endswith(ATTENTION_WEIGHTS) for n in names)
  if wants_weights and getattr(model, 'attention_impl', 'explicit') != 'explicit':
    model = model.clone(attention_impl='explicit')
  out, state = model.apply(variables, images, train=train, rngs=rngs, mutable=['intermediates'])
  flat = flax.traverse_util.flatten_dict(state.get('intermediates', {}), sep='/')
  # `sow` stores a tuple of the values sown under one name; each is sown once.
  flat = {path: values[-1] for path, values in flat.items()}
  if names is not None:
    names = list(names)
    missing = sorted(set(names) - set(flat))
    if missing:
      raise KeyError(f'{type(model).__name__} sows no {missing}; it sows: {sorted(flat)}.')
    flat = {path: flat[path] for path in names}
  return out, flat
