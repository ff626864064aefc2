"""Parameters kept at named steps of a run (`keep_params_at`) and the analysis of
one model at several steps (`--steps`), as Park & Kim compare the early phase of
training with the end."""
import json
import os
import subprocess

import chex
import numpy as np
import pytest

from helpers import make_folder, tiny_config
from vit_jax import checkpoint
from vit_jax.errors import ConfigError
from vit_jax.training import loop, settings
from vit_jax.training import workdir as workdirs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """A tiny run of 6 steps (warm-up 2) keeping the parameters of steps 2 and 6."""
  root = tmp_path_factory.mktemp('phases')
  folder = make_folder(str(root / 'images'), {'train': [12, 12, 8], 'test': [5, 4, 4]},
                       size=(10, 10))
  config = tiny_config(folder, keep_params_at='warmup,6')
  workdir = str(root / 'run')
  loop.train_and_evaluate(config, workdir)
  # The analysis's recipe says another warm-up: 'warmup' is the run's own (recorded).
  recipe = root / 'tiny.py'
  recipe.write_text('import ml_collections\n\n\ndef get_config():\n  return '
                    f'ml_collections.ConfigDict({dict(config.to_dict(), warmup_steps=4)!r})\n')
  return workdir, str(recipe), root


def test_steps_are_parsed_in_order_once_each():
  assert workdirs.kept_steps('1000, warmup,3,warmup', 500) == (3, 500, 1000)
  assert workdirs.kept_steps('', 500) == ()
  with pytest.raises(ValueError, match="'warm' is neither 'warmup' nor a step number"):
    workdirs.kept_steps('warm', 500)


def test_a_bad_list_of_steps_is_named():
  with pytest.raises(ConfigError, match="config.keep_params_at is '0'; it must be '' or steps"):
    settings.check(tiny_config('images', keep_params_at='0'))


def test_warmup_without_a_warm_up_is_refused_before_the_run():
  with pytest.raises(ConfigError, match="names 'warmup', but config.warmup_steps is 0"):
    settings.check(tiny_config('images', keep_params_at='10, warmup', warmup_steps=0))
  settings.check(tiny_config('images', keep_params_at='10', warmup_steps=0))


def test_the_run_keeps_the_parameters_of_the_named_steps(run):
  workdir, _, _ = run
  assert sorted(f for f in os.listdir(workdir) if f.startswith('params')) == [
      'params.npz', 'params_2.npz', 'params_6.npz']
  # Step 6 is the last: its kept parameters are the final ones exactly, so a kept
  # file holds the state after that step's update.
  chex.assert_trees_all_equal(checkpoint.load(os.path.join(workdir, 'params_6.npz')),
                              checkpoint.load(os.path.join(workdir, 'params.npz')))
  warmup = checkpoint.load(os.path.join(workdir, 'params_2.npz'))
  assert not np.array_equal(warmup['head']['kernel'],
                            checkpoint.load(os.path.join(workdir, 'params.npz'))['head']['kernel'])


def test_the_analysis_runs_on_each_step_with_the_joint_max_eigenvalue_spectra(run, warm_python):
  workdir, recipe, root = run
  out = root / 'analysis'
  subprocess.run([warm_python, '-m', 'analysis', 'hessian', '--config', recipe,
                  '--workdir', workdir, '--steps', 'warmup,last', '--num_images', '16',
                  '--batch_size', '8', '--hessian_batches', '2', '--lanczos_steps', '6',
                  '--out', str(out)], check=True, cwd=ROOT)
  result = json.loads((out / 'hessian.json').read_text())
  assert list(result) == ['tiny_step2', 'tiny_step6']
  assert result['tiny_step2']['top_per_minibatch'] != result['tiny_step6']['top_per_minibatch']
  assert (out / 'joint_hessian_max.png').exists()
  subjects = json.loads((out / 'subjects.json').read_text())
  assert subjects['tiny_step2']['source'] == os.path.join(workdir, 'params_2.npz')


def test_a_model_given_as_its_seeds_runs_is_one_model_per_step_over_its_seeds(run, warm_python):
  workdir, recipe, root = run
  second = str(root / 'run_seed1')
  config = tiny_config(f'folder:{root / "images"}', keep_params_at='warmup,6', seed=1)
  loop.train_and_evaluate(config, second)
  out = root / 'analysis_seeds'
  subprocess.run([warm_python, '-m', 'analysis', 'attention_distance', '--config', recipe,
                  '--workdir', f'{workdir},{second}', '--steps', 'warmup,last',
                  '--num_images', '8', '--batch_size', '8', '--out', str(out)],
                 check=True, cwd=ROOT)
  result = json.loads((out / 'attention_distance.json').read_text())
  assert sorted(result) == ['tiny_step2_seed0', 'tiny_step2_seed1', 'tiny_step6_seed0',
                            'tiny_step6_seed1']
  subjects = json.loads((out / 'subjects.json').read_text())
  assert subjects['tiny_step2_seed1']['source'] == os.path.join(second, 'params_2.npz')
  assert (subjects['tiny_step6_seed1']['group'], subjects['tiny_step6_seed1']['seed']) == (
      'tiny_step6', 1)
  # Each step is one model whose runs are the seeds' parameters at that step.
  over_runs = json.loads((out / 'runs.json').read_text())['attention_distance']
  assert sorted(over_runs) == ['tiny_step2', 'tiny_step6']
  for step in (2, 6):
    summary = over_runs[f'tiny_step{step}']
    assert summary['runs'] == [f'tiny_step{step}_seed0', f'tiny_step{step}_seed1']
    per_run = np.array([result[label]['distance_per_layer_head'] for label in summary['runs']])
    np.testing.assert_allclose(summary['mean']['distance_per_layer_head'], per_run.mean(0),
                               rtol=1e-6)
    np.testing.assert_allclose(summary['sd']['distance_per_layer_head'],
                               per_run.std(0, ddof=1), rtol=1e-5, atol=1e-7)


def test_a_step_the_run_did_not_keep_is_refused_naming_those_kept(run, warm_python):
  workdir, recipe, root = run
  refused = subprocess.run([warm_python, '-m', 'analysis', 'hessian', '--config', recipe,
                            '--workdir', workdir, '--steps', '4', '--out', str(root / 'x')],
                           cwd=ROOT, capture_output=True, text=True)
  assert refused.returncode != 0
  assert 'kept no parameters at step 4' in refused.stderr
  assert 'Kept there: params_2.npz, params_6.npz' in refused.stderr
  assert '--config.keep_params_at=4' in refused.stderr


@pytest.mark.slow
def test_two_models_of_one_recipe_at_steps_are_four_models_each_from_its_own_run(run, warm_python):
  """--config and --config2 of one recipe file, each at warm-up and last: the second
  model's labels end in '_2' before the steps are added, so no label is given twice
  and each model at each step reads its own run's parameters."""
  workdir, recipe, root = run
  second = str(root / 'run_other')
  loop.train_and_evaluate(tiny_config(f'folder:{root / "images"}', keep_params_at='warmup,6',
                                      seed=2), second)
  out = root / 'analysis_two'
  subprocess.run([warm_python, '-m', 'analysis', 'attention_distance', '--config', recipe,
                  '--workdir', workdir, '--config2', recipe, '--workdir2', second,
                  '--steps', 'warmup,last', '--num_images', '8', '--batch_size', '8',
                  '--out', str(out)], check=True, cwd=ROOT)
  subjects = json.loads((out / 'subjects.json').read_text())
  assert {label: subjects[label]['source'] for label in subjects} == {
      'tiny_step2': os.path.join(workdir, 'params_2.npz'),
      'tiny_step6': os.path.join(workdir, 'params.npz'),
      'tiny_2_step2': os.path.join(second, 'params_2.npz'),
      'tiny_2_step6': os.path.join(second, 'params.npz')}
