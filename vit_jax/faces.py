"""A room's face (`vit_jax/files/__init__.py`, ...): the names the rest of the project
uses, each taken from its module inside the room when first asked for, so that
importing a face costs nothing and a name costs only its own module (the data's
modules import TFDS and Grain, which take seconds). A face also lists its names
under `if TYPE_CHECKING:` for editors and type checkers, and tests/test_imports.py
holds the two lists equal.
"""
import importlib
from typing import Any, Callable, List, Mapping, Sequence, Tuple


def names(package: str, table: Mapping[str, Sequence[str]]
          ) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
  """The module `__getattr__` and `__dir__` of the face of `package`.

  Args:
    package: the room's package (`__name__`).
    table: a module of the room (relative to `package`) -> the names the face takes
      from it; 'name as public' gives one under another name on the face.

  Returns:
    `__getattr__` (the name's object, looked up in its module at each access, so a
    test's patch of the module is seen) and `__dir__`.
  """
  homes = {}
  for module, module_names in table.items():
    for entry in module_names:
      inner, _, public = entry.partition(' as ')
      homes[public or inner] = (f'{package}.{module}', inner)

  def attribute(name: str) -> Any:
    if name not in homes:
      raise AttributeError(f'module {package!r} has no attribute {name!r}')
    module, inner = homes[name]
    return getattr(importlib.import_module(module), inner)

  return attribute, lambda: sorted(homes)
