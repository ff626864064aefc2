"""The family contract: outside `vit_jax/models/`, no code tests a family name or
spells a family's parameter path; what differs between families is said by the
family record (`Family`, `Layers`)."""
import ast
import glob
import json
import os
import re

import flax
import jax
import jax.numpy as jnp
import pytest

from vit_jax import models
from vit_jax.models.family import CONVNET, HYBRID, MLP, TRANSFORMER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ('vit_jax', 'analysis', 'configs', 'benchmarks', 'scripts', 'notebooks')
ALLOWED: tuple = ()  # files that may test a family name or spell its paths: none


def _sources():
  """(file, source) of the Python code outside the models package and the tests."""
  for top in CHECKED:
    for path in sorted(glob.glob(os.path.join(ROOT, top, '**', '*.py'), recursive=True)):
      if not path.startswith(os.path.join(ROOT, 'vit_jax', 'models') + os.sep):
        yield os.path.relpath(path, ROOT), open(path).read()
    for path in sorted(glob.glob(os.path.join(ROOT, top, '**', '*.ipynb'), recursive=True)):
      cells = json.load(open(path))['cells']
      yield os.path.relpath(path, ROOT), '\n'.join(
          ''.join(c['source']) for c in cells if c['cell_type'] == 'code')


def _general(segment: str) -> str:
  """A regex of a path segment with its numbers as any number or an f-string field."""
  return ''.join(r'(\d+|\{[^}]*\})' if part.isdigit() else re.escape(part)
                 for part in re.split(r'(\d+)', segment) if part)


def _family_paths():
  """Regexes of two consecutive segments of every family's parameter paths, and the
  families' top-level module names."""
  pairs, tops = set(), set()
  for family in map(models.FAMILIES.get, models.families(models.CLASSIFY)):
    name = next(iter(family.variants))
    shapes = jax.eval_shape(models.get_model(name, 10).init, jax.random.PRNGKey(0),
                            jnp.zeros((1, 64, 64, 3)))['params']
    for path in flax.traverse_util.flatten_dict(shapes):
      tops.add(path[0])
      pairs.update(f'{_general(a)}/{_general(b)}' for a, b in zip(path, path[1:]))
    pairs.add(_general(family.head.rstrip('/')) + '/')
  return re.compile('|'.join(sorted(pairs))), tops


def _strings(tree):
  """(line, text) of every string of a module but its docstrings; f-strings with
  their fields as '{}'."""
  skip = {id(node.body[0].value) for node in ast.walk(tree)
          if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef,
                               ast.AsyncFunctionDef))
          and node.body and isinstance(node.body[0], ast.Expr)
          and isinstance(node.body[0].value, ast.Constant)}
  strings = []
  for node in ast.walk(tree):
    if isinstance(node, ast.JoinedStr):
      skip.update(id(v) for v in node.values)
      strings.append((node.lineno, ''.join(
          v.value if isinstance(v, ast.Constant) else '{}' for v in node.values)))
  strings += [(node.lineno, node.value) for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in skip]
  return strings


def _violations(source: str, paths, tops):
  tree = ast.parse(source)
  names = set(models.FAMILIES)
  found = []
  for line, text in _strings(tree):
    if paths.search(text):
      found.append(f'line {line}: parameter path {text!r}')
  for node in ast.walk(tree):
    # A family name compared with, or looked up in a table keyed by family.
    if isinstance(node, ast.Compare):
      constants = [n for n in [node.left] + node.comparators
                   for n in (n.elts if isinstance(n, (ast.Tuple, ast.List, ast.Set)) else [n])]
      found += [f'line {n.lineno}: compares with the family name {n.value!r}' for n in constants
                if isinstance(n, ast.Constant) and n.value in names]
    if isinstance(node, ast.Dict):
      found += [f'line {k.lineno}: a table keyed by the family name {k.value!r}'
                for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
      if node.slice.value in tops or node.slice.value in names:
        found.append(f'line {node.lineno}: looks up {node.slice.value!r}')
  return found


@pytest.fixture(scope='module')
def family_paths():
  return _family_paths()


def test_the_checker_finds_what_it_looks_for(family_paths):
  paths, tops = family_paths
  bad = '\n'.join([
      "if family == 'bit': pass",
      "x = params['embedding']['kernel']",
      "y = flat['Transformer/posembed_input/pos_embedding']",
      "z = f'Transformer/encoderblock_{i}/MlpBlock_3'",
      "COLOURS = {'vit': 'red'}",
      "BODY = '^(?!head/)'",
      "w = 'resnet/block1/unit01/a/standardized_conv2d/kernel'",
      '"""Docstrings may name Transformer/encoderblock_0 paths."""'])
  assert len(_violations(bad, paths, tops)) == 8
  fine = "labels = [f'{name}-6%' for name in ('vit', 'resnet')]\nflags = {'out': 1}"
  assert _violations(fine, paths, tops) == []


def test_no_family_name_or_parameter_path_outside_the_models_package(family_paths):
  paths, tops = family_paths
  found = {path: v for path, source in _sources() if path not in ALLOWED
           for v in [_violations(source, paths, tops)] if v}
  assert found == {}


def test_every_family_says_what_kind_of_model_it_builds():
  """`Layers.architecture` (which the report's verdicts compare) and `describe`."""
  kinds = {}
  for family in map(models.FAMILIES.get, models.families(models.CLASSIFY)):
    for name in family.variants:
      config = models.get_config(name)
      layers = family.layers(config)
      assert layers.architecture in (TRANSFORMER, CONVNET, HYBRID, MLP), name
      kinds.setdefault(family.name, set()).add(layers.architecture)
      assert family.describe(config), name
  assert kinds == {'vit': {TRANSFORMER, HYBRID}, 'bit': {CONVNET}, 'mixer': {MLP},
                   'alternet': {HYBRID}}
  config = models.get_config('ViT-B_16')
  assert models.family_of(config).describe(config) == (
      '12 blocks, width 768, 12 heads, patch 16, class token')


# Words of the analysis's own concepts: its tools, its figures and its report.
ANALYSIS_WORDS = ('analysis', 'colour', 'color', 'lesion', 'hessian', 'plot', 'figure',
                  'shade', 'report', 'verdict')


def _analysis_concepts(source: str):
  """(line, what) of each import of the analysis package, and each identifier or
  string (docstrings aside) naming one of `ANALYSIS_WORDS`."""
  tree = ast.parse(source)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
      found += [(node.lineno, f'imports {m}') for m in modules
                if (m or '').split('.')[0] == 'analysis']
    names = {ast.Name: lambda n: [n.id], ast.Attribute: lambda n: [n.attr],
             ast.FunctionDef: lambda n: [n.name], ast.ClassDef: lambda n: [n.name],
             ast.arg: lambda n: [n.arg], ast.keyword: lambda n: [n.arg or '']}
    for kind, of in names.items():
      if isinstance(node, kind):
        found += [(node.lineno, f'names {name!r}') for name in of(node)
                  if any(w in name.lower() for w in ANALYSIS_WORDS)]
  found += [(line, f'says {text!r}') for line, text in _strings(tree)
            if any(w in text.lower() for w in ANALYSIS_WORDS)]
  return found


def test_the_models_package_knows_no_analysis_concept():
  """The reverse rule: models say what they sow (`Layers`) and how a branch is
  scaled (`branch_scales`); colours, the Hessian's loops, lesions and figures are
  the analysis's own (`analysis/`)."""
  assert len(_analysis_concepts("import analysis.reporting.plots\ncolour = 'red'\nx.lesion_scales\n"
                                "def f(hessian_loop): return 'plot'\n")) == 5
  found = {}
  for path in sorted(glob.glob(os.path.join(ROOT, 'vit_jax', 'models', '*.py'))):
    concepts = _analysis_concepts(open(path).read())
    if concepts:
      found[os.path.relpath(path, ROOT)] = concepts
  assert found == {}
