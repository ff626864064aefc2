"""A tool's command-line options as one frozen dataclass: each field is a flag of
the same name, its default, help text, allowed values and least value written
once, in the field (`option`). `define_flags` makes the absl flags of a
dataclass (a flag two tools share, such as `--lanczos_steps`, is defined once
and must agree), `from_flags` reads and checks them before any model loads.

    @dataclasses.dataclass(frozen=True)
    class Options:
      landscape_points: int = option(21, 'Grid points along each direction.', least=3)
"""
import dataclasses
from typing import Any, Dict, Optional, Sequence, Type

from absl import flags

from vit_jax.errors import ConfigError

FLAGS = flags.FLAGS
_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string}


def option(default: Any, help: str, choices: Sequence[str] = (),  # pylint: disable=redefined-builtin
           least: Optional[float] = None) -> Any:
  """A field of a tool's options dataclass: its flag's default and help, and
  the values it allows (`choices`, or a number at least `least`).

  Args:
    default: the default value.
    help: what the flag sets, as `--help` shows it.
    choices: the allowed values of a string option (an enum flag); none: any.
    least: the smallest allowed value of a number option.

  Returns:
    The dataclass field.
  """
  return dataclasses.field(default=default, metadata={
      'help': help, 'choices': tuple(choices), 'least': least})


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
  for field in dataclasses.fields(options):
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
  values = {field.name: FLAGS[field.name].value for field in dataclasses.fields(options)}
  for field in dataclasses.fields(options):
    least = field.metadata['least']
    if least is not None and values[field.name] < least:
      raise ConfigError(f'--{field.name} is {values[field.name]}; it must be at least {least}.')
  return options(**values)
