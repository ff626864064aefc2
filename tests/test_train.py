"""The training loop: updates, parallelism, accumulation, checkpoints and resume."""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import orbax.checkpoint as ocp
import pytest

from helpers import TINY_VIT, images, make_folder, read_events, tiny_config
from xla_flags import with_devices
from vit_jax import checkpoint, cpu_devices, input_pipeline, models
from vit_jax.data import pipeline
from vit_jax.errors import WorkdirError
from vit_jax.files import run_folder
from vit_jax.training import budget, finetune, loop, run_state, steps
from vit_jax.training import workdir as workdirs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fixed_batch(n=16, size=8, classes=10):
  rng = np.random.RandomState(0)
  return {'image': images(n, size), 'label': np.eye(classes)[rng.randint(0, classes, n)]}


def state_and_steps(config, devices, classes=10):
  setup = steps.build(config, classes, config.total_steps, devices)
  return setup.state, setup.train_step, setup.shard_batch


@pytest.mark.parametrize('model', [
    dict(model_name='ViT-Ti_16', model=dict(TINY_VIT, patch_size=4)),
    dict(model_name='BiT-M-R50x1', model=dict(num_layers=(1,)), lr=3e-3)])
def test_loss_falls_on_a_fixed_batch(model):
  config = tiny_config(total_steps=30, warmup_steps=0, **model)
  state, step_fn, shard = state_and_steps(config, jax.devices())
  batch = shard(fixed_batch())
  losses = []
  for _ in range(30):
    state, metrics = step_fn(state, batch)
    losses.append(float(metrics['loss']))
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.5 * losses[0], losses


def test_a_training_step_on_every_family(family_name):
  """Two steps of the recipe's training step on the family's tiny model at 32 px:
  finite losses, and every parameter array but the zero-initialised head's bias moves."""
  name, fields = models.FAMILIES[family_name].tiny
  config = tiny_config(model_name=name, model=dict(fields), image_size=32, batch_size=4,
                       total_steps=2, warmup_steps=0)
  state, step_fn, shard = state_and_steps(config, jax.devices()[:1])
  before = jax.device_get(state.params)
  for _ in range(2):
    state, metrics = step_fn(state, shard(fixed_batch(4, 32)))
    assert np.isfinite(float(metrics['loss']))
  moved = jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)), before,
                                 jax.device_get(state.params))
  assert np.mean(jax.tree_util.tree_leaves(moved)) > 0.9, moved


def run_steps(config, devices, steps=3):
  state, step_fn, shard = state_and_steps(config, devices)
  for i in range(steps):
    state, _ = step_fn(state, shard(fixed_batch()))
  return jax.device_get(state.params)


# SGD keeps updates linear in the gradients; Adam's g / sqrt(v) would blow up
# float rounding of near-zero gradients (the N(0, 1e-6) biases) into O(lr) noise.
def test_eight_devices_match_one():
  config = tiny_config(optimizer='sgd', lr=0.1)
  one = run_steps(config, jax.devices()[:1])
  eight = run_steps(config, jax.devices())
  # Same global batch; only XLA's reduction order across devices differs.
  chex.assert_trees_all_close(eight, one, rtol=1e-4, atol=1e-6)


def test_gradient_accumulation_matches_the_large_batch():
  one = run_steps(tiny_config(optimizer='sgd', lr=0.1), jax.devices()[:1])
  four = run_steps(tiny_config(optimizer='sgd', lr=0.1, accum_steps=4), jax.devices()[:1])
  chex.assert_trees_all_close(four, one, rtol=1e-4, atol=1e-6)


def test_weight_decay_touches_kernels_only():
  params = {'dense': {'kernel': jnp.ones((2, 2)), 'bias': jnp.ones(2)}, 'cls': jnp.ones(3)}
  config = tiny_config(optimizer='sgd', momentum=0., lr=1.0, weight_decay=0.1, warmup_steps=0,
                       grad_clip=0.)
  optimizer = steps.make_optimizer(config, total_steps=100)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  updates, _ = optimizer.update(zeros, optimizer.init(params), params)
  np.testing.assert_allclose(updates['dense']['kernel'], -0.1)
  np.testing.assert_allclose(updates['dense']['bias'], 0)
  np.testing.assert_allclose(updates['cls'], 0)


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('images'))
  return make_folder(root, {'train': [12, 12, 8], 'test': [5, 4, 4]}, size=(10, 10))


def logged_scalars(workdir):
  """{tag: [values]} from the TensorBoard event files in `workdir`, in step order."""
  return {tag: [float(v) for _, v in sorted(steps.items())]
          for tag, steps in read_events(workdir).items()}


def test_train_and_evaluate_writes_everything(folder, tmp_path):
  summary = loop.train_and_evaluate(tiny_config(folder), str(tmp_path))
  assert summary['eval_examples'] == 13
  assert 0 <= summary['eval_accuracy'] <= 1
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['3', '6']
  scalars = logged_scalars(tmp_path)
  assert {'loss', 'grad_norm', 'learning_rate', 'eval_accuracy'} <= set(scalars)
  # Logged every step from the second (the first compiles): steps 2..6.
  assert len(scalars['images_per_sec_per_core']) == 5
  assert all(v > 0 for v in scalars['images_per_sec_per_core'])
  params = checkpoint.load(str(tmp_path / 'params.npz'))
  chex.assert_shape(params['head']['kernel'], (32, 3))
  # What the run ended with, for the analysis report and summaries.
  ended = json.loads((tmp_path / run_folder.RESULTS).read_text())
  assert ended['step'] == ended['total_steps'] == 6 and ended['wall_seconds'] > 0
  assert ended['eval_accuracy'] == summary['eval_accuracy']
  # How busy the machine was: the cores, the run's share of them, the load average.
  assert ended['cpu_count'] == len(os.sched_getaffinity(0))
  assert 0 < ended['cpu_share'] and ended['load_average'] >= 0
  # Rerun on the finished workdir: nothing trains, the restored model is evaluated.
  assert loop.train_and_evaluate(tiny_config(folder), str(tmp_path)) == summary
  # Its wall time is the training's, up to the last checkpoint, and the rerun's.
  trained = ocp.CheckpointManager(tmp_path / 'checkpoints').restore(6, args=ocp.args.Composite(
      **{run_state.CLOCK: ocp.args.JsonRestore()}))[run_state.CLOCK]['train_seconds']
  rerun = json.loads((tmp_path / run_folder.RESULTS).read_text())['wall_seconds']
  assert 0 < trained <= ended['wall_seconds'] and rerun > trained
  chex.assert_trees_all_equal(checkpoint.load(str(tmp_path / 'params.npz')), params)


class Interrupted(Exception):
  pass


@pytest.mark.parametrize('ema_decay,augmentation', [
    (0., {}), (0.9, {}), (0., dict(randaugment=(2, 9), mixup_alpha=0.2))])
def test_interrupted_and_resumed_equals_uninterrupted(folder, tmp_path, monkeypatch, ema_decay,
                                                      augmentation):
  """Bit for bit, the weights and (with `ema_decay`) their moving average, with
  every random augmentation of the recipes (Inception crop, flips, RandAugment, mixup)."""
  config = tiny_config(folder, ema_decay=ema_decay)
  config.input.update(augmentation)
  loop.train_and_evaluate(config, str(tmp_path / 'straight'))

  prefetch = input_pipeline.prefetch_to_devices
  def killed_after_three(batches, sharding, size=2):
    for i, batch in enumerate(prefetch(batches, sharding, size)):
      if i == 3:
        raise Interrupted
      yield batch
  monkeypatch.setattr(pipeline, 'prefetch_to_devices', killed_after_three)
  with pytest.raises(Interrupted):
    loop.train_and_evaluate(config, str(tmp_path / 'resumed'))
  monkeypatch.undo()
  assert os.listdir(tmp_path / 'resumed' / 'checkpoints') == ['3']
  loop.train_and_evaluate(config, str(tmp_path / 'resumed'))
  files = ['params.npz'] + ([workdirs.EMA_PARAMS] if ema_decay else [])
  assert os.path.exists(tmp_path / 'straight' / workdirs.EMA_PARAMS) == bool(ema_decay)
  for name in files:
    chex.assert_trees_all_equal(checkpoint.load(str(tmp_path / 'resumed' / name)),
                                checkpoint.load(str(tmp_path / 'straight' / name)))


def test_the_moving_average_with_timms_warm_up_follows_its_formula():
  """ema_warmup: decay_t = min(ema_decay, 1 - t^(-2/3)) after step t, written out
  from timm's ModelEmaV3.get_decay (use_warmup, warmup_gamma 1, warmup_power 2/3,
  update_after_step 0; train.py passes step = the updates so far, and get_decay
  takes step - 1): 0 at the first step, so the average starts at the trained
  weights rather than the initialisation. In float64 from each step's weights."""
  config = tiny_config(ema_decay=0.9999, ema_warmup=True)
  state, step_fn, shard = state_and_steps(config, jax.devices())
  flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(
      jax.device_get(tree))]).astype(np.float64)
  expected = flat(state.params)
  batch = shard(fixed_batch())
  for t in range(1, 6):
    state, _ = step_fn(state, batch)
    timm_step = max(0, t - 0 - 1)  # get_decay's step: the updates so far less one
    decay = 0. if timm_step <= 0 else max(min(1 - (1 + timm_step / 1.) ** (-2 / 3), 0.9999), 0.)
    expected = decay * expected + (1 - decay) * flat(state.params)
    np.testing.assert_allclose(flat(state.ema_params), expected, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(float(steps.ema_decay_at(config, 10_000)),
                             1 - 10_000 ** (-2 / 3), rtol=1e-6)
  # Without the warm-up, 10,000 steps at 0.9999 keep 0.9999^10000 = 37% of the start.
  assert 0.9999 ** 10_000 == pytest.approx(0.368, abs=1e-3)


def test_a_workdir_recorded_before_a_field_existed_resumes_at_its_default(folder, tmp_path):
  loop.train_and_evaluate(tiny_config(folder), str(tmp_path))
  record = json.loads((tmp_path / run_folder.RECORD).read_text())
  del record['ema_warmup']  # a run recorded before the field existed
  (tmp_path / run_folder.RECORD).write_text(json.dumps(record))
  loop.train_and_evaluate(tiny_config(folder), str(tmp_path))  # nothing refused
  with pytest.raises(WorkdirError, match=r"ema_warmup: False -> True"):
    loop.train_and_evaluate(tiny_config(folder, ema_warmup=True), str(tmp_path))


def test_the_moving_average_of_the_weights_follows_its_formula(folder, tmp_path):
  """ema_0 = the initial weights, ema_t = 0.8 ema_(t-1) + 0.2 w_t, in float64
  from each step's weights; evaluated beside the weights and written as
  params_ema.npz by the train command."""
  config = tiny_config(ema_decay=0.8)
  state, step_fn, shard = state_and_steps(config, jax.devices())
  flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(
      jax.device_get(tree))]).astype(np.float64)
  expected = flat(state.params)
  np.testing.assert_array_equal(flat(state.ema_params), expected)
  batch = shard(fixed_batch())
  for _ in range(5):
    state, _ = step_fn(state, batch)
    expected = 0.8 * expected + 0.2 * flat(state.params)
    np.testing.assert_allclose(flat(state.ema_params), expected, rtol=1e-5, atol=1e-7)
  assert np.abs(flat(state.ema_params) - flat(state.params)).max() > 1e-4  # it lags
  # Without ema_decay the state holds no average at all.
  assert state_and_steps(tiny_config(), jax.devices())[0].ema_params is None

  summary = loop.train_and_evaluate(tiny_config(folder, ema_decay=0.8), str(tmp_path))
  assert {'ema_eval_accuracy', 'ema_eval_loss', 'ema_eval_ece', 'ema_eval_brier'} <= set(summary)
  assert summary['ema_eval_examples'] == summary['eval_examples']
  ended = json.loads((tmp_path / run_folder.RESULTS).read_text())
  assert ended['ema_eval_accuracy'] == summary['ema_eval_accuracy']
  assert 'their moving average: accuracy' in loop.evaluation_line(summary)
  averaged = checkpoint.load(str(tmp_path / workdirs.EMA_PARAMS))
  chex.assert_trees_all_equal_shapes(averaged, checkpoint.load(str(tmp_path / 'params.npz')))


def test_a_checkpoint_without_a_moving_average_starts_one_at_its_weights():
  """A run given ema_decay on resume (--reconfigure): the average starts at the
  restored weights; one that stops keeping it leaves the saved average out."""
  with_ema = state_and_steps(tiny_config(ema_decay=0.9), jax.devices()[:1])[0]
  without = state_and_steps(tiny_config(), jax.devices()[:1])[0]
  saved = jax.device_get(flax.serialization.to_state_dict(without))
  saved['params'] = jax.tree_util.tree_map(lambda x: x + 1., saved['params'])
  restored = run_state.migrated(saved, with_ema)
  chex.assert_trees_all_equal(restored.ema_params, restored.params)
  chex.assert_trees_all_equal(restored.params, saved['params'])
  back = run_state.migrated(jax.device_get(flax.serialization.to_state_dict(with_ema)), without)
  assert back.ema_params is None


def test_corrupt_newest_checkpoint_falls_back(folder, tmp_path, caplog):
  config = tiny_config(folder)
  loop.train_and_evaluate(config, str(tmp_path))
  newest = tmp_path / 'checkpoints' / '6'
  for root, _, files in os.walk(newest):
    for f in files:
      with open(os.path.join(root, f), 'wb') as handle:
        handle.write(b'garbage')
  manager = ocp.CheckpointManager(str(tmp_path / 'checkpoints'))
  model_cfg = steps.model_config(config, 3)
  model = models.build_model(model_cfg)
  state = steps.create_train_state(config, model, steps.make_optimizer(config, 6),
                                   steps.init_params(config, model, 8))
  restored, seconds = run_state.restore_latest(
      manager, jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state))
  assert int(restored.step) == 3 and seconds > 0
  assert 'step 6' in caplog.text and 'cannot be used' in caplog.text


def test_non_finite_loss_stops_the_run(folder, tmp_path):
  # A learning rate so large that the first update overflows the parameters.
  diverging = dict(lr=1e38, optimizer='sgd', grad_clip=0., warmup_steps=0)
  with pytest.raises(loop.TrainingError, match='Loss is (nan|inf) .* at step 2'):
    loop.train_and_evaluate(tiny_config(folder, **diverging), str(tmp_path))
  assert not os.path.exists(tmp_path / 'checkpoints' / '3')
  # Checked before a save even between logging steps.
  with pytest.raises(loop.TrainingError, match='at step 3'):
    loop.train_and_evaluate(tiny_config(folder, log_every=100, **diverging),
                             str(tmp_path / 'quiet'))
  assert not os.path.exists(tmp_path / 'quiet' / 'checkpoints' / '3')


def test_fine_tune_from_npz_at_another_resolution(folder, tmp_path):
  loop.train_and_evaluate(tiny_config(folder), str(tmp_path / 'up'))
  summary = loop.train_and_evaluate(
      tiny_config(folder, pretrained=str(tmp_path / 'up' / 'params.npz'), image_size=16,
                  optimizer='sgd', weight_decay=0., total_steps=3),
      str(tmp_path / 'down'))
  assert summary['eval_examples'] == 13
  with pytest.raises(loop.TrainingError, match='gs://vit_models/imagenet21k/'):
    loop.train_and_evaluate(tiny_config(folder, pretrained=str(tmp_path / 'none.npz')),
                             str(tmp_path / 'missing'))


def test_a_fine_tune_whose_pretrained_file_is_gone_goes_on_from_its_own_checkpoint(
    folder, tmp_path, caplog):
  loop.train_and_evaluate(tiny_config(folder, total_steps=3), str(tmp_path / 'up'))
  start = str(tmp_path / 'start.npz')
  os.rename(tmp_path / 'up' / 'params.npz', start)
  tuned = tiny_config(folder, pretrained=start, total_steps=3)
  first = loop.train_and_evaluate(tuned, str(tmp_path / 'down'))
  trained = checkpoint.load(str(tmp_path / 'down' / 'params.npz'))
  os.remove(start)
  again = loop.train_and_evaluate(tuned, str(tmp_path / 'down'))
  assert f'The pretrained checkpoint {start} is gone: the run goes on from its own' in caplog.text
  assert again['eval_accuracy'] == first['eval_accuracy']
  chex.assert_trees_all_close(checkpoint.load(str(tmp_path / 'down' / 'params.npz')), trained)
  with pytest.raises(loop.TrainingError, match=f'{start} does not exist'):  # nothing to go on from
    loop.train_and_evaluate(tuned, str(tmp_path / 'new'))


def test_fine_tune_from_an_augreg_name(folder, tmp_path, monkeypatch):
  from helpers import AUGREG_ROWS, write_augreg_index
  augreg = tmp_path / 'augreg'
  write_augreg_index(augreg, AUGREG_ROWS)
  loop.train_and_evaluate(tiny_config(folder), str(tmp_path / 'up'))
  shutil.copy(tmp_path / 'up' / 'params.npz', augreg / 'Ti_16-i21k-best.npz')
  config = lambda name, **kw: tiny_config(folder, **{
      'pretrained': f'augreg:{name}', 'augreg_dir': str(augreg), 'total_steps': 3, **kw})
  assert finetune.missing_pretrained(config('Ti/16')) is None
  assert 'Ti_16-i1k.npz does not exist' in finetune.missing_pretrained(config('Ti/16@i1k'))
  assert 'set --config.model_name=R26+ViT-S_32' in finetune.missing_pretrained(config('R26+S/32'))
  assert 'No AugReg checkpoint' in finetune.missing_pretrained(config('B/16'))
  monkeypatch.setattr(pipeline, 'can_download', lambda timeout=3.: False)
  with pytest.raises(loop.TrainingError, match='index in gs://vit_models/augreg, which '
                     'cannot be reached'):
    loop.check_inputs(config('Ti/16', augreg_dir=None), str(tmp_path / 'offline'))
  summary = loop.train_and_evaluate(config('Ti/16'), str(tmp_path / 'down'))
  assert summary['eval_examples'] == 13


@pytest.mark.parametrize('text, seconds', [('15m', 900.), ('90s', 90.), ('1h30m', 5400.),
                                           ('2.5m', 150.)])
def test_durations_parse(text, seconds):
  assert budget.parse_duration(text) == seconds


@pytest.mark.parametrize('text', ['abc', '15 minutes', '15mm', 'm'])
def test_bad_durations_are_named(text):
  with pytest.raises(ValueError, match='not a duration'):
    budget.parse_duration(text)


@pytest.mark.parametrize('text', ['0', '120', '2.5'])
def test_a_number_without_its_unit_is_refused_naming_the_units(text):
  with pytest.raises(ValueError, match=f"time_budget '{text}' has no unit: write {text}s, "
                                       f'{text}m or {text}h.'):
    budget.parse_duration(text)


def test_fit_steps_is_the_closed_form():
  timing = budget.Timing(compile_seconds=10., step_seconds=0.1, eval_seconds=5.)
  # 0.1 s a step, 5 s every 100 steps, 1 s every 1000: 0.151 s a step; 10 s compiling,
  # a final evaluation (5 s) and save (1 s), 4 s margin: 80 s for steps.
  assert budget.fit_steps(timing, 100., 100, 1000, save_seconds=1., margin_seconds=4.) == int(
      80 / 0.151)
  assert budget.fit_steps(timing, 10., 100, 1000, save_seconds=1., margin_seconds=4.) == 0


def test_a_time_budget_is_decided_once_per_workdir(folder, tmp_path, monkeypatch):
  # A slow machine as the probe would see it: 1 s a step, 1 s an evaluation.
  slow = budget.Timing(compile_seconds=0., step_seconds=1., eval_seconds=1.)
  monkeypatch.setattr(budget, 'time_steps', lambda *args: slow)
  config = tiny_config(folder, total_steps=50, time_budget='30s')
  summary = loop.train_and_evaluate(config, str(tmp_path))
  record = json.loads((tmp_path / loop.BUDGET_FILE).read_text())
  assert record['recipe_steps'] == 50 and 0 < record['train_seconds'] < 30
  assert 1 <= record['expected_steps'] < 30
  # Resumed or rerun, the workdir keeps its budget without timing again.
  monkeypatch.setattr(budget, 'time_steps', lambda *args: pytest.fail('timed again'))
  assert loop.train_and_evaluate(config, str(tmp_path)) == summary
  # A machine where compiling alone outlasts the budget.
  monkeypatch.setattr(budget, 'time_steps', lambda *args: budget.Timing(60., 1., 1.))
  with pytest.raises(loop.TrainingError, match='leaves no time to train'):
    loop.train_and_evaluate(tiny_config(folder, time_budget='30s'), str(tmp_path / 'short'))


def _steps_that_change_speed(monkeypatch, after: int, delay: float):
  """Training steps that take `delay` seconds more each from step `after` on: a load
  that starts after the budget's probe. The process's clock (`time.perf_counter`,
  which the budget and the loop read) runs ahead by the delays, so the test does
  not wait them out."""
  build = steps.build
  real_clock, lost = time.perf_counter, [0.]
  monkeypatch.setattr(time, 'perf_counter', lambda: real_clock() + lost[0])

  def slowed(*args, **kwargs):
    setup = build(*args, **kwargs)
    calls = []

    def train_step(state, batch):
      calls.append(1)
      if len(calls) > after:
        lost[0] += delay
      return setup.train_step(state, batch)
    return dataclasses.replace(setup, train_step=train_step)
  monkeypatch.setattr(steps, 'build', slowed)


def test_a_run_slowed_after_the_probe_stops_at_its_seconds_with_its_schedule_done(
    folder, tmp_path, monkeypatch):
  """The probe (real: it compiles both steps) reports 1 ms a step; from step 20 on
  each step takes 500 ms more. Training stops at the training seconds of the budget,
  its learning rate decayed to its end."""
  probe = budget.time_steps
  monkeypatch.setattr(budget, 'time_steps', lambda *args: dataclasses.replace(
      probe(*args), step_seconds=1e-3))
  _steps_that_change_speed(monkeypatch, after=20, delay=0.5)
  # Set-up (building, compiling, the probe) took 19 s of a 30 s budget on a loaded
  # CI machine: a minute leaves training time on any of them.
  config = tiny_config(folder, total_steps=100_000, time_budget='60s', log_every=1,
                       eval_every=100_000, checkpoint_every=100_000, warmup_steps=1000)
  start = time.perf_counter()
  summary = loop.train_and_evaluate(config, str(tmp_path))
  wall = time.perf_counter() - start
  stopped = max(int(d) for d in os.listdir(tmp_path / 'checkpoints'))
  assert 20 < stopped < 100_000
  rates = logged_scalars(tmp_path)['learning_rate']
  assert len(rates) == stopped and max(rates) > 0.5 * config.lr  # warm-up then decay
  assert rates[-1] <= 0.01 * config.lr
  # The clock at the last checkpoint: training ended within a step of its seconds.
  seconds = json.loads((tmp_path / loop.BUDGET_FILE).read_text())['train_seconds']
  clock = json.loads((tmp_path / 'checkpoints' / str(stopped) / 'clock' / 'metadata').read_text())
  assert seconds <= clock['train_seconds'] <= seconds + 1.
  # Whether the final evaluation and saves fit the budget's reserve is measured by
  # the quick start (docs/results.md), not here: on a loaded machine they take what
  # the load leaves. Without the clock the run would take 100,000 steps of 500 ms.
  assert wall < 5 * 60., wall
  assert summary['eval_examples'] == 13 and (tmp_path / 'params.npz').exists()
  # Rerun, the workdir's clock has run out (kept in its checkpoint): nothing trains.
  assert loop.train_and_evaluate(config, str(tmp_path)) == summary
  assert max(int(d) for d in os.listdir(tmp_path / 'checkpoints')) == stopped


def test_a_run_faster_than_its_probe_finishes_the_recipe(folder, tmp_path, monkeypatch):
  """The probe sees a slow machine (1 s a step); the real steps take milliseconds:
  the run trains the recipe's steps, its schedule that of the steps."""
  monkeypatch.setattr(budget, 'time_steps', lambda *args: budget.Timing(0., 1., 1.))
  config = tiny_config(folder, total_steps=40, time_budget='1h', log_every=1, warmup_steps=0)
  loop.train_and_evaluate(config, str(tmp_path))
  assert max(int(d) for d in os.listdir(tmp_path / 'checkpoints')) == 40
  rates = logged_scalars(tmp_path)['learning_rate']
  schedule = steps.learning_rate_schedule(config, 40)
  # The clock's share (seconds of an hour) stays below the steps' (k / 40) after step
  # 0, where set-up and compiling (up to 30 s on a loaded machine) give it <= 1%.
  np.testing.assert_allclose(rates, [float(schedule(k / 40)) for k in range(40)], rtol=1e-3)
  np.testing.assert_allclose(rates[1:], [float(schedule(k / 40)) for k in range(1, 40)],
                             rtol=1e-6)


def test_the_clock_counts_earlier_runs_and_the_larger_progress():
  clock = budget.Clock(total_steps=100, seconds=10., spent=5.)
  assert 0.5 <= clock.progress(10) < 0.6 and not clock.done(10)
  assert clock.progress(80) == 0.8 and clock.done(100)
  assert budget.Clock(total_steps=100, seconds=10., spent=10.).done(1)
  unbudgeted = budget.Clock(total_steps=100)
  assert unbudgeted.progress(30) == 0.3 and not unbudgeted.done(99) and unbudgeted.done(100)


def test_the_budget_probe_times_real_steps(folder):
  config = tiny_config(folder)
  setup = steps.build(config, 3, 6)
  source = input_pipeline.get_source(folder, 'train')
  batches = input_pipeline.prefetch_to_devices(iter(input_pipeline.train_dataset(
      source, batch_size=16, image_size=8)),
      jax.sharding.NamedSharding(setup.mesh, jax.sharding.PartitionSpec('data')))
  before = jax.tree_util.tree_map(np.asarray, setup.state.params)
  calls = []
  timing = budget.time_steps(setup.train_step, setup.state, batches,
                             lambda: calls.append(1), eval_batches=4)
  assert timing.step_seconds > 0 and timing.compile_seconds >= 0 and len(calls) == 2
  chex.assert_trees_all_equal(jax.tree_util.tree_map(np.asarray, setup.state.params), before)


def test_wrong_config_key_is_named(tmp_path, warm_python):
  result = subprocess.run(
      [warm_python, '-m', 'vit_jax.train', '--config', f'{REPO}/configs/quickstart_vit.py',
       '--workdir', str(tmp_path), '--config.learning_rat=0.1'],
      capture_output=True, text=True, cwd=REPO, timeout=300)
  assert result.returncode != 0
  assert 'learning_rat' in result.stderr


def test_a_run_without_its_inputs_names_all_of_them_before_any_work(tmp_path, monkeypatch):
  monkeypatch.setattr(pipeline, 'can_download', lambda timeout=3.: False)

  def no_work(*args, **kwargs):
    raise AssertionError('data was read or a download started before the inputs were checked')
  monkeypatch.setattr(pipeline, 'get_source', no_work)
  monkeypatch.setattr(steps, 'build', no_work)
  config = tiny_config('cifar10', pretrained=str(tmp_path / 'ViT-B_16.npz'),
                       data_dir=str(tmp_path / 'tfds'))
  with pytest.raises(steps.TrainingError) as error:
    loop.train_and_evaluate(config, str(tmp_path / 'work'))
  message = str(error.value)
  assert 'ViT-B_16.npz does not exist' in message and 'gs://vit_models/imagenet21k/' in message
  assert "TFDS dataset 'cifar10' is not prepared" in message and 'storage.googleapis.com' in message
  assert 'scripts/get_data.sh' in message and '--config.dataset=fashion_mnist' in message
  # A shipped offline copy makes Fashion-MNIST available without network.
  assert input_pipeline.unavailable('fashion_mnist') is None
  assert 'does not exist' in input_pipeline.unavailable('folder:' + str(tmp_path / 'none'))


def test_the_headline_command_offline_fails_at_once_naming_the_checkpoint(tmp_path, warm_python):
  result = subprocess.run(
      [warm_python, '-m', 'vit_jax.train', '--config', f'{REPO}/configs/vit_b16.py',
       '--workdir', str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=300)
  assert result.returncode != 0
  assert 'This run cannot start' in result.stderr
  assert 'ViT-B_16.npz does not exist' in result.stderr
  if not input_pipeline.can_download():
    assert "TFDS dataset 'cifar10' is not prepared" in result.stderr


@pytest.mark.parametrize('cores, batch, accum, processes, expected', [
    (2, 128, 1, 1, 2),   # one device per core
    (6, 128, 1, 1, 4),   # 6 does not divide 128: the largest count that does
    (8, 128, 4, 1, 8),   # accumulation pieces of 32 still split 8 ways
    (8, 96, 1, 2, 8),    # eval batch 512 and train 96 share 32: 16 per process
    (4, 100, 1, 3, 1),   # an invalid batch for 3 processes is left to the batch check
    (1, 128, 1, 1, 1),
])
def test_cpu_device_count_divides_every_batch(cores, batch, accum, processes, expected):
  config = tiny_config(batch_size=batch, accum_steps=accum, eval_batch_size=512)
  assert cpu_devices.cpu_device_count(config, cores, processes) == expected
  # At lowered priority (nice 19 beside other work, where two devices deadlocked at
  # an all-reduce), one device whatever the cores.
  assert cpu_devices.cpu_device_count(config, cores, processes, niceness=19) == 1


def test_non_positive_batch_or_accumulation_is_named(tmp_path):
  for fields in (dict(accum_steps=0), dict(batch_size=0)):
    with pytest.raises(ValueError, match=f'config.{next(iter(fields))} is 0; it must be an '
                                         'integer >= 1'):
      loop.train_and_evaluate(tiny_config('fashion_mnist', **fields), str(tmp_path))


def test_cpu_split_leaves_an_explicit_device_count_alone(monkeypatch):
  updates = []
  monkeypatch.setattr(cpu_devices.jax.config, 'update', lambda *args: updates.append(args))
  monkeypatch.setattr(cpu_devices.os, 'sched_getaffinity', lambda pid: {0, 1})
  monkeypatch.delenv('JAX_NUM_CPU_DEVICES', raising=False)
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
  cpu_devices.split_cpu_into_devices(tiny_config(), requested=0)
  assert updates == []
  cpu_devices.split_cpu_into_devices(tiny_config(), requested=4)
  monkeypatch.setenv('XLA_FLAGS', '')
  cpu_devices.split_cpu_into_devices(tiny_config(), requested=0)
  assert updates == [('jax_num_cpu_devices', 4), ('jax_num_cpu_devices', 2)]


def test_split_cpu_devices_wait_for_each_other_at_collectives(monkeypatch):
  """Several CPU devices get XLA's collective timeouts raised (a core taken by
  other work made XLA:CPU abort a run after 40 s); a value the user set is kept,
  and one device changes nothing."""
  monkeypatch.setattr(cpu_devices.jax.config, 'update', lambda *args: None)
  monkeypatch.delenv('JAX_NUM_CPU_DEVICES', raising=False)
  monkeypatch.setenv('XLA_FLAGS', '')
  cpu_devices.split_cpu_into_devices(tiny_config(), requested=1)
  assert os.environ['XLA_FLAGS'] == ''
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_collective_timeout_seconds=5')
  cpu_devices.split_cpu_into_devices(tiny_config(), requested=2)
  assert os.environ['XLA_FLAGS'].split() == [
      '--xla_cpu_collective_timeout_seconds=5',
      '--xla_cpu_collective_call_terminate_timeout_seconds=3600']


@pytest.mark.parametrize('platform, version, measured', [
    ('cpu', '0.10.2', True), ('cpu', '0.12.0.1', True), ('cpu', '0.11.2', False),
    ('cpu', '0.10.20', False), ('gpu', '0.10.2', False), ('tpu', '0.12.0.1', False)])
def test_cpu_steps_choose_ynnpack_work_only_on_a_measured_jaxlib(monkeypatch, platform, version,
                                                                measured):
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_collective_timeout_seconds=5')
  options = cpu_devices.gradient_compiler_options(platform, version)
  # The user's own choice in XLA_FLAGS is kept.
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_experimental_ynn_fusion_type=dot')
  assert cpu_devices.gradient_compiler_options(platform, version) is None
  if not measured:
    assert options is None
    return
  assert options == {'xla_cpu_experimental_ynn_fusion_type':
                     'LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_REDUCE,'
                     'LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION'}


def _ynn_fusions_ops(hlo_text):
  """For each YNNPACK fusion of a compiled program, the ops of the computation it
  calls, leaving out parameters, constants and layout ops."""
  found = []
  for call in re.finditer(r'calls=%?([\w.\-]+)[^\n]*__ynn_fusion', hlo_text):
    body = re.search(r'\n%?' + re.escape(call.group(1)) + r' .*?\n}', hlo_text, re.S).group(0)
    found.append(set(re.findall(r'= \S+ ([a-z][\w\-]*)\(', body))
                 - {'parameter', 'constant', 'bitcast', 'broadcast'})
  return found


def test_the_cpu_train_step_keeps_its_numbers_with_its_compiler_options(monkeypatch):
  """The train command's step of a small BiT, compiled with `gradient_compiler_options`,
  gives the parameters XLA's default compilation gives within float32 rounding. Where
  the options apply, YNNPACK gets dots with elementwise work fused in; by default it
  gets each dot alone."""
  config = tiny_config(model_name='BiT-M-R50x1', image_size=16, optimizer='sgd', lr=0.1,
                       model=dict(num_layers=(1, 1), width_factor=0.5, root_pool=False))
  rng = np.random.RandomState(0)
  batch = {'image': rng.uniform(-1, 1, (16, 16, 16, 3)).astype(np.float32),
           'label': np.eye(3, dtype=np.float32)[rng.randint(0, 3, 16)]}
  applies = cpu_devices.gradient_compiler_options('cpu') is not None
  results = {}
  for name in ('tuned', 'default'):
    if name == 'default':
      monkeypatch.setattr(cpu_devices, 'gradient_compiler_options', lambda *args: None)
    setup = steps.build(config, 3, total_steps=10)
    state, placed = setup.state, setup.shard_batch(batch)
    if applies:
      text = setup.train_step.lower(state, placed).compile().as_text()
      dots_with_more = [ops for ops in _ynn_fusions_ops(text) if 'dot' in ops and ops - {'dot'}]
      assert bool(dots_with_more) == (name == 'tuned'), dots_with_more
    for _ in range(2):
      state, metrics = setup.train_step(state, placed)
    results[name] = jax.device_get((state.params, metrics['loss']))
  chex.assert_trees_all_close(results['tuned'], results['default'], rtol=2e-5, atol=2e-6)


def symmetric_folder(root, n=16, size=8):
  """Left-right symmetric images: random flips leave them unchanged, so the data a
  process sees does not depend on which process drew which flip."""
  rng = np.random.RandomState(0)
  for i in range(n):
    d = os.path.join(root, 'train', f'class_{i % 2}')
    os.makedirs(d, exist_ok=True)
    half = rng.randint(0, 256, (size, size // 2, 3), dtype=np.uint8)
    pixels = np.concatenate([half, half[:, ::-1]], axis=1)
    PIL.Image.fromarray(pixels).save(os.path.join(d, f'{i}.png'))
  shutil.copytree(os.path.join(root, 'train'), os.path.join(root, 'test'))
  return f'folder:{root}'


@pytest.mark.slow
def test_two_processes_agree_with_one(tmp_path):
  """Full-batch SGD on order-free data: 2 processes x 1 device = 1 process x 2 devices."""
  dataset = symmetric_folder(str(tmp_path / 'data'))
  flags_common = [
      '--config', f'{REPO}/configs/quickstart_vit.py', f'--config.dataset={dataset}',
      '--config.image_size=8', '--config.input.crop=False', '--config.batch_size=16',
      '--config.eval_batch_size=16', '--config.total_steps=3', '--config.warmup_steps=0',
      '--config.optimizer=sgd', '--config.lr=0.1', '--config.log_every=1',
      '--config.model.hidden_size=32', '--config.model.mlp_dim=64', '--config.model.num_layers=2']

  def run(workdir, devices, extra=(), background=False):
    env = dict(os.environ, XLA_FLAGS=with_devices(devices))
    command = [sys.executable, '-m', 'vit_jax.train', '--workdir', str(workdir),
               *flags_common, *extra]
    if background:
      return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

  address = ['--coordinator_address=127.0.0.1:29517', '--num_processes=2']
  workers = [run(tmp_path / 'two', 1, [*address, f'--process_id={i}'], background=True)
             for i in range(2)]
  for index, worker in enumerate(workers):
    output, _ = worker.communicate(timeout=600)
    assert worker.returncode == 0, output[-3000:]
    assert f'Process {index} of 2, 2 devices in all' in output
  run(tmp_path / 'one', 2)
  chex.assert_trees_all_close(checkpoint.load(str(tmp_path / 'two' / 'params.npz')),
                              checkpoint.load(str(tmp_path / 'one' / 'params.npz')),
                              rtol=1e-4, atol=1e-6)



def test_the_step_builds_and_runs_without_tensorflow():
  """Benchmarks and analysis build the train step on machines with JAX alone."""
  script = f'''
import sys
sys.modules['tensorflow'] = None  # any import of TensorFlow now fails
import numpy as np
from configs import common
from vit_jax import checkpoint, models
from vit_jax.training import finetune, steps
config = common.base_config()
config.update(model_name='ViT-Ti_16', image_size=8, batch_size=16, optimizer='adam', lr=1e-2)
config.model.update({dict(TINY_VIT, patch_size=4)!r})
setup = steps.build(config, 10, total_steps=2)
batch = {{'image': np.zeros((16, 8, 8, 3), np.float32),
         'label': np.eye(10, dtype=np.float32)[np.arange(16) % 10]}}
state, metrics = setup.train_step(setup.state, setup.shard_batch(batch))
assert np.isfinite(float(metrics['loss']))
'''
  result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
  assert result.returncode == 0, result.stderr


def test_a_run_reads_its_pretrained_file_once_before_the_state_is_built(tmp_path):
  """`finetune.initial_params` reads and fits `pretrained`; `steps.build` reads no
  file, and refuses a recipe that names one without the parameters it gives."""
  fresh = tiny_config()
  start = str(tmp_path / 'start.npz')
  checkpoint.save(start, jax.device_get(steps.build(fresh, 10, 6).state.params))
  chex.assert_trees_all_close(finetune.initial_params(fresh, 10),
                              steps.build(fresh, 10, 6).state.params)
  tuned = tiny_config(pretrained=start, keep_head=True)
  with pytest.raises(ValueError, match='steps.build does not read'):
    steps.build(tuned, 10, 6)
  params = finetune.initial_params(tuned, 10)
  chex.assert_trees_all_close(jax.device_get(params), checkpoint.load(start))
  chex.assert_trees_all_close(steps.build(tuned, 10, 6, params=params).state.params, params)
