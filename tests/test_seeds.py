"""Models given as several training runs (seeds): the runs joined into one
estimate, the verdicts on it, the sweep that trains the seeds and the analysis's
refusal of runs that are not seeds of one recipe."""
import dataclasses
import json
import subprocess

import numpy as np
import pytest

from analysis.reporting import runs, verdict
from doc_snippets import ROOT
from vit_jax import sweep
from vit_jax.models.family import CONVNET, TRANSFORMER


@pytest.mark.parametrize('values, errors', [
    ([0.52, 0.61, 0.47], [0.01, 0.02, 0.015]),  # the runs spread beyond their own errors
    ([0.50, 0.51, 0.505, 0.49], [0.05, 0.04, 0.05, 0.06]),  # within them: no between-run part
    ([1.0, 3.0], [0.5, 0.5])])
def test_combined_runs_are_the_random_effects_mean(values, errors):
  v, s = np.array(values), np.array(errors)
  n = len(v)
  tau2 = max(0., v.var(ddof=1) - (s ** 2).mean())  # DerSimonian-Laird with equal weights
  (mean, stderr), between = verdict.combine(list(zip(values, errors)))
  np.testing.assert_allclose([mean, stderr, between],
                             [v.mean(), np.sqrt((tau2 + (s ** 2).mean()) / n), np.sqrt(tau2)],
                             rtol=1e-12)
  # Never below the spread of the runs' values over sqrt(n), nor their own mean error.
  assert stderr >= np.sqrt(v.var(ddof=1) / n) - 1e-15
  assert stderr >= np.sqrt((s ** 2).mean() / n) - 1e-15


def test_runs_without_errors_and_one_run():
  (mean, stderr), between = verdict.combine([(1., None), (2., None), (4., None)])
  np.testing.assert_allclose([mean, stderr, between],
                             [7 / 3, np.std([1, 2, 4], ddof=1) / np.sqrt(3),
                              np.std([1, 2, 4], ddof=1)])
  (mean, stderr), between = verdict.combine([(0.3, 0.1)])
  assert (mean, stderr) == (0.3, 0.1) and np.isnan(between)


def _models(groups):
  return {f'{group}_seed{seed}': {'group': group, 'seed': seed, 'architecture': kind}
          for group, kind, n in groups for seed in range(n)}


@pytest.mark.parametrize('shift', np.linspace(-0.3, 0.3, 25))
def test_a_contrast_is_inconclusive_exactly_inside_the_combined_interval(shift):
  models = _models([('vit', TRANSFORMER, 3), ('resnet', CONVNET, 3)])
  labels = list(models)
  rng = np.random.default_rng(0)
  values = dict(zip(labels, rng.normal(0.5, 0.05, len(labels))))
  for label in labels[:3]:
    values[label] += shift
  estimate = lambda label: (values[label], 0.02)
  found = verdict.contrast('f', 'claim', 'x', models, labels, estimate)
  (a, sa), _ = verdict.combine([estimate(label) for label in labels[:3]])
  (b, sb), _ = verdict.combine([estimate(label) for label in labels[3:]])
  inside = abs(a - b) <= verdict.Z * np.hypot(sa, sb)
  assert (found.verdict == verdict.INCONCLUSIVE) == inside
  assert found.verdict in (verdict.INCONCLUSIVE, verdict.AGREES if a > b else verdict.DIFFERS)
  assert found.runs == 3 and 'vit (3 seeds)' in found.measured


def test_single_verdicts_on_each_run_join_into_one_on_the_model():
  models = {**_models([('vit', TRANSFORMER, 3)]), 'other': {'architecture': TRANSFORMER}}
  values = {'vit_seed0': (0.30, 0.05), 'vit_seed1': (0.10, 0.05), 'vit_seed2': (0.20, 0.05),
            'other': (0.4, 0.1)}
  found = [verdict.single('f', 'claim', 'gap', label, value) for label, value in values.items()]
  found += [verdict.single('g', 'another claim', 'x', label, value)
            for label, value in values.items()]
  joined = verdict.across_seeds(found, models)
  assert [v.label for v in joined] == ['vit', 'other', 'vit', 'other']
  assert joined[0].measured.startswith('vit (3 seeds): gap ')
  (mean, stderr), between = verdict.combine(list(values.values())[:3])
  assert joined[0].estimate == (mean, stderr) and joined[0].runs == 3
  assert joined[0].verdict == verdict.judge((mean, stderr))[0]
  assert f'between-run SD {between:.2g}' in joined[0].measured
  assert joined[1] == found[3] and joined[1].runs == 1


def test_each_run_alone_is_judged_and_a_verdict_that_flips_shows(monkeypatch):
  """Three runs of a ViT and of a ResNet, the ViT's third run unlike its others: the
  report's verdicts again with one run of each model, run by run."""
  from types import SimpleNamespace
  from analysis import tool
  from analysis.cli import report
  models = _models([('vit', TRANSFORMER, 3), ('resnet', CONVNET, 3)])
  values = {'vit_seed0': (1.0, 0.1), 'vit_seed1': (1.1, 0.1), 'vit_seed2': (0.0, 0.1),
            'resnet_seed0': (0.5, 0.1), 'resnet_seed1': (0.4, 0.1), 'resnet_seed2': (0.5, 0.1)}

  def judged(result, subjects):
    labels = list(result)
    return [verdict.contrast('higher', 'the ViT higher', 'x', subjects, labels,
                             lambda label: result[label])] + [
        verdict.single('positive', 'the ViT positive', 'x', label, result[label])
        for label in labels if subjects.get(label, {}).get('architecture') == TRANSFORMER] + [
        verdict.Verdict('token', 'a class token', 'x', verdict.NOT_COMPARABLE, 'none',
                        label=label)
        for label in labels if subjects.get(label, {}).get('architecture') == TRANSFORMER]

  monkeypatch.setitem(tool.TOOLS, 'fake', SimpleNamespace(verdicts=judged))
  results = {'fake': values}
  combined = report.all_verdicts(results, models)
  assert [v.runs for _, v in combined] == [3, 3, 1, 1, 1]
  # A verdict on one run that the runs do not join (no number) gets its own alone.
  assert report.each_run(results, models) == [
      [verdict.AGREES, verdict.AGREES, verdict.DIFFERS],
      [verdict.AGREES, verdict.AGREES, verdict.INCONCLUSIVE]] + [[verdict.NOT_COMPARABLE]] * 3
  single_runs = {label: {'architecture': about['architecture']}
                 for label, about in models.items()}
  assert report.each_run(results, single_runs) == [[]] * len(
      report.all_verdicts(results, single_runs))


def test_two_runs_of_a_deterministic_model_spread_by_nothing(subjects, tmp_path):
  """A tool run on one model twice, as two seeds that changed nothing: every number's
  spread over the runs is zero, and the mean is the number."""
  from analysis.cli import command as cli
  from helpers import batches
  first = dataclasses.replace(subjects['vit'], label='vit_seed0')
  second = dataclasses.replace(subjects['vit'], label='vit_seed1')
  results, _, failed = cli.run_tools(['attention_distance'], [first, second],
                                     lambda s: batches, str(tmp_path))
  assert not failed
  about = {s.label: {'group': 'vit', 'seed': i} for i, s in enumerate((first, second))}
  summary = runs.across_runs(results, about)['attention_distance']['vit']
  assert summary['runs'] == ['vit_seed0', 'vit_seed1']
  distances = np.array(summary['sd']['distance_per_layer_head'])
  assert distances.size and np.all(distances == 0)
  np.testing.assert_array_equal(summary['mean']['distance_per_layer_head'],
                                results['attention_distance']['vit_seed0'][
                                    'distance_per_layer_head'])


def test_across_runs_against_numpy():
  results = {'t': {'a_seed0': {'x': [1., 2.], 'name': 'n', 'k': 3},
                   'a_seed1': {'x': [3., 5.], 'name': 'n', 'k': 4},
                   'b': {'x': [0., 0.], 'name': 'm', 'k': 1}},
             'pairs': {'a_seed0 vs b': 1.}}  # no entry per run: left out
  about = {'a_seed0': {'group': 'a', 'seed': 0}, 'a_seed1': {'group': 'a', 'seed': 1}, 'b': {}}
  assert runs.across_runs(results, about) == {'t': {'a': {
      'runs': ['a_seed0', 'a_seed1'],
      'mean': {'x': [2., 3.5], 'name': 'n', 'k': 3.5},
      'sd': {'x': [np.std([1, 3], ddof=1), np.std([2, 5], ddof=1)], 'name': None,
             'k': np.std([3, 4], ddof=1)}}}}


def test_a_joint_curve_of_a_model_given_as_runs_is_their_mean_with_the_runs_behind(tmp_path):
  """Three runs of one model and a model of one run: two curves, the first the runs'
  mean with the combined standard error at each point, its runs drawn thin."""
  from analysis.reporting import joint_figures
  rng = np.random.RandomState(0)
  values, errors = rng.normal(size=(3, 5)), rng.uniform(0.05, 0.2, (3, 5))
  by_model = {f'vit_seed{i}': {'v': values[i], 'e': errors[i]} for i in range(3)}
  by_model['resnet'] = {'v': rng.normal(size=7), 'e': np.full(7, 0.1)}
  palette = joint_figures.Palette({label: 'C0' for label in by_model},
                                  {'vit': [f'vit_seed{i}' for i in range(3)]})
  series, stderr, drawn, colours, entries = joint_figures._runs_as_means(
      {k: r['v'] for k, r in by_model.items()}, {k: r['e'] for k, r in by_model.items()},
      palette, by_model, palette.groups)
  assert set(series) == set(entries) == {'vit', 'resnet'} and len(drawn['vit']) == 3
  np.testing.assert_allclose(series['vit'], values.mean(0))
  between = np.maximum(0, values.var(0, ddof=1) - (errors ** 2).mean(0))
  np.testing.assert_allclose(stderr['vit'], np.sqrt((between + (errors ** 2).mean(0)) / 3))
  figure = tmp_path / 'joint.png'
  assert joint_figures.depth_curves(by_model, lambda r: r['v'], palette, str(figure), 'title',
                                    'value', errors=lambda r: r['e']) == [str(figure)]
  assert figure.is_file()


def test_the_sweep_trains_each_row_once_per_seed():
  from configs import ablations, quickstart_vit
  plain = sweep.with_seeds(quickstart_vit.get_config(), [0, 1, 2])
  assert plain.sweep.name == 'seeds'
  assert [tuple(r) for r in plain.sweep.rows] == [(f'seed{s}', {'seed': s}) for s in (0, 1, 2)]
  recipe = ablations.get_config('registers')
  seeded = dict(sweep.with_seeds(recipe, [3, 4]).sweep.rows)
  first, fields = recipe.sweep.rows[0]
  assert seeded[f'{first}.seed4'] == dict(fields, seed=4)
  assert len(seeded) == 2 * len(recipe.sweep.rows)
  from vit_jax.errors import ConfigError
  with pytest.raises(ConfigError, match='give each seed once'):
    sweep.with_seeds(recipe, [1, 1])


def test_rows_of_a_seeded_sweep_are_named_by_their_recipes_rows():
  from configs import ablations
  from vit_jax.errors import ConfigError
  recipe = sweep.with_seeds(ablations.get_config('registers'), [0, 1])
  labels = [label for label, _ in recipe.sweep.rows]
  assert sweep.chosen_rows('registers', labels, ['reg4', 'token.seed1']) == [
      'reg4.seed0', 'reg4.seed1', 'token.seed1']
  assert sweep.chosen_rows('registers', labels, None) == labels
  with pytest.raises(ConfigError, match="--rows names reg8, not a row of sweep 'registers'; "
                     'its rows: none, reg4, token, token-reg4'):
    sweep.chosen_rows('registers', labels, ['reg8'])
  assert sweep.chosen_rows('seeds', ['seed0', 'seed1'], ['seed1']) == ['seed1']


def test_the_sweeps_table_summarises_each_rows_seeds(tmp_path):
  accuracy = {'global.seed0': 0.871, 'global.seed1': 0.862, 'global.seed2': 0.880,
              'k3.seed0': 0.877, 'k3.seed1': 0.869, 'k5': 0.86}
  results = [{'label': label, 'fields': {}, 'eval_accuracy': a, 'eval_loss': 0.4,
              'wall_seconds': 60.} for label, a in accuracy.items()]
  sweep.write_table('window', results, str(tmp_path))
  table = (tmp_path / 'window.md').read_text()
  runs = np.array([0.871, 0.862, 0.880])
  sd = runs.std(ddof=1)
  assert (f'| global | 3 | {100 * runs.mean():.2f}% | {100 * sd:.2f} points | '
          f'{100 * sd / np.sqrt(3):.2f} points |') in table
  assert '| k3 | 2 | 87.30% |' in table and '| k5 | ' not in table.split('| row | seeds')[1]
  assert sweep.recipe_row('seed3') == '' and sweep.recipe_row('noseed3') == 'noseed3'
  assert sweep.seeds_table(results[-1:]) == []


def test_a_row_started_from_another_row_starts_from_its_seed():
  from configs import finetune_cases
  recipe = finetune_cases.get_config()
  seeded = dict(sweep.with_seeds(recipe, [0, 1]).sweep.rows)
  assert seeded['head-then-all.seed1']['pretrained'] == 'row:head-only.seed1'
  for label in seeded:  # every reference names a row of the seeded sweep
    sweep.checked_row(sweep.with_seeds(recipe, [0, 1]), label)


@pytest.mark.parametrize('second, says', [
    ({'lr': 0.003, 'seed': 1}, r'runs of different recipes: .*b differs from .*a in lr: 0.001 '
                               r'-> 0.003\. Give the seeds of one recipe'),
    ({'lr': 0.001, 'seed': 0}, 'more than one run of seed 0: give each seed once')])
def test_runs_that_are_not_seeds_of_one_recipe_are_refused(tmp_path, second, says, warm_python):
  import re
  for name, settings in (('a', {'lr': 0.001, 'seed': 0}), ('b', second)):
    (tmp_path / name).mkdir()
    (tmp_path / name / 'config.json').write_text(json.dumps(settings))
  run = subprocess.run(
      [warm_python, '-m', 'analysis', 'attention_distance', '--config',
       'configs/quickstart_vit.py', '--workdir', f'{tmp_path / "a"},{tmp_path / "b"}',
       '--out', str(tmp_path / 'out')], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 1 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert re.search(says, run.stderr.strip().splitlines()[-1]), run.stderr[-500:]


@pytest.mark.parametrize('flags, says', [
    (['--rows', 'none', '--seeds', '0,1'],
     r'runs of different recipes: .*none\.seed1 differs from .*none\.seed0 in lr'),
    (['--seeds', '0,1'], '--seeds names the runs of each row of --rows: give --rows')])
def test_the_rows_of_a_sweep_are_analysed_as_their_seeds_runs(tmp_path, flags, says, warm_python):
  import re
  for seed in (0, 1):
    (tmp_path / f'none.seed{seed}').mkdir()
    (tmp_path / f'none.seed{seed}' / 'config.json').write_text(
        json.dumps({'lr': 0.001 * (seed + 1), 'seed': seed}))
  run = subprocess.run(
      [warm_python, '-m', 'analysis', 'attention_distance', '--config',
       'configs/ablations.py:registers', '--workdir', str(tmp_path), *flags,
       '--out', str(tmp_path / 'out')], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 1 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert re.search(says, run.stderr.strip().splitlines()[-1]), run.stderr[-500:]


@pytest.mark.parametrize('seeds', ['-1', '0,0'])
def test_a_negative_or_repeated_seed_is_one_sentence_before_any_work(tmp_path, seeds, warm_python):
  done = subprocess.run([warm_python, '-m', 'vit_jax.sweep', '--config',
                         'configs/ablations.py:skip', '--workdir', str(tmp_path / 'w'),
                         f'--seeds={seeds}'], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[-1] == (
      f'Error: --seeds={seeds}: give each seed once, each 0 or more (the data order and '
      'initialisation draw from it), e.g. --seeds=0,1,2.')
  assert not (tmp_path / 'w').exists()
