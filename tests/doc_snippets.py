"""The code blocks of README.md and docs/, and how the tests run them.

A fenced block whose language is `python` or `bash` runs; any other language
(`text`, a table of output) is shown only. An HTML comment on the line before a
fence changes how the block runs, the page showing the real command:

    <!-- test: files ViT-Ti_16.npz workdirs/quickstart_vit; replace "ViT-B_16" "ViT-Ti_16" -->
    <!-- test: skip "why this block cannot run in a test" -->

`files` makes inputs in the run's directory before the page's blocks run: a
`<model>.npz` in the published layout (initialised, 21,843 classes at 224 px,
with a pre-logits layer where the model has one; a LiT model's with its BERT
vocabulary `<model>.txt`), a `<name>.pt` sparse autoencoder in saev's layout (a
ReLU SAE of 128 latents on the quick-start ViT's 64-wide stream), or
`workdirs/<recipe>` holding
the initialised `params.npz` of `configs/<recipe>.py`, or `augreg`, a local AugReg
index (`tests/test_checkpoint.py`). `replace` substitutes
text (smaller sizes, shorter runs) and fails when the text is not in the block.
`skip` shows the block untested, with the reason the test reports.

A page's bash blocks run in order, each in `bash -e -o pipefail`, then its
python blocks in order in one interpreter (one namespace), all in one
temporary directory holding links to `configs/`, `scripts/`, `tests/`, ...;
`python` and `.venv/bin/python` at the start of a command are the tests'
interpreter, started warm (tests/warm_python.py), and `DIR` is a directory of
its own.

A page's Python must test what it says it tests: each of its loops (`for`,
`while`, a comprehension) runs its body at least once and each `assert` is
reached, or the page test fails naming the line (`checked_code`); an `assert` of
a constant or of a non-empty tuple, which cannot fail, is refused before the page
runs.
"""
import ast
import dataclasses
import os
import re
import shlex
from typing import List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ('python', 'bash')
FENCE = re.compile(r'^(\s*)```(\S*)\s*$')
DIRECTIVE = re.compile(r'^\s*<!--\s*test:(.*?)-->\s*$')
LINKED = ('configs', 'scripts', 'tests', 'benchmarks', 'notebooks', 'docs', 'vit_jax')


@dataclasses.dataclass
class Block:
  path: str  # relative to the repository root
  line: int  # of the first code line, 1-based
  language: str
  code: str
  skip: Optional[str] = None
  files: Tuple[str, ...] = ()
  replace: Tuple[Tuple[str, str], ...] = ()

  @property
  def where(self) -> str:
    return f'{self.path}:{self.line}'

  def runnable_code(self) -> str:
    code = self.code
    for old, new in self.replace:
      if old not in code:
        raise ValueError(f'{self.where}: replace {old!r}: not in the block.')
      code = code.replace(old, new)
    return code


def docs_figures():
  """scripts/docs_figures.py, which writes the measured figures the pages quote
  from their records, loaded as a module."""
  import importlib.util
  spec = importlib.util.spec_from_file_location('docs_figures',
                                                os.path.join(ROOT, 'scripts', 'docs_figures.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def pages() -> List[str]:
  """README.md and every Markdown page under docs/, relative to the root."""
  found = ['README.md']
  for folder, _, names in sorted(os.walk(os.path.join(ROOT, 'docs'))):
    found += sorted(os.path.relpath(os.path.join(folder, n), ROOT) for n in names
                    if n.endswith('.md'))
  return found


def _directive(text: str, where: str) -> dict:
  lexer = shlex.shlex(text, posix=True, punctuation_chars=';')
  lexer.whitespace_split = True
  parts, options = [[]], {}
  for token in lexer:
    if token == ';':
      parts.append([])
    else:
      parts[-1].append(token)
  for key, *args in filter(None, parts):
    part = ' '.join([key, *args])
    if key == 'skip' and len(args) == 1:
      options['skip'] = args[0]
    elif key == 'files' and args:
      options['files'] = options.get('files', ()) + tuple(args)
    elif key == 'replace' and len(args) == 2:
      options['replace'] = options.get('replace', ()) + (tuple(args),)
    else:
      raise ValueError(f'{where}: unknown test directive {part!r}; use skip "reason", '
                       'files NAME..., or replace "old" "new".')
  return options


def blocks(path: str) -> List[Block]:
  """The fenced code blocks of one page, with their directives."""
  with open(os.path.join(ROOT, path)) as f:
    lines = f.read().split('\n')
  found, i = [], 0
  while i < len(lines):
    match = FENCE.match(lines[i])
    if not match:
      i += 1
      continue
    indent, language = match.groups()
    options = {}
    directive = DIRECTIVE.match(lines[i - 1]) if i else None
    if directive:
      options = _directive(directive.group(1), f'{path}:{i}')
    end = i + 1
    while end < len(lines) and lines[end].strip() != '```':
      end += 1
    if end == len(lines):
      raise ValueError(f'{path}:{i + 1}: a code block that is never closed.')
    code = '\n'.join(l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:end])
    found.append(Block(path, i + 2, language, code + '\n', **options))
    i = end + 1
  return found


def interpreter_commands(code: str, python: str, tools: str) -> str:
  """A shell block with its `python` / `.venv/bin/python` commands run by `python`
  and its other `.venv/bin/` commands (`mkdocs`) from the folder `tools`."""
  code = re.sub(r'(^|\s|=")(\.venv/bin/)?python(3)?(?=\s)', lambda m: m.group(1) + python, code,
                flags=re.M)
  return re.sub(r'(^|\s)\.venv/bin/(?=\w)', lambda m: m.group(1) + tools + '/', code, flags=re.M)


# The names the checked code calls, bound in the program's namespace.
_SEEN, _MARK, _LOOP = '__page_seen__', '__page_mark__', '__page_loop__'


class _Checked(ast.NodeTransformer):
  """Marks each loop body, comprehension and `assert` of a block with its line."""

  def __init__(self, path: str):
    self.path, self.expected = path, set()

  def _key(self, node: ast.AST, what: str) -> str:
    key = f'{self.path}:{node.lineno}: {what}'
    self.expected.add(key)
    return key

  def _mark(self, key: str) -> ast.stmt:
    return ast.Expr(ast.Call(ast.Name(_MARK, ast.Load()), [ast.Constant(key)], []))

  def _loop(self, node):
    self.generic_visit(node)
    node.body.insert(0, self._mark(self._key(node, 'a loop whose body never runs')))
    return node

  visit_For = visit_AsyncFor = visit_While = _loop

  def visit_comprehension(self, node: ast.comprehension) -> ast.comprehension:
    self.generic_visit(node)
    key = self._key(node.iter, 'a comprehension over nothing')
    node.iter = ast.Call(ast.Name(_LOOP, ast.Load()), [ast.Constant(key), node.iter], [])
    return node

  def visit_Assert(self, node: ast.Assert):
    self.generic_visit(node)
    if _cannot_fail(node.test):
      raise ValueError(f'{self.path}:{node.lineno}: an assert that cannot fail; assert a '
                       'comparison, not a constant or a tuple.')
    return [self._mark(self._key(node, 'an assert never reached')), node]


def _cannot_fail(test: ast.expr) -> bool:
  """Whether an assert's test is true whatever the code computes."""
  if isinstance(test, ast.Constant):
    return bool(test.value)
  if isinstance(test, (ast.Tuple, ast.List, ast.Set)):
    return bool(test.elts)
  if isinstance(test, ast.Dict):
    return bool(test.keys)
  return isinstance(test, ast.Lambda)


def checked_code(code: str, path: str, first_line: int) -> Tuple[ast.Module, set]:
  """A block's code as a module whose loops and asserts record that they ran.

  Args:
    code: the block's code.
    path: the page, relative to the root.
    first_line: the page's line of the code's first line.

  Returns:
    The module, and the places it records (`page:line: what`), each the message
    when it never ran.
  """
  tree = ast.parse('\n' * (first_line - 1) + code, path)
  checked = _Checked(path)
  tree = ast.fix_missing_locations(checked.visit(tree))
  return tree, checked.expected


_PREAMBLE = f"""{_SEEN} = set()

def {_MARK}(key):
  {_SEEN}.add(key)

def {_LOOP}(key, items):
  for item in items:
    {_SEEN}.add(key)
    yield item
"""


def python_program(runnable: Sequence[Block]) -> str:
  """One program running the blocks in order in one namespace, each compiled
  under its page and line so a traceback names the documentation line, that
  fails at its end naming every loop of theirs that never ran its body and every
  assert never reached (`checked_code`)."""
  parts = [f'import sys; sys.path.insert(0, {os.path.join(ROOT, "tests")!r})',
           'from doc_snippets import checked_code',
           'namespace = {"__name__": "__main__"}', f'exec({_PREAMBLE!r}, namespace)',
           'expected = set()']
  for block in runnable:
    checked_code(block.runnable_code(), block.path, block.line)  # refuses before any block runs
    parts += [f'tree, found = checked_code({block.runnable_code()!r}, {block.path!r}, '
              f'{block.line})',
              'expected.update(found)',
              f'exec(compile(tree, {block.path!r}, "exec"), namespace)']
  parts.append(f'vacuous = sorted(expected - namespace[{_SEEN!r}])\n'
               'if vacuous:\n'
               '  raise SystemExit("The page tests nothing here: " + "; ".join(vacuous))')
  return '\n'.join(parts) + '\n'
