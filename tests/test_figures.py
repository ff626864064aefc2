"""The figure inventory (docs/figures.md): one row per figure with a status, and
every command in it names a tool, flag, recipe, sweep and row that exist."""
import importlib.util
import os
import re
import shlex
from typing import Dict, List, Tuple

import pytest

from analysis import tool
from analysis import tools  # noqa: F401  (registers the built-in tools and their flags)
from analysis.cli import request
from doc_snippets import ROOT

request.define_flags()
FLAGS = request.FLAGS  # the analysis command's flags

PAGE = os.path.join(ROOT, 'docs', 'figures.md')
STATUSES = ('reproduced', 'different finding', 'inconclusive', 'needs data', 'not yet')
VERDICTS = STATUSES[:3]  # the statuses that judge a finding
PAPERS = {'An Image is Worth': 'ViT paper', 'Raghu et al.': 'Raghu et al.',
          'Park & Kim': 'Park & Kim', 'Darcet et al.': 'Darcet et al.'}
RECIPE_FLAGS = ('config', 'config2')
# The flags of the training and sweep commands (defined under their __main__).
COMMAND_FLAGS = {
    'vit_jax.train': ('config', 'workdir', 'reconfigure', 'coordinator_address',
                      'num_processes', 'process_id', 'cpu_devices'),
    'vit_jax.sweep': ('config', 'workdir', 'cpu_devices', 'rows'),
}


def _text() -> str:
  with open(PAGE) as f:
    return f.read()


def variables() -> Dict[str, str]:
  """The shell variables the page defines (NAME="...")."""
  return dict(re.findall(r'^([A-Z])="([^"]*)"$', _text(), re.M))


def rows() -> List[Tuple[str, Dict[str, str]]]:
  """(paper, row) for every table row, the row keyed by its table's header."""
  found, paper, header = [], None, None
  for line in _text().splitlines():
    if line.startswith('## '):
      paper = next((short for key, short in PAPERS.items() if key in line), None)
      header = None
    elif line.startswith('| ') and paper:
      cells = [c.strip() for c in line.strip()[1:-1].split('|')]
      if header is None:
        header = cells
      elif not set(''.join(cells)) <= set('- '):
        assert len(cells) == len(header), line
        found.append((paper, dict(zip(header, cells))))
  return found


def commands() -> List[str]:
  """Every command of the tables, the page's variables expanded."""
  names = variables()
  spans = [span for _, row in rows() for span in re.findall(r'`([^`]+)`', row['command here'])]
  return [re.sub(r'\$([A-Z])', lambda m: names[m.group(1)], span) for span in spans
          if span.startswith(('python -m ', 'pytest '))]


def _recipe(value: str):
  path, _, arg = value.partition(':')
  assert os.path.exists(os.path.join(ROOT, path)), value
  spec = importlib.util.spec_from_file_location('recipe', os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _options(args: List[str]) -> Dict[str, str]:
  options = {}
  for arg in args:
    assert arg.startswith('--'), arg
    name, _, value = arg[2:].partition('=')
    options[name] = value
  return options


def _pairs(args: List[str]) -> List[str]:
  """`--flag value` written as `--flag=value`, as the page writes both."""
  joined, i = [], 0
  while i < len(args):
    if '=' not in args[i] and i + 1 < len(args) and not args[i + 1].startswith('--'):
      joined.append(f'{args[i]}={args[i + 1]}')
      i += 2
    else:
      joined.append(args[i])
      i += 1
  return joined


def check(command: str) -> None:
  """Raises AssertionError where the command names something that does not exist."""
  words = shlex.split(command)
  if words[0] == 'pytest':
    for path in words[1:]:
      assert os.path.exists(os.path.join(ROOT, path)), path
    return
  module, rest = words[2], words[3:]
  if module == 'analysis':
    assert rest[0] in tool.TOOLS or rest[0] == 'all', f'no analysis tool {rest[0]!r}'
    rest = rest[1:]
  else:
    assert module in ('vit_jax.train', 'vit_jax.sweep'), module
  options = _options(_pairs(rest))
  for name in options:
    base = name.split('.')[0]
    assert base in (FLAGS if module == 'analysis' else COMMAND_FLAGS[module]), \
        f'no flag --{name}'
  for which, row_flag in zip(RECIPE_FLAGS, ('row', 'row2')):
    if which not in options:
      assert row_flag not in options, command
      continue
    recipe = _recipe(options[which])
    if module == 'vit_jax.sweep':
      assert 'sweep' in recipe, f'{options[which]} is not a sweep recipe'
    named = [options[row_flag]] if row_flag in options else []
    if which == 'config' and 'rows' in options:
      named += options['rows'].split(',')
    for row in named:
      assert row in dict(recipe.sweep.rows), f'no row {row!r}'


def test_every_row_has_a_status_and_a_measurement_or_a_reason():
  found = rows()
  assert {paper for paper, _ in found} == set(PAPERS.values())
  for paper, row in found:
    assert row['status'] in STATUSES, (paper, row['figure'], row['status'])
    if row['status'] in VERDICTS:
      assert row['measured here'] and row['command here'], (paper, row['figure'])
  figures = [(paper, row['figure']) for paper, row in found]
  assert len(figures) == len(set(figures)), 'a figure listed twice'


def test_the_summary_counts_the_rows():
  found = [row['status'] for _, row in rows()]
  said = re.search(r'Of the (\d+) rows: (\d+) reproduced, (\d+) different findings, (\d+) '
                   r'inconclusive, (\d+) need data, (\d+) not yet\.', _text())
  assert said, 'the summary line is missing'
  assert [int(n) for n in said.groups()] == [len(found)] + [found.count(s) for s in STATUSES]


RUNS = re.compile(r'(none|[0-9]+|[0-9]+ \([^)]+\)(, [0-9]+ \([^)]+\))+)')


def test_every_verdict_says_how_many_runs_it_rests_on_and_the_summary_counts_them():
  """A verdict row's runs cell is a count per model, or none; a row without a
  verdict has none to give (—). The summary counts verdicts on three runs of every
  model, on mixed counts, on one run and on no trained model."""
  kinds = []
  for paper, row in rows():
    cell = row['runs']
    if row['status'] not in VERDICTS:
      assert cell == '—', (paper, row['figure'], cell)
      continue
    assert RUNS.fullmatch(cell), (paper, row['figure'], cell)
    counts = set(re.findall(r'(?:^|, )([0-9]+)', cell))  # each model's count
    kinds.append('none' if cell == 'none' else 'mixed' if len(counts) > 1 else
                 'three' if counts == {'3'} else 'one' if counts == {'1'} else cell)
  said = re.search(r'Of the (\d+) verdicts, (\d+) rest on three runs of every model, (\d+) on '
                   r'three runs of some\s+of their models and one of the others, (\d+) on one '
                   r'run, and (\d+) on no trained model\.', _text())
  assert said, 'the summary of runs is missing'
  assert [int(n) for n in said.groups()] == [
      len(kinds), kinds.count('three'), kinds.count('mixed'), kinds.count('one'),
      kinds.count('none')], kinds


def test_every_command_names_what_exists():
  listed = commands()
  assert len(listed) > 30
  for command in listed:
    check(command)


@pytest.mark.parametrize('command, says', [
    ('python -m analysis ckaa --config configs/quickstart_vit.py', "no analysis tool 'ckaa'"),
    ('python -m analysis cka --config configs/nothing.py', 'configs/nothing.py'),
    ('python -m analysis cka --config configs/ablations.py:data --row vit-7%', "no row 'vit-7%'"),
    ('python -m analysis cka --config configs/ablations.py:data --rows vit-6%,vit-7%',
     "no row 'vit-7%'"),
    ('python -m analysis cka --config configs/quickstart_vit.py --rowz a', 'no flag --rowz'),
    ('python -m vit_jax.sweep --config configs/quickstart_vit.py', 'not a sweep recipe'),
    ('python -m vit_jax.train --config configs/quickstart_vit.py --rows a', 'no flag --rows'),
    ('pytest tests/test_nothing.py', 'tests/test_nothing.py'),
])
def test_the_check_catches_what_does_not_exist(command, says):
  with pytest.raises(AssertionError, match=re.escape(says)):
    check(command)


def test_every_figure_a_tool_cites_is_in_the_inventory_and_runs_the_tool():
  """A tool's paper text cites figures ("Raghu et al. (Fig. 1-2)"): each is a row of
  the inventory, and the rows of those figures run the tool; a tool citing none
  measures something without a figure, and the page gives its command."""
  by_figure: Dict[Tuple[str, str], str] = {}
  for paper, row in rows():
    number = re.match(r'Fig\. (\d+)', row['figure'])
    if number:
      key = (paper, int(number.group(1)))
      by_figure[key] = by_figure.get(key, '') + row['command here']
  page = open(PAGE).read()
  for name, record in tool.TOOLS.items():
    commands_of_cited = ''
    citations = re.findall(r'(Raghu et al\.|Park & Kim|ViT paper|Darcet et al\.) '
                           r'\(Fig\. ([^)]*)\)', record.paper)
    if not citations:  # a measurement without a figure: the page names its command
      assert re.search(rf'python -m\s+analysis\s+{name} ', page), name
      continue
    for paper, cited in citations:
      for part in re.split(r',\s*', cited):
        ends = [int(n) for n in re.findall(r'\d+', part)]
        for number in range(ends[0], ends[-1] + 1):
          assert (paper, number) in by_figure, f'{name} cites {paper} Fig. {number}'
          commands_of_cited += by_figure[(paper, number)]
    assert f'analysis {name} ' in commands_of_cited, name


ATTRIBUTIONS = ('scale', 'different at both tiers', 'untestable offline',
                'waits for the paper-like tier')


def _tier_rows() -> Dict[str, Dict[str, str]]:
  """The rows of 'Different findings by tier', keyed 'paper, figure'."""
  section = _text().split('## Different findings by tier', 1)[1]
  table = [line for line in section.splitlines() if line.startswith('| ')]
  header = [c.strip() for c in table[0].strip()[1:-1].split('|')]
  return {cells[0]: dict(zip(header, cells)) for cells in (
      [c.strip() for c in line.strip()[1:-1].split('|')] for line in table[2:])}


def test_every_different_finding_is_attributed_by_tier_and_counted():
  tiers = _tier_rows()
  different = {f'{paper}, {row["figure"]}' for paper, row in rows()
               if row['status'] == 'different finding'}
  assert set(tiers) == different
  said = {kind: sum(row['attribution'].strip('*').startswith(kind) or
                    row['attribution'].startswith(f'**{kind}**') for row in tiers.values())
          for kind in ATTRIBUTIONS}
  assert sum(said.values()) == len(tiers), [r['attribution'] for r in tiers.values()]
  # "N attributed (a scale, b different at both tiers, c untestable offline)", then
  # ", M waiting for the paper-like tier" while any waits.
  counts = re.search(
      r'(\d+) attributed \((\d+) scale, (\d+) different at both tiers, (\d+) untestable '
      r'offline\)(?:, (\d+) waiting for the paper-like tier)?'.replace(' ', r'\s+'), _text())
  assert counts, 'the inventory counts its attributions per kind'
  assert [int(n or 0) for n in counts.groups()] == [
      len(tiers) - said['waits for the paper-like tier'], *(said[k] for k in ATTRIBUTIONS)]
