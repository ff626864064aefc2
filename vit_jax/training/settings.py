"""The fields of a training recipe: each one's default beside what it allows.

`base_config()` gives every field its neutral default (recipes in `configs/`
override what they set); fields without a value are typed placeholders, so every
field can be set from the command line (`--config.pretrained=PATH`, and
`--config.pretrained=None` to clear it). `check(config)` names the first field
whose value is not allowed, and `check_overrides(argv, config)` a `--config.X`
that names no field, with the field meant where it can tell.
"""
import dataclasses
import difflib
import math
import re
from typing import Any, Callable, Dict, List, Optional, Sequence

import ml_collections
from ml_collections import config_dict

from vit_jax import models
from vit_jax.errors import ConfigError
from vit_jax.training import budget
from vit_jax.training import workdir as workdirs

MIN_BUDGET_SECONDS = 30.  # data, compilation and the speed probe take tens of seconds on CPU


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
  """A finite int or float (not a bool): no field takes inf or nan."""
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_regex(text) -> bool:
  try:
    re.compile(text)
  except (re.error, TypeError):
    return False
  return True


def _lr_mults(value) -> bool:
  return all(isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)
             and _is_regex(pair[0]) and _is_number(pair[1]) and pair[1] >= 0 for pair in value)


def _randaugment(value) -> bool:
  return value is None or (len(value) == 2 and all(_is_number(v) and v >= 0 for v in value))


def _steps_list(value: str) -> bool:
  try:
    workdirs.kept_steps(value, 1)
  except ValueError:
    return False
  return True


def _budget(value: str) -> bool:
  if value == '':
    return True
  try:
    return budget.parse_duration(value) >= MIN_BUDGET_SECONDS
  except ValueError:
    return False


@dataclasses.dataclass(frozen=True)
class Field:
  """A recipe field: its default, its type where the default is None, whether a
  value is allowed, and what is allowed in words."""
  default: Any
  allowed: Callable[[Any], bool]
  allows: str
  kind: Optional[type] = None  # the type of a field whose default is None


_TEXT = (lambda v: isinstance(v, str) and v != '', 'a non-empty string')
_PATH = (lambda v: v is None or isinstance(v, str), 'a path, or None')
_FLAG = (lambda v: isinstance(v, bool), 'True or False')
_POSITIVE_INT = (lambda v: _is_int(v) and v >= 1, 'an integer >= 1')
_COUNT = (lambda v: _is_int(v) and v >= 0, 'an integer >= 0')
_NON_NEGATIVE = (lambda v: _is_number(v) and v >= 0, 'a number >= 0')


def _one_of(*choices: str):
  return (lambda v: v in choices, 'one of ' + ', '.join(map(repr, choices)))


FIELDS: Dict[str, Field] = {
    # Model: a zoo name plus architecture overrides (see vit_jax.models.get_config).
    'model_name': Field('ViT-B_16', *_TEXT),
    # Which tier of recipes a model belongs to ('quick-start', 'paper-like'), as
    # the analysis's report names it; '' for the published models' recipes.
    'tier': Field('', lambda v: isinstance(v, str), 'a string'),
    'model': Field(ml_collections.ConfigDict(),
                   lambda v: isinstance(v, (dict, ml_collections.ConfigDict)),
                   'architecture fields of the model'),
    # A published or our .npz to fine-tune from, or 'augreg:B/16'.
    'pretrained': Field(None, *_PATH, kind=str),
    # Keep the pretrained head (same classes) instead of a new one.
    'keep_head': Field(False, *_FLAG),
    # Where the AugReg index.csv and files are; None: gs://vit_models/augreg.
    'augreg_dir': Field(None, *_PATH, kind=str),

    # Data.
    'dataset': Field('fashion_mnist', *_TEXT),  # a TFDS name or folder:/path
    'data_dir': Field(None, *_PATH, kind=str),
    'train_split': Field('train', *_TEXT),
    'eval_split': Field('test', *_TEXT),
    'image_size': Field(224, *_POSITIVE_INT),
    # The training pipeline's augmentation, `config.input`, passed through as the
    # keyword arguments of `input_pipeline.train_dataset`.
    'input.crop': Field(True, *_FLAG),  # Inception's random-resized crops
    # With input.crop False: random shifts of up to this many px.
    'input.crop_padding': Field(0, *_COUNT),
    'input.mixup_alpha': Field(0., *_NON_NEGATIVE),
    'input.randaugment': Field(None, _randaugment, '(layers, magnitude) >= 0, or None',
                               kind=tuple),

    # Optimisation.
    'batch_size': Field(512, *_POSITIVE_INT),
    'eval_batch_size': Field(512, *_POSITIVE_INT),
    'accum_steps': Field(1, *_POSITIVE_INT),
    'num_epochs': Field(1., lambda v: _is_number(v) and v > 0, 'a number > 0'),
    'total_steps': Field(0, _COUNT[0], 'an integer >= 0 (0: derived from num_epochs)'),
    # E.g. '15m': as many of those steps as fit in 15 minutes, evaluations and saving
    # included (timed on a few steps before the schedule is built); '' for no budget.
    'time_budget': Field('', _budget, f"a duration of at least {MIN_BUDGET_SECONDS:.0f} s "
                         "such as 15m, 90s or 1h30m, or '' for none"),
    'optimizer': Field('sgd', *_one_of('sgd', 'adam')),
    'momentum': Field(0.9, lambda v: _is_number(v) and 0 <= v < 1, 'a number in [0, 1)'),
    # SGD's momentum kept in this dtype (the original vit_jax keeps it in bfloat16).
    'momentum_dtype': Field('float32', *_one_of('float32', 'bfloat16')),
    'lr': Field(0.03, lambda v: _is_number(v) and v > 0, 'a number > 0'),
    'warmup_steps': Field(500, *_COUNT),
    'decay': Field('cosine', *_one_of('cosine', 'linear')),
    # Where the linear decay ends (the original vit_jax's `linear_end`, 1e-5).
    'linear_end': Field(0., *_NON_NEGATIVE),
    'weight_decay': Field(0., *_NON_NEGATIVE),  # decoupled, kernels only, per step at peak lr
    'grad_clip': Field(1.0, _NON_NEGATIVE[0], 'a number >= 0 (0: no clipping)'),
    # An exponential moving average of the weights, evaluated and saved beside them.
    'ema_decay': Field(0., lambda v: _is_number(v) and 0 <= v < 1,
                       'a number in [0, 1) (0: none)'),
    # timm's ModelEmaV3 warm-up: decay min(ema_decay, 1 - step^(-2/3)), so a short run's
    # average does not keep a large share of the initialisation.
    'ema_warmup': Field(False, *_FLAG),
    'loss': Field('softmax', *_one_of('softmax', 'sigmoid')),
    'label_smoothing': Field(0., lambda v: _is_number(v) and 0 <= v < 1, 'a number in [0, 1)'),
    # (regex, factor) pairs: a parameter whose '/'-joined path the first regex finds
    # in trains at factor x lr; 0 freezes it. E.g. ((Family.body, 0.1),): body at lr/10.
    'lr_mults': Field((), _lr_mults, '(regex, factor >= 0) pairs, each regex valid'),

    # Where the state lives on the mesh: 'data' replicates it, 'fsdp' splits every
    # leaf over the devices (vit_jax.training.sharding).
    'sharding': Field('data', *_one_of('data', 'fsdp')),
    # Devices on the mesh's model axis, which splits attention heads and MLP hidden
    # units (tensor parallelism); the batch is split over the rest.
    'model_parallel': Field(1, *_POSITIVE_INT),

    # Bookkeeping.
    # Grain's and numpy's generators take seeds in [0, 2**32).
    'seed': Field(0, lambda v: _is_int(v) and 0 <= v < 2**32, 'an integer from 0 to 2**32 - 1'),
    'log_every': Field(50, *_POSITIVE_INT),
    'eval_every': Field(1000, *_POSITIVE_INT),
    'checkpoint_every': Field(1000, *_POSITIVE_INT),
    'keep_checkpoints': Field(2, _POSITIVE_INT[0], 'an integer >= 1 (checkpoints kept)'),
    # Steps whose parameters stay as params_<step>.npz beside the final params.npz
    # (the analysis's --steps): 'warmup' (the end of warm-up) and step numbers.
    'keep_params_at': Field('', _steps_list, "'' or steps separated by commas: 'warmup' and "
                            "integers >= 1, such as 'warmup,1000'"),
}
SWEEP_FIELD = 'sweep'  # sweep recipes add their rows (vit_jax.sweep_rows)
# Names people reach for, and the field they mean.
ALIASES = {'learning_rate': 'lr', 'batchsize': 'batch_size', 'epochs': 'num_epochs',
           'steps': 'total_steps', 'num_steps': 'total_steps', 'wd': 'weight_decay',
           'warmup': 'warmup_steps', 'checkpoint': 'pretrained', 'init': 'pretrained',
           'clip': 'grad_clip', 'model_type': 'model_name', 'arch': 'model_name',
           **workdirs.MOVED_FIELDS}
# Fields that group others ('input': 'input.crop', ...).
GROUPS = tuple(dict.fromkeys(name.split('.')[0] for name in FIELDS if '.' in name))


def _parent_and_key(config: ml_collections.ConfigDict, name: str):
  """The ConfigDict that holds field `name` ('input.crop': config.input) and its key."""
  *groups, key = name.split('.')
  for group in groups:
    config = config[group]
  return config, key


def defaults() -> Dict[str, Any]:
  """Each field's default by its dotted name ('input.crop'), the groups left out.

  Returns:
    field -> default.
  """
  return {name: field.default for name, field in FIELDS.items()
          if not isinstance(field.default, ml_collections.ConfigDict)}


def base_config() -> ml_collections.ConfigDict:
  """Every field at its default; None defaults as typed placeholders."""
  config = ml_collections.ConfigDict({group: ml_collections.ConfigDict() for group in GROUPS})
  for name, field in FIELDS.items():
    value = field.default
    if isinstance(value, ml_collections.ConfigDict):
      value = ml_collections.ConfigDict(value)
    parent, key = _parent_and_key(config, name)
    setattr(parent, key, config_dict.placeholder(field.kind) if value is None else value)
  return config


def _names(config: ml_collections.ConfigDict) -> list:
  """The recipe's field names, a group's fields as 'input.crop'."""
  names = []
  for key in config:
    names += [f'{key}.{inner}' for inner in config[key]] if key in GROUPS else [key]
  return names


def _as_none(value):
  """'None' and '' as a placeholder field gets them from the command line: None."""
  return None if value in ('None', '') else value


def check(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Raises a ConfigError naming the first field whose value is not allowed, or a
  field no recipe has; clears path fields set to 'None'.

  Args:
    config: the recipe.

  Returns:
    `config`.

  Raises:
    ConfigError: a value not allowed, or an unknown field.
  """
  unknown = sorted(set(_names(config)) - set(FIELDS) - {SWEEP_FIELD})
  if unknown:
    raise ConfigError(f'The recipe has fields no recipe has: {unknown}. {_meant(unknown[0])}')
  for name, field in FIELDS.items():
    parent, key = _parent_and_key(config, name)
    if field.kind is str:
      value = _as_none(parent[key])
      if value != parent[key]:
        with parent.unlocked():
          parent[key] = value
    if not field.allowed(parent[key]):
      raise ConfigError(f'config.{name} is {parent[key]!r}; it must be {field.allows}.')
  if config.warmup_steps == 0 and workdirs.WARMUP in config.keep_params_at.replace(' ', '').split(','):
    raise ConfigError("config.keep_params_at names 'warmup', but config.warmup_steps is 0: the "
                      'run has no warm-up to keep the parameters of; name a step number instead.')
  try:
    model = models.get_config(config.model_name)
    models.require(model, models.CLASSIFY)  # before the fields, which a LiT model lacks
    if config.model_parallel > 1:
      models.require(model, models.TENSOR_PARALLEL)
    family = models.get_config(config.model_name)
    model = models.get_config(config.model_name, **config.model)
  except ValueError as e:
    raise ConfigError(f'config.model_name / config.model: {e}') from e
  for key, value in config.model.items():  # True is an int to Python, not a count
    default = family.get(key)
    if isinstance(value, bool) and _is_number(default):
      raise ConfigError(f'config.model.{key} is {value!r}; it must be '
                        f'{"an integer" if _is_int(default) else "a number"}, as its default '
                        f'{default!r} is.')
  check_geometry(model, config.image_size)
  return config


def check_geometry(model: ml_collections.ConfigDict, image_size: int) -> None:
  """Refuses architecture fields that do not fit each other or the image: attention
  heads that do not divide the width, registers that are no whole number or meet
  position embeddings after the input, and a patch embedding on the image (not a
  hybrid's feature map) whose patch is larger than the image or does not divide it.

  Args:
    model: the model's architecture fields (`models.get_config`).
    image_size: the side of the images it is given.
  """
  width, heads = model.get('hidden_size'), model.get('num_heads')
  if isinstance(width, int) and isinstance(heads, int) and width % heads:
    raise ConfigError(f'config.model: hidden_size {width} is not divisible by num_heads {heads} '
                      '(each head takes hidden_size / num_heads channels); choose a number of '
                      'heads that divides it.')
  registers = model.get('num_registers', 0)
  if not _is_int(registers) or registers < 0:
    raise ConfigError(f'config.model.num_registers is {registers!r}; give a whole number of '
                      'registers, 0 for none.')
  if registers and model.get('posemb_where', 'input') != 'input':
    raise ConfigError(f"config.model.num_registers {registers} needs posemb_where='input' "
                      '(registers join after the position embedding at the input), not '
                      f'{model.get("posemb_where")!r}.')
  patch = model.get('patch_size')
  if isinstance(patch, int) and not model.get('resnet_layers'):
    if patch > image_size:
      raise ConfigError(f'config.model.patch_size {patch} is larger than config.image_size '
                        f'{image_size}: the image would have no patch; use a smaller patch or '
                        'larger images.')
    if image_size % patch:
      raise ConfigError(f'config.image_size {image_size} is not a multiple of '
                        f'config.model.patch_size {patch}: the last {image_size % patch} rows '
                        'and columns would be dropped; choose a size the patch divides.')


def _meant(name: str, fields: Sequence[str] = tuple(FIELDS)) -> str:
  """'Did you mean ...?' for a misspelt field, or the list of fields."""
  guess = (ALIASES.get(name) if fields == tuple(FIELDS) else None) or next(
      iter(difflib.get_close_matches(name, fields, 1, 0.6)), None)
  if guess:
    return f'Did you mean {guess}?'
  return f'The fields are: {", ".join(fields)}.'


def model_overrides(argv: Sequence[str], config: ml_collections.ConfigDict,
                    flag: str = 'config') -> List[str]:
  """The architecture fields of the recipe's model that `--<flag>.model.FIELD` in
  `argv` sets and the recipe's `model` leaves out (at the family's default).

  Args:
    argv: the command line.
    config: the recipe.
    flag: the recipe flag's name.

  Returns:
    The fields' names.
  """
  if 'model_name' not in config or not isinstance(config.get('model'), ml_collections.ConfigDict):
    return []
  fields = model_fields(config)
  prefix = f'--{flag}.model.'
  named = [arg[len(prefix):].partition('=')[0] for arg in argv if arg.startswith(prefix)]
  return [n for n in dict.fromkeys(named) if n in fields and n not in config.model]


def model_fields(config: ml_collections.ConfigDict) -> List[str]:
  """The architecture fields the recipe's model takes: its family's, or where the
  model name is unknown the recipe's own.

  Args:
    config: the recipe.

  Returns:
    The fields' names.
  """
  try:
    family = models.get_config(config.model_name)
  except (ValueError, AttributeError, KeyError):
    return list(config.get('model', {}))
  return [k for k in family if k not in ('family', 'name')]


def add_model_fields(config: ml_collections.ConfigDict, names: Sequence[str]) -> None:
  """Adds the architecture fields `names` to the recipe's `model` at the family's
  defaults (a field whose default is None typed to take any literal), so that the
  command line can set them.

  Args:
    config: the recipe.
    names: fields of its model's family.
  """
  if not names:
    return
  family = models.get_config(config.model_name)
  with config.unlocked(), config.model.unlocked():
    for name in names:
      config.model[name] = model_field_value(family[name])


def model_field_value(value: Any) -> Any:
  """A model field's value as a recipe's `model` holds it, so that the command line
  can set it: None typed to take any literal, a list as a tuple.

  Args:
    value: the value.

  Returns:
    What the recipe holds.
  """
  return (config_dict.placeholder(object) if value is None else
          tuple(value) if isinstance(value, list) else value)


def check_overrides(argv: Sequence[str], config: ml_collections.ConfigDict,
                    flag: str = 'config') -> None:
  """Raises a ConfigError for a `--config.a.b=...` in `argv` that names no field of
  `config`, or gives a number field a value that is not one (before the flag
  parser fails on it).

  Args:
    argv: the command line.
    config: the recipe.
    flag: the recipe flag's name.
  """
  add_model_fields(config, model_overrides(argv, config, flag))
  prefix = f'--{flag}.'
  for i, arg in enumerate(argv):
    if not arg.startswith(prefix):
      continue
    path, equals, given = arg[len(prefix):].partition('=')
    if not equals and i + 1 < len(argv):
      given = argv[i + 1]
    node = config
    for i, key in enumerate(path.split('.')):
      if not isinstance(node, (ml_collections.ConfigDict, dict)):
        raise ConfigError(f'{prefix}{path} names no field of the recipe: '
                          f'{flag}.{".".join(path.split(".")[:i])} has no fields.')
      if key not in node:
        hint = _meant(key) if i == 0 else _meant(key, tuple(
            model_fields(config) if path.split('.')[:i] == ['model'] else node))
        raise ConfigError(f'{prefix}{path} names no field of the recipe. {hint}')
      node = node[key]
    _check_number(f'{prefix}{path}', node, given)


def _check_number(flag: str, default, given: str) -> None:
  """A ConfigError when a field whose recipe value is an integer or a float is
  given text that is not one."""
  kind = int if _is_int(default) else float if isinstance(default, float) else None
  if kind is None:
    return
  try:
    kind(given)
  except ValueError:
    raise ConfigError(f'{flag}={given} is not {"an integer" if kind is int else "a number"}; '
                      f'the recipe has {default!r}, e.g. {flag}={default!r}.') from None
