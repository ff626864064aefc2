"""The model zoo: published ViT, hybrid, BiT, MLP-Mixer and AlterNet variants by
name, and the LiT image-text models.

    model = get_model('ViT-B_16', num_classes=10)
    variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)))
    logits, inter = apply_with_intermediates(model, variables, images)

    lit = get_model('LiT-B16B')  # lit.apply(variables, images=..., tokens=...)
"""
from typing import Any, Dict, Iterable, List, Optional, Tuple

import flax
import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from vit_jax.models import alternet, lit, mixer, resnet, vit
from vit_jax.models.attention import ATTENTION_WEIGHTS
from vit_jax.models.family import Family

FAMILIES: Dict[str, Family] = {}  # every family of the zoo, by name
MODELS: Dict[str, Dict[str, Any]] = {}  # every published variant: its fields and family


def register(family: Family) -> Family:
  """Adds `family` and its published variants to the zoo (`FAMILIES`, `MODELS`).

  Args:
    family: the record a model module exports.

  Returns:
    `family`.
  """
  taken = sorted(set(family.variants) & (set(MODELS) | set(lit.VARIANTS)))
  if family.name in FAMILIES or family.name == lit.FAMILY or taken:
    raise ValueError(f'The family {family.name!r} or its variants {taken} are in the zoo '
                     'already; give the family and each variant a name of its own.')
  if family.tiny[0] not in family.variants:
    raise ValueError(f'The tiny model of {family.name!r} is {family.tiny[0]!r}, not one of its '
                     f'variants {sorted(family.variants)}.')
  FAMILIES[family.name] = family
  MODELS.update({name: dict(fields, family=family.name)
                 for name, fields in family.variants.items()})
  return family


# A new family is a model module exporting FAMILY and one line here.
register(vit.FAMILY)
register(resnet.FAMILY)
register(mixer.FAMILY)
register(alternet.FAMILY)


def family_of(config: ml_collections.ConfigDict) -> Family:
  """The family description of a model config from `get_config`.

  Args:
    config: a zoo config.

  Returns:
    Its family.

  Raises:
    ValueError: a LiT config (a two-tower model is no image classifier).
  """
  if lit.is_lit(config):
    raise ValueError(
        f'{config.name} is a two-tower image-text model, not an image classifier: classify '
        f'with `python -m vit_jax.zeroshot --model {config.name}`, or use its image tower '
        f'{config.image_model!r} alone.')
  return FAMILIES[config.family]


def list_models() -> List[str]:
  """The published model names `get_model` knows."""
  return sorted(list(MODELS) + list(lit.VARIANTS))


def get_config(name: str, **overrides: Any) -> ml_collections.ConfigDict:
  """The architecture of a published model, with fields overridden by keyword.

  `name` is a published name ('ViT-B_16', 'R50+ViT-B_16', 'BiT-M-R50x1'); a '/'
  may stand for the '_' ('ViT-B/16'). Besides the architecture fields, every
  model takes `num_classes` and `dtype` (the compute dtype; parameters stay
  float32). A LiT model's fields are those of `lit.FIELDS`.

  Args:
    name: the published name.
    **overrides: fields to set.

  Returns:
    The config.

  Raises:
    ValueError: an unknown name or field, naming the known ones.
  """
  key = name.replace('/', '_')
  if key in lit.VARIANTS:
    return lit.get_config(key, get_config(lit.VARIANTS[key]['image_model']), **overrides)
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
  """The Flax module of a model config from `get_config`.

  Args:
    config: a zoo config.

  Returns:
    The module.
  """
  if lit.is_lit(config):
    return lit.build(config)
  fields = {k: v for k, v in config.items() if k not in ('family', 'name')}
  fields['dtype'] = jnp.dtype(fields['dtype'])
  return family_of(config).build(fields)


def get_model(name: str, num_classes: Optional[int] = 1000, **overrides: Any) -> nn.Module:
  """The Flax module of a published model, e.g. `get_model('ViT-B_16', 10)`. A
  LiT model has no classes: `num_classes` is not used for it.

  Args:
    name: the published name.
    num_classes: the classifier's classes.
    **overrides: fields to set.

  Returns:
    The module.
  """
  if name.replace('/', '_') in lit.VARIANTS:
    return build_model(get_config(name, **overrides))
  return build_model(get_config(name, num_classes=num_classes, **overrides))


def apply_with_intermediates(model: nn.Module, variables: Any, images: Any, *,
                             train: bool = False, rngs: Any = None,
                             names: Optional[Iterable[str]] = None
                             ) -> Tuple[Any, Dict[str, Any]]:
  """Runs `model` and returns (output, {path: array}) of what it sowed.

  Paths are '/'-joined module paths ending in the sown name, e.g.
  'Transformer/encoderblock_3/+sa',
  'Transformer/encoderblock_3/MultiHeadDotProductAttention_1/attention_weights',
  'resnet/block2/unit03/output'. `names` keeps only the paths listed; under
  `jax.jit` the unkept ones are never materialised. Attention weights exist
  only on the explicit attention path, which runs when they are asked for
  (`names` None or naming one); otherwise the fused path runs.

  Args:
    model: a zoo module.
    variables: its variables ({'params': ...}).
    images: (B, H, W, 3) images.
    train: run in training mode (dropout, stochastic depth).
    rngs: the random streams training mode needs.
    names: the paths to keep, or None for all.

  Returns:
    (the model's output, {path: array}).

  Raises:
    KeyError: a name the model does not sow, listing those it does.
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
