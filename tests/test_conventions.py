"""The conventions table: the docs show it as the code holds it, each default is
the tool's and its flag's, and the report names what a JSON records."""
import os

import pytest
from absl import flags

from analysis.reporting import conventions
from analysis.tools import TOOLS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_docs_table_is_the_codes():
  with open(os.path.join(ROOT, 'docs', 'analysis.md')) as f:
    text = f.read()
  start = text.index('<!-- conventions table: start -->\n') + len(
      '<!-- conventions table: start -->\n')
  end = text.index('\n<!-- conventions table: end -->')
  assert text[start:end] == conventions.table()


@pytest.mark.parametrize('convention', [c for c in conventions.CONVENTIONS if c.option],
                         ids=lambda c: f'{c.tool}-{c.option}')
def test_each_default_is_the_tools_and_its_flags(convention):
  tool = TOOLS[convention.tool]
  assert str(getattr(tool.options(), convention.option)) == convention.default
  flag = flags.FLAGS[convention.option]
  assert str(flag.default) == convention.default
  if isinstance(flag, flags.EnumFlag) or hasattr(flag.parser, 'enum_values'):
    values = set(flag.parser.enum_values)
    assert {value for value, _ in convention.departures} | {convention.default} == values


def test_every_tool_named_is_registered():
  assert {c.tool for c in conventions.CONVENTIONS} <= set(TOOLS)


def test_the_report_names_the_conventions_a_json_records():
  result = {'vit': {'objective': {'l2_on': 'all'}, 'density_width': 'pyhessian'},
            'bit': {'objective': {'l2_on': 'kernels'}, 'density_width': 'pyhessian'}}
  text = conventions.caption('hessian', result)
  assert text.startswith('Conventions: ')
  assert 'L2 term of the training objective: all, kernels (a departure' in text
  assert 'SLQ density\'s Gaussians: pyhessian (the authors\')' in text
  assert 'corruption parameters: cifar (the authors\')' in conventions.caption(
      'corruption', {'parameters': 'cifar'})
  assert 'a departure' in conventions.caption('corruption', {'parameters': 'imagenet'})
  assert conventions.caption('cka', {'cka': {}}) == ''
