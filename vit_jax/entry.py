"""What the command-line entry points share: recipe overrides checked before the
flag parser reads them, a console that prints the project's lines and the
libraries' only at a higher `--verbosity`, and a user's error (`errors.UserError`)
said in its own words without a traceback, unless --traceback asks for it."""
import importlib.util
import os
import sys
from typing import Callable, Sequence

import ml_collections
from absl import app, flags

from vit_jax import console, settings
from vit_jax.errors import ConfigError, UserError

flags.DEFINE_bool('traceback', False, 'Show the traceback of a user error (a wrong setting, '
                  'missing data, a bad checkpoint) as well as its message.')


def load_recipe(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict of 'path/to/recipe.py[:arg]', as `config_flags` loads it.

  Args:
    spec: the recipe's path, with an optional ':arg' for its `get_config`.

  Returns:
    The recipe.

  Raises:
    ConfigError: no such file, not valid Python, or no `get_config`.
  """
  path, _, arg = spec.partition(':')
  if not os.path.isfile(path):
    raise ConfigError(f'The recipe {path} does not exist; recipes are in configs/, e.g. '
                      'configs/quickstart_vit.py.')
  module_spec = importlib.util.spec_from_file_location('recipe', path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ConfigError(f'The recipe {path} is not valid Python ({e.msg}, line {e.lineno}); '
                      'correct it.') from e
  if not callable(getattr(module, 'get_config', None)):
    raise ConfigError(f'The recipe {path} defines no get_config(): a recipe is a module whose '
                      'get_config() returns the ConfigDict, as configs/quickstart_vit.py does.')
  try:
    return module.get_config(arg) if arg else module.get_config()
  except ValueError as e:  # recipes refuse an argument they do not know this way
    raise ConfigError(f'{spec}: {e}') from e


def check_recipe_overrides(argv: Sequence[str], config_flags: Sequence[str]) -> None:
  """For each recipe flag (e.g. 'config', 'config2') given as `--config FILE` or
  `--config=FILE`, checks that every `--config.a.b=...` names a field of it.

  Args:
    argv: the command line.
    config_flags: the recipe flags' names.
  """
  for name in config_flags:
    spec = None
    for i, arg in enumerate(argv):
      if arg == f'--{name}' and i + 1 < len(argv):
        spec = argv[i + 1]
      elif arg.startswith(f'--{name}='):
        spec = arg.split('=', 1)[1]
    if spec is not None:
      settings.check_overrides(argv, load_recipe(spec), name)


def _say(error: UserError, traceback: bool) -> None:
  """A user error as one line on stderr (exit status 1), or raised with --traceback."""
  if traceback:
    raise error
  print(f'Error: {error}', file=sys.stderr, flush=True)
  sys.exit(1)


def run(main: Callable, config_flags: Sequence[str] = ('config',)) -> None:
  """`app.run(main)`, with the recipe overrides checked first, the console set by
  `--verbosity` (`console.configure`), and user errors and Ctrl-C printed as one
  message (exit status 1).

  Args:
    main: the command's absl main.
    config_flags: the recipe flags' names.
  """
  def guarded(argv):
    # absl's app.run raises an unset --verbosity to 0 (INFO); unset is quiet here.
    console.configure(flags.FLAGS.verbosity if flags.FLAGS['verbosity'].present else -1)
    try:
      return main(argv)
    except UserError as e:
      _say(e, flags.FLAGS.traceback)
    except KeyboardInterrupt:  # where the command has no handler of its own: one line
      if flags.FLAGS.traceback:
        raise
      print('Error: Stopped by Ctrl-C.', file=sys.stderr, flush=True)
      sys.exit(1)

  try:
    check_recipe_overrides(sys.argv, config_flags)
  except UserError as e:  # before the flags are parsed: --traceback read from argv
    _say(e, '--traceback' in sys.argv)
  app.run(guarded)
