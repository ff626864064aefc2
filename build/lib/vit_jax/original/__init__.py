"""The original google-research/vision_transformer's API (docs/original.md): every
adapter of its names onto this project's code, in this package's modules.

The original's users import its names from their old paths: `vit_jax.utils`,
`vit_jax.main`, `vit_jax.models_vit`, ... are one-line faces of this package's
modules, and the paths the original shares with the project's own modules
(`vit_jax.checkpoint`, `vit_jax.input_pipeline`, `vit_jax.models`, `vit_jax.train`)
hand the original's names on through a module `__getattr__` (`forward`), which
imports the adapter only when such a name is asked for. The project's modules import
nothing of this package but this face, which imports nothing of the project, so the
adapters sit above the project and close no circle (tests/test_imports.py).
"""
import importlib
from typing import Any, Callable

# A path the original shares with a project module -> this package's module of the
# original's names there.
SHARED_PATHS = {
    'vit_jax.checkpoint': 'vit_jax.original.checkpoint',
    'vit_jax.input_pipeline': 'vit_jax.original.input_pipeline',
    'vit_jax.models': 'vit_jax.original.models',
    'vit_jax.train': 'vit_jax.original.train',
}


def forward(path: str) -> Callable[[str], Any]:
  """The module `__getattr__` of the project module at `path`: the original's names
  there (its adapter module's `ORIGINAL_NAMES`), imported on first use.

  Args:
    path: the project module's name (`__name__`), a key of `SHARED_PATHS`.

  Returns:
    The function, name -> the original's object.
  """
  def original_name(name: str) -> Any:
    adapter = importlib.import_module(SHARED_PATHS[path])
    if name in adapter.ORIGINAL_NAMES:
      return getattr(adapter, name)
    raise AttributeError(f'module {path!r} has no attribute {name!r}')
  return original_name


def lit_method(name: str) -> Callable[..., Any]:
  """A method of the original's `LitModel` (`name`, a function of the model in
  `vit_jax.original.lit`; `vocab_path` is wrapped in `property`), for it and for the
  zoo's LiT model, which `vit_jax.models.get_model('LiT-B16B')` builds for the
  original's notebooks: the function, imported on first call.

  Args:
    name: the method's name.

  Returns:
    The method.
  """
  def method(self, *args: Any, **kwargs: Any) -> Any:
    return getattr(importlib.import_module('vit_jax.original.lit'), name)(self, *args, **kwargs)
  method.__name__ = method.__qualname__ = name
  method.__doc__ = f'The original `LitModel.{name}` (`vit_jax.original.lit.{name}`).'
  return method
