"""The analysis tool registry: a tool defined outside `analysis/`
(tests/logit_margin_tool.py) runs through `python -m analysis`, gets its report
section with its caption and its TensorBoard events, with no file of the package
changed."""
import ast
import dataclasses
import importlib.util
import inspect
import json
import os
import subprocess
from typing import Optional

import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

import analysis.tools  # noqa: F401  (the package's tools registered, their flags defined)
from analysis import tool, tool_options
from analysis.tool import Tool, register
from analysis.tool_options import define_flags, option
from vit_jax.errors import ConfigError
from helpers import quickstart_vit_checkpoint, read_events

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def registry(monkeypatch):
  """The registry as it is, in a copy this test may extend; and the tool module,
  imported afresh into it."""
  monkeypatch.setattr(tool, 'TOOLS', dict(tool.TOOLS))
  spec = importlib.util.spec_from_file_location('logit_margin_tool_copy',
                                                os.path.join(TESTS, 'logit_margin_tool.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return tool.TOOLS, module


def test_registered_tools_need_unique_names_and_a_known_kind(registry):
  tools, module = registry
  record = module.LOGIT_MARGIN
  assert list(tools)[-1] == 'logit_margin' and tools['logit_margin'] is record
  assert register(record) is record  # registering the same record again is a no-op
  with pytest.raises(ValueError, match='registered already'):
    register(Tool(name='logit_margin', title='', quantity='', paper='', run=record.run,
                  findings=record.findings, draw=record.draw))
  with pytest.raises(ValueError, match='runs_on'):
    register(Tool(name='other', title='', quantity='', paper='', run=record.run,
                  findings=record.findings, draw=record.draw, runs_on='pairs'))


def test_each_tools_flags_are_its_options_fields(registry):
  assert {'hessian', 'landscape', 'corruption', 'nll', 'logit_margin'} <= {
      name for name, record in tool.TOOLS.items() if record.options}
  for record in tool.TOOLS.values():
    for field in tool_options.flag_fields(record.options) if record.options else ():
      flag = flags.FLAGS[field.name]
      assert flag.default == field.default and flag.help.endswith(field.metadata['help'])
      if field.metadata['choices']:
        assert list(flag.parser.enum_values) == list(field.metadata['choices'])
    if record.options:  # the run takes the options whole, their defaults by default
      assert inspect.signature(record.run).parameters['options'].default == record.options()


def test_what_a_budget_shrinks_and_shortens_is_named_by_fields(registry):
  """A tool's `shortened_by` and every budgeted field's `follows` name what its
  options have: a rename fails when the tool registers, not when a budget runs."""
  for record in tool.TOOLS.values():
    fields = {f.name for f in dataclasses.fields(record.options)} if record.options else set()
    assert set(record.shortened_by) <= fields | {'num_images'}, record.name
    for field in tool_options.budgeted(record.options) if record.options else ():
      follows = field.metadata['budget'].follows
      assert not follows or hasattr(record.options(), follows), (record.name, field.name)
  hessian = tool.TOOLS['hessian']
  with pytest.raises(ValueError, match="shortened_by names hessian_minibatches, not options"):
    tool.register(dataclasses.replace(hessian, name='renamed',
                                      shortened_by=('hessian_minibatches',)))
  assert 'renamed' not in tool.TOOLS


def test_a_budget_shrinks_the_lowest_order_first_and_stops_at_the_minimum():
  @dataclasses.dataclass(frozen=True)
  class Sizes:
    steps: int = option(30, 'Steps.', flag=False, budget=tool_options.Budget(10, order=0))
    follower: Optional[int] = option(None, 'Half the steps unless set.', flag=False,
                                     budget=tool_options.Budget(2, order=1,
                                                                smaller=lambda n: 2,
                                                                follows='half'))
    bands: tuple = option((1, 2, 3, 4), 'Bands.', flag=False,
                          budget=tool_options.Budget((1, 4), order=1,
                                                     smaller=lambda b: (b[0], b[-1])))
    fixed: int = option(7, 'Never shrinks.', flag=False)

    @property
    def half(self):
      return self.follower or self.steps // 2

  chosen, seen = Sizes(), []
  while (chosen := tool_options.shrink(chosen)) is not None:
    seen.append(chosen)
  assert [s.steps for s in seen] == [20, 13, 10, 10]
  assert [s.half for s in seen] == [10, 6, 5, 2]  # follows the steps until it shrinks itself
  assert seen[-1] == Sizes(steps=10, follower=2, bands=(1, 4))
  assert tool_options.smallest(Sizes()) == seen[-1]
  assert tool_options.changes(Sizes(), seen[-1]) == {
      'steps': [30, 10], 'follower': [15, 2], 'bands': [(1, 2, 3, 4), (1, 4)]}
  assert tool_options.shrink(None) is None


def test_options_are_checked_and_a_flag_two_tools_share_must_agree(registry):
  _, module = registry
  with flagsaver.flagsaver(logit_margin_rank=1):
    with pytest.raises(ConfigError, match='--logit_margin_rank is 1; it must be at least 2'):
      module.LOGIT_MARGIN.read_options()
  with flagsaver.flagsaver(logit_margin_rank=4):
    assert module.LOGIT_MARGIN.read_options() == module.Options(logit_margin_rank=4)

  @dataclasses.dataclass(frozen=True)
  class Clashing:
    lanczos_steps: int = option(30, 'Another default for a flag the Hessian tool defines.')
  with pytest.raises(ValueError, match='--lanczos_steps of .*Clashing differs from the flag'):
    define_flags(Clashing)


@pytest.mark.slow
def test_a_tool_registered_outside_the_package_runs_through_the_command_line(tmp_path, warm_python):
  config_path = os.path.join(ROOT, 'configs', 'quickstart_vit.py')
  npz = quickstart_vit_checkpoint(tmp_path)
  out = tmp_path / 'out'
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get('PYTHONPATH', '')]))
  subprocess.run(
      [warm_python, '-m', 'analysis', 'logit_margin', '--tool_modules=logit_margin_tool',
       '--config', config_path, '--checkpoint', npz, '--num_images', '20', '--batch_size', '10',
       '--out', str(out), '--logit_margin_rank=3'], check=True, cwd=ROOT, env=env)
  result = json.loads((out / 'logit_margin.json').read_text())['quickstart_vit']
  assert len(result['margins']) == 20 and min(result['margins']) >= 0
  page = (out / 'report.html').read_text()
  assert '<section id="logit_margin"><h2>Logit margins</h2>' in page
  assert 'logit_margin_quickstart_vit.png' in page
  mean = np.mean(result['margins'])
  assert 'quickstart_vit: mean margin <span class="num" data-file="logit_margin.json"' in page
  assert f'>{mean:.3g}</span>' in page
  events = read_events(out / 'tensorboard' / 'quickstart_vit')
  margins = events['analysis/logit_margin/margin']
  np.testing.assert_allclose([float(margins[i]) for i in range(3)],
                             result['margins'][:3], rtol=1e-6)
  assert 'analysis/logit_margin/logit_margin_quickstart_vit' in events


def test_no_module_outside_the_tools_is_named_like_a_tool():
  import pkgutil
  analysis_dir = os.path.dirname(analysis.tools.__path__[0])
  outside = {m.name.rsplit('.', 1)[-1] for m in pkgutil.walk_packages([analysis_dir], 'analysis.')
             if not m.name.startswith('analysis.tools')}
  assert not outside & set(tool.TOOLS), outside & set(tool.TOOLS)


def test_joint_figures_are_drawn_for_two_models_or_more():
  """`Tool.draw_joint`, the one place that leaves a lone model's joint figures out,
  counting the models as the tool's `models` does (its per-model entries by default)."""
  calls = []
  record = Tool(name='joint_test', title='t', quantity='q', paper='p', run=lambda *a: {},
                findings=lambda result, quote: {}, draw=tool.no_figures,
                joint=lambda result, colour_of, out: calls.append(result) or ['a.png'])
  one, two = {'a': {'x': 1}, 'n': 3}, {'a': {'x': 1}, 'b': {'x': 2}, 'n': 3}
  assert record.draw_joint(one, {}, 'out') == [] and calls == []
  assert record.draw_joint(two, {}, 'out') == ['a.png'] and calls == [two]
  no_joint = Tool(name='no_joint', title='t', quantity='q', paper='p', run=lambda *a: {},
                  findings=lambda result, quote: {}, draw=tool.no_figures)
  assert no_joint.draw_joint(two, {}, 'out') == []
  # The tools whose JSON is not per model name their models themselves.
  assert tool.TOOLS['cka'].models({'layers': {'vit': [], 'resnet': []}, 'cka': {}}) == [
      'vit', 'resnet']
  assert tool.TOOLS['corruption'].models({'errors': {'vit': {}}, 'ranks': {}}) == ['vit']


def test_no_function_of_a_tool_is_over_sixty_lines():
  """A tool's `run`, `measure` or `draw` reads in one screen: what grows past 60 lines
  (signature, docstring and body) is split into functions of its own."""
  folder = os.path.join(ROOT, 'analysis', 'tools')
  longer = []
  for name in sorted(os.listdir(folder)):
    if name.endswith('.py'):
      for node in ast.walk(ast.parse(open(os.path.join(folder, name)).read())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          lines = node.end_lineno - node.lineno + 1
          if lines > 60:
            longer.append(f'analysis/tools/{name}:{node.lineno} {node.name} ({lines} lines)')
  assert not longer, longer
