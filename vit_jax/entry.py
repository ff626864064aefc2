"""What the command-line entry points share: recipe overrides checked before the
flag parser reads them, a console that prints the project's lines and the
libraries' only at a higher `--verbosity`, and a user's error (`errors.UserError`)
said in its own words without a traceback, unless --traceback asks for it."""
import importlib.util
import inspect
import os
import sys
from typing import Callable, NoReturn, Optional, Sequence

import ml_collections
from absl import app, flags
from ml_collections import config_flags
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from vit_jax import console, training
from vit_jax.errors import ConfigError, Interrupted, UserError

flags.DEFINE_bool('traceback', False, 'Show the traceback of a user error (a wrong setting, '
                  'missing data, a bad checkpoint) as well as its message.')


def load_recipe(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict of 'path/to/recipe.py[:arg]', as `config_flags` loads it.

  Args:
    spec: the recipe's path, with an optional ':arg' for its `get_config`.

  Returns:
    The recipe.

  Raises:
    ConfigError: no such file, not valid Python, a module it imports missing, no
      `get_config`, one that fails or takes another argument, or one that returns
      no ConfigDict.
  """
  path, _, arg = spec.partition(':')
  if not os.path.isfile(path):
    raise ConfigError(f'The recipe {path} does not exist; recipes are in configs/, e.g. '
                      'configs/quickstart_vit.py (the original vit_jax\'s configs in '
                      'vit_jax/configs/, e.g. vit_jax/configs/vit.py:b16,cifar10).')
  module_spec = importlib.util.spec_from_file_location('recipe', path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ConfigError(f'The recipe {path} is not valid Python ({e.msg}, line {e.lineno}); '
                      'correct it.') from e
  except ImportError as e:
    raise ConfigError(f'The recipe {path} imports {e.name or e}, which is not installed or not '
                      'found: run from the repository root, or correct the import.') from e
  except Exception as e:  # noqa: BLE001  (the recipe's own code failed)
    raise ConfigError(f'The recipe {path} failed while loading ({type(e).__name__}: {e}); '
                      'correct it.') from e
  get_config = getattr(module, 'get_config', None)
  if not callable(get_config):
    raise ConfigError(f'The recipe {path} defines no get_config(): a recipe is a module whose '
                      'get_config() returns the ConfigDict, as configs/quickstart_vit.py does.')
  takes = [p for p in inspect.signature(get_config).parameters.values()
           if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  needs = [p for p in takes if p.default is p.empty]
  if arg and not takes:
    raise ConfigError(f'{spec}: the recipe {path} takes no argument; give it as {path}.')
  if not arg and needs:
    raise ConfigError(f'The recipe {path} needs an argument ({needs[0].name}): give it as '
                      f'{path}:<{needs[0].name}>.')
  try:
    config = get_config(arg) if arg else get_config()
  except ValueError as e:  # recipes refuse an argument they do not know this way
    raise ConfigError(f'{spec}: {e}') from e
  except Exception as e:  # noqa: BLE001  (the recipe's own code failed)
    raise ConfigError(f'The recipe {spec} failed in get_config() ({type(e).__name__}: {e}); '
                      'correct it.') from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f'The recipe {spec} returns a {type(config).__name__}, not an '
                      'ml_collections.ConfigDict: return ml_collections.ConfigDict(...) from '
                      'get_config(), as configs/quickstart_vit.py does.')
  return config


class RecipeParser(ConfigFileFlagParser):
  """Loads a recipe flag's file as `load_recipe` does, adding to its `model` the
  architecture fields that `--<flag>.model.FIELD=...` sets and the recipe leaves at
  the family's default, so every documented model field can be set from the
  command line (`--config.model.num_registers=4`)."""

  def __init__(self, name: str, argv: Optional[Sequence[str]] = None):
    super().__init__(name, lock_config=True)
    self.argv = argv

  def parse(self, path: str) -> ml_collections.ConfigDict:
    config = load_recipe(path)
    argv = sys.argv if self.argv is None else self.argv
    take_pretrained_model(config, argv, self.name)
    training.add_model_fields(config, training.model_overrides(argv, config, self.name))
    config.lock()
    return config


def take_pretrained_model(config: ml_collections.ConfigDict, argv: Sequence[str],
                          flag: str = 'config') -> None:
  """Makes the recipe's model that of the `transformers` folder its `pretrained`
  names (`--<flag>.pretrained` in `argv`, else the recipe's own), before the
  command line's model fields are set (`finetune.take_folder_model`); where that
  folder is gone, the model `--workdir`'s run recorded when it was fine-tuned
  from it (`finetune.take_recorded_model`).

  Args:
    config: the recipe, changed in place.
    argv: the command line.
    flag: the recipe flag's name.
  """
  given = _flag_value(argv, f'{flag}.pretrained')
  path = config.get('pretrained') if given is None else given
  if training.take_folder_model(config, path) is None:
    training.take_recorded_model(config, path, _flag_value(argv, 'workdir'))


def _flag_value(argv: Sequence[str], name: str) -> Optional[str]:
  """The last value `argv` gives the flag `name` (`--name VALUE` or `--name=VALUE`),
  or None where it gives none."""
  value = None
  for i, arg in enumerate(argv):
    if arg == f'--{name}' and i + 1 < len(argv):
      value = argv[i + 1]
    elif arg.startswith(f'--{name}='):
      value = arg.split('=', 1)[1]
  return value


def define_recipe_flag(name: str, help_string: str, flag_values: flags.FlagValues = flags.FLAGS,
                       sys_argv: Optional[Sequence[str]] = None) -> None:
  """Defines the recipe flag `name` (`config_flags.DEFINE_config_file`, read by
  `RecipeParser`).

  Args:
    name: the flag.
    help_string: its help.
    flag_values: where to define it.
    sys_argv: the command line its overrides come from (default: sys.argv).
  """
  config_flags.DEFINE_config_file(name, None, help_string, flag_values=flag_values,
                                  sys_argv=None if sys_argv is None else list(sys_argv))
  flag_values[name].parser = RecipeParser(name, sys_argv)


def check_recipe_overrides(argv: Sequence[str], config_flags: Sequence[str],
                           fields: bool = True) -> None:
  """For each recipe flag (e.g. 'config', 'config2') given as `--config FILE` or
  `--config=FILE`, loads the recipe (`load_recipe`: a missing file or a failing
  `get_config` is one sentence) and checks that every `--config.a.b=...` names a
  field of it.

  Args:
    argv: the command line.
    config_flags: the recipe flags' names.
    fields: check the overrides against the project's recipe fields; False for
      configs of another layout (the original's), which are only loaded.
  """
  for name in config_flags:
    spec = _flag_value(argv, name)
    if spec is not None:
      recipe = load_recipe(spec)
      if fields:
        take_pretrained_model(recipe, argv, name)
        training.check_overrides(argv, recipe, name)


def _say(error: UserError, traceback: bool) -> None:
  """A user error as one line on stderr (exit status 1), or raised with --traceback."""
  if traceback:
    raise error
  print(f'Error: {error}', file=sys.stderr, flush=True)
  sys.exit(1)


def _stop_at_once(message: str) -> NoReturn:
  """The one line of a command stopped by Ctrl-C pressed again (or where it has no
  handler of its own), then the process ends without Python's finalisation
  (`errors.Interrupted` says why), exit status 1."""
  print(f'Error: {message}', file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(1)


def run(main: Callable, config_flags: Sequence[str] = ('config',), fields: bool = True) -> None:
  """`app.run(main)`, with the recipes loaded and their overrides checked first,
  the console set by `--verbosity` (`console.configure`), and user errors and
  Ctrl-C printed as one message (exit status 1).

  Args:
    main: the command's absl main.
    config_flags: the recipe flags' names.
    fields: check the overrides against the project's recipe fields
      (`check_recipe_overrides`).
  """
  def guarded(argv):
    # absl's app.run raises an unset --verbosity to 0 (INFO); unset is quiet here.
    console.configure(flags.FLAGS.verbosity if flags.FLAGS['verbosity'].present else -1)
    try:
      return main(argv)
    except Interrupted as e:
      if flags.FLAGS.traceback:
        raise
      _stop_at_once(str(e))
    except UserError as e:
      _say(e, flags.FLAGS.traceback)
    except KeyboardInterrupt:  # where the command has no handler of its own: one line
      if flags.FLAGS.traceback:
        raise
      _stop_at_once('Stopped by Ctrl-C.')

  try:
    check_recipe_overrides(sys.argv, config_flags, fields)
  except UserError as e:  # before the flags are parsed: --traceback read from argv
    _say(e, '--traceback' in sys.argv)
  app.run(guarded)
