"""The model zoo: published ViT, hybrid, BiT, MLP-Mixer and AlterNet image
classifiers and LiT image-text models by name, in one registry of families that
declare what their models can do (`Family.capabilities`).

    model = get_model('ViT-B_16', num_classes=10)
    variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)))
    logits, inter = apply_with_intermediates(model, variables, images)

    lit = get_model('LiT-B16B')  # lit.apply(variables, images=..., tokens=...)
"""
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import original
from vit_jax.models import alternet, lit, mixer, resnet, vit
from vit_jax.models.attention import ATTENTION_WEIGHTS
from vit_jax.models.family import (  # noqa: F401  (the capabilities, as models.SCAN, ...)
    CAPABILITIES, CLASSIFY, SCAN, TENSOR_PARALLEL, ZERO_SHOT, Family)

FAMILIES: Dict[str, Family] = {}  # every family of the zoo, by name
MODELS: Dict[str, Dict[str, Any]] = {}  # every published variant: its fields and family


def register(family: Family) -> Family:
  """Adds `family` and its published variants to the zoo (`FAMILIES`, `MODELS`).

  Args:
    family: the record a model module exports.

  Returns:
    `family`.

  Raises:
    ValueError: a name taken, a tiny model that is no variant, or capabilities
      that are not those of `CAPABILITIES` or that the record cannot back.
  """
  taken = sorted(set(family.variants) & set(MODELS))
  if family.name in FAMILIES or taken:
    raise ValueError(f'The family {family.name!r} or its variants {taken} are in the zoo '
                     'already; give the family and each variant a name of its own.')
  if family.tiny[0] not in family.variants:
    raise ValueError(f'The tiny model of {family.name!r} is {family.tiny[0]!r}, not one of its '
                     f'variants {sorted(family.variants)}.')
  unknown = sorted(family.capabilities - set(CAPABILITIES))
  if unknown:
    raise ValueError(f'{family.name!r} declares the capabilities {unknown}; the known ones are '
                     f'{sorted(CAPABILITIES)}.')
  if family.can(CLASSIFY) and (family.layers is None or not family.head):
    raise ValueError(f'{family.name!r} classifies, so it declares its sown `layers` and '
                     'its `head`.')
  if family.can(TENSOR_PARALLEL) != bool(family.tensor_parallel):
    raise ValueError(f'{family.name!r} declares {TENSOR_PARALLEL!r} exactly when it gives '
                     'the `tensor_parallel` rules that split its parameters.')
  FAMILIES[family.name] = family
  MODELS.update({name: dict(fields, family=family.name)
                 for name, fields in family.variants.items()})
  return family


# A new family is a model module exporting FAMILY and one line here.
register(vit.FAMILY)
register(resnet.FAMILY)
register(mixer.FAMILY)
register(alternet.FAMILY)
register(lit.FAMILY)


def family_of(config: ml_collections.ConfigDict) -> Family:
  """The family of a model config from `get_config`.

  Args:
    config: a zoo config.

  Returns:
    Its family.
  """
  return FAMILIES[config.family]


def families(capability: str) -> List[str]:
  """The names of the families whose models can do `capability`.

  Args:
    capability: a key of `CAPABILITIES`.

  Returns:
    The family names, in the order they were registered.
  """
  return [name for name, family in FAMILIES.items() if family.can(capability)]


def require(config: ml_collections.ConfigDict, capability: str) -> Family:
  """The family of a model config, where its models can do `capability`.

  Args:
    config: a zoo config.
    capability: what the caller needs of the model (a key of `CAPABILITIES`).

  Returns:
    Its family.

  Raises:
    ValueError: the model cannot, saying what it can do and which families can.
  """
  family = family_of(config)
  if family.can(capability):
    return family
  can = '; '.join(CAPABILITIES[c] for c in sorted(family.capabilities)) or 'nothing else'
  others = ', '.join(FAMILIES[name].title for name in families(capability))
  raise ValueError(f'{config.name} ({family.title}) cannot {CAPABILITIES[capability]}; it can '
                   f'{can}. Models that can: {others}.')


def list_models() -> List[str]:
  """The published model names `get_model` knows."""
  return sorted(MODELS)


def get_config(name: str, **overrides: Any) -> ml_collections.ConfigDict:
  """The architecture of a published model, with fields overridden by keyword.

  `name` is a published name ('ViT-B_16', 'R50+ViT-B_16', 'BiT-M-R50x1'); a '/'
  may stand for the '_' ('ViT-B/16'). Besides the architecture fields, every
  model takes `dtype` (the compute dtype; parameters stay float32) and the
  fields of its family's `defaults` (an image classifier's `num_classes`); a LiT
  model's `image` and `text` overrides update its towers' fields.

  Args:
    name: the published name.
    **overrides: fields to set.

  Returns:
    The config.

  Raises:
    ValueError: an unknown name or field, naming the known ones.
  """
  key = name.replace('/', '_')
  if key not in MODELS:
    raise ValueError(f'Unknown model {name!r}. Known models: {", ".join(list_models())}.')
  family = FAMILIES[MODELS[key]['family']]
  if 'dtype' in overrides:
    _check_dtype(overrides['dtype'])
  config = dict(MODELS[key], name=key, **family.defaults, dtype='float32')
  return ml_collections.ConfigDict(family.make_config(config, overrides))


def with_fields(config: ml_collections.ConfigDict, **fields: Any) -> ml_collections.ConfigDict:
  """A new config: `config` with `fields` set as `get_config` sets its overrides
  (by the family's `make_config`: a field the model lacks is refused; a LiT
  tower's dict of fields, `image` or `text`, is updated).

  Args:
    config: a zoo config (`get_config`), left as it is.
    **fields: the fields to set.

  Returns:
    The new config.

  Raises:
    ValueError: a field the model lacks, or a dtype it cannot compute in.
  """
  if 'dtype' in fields:
    _check_dtype(fields['dtype'])
  return ml_collections.ConfigDict(family_of(config).make_config(config.to_dict(), fields))


def config_of(model: Union[str, ml_collections.ConfigDict], **overrides: Any) -> ml_collections.ConfigDict:
  """The config of `model`, given as a zoo name (`get_config`'s) or as a config
  whole, with `overrides` set.

  Args:
    model: a published name, or a config from `get_config`.
    **overrides: fields to set.

  Returns:
    The config (`model` itself where it is a config and nothing is set).
  """
  if isinstance(model, str):
    return get_config(model, **overrides)
  return with_fields(model, **overrides) if overrides else model


COMPUTE_DTYPES = ('float32', 'bfloat16', 'float16', 'float64')  # what a model may compute in


def _check_dtype(value: Any) -> None:
  """Refuses a compute dtype other than `COMPUTE_DTYPES`, naming them."""
  try:
    name = jnp.dtype(value).name
  except TypeError:
    name = None
  if name not in COMPUTE_DTYPES:
    raise ValueError(f'dtype {value!r} is not a dtype these models compute in; use one of '
                     f'{", ".join(COMPUTE_DTYPES)}.')


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
  """The Flax module of a model config from `get_config`.

  Args:
    config: a zoo config.

  Returns:
    The module.
  """
  fields = {k: v for k, v in config.to_dict().items() if k not in ('family', 'name')}
  fields['dtype'] = jnp.dtype(fields['dtype'])
  return family_of(config).build(fields)


def get_model(name: str, num_classes: Optional[int] = 1000, **overrides: Any) -> nn.Module:
  """The Flax module of a published model, e.g. `get_model('ViT-B_16', 10)`.
  `num_classes` is for the families that take it (not LiT's image-text models).

  Args:
    name: the published name.
    num_classes: the classifier's classes.
    **overrides: fields to set.

  Returns:
    The module.
  """
  if 'num_classes' in FAMILIES[get_config(name).family].defaults:
    overrides['num_classes'] = num_classes
  return build_model(get_config(name, **overrides))


def fixed_variables(model: nn.Module, params: Any, image_size: int) -> Dict[str, Any]:
  """The variables to apply `model` with while `params` stay fixed (evaluation,
  inference, analysis): `params`, and the kernels of its weight-standardised
  convolutions (BiT, hybrid) standardised once, in the `standardised` collection,
  so that no call standardises them again. For a model without them, only
  `params`. The standardised kernels are constants to `model.apply`: a gradient
  or jvp with respect to `params` takes `{'params': params}`.

  Args:
    model: a zoo module.
    params: its parameters.
    image_size: a side length the model takes, to trace it at.

  Returns:
    {'params': params} and, where the model has them, {'standardised': ...}.
  """
  def standardised(p):
    images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
    # Only the collection is returned: XLA drops the forward pass it rides on.
    return model.apply({'params': p}, images, mutable=[resnet.STANDARDISED])[1]
  return {'params': params, **jax.jit(standardised)(params)}


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


__getattr__ = original.forward(__name__)  # the original vit_jax's names (vit_jax/original/)
