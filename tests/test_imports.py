"""The import graph of `vit_jax/` and `analysis/`, read from the code (every import
statement, those inside functions too): which modules import which, the circles
it holds, and what the analysis's pure measures may import."""
import ast
import os
from typing import Dict, List, Set

import pytest

from doc_snippets import ROOT

PACKAGES = ('vit_jax', 'analysis')
# The original vit_jax's paths that are only its (one-line faces of `vit_jax/original/`).
ORIGINAL_FACES = {'vit_jax.main', 'vit_jax.utils', 'vit_jax.test_utils', 'vit_jax.inference_time',
                  'vit_jax.preprocess', 'vit_jax.models_vit', 'vit_jax.models_lit',
                  'vit_jax.models_mixer', 'vit_jax.models_resnet'}
# What the analysis's measures may import of the project: pure functions and names.
PURE = {'vit_jax.errors', 'vit_jax.calibration', 'vit_jax.models.family'}
# The analysis's floors, lowest first: a module imports only from its own floor and
# those below it (the prefixes name a floor's modules).
FLOORS = (('analysis.measures',), ('analysis.runtime',), ('analysis.reporting',),
          ('analysis.tool', 'analysis.tool_options'), ('analysis.tools',),
          ('analysis.cli', 'analysis.__main__'))
# Modules that read or write files: the measures leave file formats to `runtime/`.
FILE_FORMATS = {'json', 'pickle', 'safetensors', 'safetensors.numpy', 'zipfile', 'etils',
                'orbax', 'vit_jax.torch_save', 'vit_jax.checkpoint'}


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
  """Every module `module` imports, wherever in the file, relative imports resolved."""
  names = set()
  for node in ast.walk(ast.parse(open(MODULES[module]).read())):
    if isinstance(node, ast.Import):
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
