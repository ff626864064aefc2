"""A tool's options as one frozen dataclass, which reaches the tool's `run` whole:
each field is a flag of the same name (or, with `flag=False`, a setting only code
and time budgets change), its default, help text, allowed values, least value
and how a time budget shrinks it written once, in the field (`option`).
`define_flags` makes the absl flags of a dataclass (a flag two tools share, such
as `--lanczos_steps`, is defined once and must agree), `from_flags` reads and
checks them before any model loads, and `shrink` gives the smaller sample a time
budget takes (`dataclasses.replace` on the fields marked with a `Budget`).

    @dataclasses.dataclass(frozen=True)
    class Options:
      landscape_points: int = option(21, 'Grid points along each direction.', least=3,
                                     budget=Budget(minimum=11, order=0))
"""
import dataclasses
import itertools
from typing import Any, Callable, Dict, Optional, Sequence, Type

from absl import flags

from vit_jax.errors import ConfigError

FLAGS = flags.FLAGS
_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string}


def two_thirds(value: Any) -> Any:
  """Two thirds of a count (rounded down) or of a fraction (to 3 decimals)."""
  return value * 2 // 3 if isinstance(value, int) else round(value * 2 / 3, 3)


def _size(value: Any) -> float:
  return len(value) if isinstance(value, (tuple, list)) else value


@dataclasses.dataclass(frozen=True)
class Budget:
  """How a time budget shrinks an option: to `smaller(value)` (never below
  `minimum`) while its value is above `minimum`; the fields of the lowest `order`
  still above their minimum shrink first, together. A sequence's size is its
  length. `follows` names the property of the options that gives the value in
  use where the field's default, None, means that it follows another option.
  """
  minimum: Any
  order: int
  smaller: Callable[[Any], Any] = two_thirds
  follows: str = ''


def option(default: Any, help: str, choices: Sequence[str] = (),  # pylint: disable=redefined-builtin
           least: Optional[float] = None, flag: bool = True,
           budget: Optional[Budget] = None) -> Any:
  """A field of a tool's options dataclass: its flag's default and help, the
  values it allows (`choices`, or a number at least `least`), and how a time
  budget shrinks it.

  Args:
    default: the default value.
    help: what the flag sets, as `--help` shows it (or what the setting is).
    choices: the allowed values of a string option (an enum flag); none: any.
    least: the smallest allowed value of a number option.
    flag: whether the command line sets it; False: code and budgets only.
    budget: how a time budget shrinks it; None: never.

  Returns:
    The dataclass field.
  """
  return dataclasses.field(default=default, metadata={
      'help': help, 'choices': tuple(choices), 'least': least, 'flag': flag,
      'budget': budget})


def flag_fields(options: Type) -> list:
  """The fields of `options` that are command-line flags."""
  return [f for f in dataclasses.fields(options) if f.metadata.get('flag', True)]


def budgeted(options: Type) -> list:
  """The fields of `options` a time budget shrinks, in the order they shrink."""
  return sorted((f for f in dataclasses.fields(options) if f.metadata.get('budget')),
                key=lambda f: f.metadata['budget'].order)


def in_use(chosen: Any, field: dataclasses.Field) -> Any:
  """The value of `field` that `chosen` runs with (its `Budget.follows` where set and
  the field is None).

  Args:
    chosen: the options.
    field: one of its fields.

  Returns:
    The value.
  """
  value = getattr(chosen, field.name)
  follows = field.metadata['budget'].follows if field.metadata.get('budget') else ''
  return getattr(chosen, follows) if value is None and follows else value


def shrink(chosen: Any) -> Optional[Any]:
  """The options of a smaller sample for a time budget: the budgeted fields of the
  lowest order still above their minimum, each at its `Budget.smaller` value; None
  where every budgeted field is at its minimum (the smallest sample the tool reports).

  Args:
    chosen: the options.

  Returns:
    The smaller options, or None.
  """
  if chosen is None:
    return None
  for _, group in itertools.groupby(budgeted(type(chosen)),
                                    key=lambda f: f.metadata['budget'].order):
    changes = {}
    for field in group:
      rule, value = field.metadata['budget'], in_use(chosen, field)
      if _size(value) > _size(rule.minimum):
        smaller = rule.smaller(value)
        changes[field.name] = rule.minimum if _size(smaller) < _size(rule.minimum) else smaller
    if changes:
      return dataclasses.replace(chosen, **changes)
  return None


def smallest(chosen: Any) -> Any:
  """The options at the smallest sample a time budget takes (`shrink` until None).

  Args:
    chosen: the options.

  Returns:
    The smallest options (`chosen` where nothing shrinks).
  """
  while (smaller := shrink(chosen)) is not None:
    chosen = smaller
  return chosen


def changes(asked: Any, planned: Any) -> Dict[str, list]:
  """The options a plan changed: {field: [asked, planned]}.

  Args:
    asked: the options asked for (or None).
    planned: those planned.

  Returns:
    The changed fields.
  """
  if asked is None:
    return {}
  return {f.name: [in_use(asked, f), in_use(planned, f)] for f in dataclasses.fields(asked)
          if getattr(asked, f.name) != getattr(planned, f.name)}


def _fingerprint(field: dataclasses.Field) -> tuple:
  return field.type, field.default, field.metadata['choices'], field.metadata['least']


_DEFINED: Dict[str, tuple] = {}  # flag name -> what defined it


def define_flags(options: Type) -> None:
  """Defines the absl flag of every field of `options` (a dataclass of `option`
  fields); a flag defined before by another tool's options must agree with it.

  Args:
    options: the dataclass.

  Raises:
    ValueError: a default of a type no flag takes, or a flag another tool
      defined with another default, type or allowed values.
  """
  for field in flag_fields(options):
    if field.name in _DEFINED:
      if _DEFINED[field.name] != _fingerprint(field):
        raise ValueError(f'--{field.name} of {options.__qualname__} differs from the flag '
                         'of that name another tool defines; give it its own name.')
      continue
    kind = type(field.default) if field.default is not None else str
    choices = field.metadata['choices']
    if choices:
      flags.DEFINE_enum(field.name, field.default, list(choices), field.metadata['help'])
    elif kind in _DEFINE:
      _DEFINE[kind](field.name, field.default, field.metadata['help'])
    else:
      raise ValueError(f'--{field.name} of {options.__qualname__} is a {kind}; an option '
                       f'is one of {", ".join(t.__name__ for t in _DEFINE)}.')
    _DEFINED[field.name] = _fingerprint(field)


def from_flags(options: Type) -> Any:
  """The options the command line sets, each number checked against its least value.

  Args:
    options: the dataclass.

  Returns:
    An instance of it.

  Raises:
    ConfigError: a number below its least value, saying which flag.
  """
  values = {field.name: FLAGS[field.name].value for field in flag_fields(options)}
  for field in flag_fields(options):
    least = field.metadata['least']
    if least is not None and values[field.name] < least:
      raise ConfigError(f'--{field.name} is {values[field.name]}; it must be at least {least}.')
  return options(**values)
