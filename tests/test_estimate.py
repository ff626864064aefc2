"""Time estimates of the analysis tools (`analysis.runtime.estimate`, `--time_budget`): each
tool's count of model passes against what its runner does, the pricing, and the
command refusing a budget its tools do not fit before any of them runs."""
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np
import pytest

from analysis import tool_options
from analysis.cli import planning, report
from analysis.runtime import estimate
from analysis.tools import TOOLS, corruption, erf, hessian, landscape, robustness
from helpers import TINY_VIT, batches, quickstart_vit_checkpoint, subject
from vit_jax import console

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AMOUNTS = estimate.Amounts(num_images=1000, batch_size=100)


@pytest.fixture(scope='module')
def vit():
  return subject('ViT-Ti_16', 'vit', **TINY_VIT)


def test_the_hessian_counts_its_lanczos_products(vit):
  """Per minibatch the top-k Lanczos steps, then every SLQ probe's steps and every
  trace probe on each, and Lanczos steps on each of the 7 parameter blocks on one:
  the products `hessian.measure` reports progress in."""
  options = hessian.Options(hessian_batches=2, lanczos_steps=10)
  work = TOOLS['hessian'].work(vit, options, AMOUNTS)
  assert work.passes == {'hvp': 2 * (10 + 2 * 20 + 5) + 7 * 5}
  default = TOOLS['hessian'].work(vit, hessian.Options(), AMOUNTS).passes['hvp']
  assert default == 4 * (20 + 2 * 40 + 10) + 7 * 10 == 510


def test_forward_tools_count_passes_over_the_split(vit):
  batches_of_split = AMOUNTS.batches
  assert TOOLS['cka'].work(vit, None, AMOUNTS).passes == {'forward': batches_of_split}
  assert TOOLS['probes'].work(vit, None, AMOUNTS).passes == {'forward': 2 * batches_of_split}
  noisy = len(robustness.EPSILONS) * len(robustness.FREQUENCIES)
  assert TOOLS['robustness'].work(vit, robustness.Options(), AMOUNTS).passes == {
      'forward': batches_of_split * (1 + noisy)}
  # ERF: an input gradient per stream layer over its images, each layer compiled apart.
  layers = len(vit.layers.stream)
  work = TOOLS['erf'].work(vit, None, AMOUNTS)
  assert work.passes == {'gradient': layers * erf.ERF_IMAGES / 100}
  assert work.compiles == {'gradient': layers}
  assert estimate.Amounts(num_images=250, batch_size=100).batches == 3


def test_prices_add_passes_and_compilations():
  prices = estimate.Prices(run={'forward': 0.5, 'hvp': 2.}, compile={'forward': 3., 'hvp': 10.})
  work = estimate.Work({'forward': 10, 'hvp': 4}, {'hvp': 2})
  assert prices.seconds(work) == 10 * 0.5 + 4 * 2. + 2 * 10.
  # Without a count of compilations, each kind used compiles once.
  assert prices.seconds(estimate.Work({'forward': 10})) == 5. + 3.
  with pytest.raises(ValueError, match='Unknown kinds'):
    estimate.Work({'backward': 1})
  assert console.duration(185.2) == '3m05s' and console.duration(42.4) == '42s'


def test_pricing_times_only_the_kinds_asked_for(vit):
  images, labels = next(batches('eval'))
  prices = estimate.price(vit, images, labels, ['forward', 'hvp'])
  assert set(prices.run) == set(prices.compile) == {'forward', 'hvp'}
  assert all(t > 0 for t in prices.run.values())
  assert all(t >= 0 for t in prices.compile.values())
  assert estimate.kinds_needed([estimate.Work({'hvp': 3}), estimate.Work({'forward': 1})]) == [
      'forward', 'hvp']


@pytest.fixture
def passes_at_10ms(monkeypatch):
  """Every pass of every kind priced at 10 ms, compiling free."""
  monkeypatch.setattr(estimate, 'price', lambda *a, **k: estimate.Prices(
      run={'forward': 0.01, 'gradient': 0.01, 'hvp': 0.01},
      compile={'forward': 0., 'gradient': 0., 'hvp': 0.}))


def _planner(vit, names, options, seconds):
  prices, _ = planning.price(names, [vit], lambda s: batches, options, AMOUNTS)
  return planning.Planner(names, [vit], prices, options, AMOUNTS, time.perf_counter() + seconds,
                          console.duration(seconds))


def _asked():
  return {'hessian': hessian.Options(), 'landscape': landscape.Options(), 'cka': None}


def test_a_budget_is_met_by_smaller_samples_of_the_costliest_tools(vit, passes_at_10ms, capsys,
                                                                   tmp_path):
  """Every pass priced at 10 ms: the Hessian (510 products) and the landscape (21 x
  21 points on 2 batches) shrink, the costliest first, until the whole fits; a
  budget below their minimums is refused naming them."""
  names = ['hessian', 'landscape', 'cka']
  options = _asked()
  planner = _planner(vit, names, options, 7.)
  assert sum(planner.fit(names).values()) <= 7.
  assert options['hessian'].hessian_batches == 2 and options['landscape'].landscape_points < 21
  assert options['cka'] is None
  said = capsys.readouterr().out
  assert 'hessian: a smaller sample for --time_budget=7s: hessian_batches 4 -> 2' in said
  report.record_plan(str(tmp_path), '7s', planner.changed(), names)
  assert report.plan_note(str(tmp_path), 'hessian').startswith(
      'Smaller samples to fit --time_budget=7s: hessian_batches 2 instead of 4')
  assert report.plan_note(str(tmp_path), 'cka') == ''
  report.record_plan(str(tmp_path), '1h', {}, ['hessian'])  # run again at its asked size
  assert report.plan_note(str(tmp_path), 'hessian') == ''
  assert report.plan_note(str(tmp_path), 'landscape').startswith('Smaller samples')
  # Enough time: nothing changes.
  options = _asked()
  _planner(vit, names, options, 1e4).fit(names)
  assert options == _asked()


def test_tools_their_smallest_samples_do_not_fit_are_left_out_least_important_first(
    vit, passes_at_10ms, capsys):
  """Every pass priced at 10 ms: at their smallest samples CKA takes 0.1 s, the
  Hessian 0.92 s and the landscape 1.21 s. With 1.5 s the most important fit
  (CKA, then the Hessian, shrunk to its minimum) and the landscape is left out,
  said and recorded; with 0.5 s a cheaper tool after a left-out one still runs."""
  names = planning.by_importance(['landscape', 'hessian', 'cka'])
  assert names == ['cka', 'hessian', 'landscape']  # the two papers' headline figures first
  options = _asked()
  planner = _planner(vit, names, options, 1.5)
  assert planner.minimum_seconds('hessian') == pytest.approx(0.92)
  assert planner.minimum_seconds('landscape') == pytest.approx(1.21)
  assert options == _asked()  # pricing the minimum changes nothing
  estimated = planner.fit(names)
  assert set(estimated) == {'cka', 'hessian'} and sum(estimated.values()) <= 1.5
  assert set(planner.left_out) == {'landscape'}
  assert 'even at their smallest samples' in planner.left_out['landscape']
  assert options['hessian'].hessian_batches == 2
  said = capsys.readouterr().out
  assert 'Left out, not fitting --time_budget=2s even at their smallest samples: landscape' in said
  planner = _planner(vit, ['hessian', 'cka'], _asked(), 0.5)
  assert set(planner.fit(['hessian', 'cka'])) == {'cka'}
  assert set(planner.left_out) == {'hessian'}


def test_between_tools_the_rest_is_planned_against_the_clock(vit, passes_at_10ms, capsys):
  """A first tool that took three times its estimate scales the others' estimates
  by three, and they shrink to fit what is left; where even their minimums do not
  fit, the less important are left out, nothing refused."""
  names = ['cka', 'hessian', 'landscape']
  options = _asked()
  planner = _planner(vit, names, options, 60.)
  planner.fit(names)
  assert options == _asked()  # 5.1 + 5.1 + 8.8 s fit a minute
  assert planner.slowdown() == 1.
  planner.record('cka', 3 * planning.EVIDENCE_SECONDS)  # priced 0.1 s: too little to judge
  assert planner.slowdown() == 1.
  planner.ran['cka'] = [planning.EVIDENCE_SECONDS, 3 * planning.EVIDENCE_SECONDS]
  assert planner.slowdown() == pytest.approx(3.)
  planner.deadline = time.perf_counter() + 20.
  estimated = planner.fit(['hessian', 'landscape'])
  assert sum(estimated.values()) <= 20.
  assert estimated['hessian'] == pytest.approx(3 * planner.seconds('hessian'))
  assert options['hessian'].hessian_batches < 4 and options['cka'] is None
  said = capsys.readouterr().out
  assert 'left of --time_budget=1m00s (the tools so far took 3.0x their estimates)' in said
  assert 'hessian: a smaller sample for the ' in said
  assert set(planner.changed()) <= {'hessian', 'landscape'} and planner.changed()
  planner.deadline = time.perf_counter() + 5.
  # 3 x 0.92 s of the Hessian's minimum fit; 3 x 1.21 s of the landscape's more do not.
  assert set(planner.fit(['hessian', 'landscape'])) == {'hessian'}
  assert set(planner.left_out) == {'landscape'}
  assert 'Left out, not fitting the ' in capsys.readouterr().out


def test_a_planned_option_the_user_left_out_is_said_against_its_default(vit, capsys):
  """The corruption tool runs on every image unless told: shrinking it says 1.0 -> 0.667."""
  prices = {vit.label: estimate.Prices(run={'forward': 0.01}, compile={'forward': 0.},
                                       host={'corrupted image': 0.})}
  options = {'corruption': corruption.Options()}
  planner = planning.Planner(['corruption'], [vit], prices, options, AMOUNTS,
                             time.perf_counter() + 6., '6s')
  planner.fit(['corruption'])
  assert planner.changed() == {'corruption': {'corruption_fraction': [1., 0.667]}}
  assert 'corruption_fraction 1.0 -> 0.667' in capsys.readouterr().out


def test_host_work_is_priced_by_the_tools_that_count_it(vit):
  """The probes' solves and the corruptions are timed on a sample and counted in
  their units; a tool run once for all models prices its host work once."""
  images, labels = next(batches('eval'))
  for name, units in (('probes', {'layer probes', 'few-shot probes'}),
                      ('corruption', {'corrupted image'})):
    registered = TOOLS[name]
    options = registered.options() if registered.options else None
    prices = registered.host_prices(vit, images, labels, options, AMOUNTS)
    work = registered.work(vit, options, AMOUNTS)
    assert set(prices) == set(work.host) == units
    assert all(p > 0 for p in prices.values()), prices
  work = TOOLS['corruption'].work(vit, corruption.Options(corruption_fraction=0.5), AMOUNTS)
  assert work.host == {'corrupted image': 15 * 5 * 1000 * 0.5}
  assert TOOLS['corruption'].work(vit, corruption.Options(corruptions_from='tfds'),
                                  AMOUNTS).host == {'corrupted image': 0}
  priced = estimate.Prices(run={'forward': 0.}, compile={'forward': 0.},
                           host={'corrupted image': 0.002})
  assert priced.seconds(work) == pytest.approx(0.002 * 37500)
  twice, unpriced = planning.price(['corruption'], [vit, dataclasses.replace(vit, label='b')],
                                   lambda s: batches, {'corruption': corruption.Options()}, AMOUNTS)
  assert unpriced == []
  assert twice[vit.label].host['corrupted image'] > 0 == twice['b'].host['corrupted image']


@pytest.mark.parametrize('name,options,smallest', [
    ('hessian', hessian.Options(hessian_batches=10, lanczos_steps=30),
     dict(hessian_batches=2, lanczos_steps=10, density_steps_in_use=20, density_probes=1,
          trace_probes_in_use=2, block_steps_in_use=4)),
    ('landscape', landscape.Options(), dict(landscape_points=11, landscape_batches=1)),
    ('corruption', corruption.Options(), dict(corruption_fraction=0.2)),
    ('robustness', robustness.Options(),
     dict(noise_frequencies=list(np.linspace(0, np.pi, 5))))])
def test_each_tool_shrinks_to_its_stated_minimum(vit, name, options, smallest):
  """Every step takes less work, and the last stops at the minimum the tool states."""
  work = lambda o: sum(TOOLS[name].work(vit, o, AMOUNTS).passes.values())
  while (smaller := tool_options.shrink(options)) is not None:
    assert work(smaller) < work(options), (options, smaller)
    options = smaller
  for key, value in smallest.items():
    np.testing.assert_allclose(getattr(options, key), value)
  assert TOOLS[name].minimum


def _analysis(python, tmp_path, *args):
  path = quickstart_vit_checkpoint(tmp_path)
  return subprocess.run(
      [python, '-m', 'analysis', *args, '--config', 'configs/quickstart_vit.py',
       '--checkpoint', path, '--num_images', '40', '--batch_size', '20',
       '--out', str(tmp_path / 'out'), '--notensorboard'],
      capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_pricing_stops_at_its_deadline_and_names_the_tools_left(vit, passes_at_10ms):
  prices, unpriced = planning.price(['cka', 'hessian'], [vit], lambda s: batches,
                                    _asked(), AMOUNTS, deadline=time.perf_counter() - 1.)
  assert unpriced == ['cka', 'hessian'] and prices[vit.label].run == {}


@pytest.mark.slow
def test_a_budget_the_tools_do_not_fit_still_ends_with_a_report(tmp_path, warm_python):
  """A budget far too short: the most important tools that fit run, the others are
  left out, and the report lists each with the command that runs it; exit 0."""
  done = _analysis(warm_python, tmp_path, 'all', '--time_budget=2s')
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'Left out, ' in done.stdout
  plan = json.loads((tmp_path / 'out' / report.PLAN_FILE).read_text())
  left = {n for n, p in plan.items() if 'left_out' in p}
  assert left and left == set(report.load_left_out(str(tmp_path / 'out')))
  ran = {n for n in TOOLS if (tmp_path / 'out' / f'{n}.json').exists()}
  assert not ran & left and ran | left <= set(TOOLS)
  page = (tmp_path / 'out' / 'report.md').read_text()
  assert '## Tools left out for the time budget' in page
  command = plan[sorted(left)[0]]['command']
  program, *rest = shlex.split(command)
  # The interpreter that ran the analysis: the command runs as pasted in its folder.
  assert os.access(os.path.join(ROOT, program), os.X_OK), program
  assert shlex.join(rest).startswith(f'-m analysis {sorted(left)[0]} --config') and \
      '--time_budget' not in command and command in page


@pytest.mark.slow
def test_a_budget_that_fits_prints_and_keeps_the_estimates(tmp_path, warm_python):
  done = _analysis(warm_python, tmp_path, 'norm_ratio', '--time_budget=1h')
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'Estimated: norm_ratio' in done.stdout
  estimated = json.loads((tmp_path / 'out' / 'estimates.json').read_text())
  measured = json.loads((tmp_path / 'out' / 'timings.json').read_text())
  assert set(estimated) == set(measured) == {'norm_ratio'}
  assert np.isfinite(estimated['norm_ratio']) and estimated['norm_ratio'] > 0
  done = _analysis(warm_python, tmp_path, 'norm_ratio', '--time_budget=soon')
  assert done.returncode != 0 and 'not a duration' in done.stderr


def test_the_command_of_a_tool_left_out_is_the_same_analysis_without_the_budget():
  from analysis.cli import command as cli
  argv = ['analysis', 'all', '--config', 'configs/quickstart_vit.py', '--workdir', 'w v',
          '--time_budget=15m', '--out', 'o', '--time_budget', '2m']
  assert cli.tool_command('hessian', argv, 'all') == (
      f"{shlex.quote(cli.interpreter())} -m analysis hessian --config "
      "configs/quickstart_vit.py --workdir 'w v' --out o")


def test_a_left_out_tools_command_names_the_interpreter_that_ran_the_analysis(monkeypatch,
                                                                             tmp_path):
  """Pasted into the shell the analysis ran in, the command runs with the same Python:
  `.venv/bin/python` from the repository, the full path from elsewhere."""
  from analysis.cli import command as cli
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, 'executable', str(tmp_path / '.venv' / 'bin' / 'python'))
  assert cli.interpreter() == os.path.join('.venv', 'bin', 'python')
  (tmp_path / 'elsewhere').mkdir()
  monkeypatch.chdir(tmp_path / 'elsewhere')
  assert cli.interpreter() == str(tmp_path / '.venv' / 'bin' / 'python')
  monkeypatch.setattr(sys, 'executable', '')
  assert cli.interpreter() == 'python'
