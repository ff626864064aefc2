"""The import graph of `vit_jax/` and `analysis/`, read from the code (every import
statement, those inside functions and under `TYPE_CHECKING` too, and every
`importlib.import_module` of a written name): which modules import which, the
circles it holds, the rooms of `vit_jax/` and their floors, and what the analysis's
pure measures may import."""
import ast
import importlib
import os
from typing import Dict, List, Set

import pytest

from doc_snippets import ROOT

PACKAGES = ('vit_jax', 'analysis')
# The original vit_jax's paths that are only its (one-line faces of `vit_jax/original/`).
ORIGINAL_FACES = {'vit_jax.main', 'vit_jax.utils', 'vit_jax.test_utils', 'vit_jax.inference_time',
                  'vit_jax.preprocess', 'vit_jax.models_vit', 'vit_jax.models_lit',
                  'vit_jax.models_mixer', 'vit_jax.models_resnet'}
# The rooms of `vit_jax/`: each is reached from outside only through its face.
ROOMS = ('vit_jax.files', 'vit_jax.training', 'vit_jax.data')
# The top of `vit_jax/`: what every room may use, the commands, and the old paths
# (the original's, and the project's documented `checkpoint` and `input_pipeline`).
BASE = {'vit_jax', 'vit_jax.errors', 'vit_jax.console', 'vit_jax.cpu_devices',
        'vit_jax.calibration', 'vit_jax.faces', 'vit_jax.original'}
COMMANDS = {'vit_jax.train', 'vit_jax.export', 'vit_jax.zeroshot', 'vit_jax.sweep',
            'vit_jax.sweep_rows', 'vit_jax.entry'}
OLD_PATHS = ORIGINAL_FACES | {'vit_jax.checkpoint', 'vit_jax.input_pipeline'}
# The floors of `vit_jax/`, lowest first (prefixes, as `FLOORS`): the zoo, the files
# it is read from and written to, the data, training; above them the commands, the
# old paths and the original's adapters (every other module).
VIT_FLOORS = (('vit_jax.models', 'vit_jax.configs'), ('vit_jax.files',), ('vit_jax.data',),
              ('vit_jax.training',))
# What the analysis's measures may import of the project: pure functions and names.
PURE = {'vit_jax.errors', 'vit_jax.calibration', 'vit_jax.models.family'}
# The analysis's floors, lowest first: a module imports only from its own floor and
# those below it (the prefixes name a floor's modules).
FLOORS = (('analysis.measures',), ('analysis.runtime',), ('analysis.reporting',),
          ('analysis.tool', 'analysis.tool_options'), ('analysis.tools',),
          ('analysis.cli', 'analysis.__main__'))
# Modules that read or write files: the measures leave file formats to `runtime/`.
FILE_FORMATS = {'json', 'pickle', 'safetensors', 'safetensors.numpy', 'zipfile', 'etils',
                'orbax', 'vit_jax.files', 'vit_jax.checkpoint'}


def _modules() -> Dict[str, str]:
  """Module name -> file, for every module of `PACKAGES`."""
  found = {}
  for package in PACKAGES:
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if name.endswith('.py'):
          path = os.path.join(folder, name)
          module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
          found[module[:-len('.__init__')] if module.endswith('.__init__') else module] = path
  return found


MODULES = _modules()


def imported(module: str) -> Set[str]:
  """Every module `module` imports, wherever in the file, relative imports resolved,
  and those it names to `importlib.import_module`. The original's face
  (`vit_jax.original`) is read for its statements only: its hooks import the
  adapters, which sit above the whole project, when the original's names are asked
  for (`test_the_project_imports_of_the_original_api_only_its_face`)."""
  names = set()
  for node in ast.walk(ast.parse(open(MODULES[module]).read())):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == 'import_module' and node.args
        and isinstance(node.args[0], ast.Constant) and module != 'vit_jax.original'):
      names.add(node.args[0].value)
    elif isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = module.split('.')
        if not MODULES[module].endswith('__init__.py'):
          parts = parts[:-1]
        base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      # `from package import module` names the module; `from module import name`, the module.
      names.update(f'{base}.{alias.name}' if f'{base}.{alias.name}' in MODULES else base
                   for alias in node.names)
  return names


def _own(name: str) -> str:
  """The project's module `name` is, or is a name in; '' for another library's."""
  while name and name not in MODULES:
    name = name.rpartition('.')[0]
  return name


GRAPH = {module: {_own(n) for n in imported(module)} - {'', module} for module in MODULES}


def circles(graph: Dict[str, Set[str]]) -> List[Set[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm),
  of the graph's own nodes."""
  graph = {node: edges & graph.keys() for node, edges in graph.items()}
  index: Dict[str, int] = {}
  low: Dict[str, int] = {}
  stack: List[str] = []
  found = []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    for other in graph[node]:
      if other not in index:
        visit(other)
        low[node] = min(low[node], low[other])
      elif other in stack:
        low[node] = min(low[node], index[other])
    if low[node] == index[node]:
      component = set()
      while True:
        member = stack.pop()
        component.add(member)
        if member == node:
          break
      if len(component) > 1:
        found.append(component)

  for node in graph:
    if node not in index:
      visit(node)
  return found


def test_circles_are_found():
  graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}, 'e': set()}
  assert circles(graph) == [{'a', 'b', 'c'}]
  assert circles({'a': {'b'}, 'b': set()}) == []


def test_the_analysis_has_no_import_circle():
  assert not circles({m: e for m, e in GRAPH.items() if m.startswith('analysis')})


def test_vit_jax_has_no_import_circle():
  assert not circles({m: e for m, e in GRAPH.items() if m.startswith('vit_jax')})


def test_the_project_imports_of_the_original_api_only_its_face():
  """The compatibility layer (`vit_jax/original/`) sits above the project: the
  project's modules import its face (`vit_jax.original`: the shared paths' forwarding)
  and nothing else of it, and the face imports nothing of the project."""
  layer = {m for m in MODULES if m.startswith('vit_jax.original.')}
  for module in set(MODULES) - layer - ORIGINAL_FACES - {'vit_jax.original'}:
    assert not GRAPH[module] & layer, (module, GRAPH[module] & layer)
  assert GRAPH['vit_jax.original'] == set()


@pytest.mark.parametrize('module', sorted(m for m in MODULES if m.startswith('analysis.measures')))
def test_the_measures_are_pure(module):
  """A measure imports other measures, and of the project only `PURE`: no tool,
  report or runtime, no training code, no file format."""
  names = imported(module)
  project = {_own(n) for n in names} - {''}
  assert all(m.startswith('analysis.measures') or m in PURE for m in project), project
  assert not names & FILE_FORMATS, names & FILE_FORMATS


def floor(module: str) -> int:
  """The floor of an analysis module (`FLOORS`); the package itself is the top."""
  for level, prefixes in enumerate(FLOORS):
    if any(module == p or module.startswith(p + '.') for p in prefixes):
      return level
  assert module == 'analysis', f'{module} is on no floor: add it to FLOORS'
  return len(FLOORS)


@pytest.mark.parametrize('module', sorted(m for m in MODULES if m.startswith('analysis')))
def test_no_analysis_import_climbs_a_floor(module):
  """The measures, the runtime, the reporting, the tool contract, the tools and the
  command, each above the last: an import reaches down or along, never up."""
  up = {m for m in GRAPH[module] if m.startswith('analysis') and floor(m) > floor(module)}
  assert not up, f'{module} (floor {floor(module)}) imports {sorted(up)} above it'


def test_a_climbing_import_is_found():
  assert floor('analysis.reporting.plots') < floor('analysis.tools.cka') < floor('analysis.cli')
  assert floor('analysis.reporting.verdict') < floor('analysis.tool') == floor('analysis.tool_options')


def test_an_import_module_of_a_written_name_is_an_import():
  assert 'vit_jax.original.lit' not in imported('vit_jax.original')
  assert {'vit_jax.files.checkpoint', 'vit_jax.files.layout'} <= GRAPH['vit_jax.files']


def room_of(module: str) -> str:
  """The room `module` is in (`ROOMS`), or ''."""
  return next((r for r in ROOMS if module.startswith(r + '.')), '')


def vit_floor(module: str) -> int:
  """The floor of a `vit_jax` module: 0 for `BASE`, then `VIT_FLOORS`'; the top
  holds the rest."""
  if module in BASE:
    return 0
  for level, prefixes in enumerate(VIT_FLOORS, 1):
    if any(module == p or module.startswith(p + '.') for p in prefixes):
      return level
  return len(VIT_FLOORS) + 1


@pytest.mark.parametrize('module', sorted(m for m in MODULES if not room_of(m) and m not in ROOMS))
def test_a_room_is_entered_through_its_face(module):
  """No module outside a room imports a module inside it: only its face."""
  inner = {m for m in GRAPH[module] if room_of(m)}
  assert not inner, f'{module} imports {sorted(inner)}: import their names from the face'


def test_the_top_of_vit_jax_holds_the_commands_the_old_paths_and_the_base():
  top = {m for m in MODULES if m.startswith('vit_jax.') and m.count('.') == 1
         and not MODULES[m].endswith('__init__.py')}
  assert top - BASE - COMMANDS - OLD_PATHS == set(), 'a module of a room at the top'
  assert top >= COMMANDS | OLD_PATHS


@pytest.mark.parametrize('module', sorted(m for m in MODULES if m.startswith('vit_jax')))
def test_no_vit_jax_import_climbs_a_floor(module):
  """The base, the zoo, the files, the data, training, each above the last, and the
  commands and old paths over all: an import reaches down or along, never up (so no
  room imports a command)."""
  up = {m for m in GRAPH[module]
        if m.startswith('vit_jax') and vit_floor(m) > vit_floor(module)}
  assert not up, f'{module} (floor {vit_floor(module)}) imports {sorted(up)} above it'


def test_a_climbing_vit_jax_import_is_found():
  assert vit_floor('vit_jax.errors') < vit_floor('vit_jax.models.vit') < vit_floor(
      'vit_jax.files.checkpoint') < vit_floor('vit_jax.data.pipeline') < vit_floor(
          'vit_jax.training.loop') < vit_floor('vit_jax.train') == vit_floor('vit_jax.checkpoint')


def face_table(room: str) -> Dict[str, Set[str]]:
  """A face's names, as `faces.names` takes them: module -> 'inner as public'."""
  tree = ast.parse(open(MODULES[room]).read())
  call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
              and getattr(n.func, 'attr', '') == 'names')
  return {key.value: {e.value for e in value.elts}
          for key, value in zip(call.args[1].keys, call.args[1].values)}


def face_imports(room: str) -> Dict[str, Set[str]]:
  """A face's names, as its `if TYPE_CHECKING:` block imports them."""
  tree = ast.parse(open(MODULES[room]).read())
  block = next(n for n in tree.body if isinstance(n, ast.If)
               and getattr(n.test, 'id', '') == 'TYPE_CHECKING')
  return {node.module[len(room) + 1:]: {a.name + (f' as {a.asname}' if a.asname else '')
                                       for a in node.names} for node in block.body}


@pytest.mark.parametrize('room', ROOMS)
def test_a_face_names_what_its_type_checking_block_imports(room):
  """Each name of a face once for editors and once for `faces.names`, alike, and each
  one there in its module."""
  assert face_table(room) == face_imports(room)
  face = importlib.import_module(room)
  for entry in set().union(*face_table(room).values()):
    assert getattr(face, entry.partition(' as ')[2] or entry) is not None
  with pytest.raises(AttributeError, match='no attribute'):
    getattr(face, 'not_a_name')


def test_the_documented_names_stay_on_their_old_paths():
  from vit_jax import checkpoint, input_pipeline
  from vit_jax.data import pipeline
  from vit_jax.files import checkpoint as files_checkpoint
  for name in ('load', 'read', 'save', 'from_pretrained', 'weights_file', 'CheckpointError'):
    assert getattr(checkpoint, name) is getattr(files_checkpoint, name)
  for name in ('get_source', 'train_dataset', 'eval_dataset', 'DataError', 'read_image'):
    assert getattr(input_pipeline, name) is getattr(pipeline, name)
