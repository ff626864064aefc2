"""The optimizer is a plain step-based optax chain whose learning rate is an
`optax.inject_hyperparams` hyperparameter; a budgeted run sets it from outside;
checkpoints of the layout before (the schedule's `ScaleByScheduleState`) resume."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from helpers import tiny_config
from vit_jax.training import run_state, steps

TOTAL = 12


def _params():
  rng = np.random.RandomState(0)
  return {'body': {'kernel': jnp.asarray(rng.randn(3, 4), jnp.float32),
                   'bias': jnp.asarray(rng.randn(4), jnp.float32)},
          'head': {'kernel': jnp.asarray(rng.randn(4, 2), jnp.float32)}}


def _grads(k):
  rng = np.random.RandomState(100 + k)
  return jax.tree_util.tree_map(lambda p: jnp.asarray(rng.randn(*p.shape), jnp.float32),
                                _params())


def _progress_rate(schedule):
  """The rate as the optimizer took it before: -schedule(progress), the progress
  given to each update from the host as float32(steps done / total)."""
  def update(updates, state, params=None, *, progress):
    del params
    rate = schedule(progress)
    return (jax.tree_util.tree_map(lambda u: (-rate * u).astype(u.dtype), updates),
            optax.ScaleByScheduleState(count=optax.safe_increment(state.count)))
  return optax.GradientTransformationExtraArgs(
      lambda params: optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32)), update)


def _reference(config, total):
  """The chain of `make_optimizer` written out with the former progress-fed rate."""
  schedule = steps.learning_rate_schedule(config, total)
  return optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.scale_by_adam(),
                     optax.add_decayed_weights(config.weight_decay / config.lr,
                                               mask=steps.kernel_mask),
                     _progress_rate(schedule))


@pytest.mark.numerics
@pytest.mark.parametrize('decay', ['cosine', 'linear'])
def test_an_unbudgeted_run_is_bit_identical_to_the_progress_fed_rate(decay):
  """Over 40 steps, 7 of whose k / 40 XLA:CPU's division gets an ulp off."""
  total = 40
  config = tiny_config(decay=decay, warmup_steps=10, grad_clip=1.0)
  new, old = steps.make_optimizer(config, total), _reference(config, total)
  new_update = jax.jit(new.update)
  old_update = jax.jit(lambda g, s, p, progress: old.update(g, s, p, progress=progress))
  params_new = params_old = _params()
  state_new, state_old = new.init(params_new), old.init(params_old)
  for k in range(total + 2):  # past the end, where both hold the rate at 0
    updates, state_new = new_update(_grads(k), state_new, params_new)
    params_new = optax.apply_updates(params_new, updates)
    updates, state_old = old_update(_grads(k), state_old, params_old,
                                    np.float32(min(k / total, 1.)))
    params_old = optax.apply_updates(params_old, updates)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params_new, params_old)
    # The rate it used (XLA's compiled cosine and the eager one differ by ulps of 1).
    np.testing.assert_allclose(float(steps.last_learning_rate(state_new)), float(
        steps.learning_rate_schedule(config, total)(np.float32(min(k / total, 1.)))),
        rtol=1e-6, atol=1e-6 * config.lr)


def test_a_budgeted_run_takes_the_rate_set_from_outside():
  config = tiny_config(time_budget='15m', optimizer='sgd', momentum=0., weight_decay=0.,
                       grad_clip=0., lr_mults=(('^head/', 0.5),))
  setup = steps.build(config, 10, TOTAL, jax.devices()[:1])
  batch = setup.shard_batch({'image': np.zeros((16, 8, 8, 3), np.float32),
                             'label': np.eye(10, dtype=np.float32)[np.arange(16) % 10]})
  before = jax.device_get(setup.state.params)
  moved = {}
  for rate in (0.25, 0.5):
    fresh = jax.tree_util.tree_map(lambda x: x.copy(), setup.state)  # the step donates it
    state, metrics = setup.train_step(steps.set_learning_rate(fresh, rate), batch)
    assert float(metrics['learning_rate']) == rate
    moved[rate] = jax.tree_util.tree_map(np.subtract, jax.device_get(state.params), before)
  # Plain SGD: each step is -rate * factor * gradient, twice as long at twice the rate.
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, 2 * b, rtol=1e-5, atol=1e-9),
                         moved[0.5], moved[0.25])
  assert np.abs(moved[0.25]['head']['bias']).max() > 0


def _earlier_layout(state):
  """The state as the optimizer before this one held it: `ScaleByScheduleState(count)`
  where the rate's `inject_hyperparams` state is now."""
  is_rate = lambda n: isinstance(n, optax.InjectStatefulHyperparamsState)
  return state.replace(opt_state=jax.tree_util.tree_map(
      lambda n: optax.ScaleByScheduleState(count=n.count) if is_rate(n) else n,
      state.opt_state, is_leaf=is_rate))


def _trained(config, devices, count):
  setup = steps.build(config, 10, TOTAL, devices)
  rng = np.random.RandomState(0)
  state = setup.state
  for _ in range(count):
    batch = setup.shard_batch({'image': rng.uniform(-1, 1, (16, 8, 8, 3)).astype(np.float32),
                               'label': np.eye(10, dtype=np.float32)[rng.randint(0, 10, 16)]})
    state, _ = setup.train_step(state, batch)
  return setup, state


@pytest.mark.parametrize('lr_mults', [(), (('^head/', 0.),), (('^head/', 2.),)])
def test_a_checkpoint_of_the_earlier_layout_resumes_exactly(tmp_path, lr_mults):
  config = tiny_config(lr_mults=lr_mults)
  devices = jax.devices()[:1]
  setup, state = _trained(config, devices, 3)
  manager = ocp.CheckpointManager(str(tmp_path), options=ocp.CheckpointManagerOptions(
      enable_async_checkpointing=False))
  run_state.save(manager, 3, _earlier_layout(state), 7.)
  restored, seconds = run_state.resume(manager, setup.state)
  assert seconds == 7.
  # Everything but the last rate, which the next update recomputes from the count.
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(restored),
                         jax.device_get(steps.set_learning_rate(state, 0.)))
  batch = setup.shard_batch({'image': np.ones((16, 8, 8, 3), np.float32),
                             'label': np.eye(10, dtype=np.float32)[np.arange(16) % 10]})
  (a, metrics_a), (b, metrics_b) = setup.train_step(restored, batch), setup.train_step(state, batch)
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))
  assert float(metrics_a['learning_rate']) == float(metrics_b['learning_rate']) > 0


def test_a_run_reconfigured_to_a_budget_resumes_its_unbudgeted_checkpoint(tmp_path):
  config = tiny_config()
  devices = jax.devices()[:1]
  _, state = _trained(config, devices, 2)
  manager = ocp.CheckpointManager(str(tmp_path), options=ocp.CheckpointManagerOptions(
      enable_async_checkpointing=False))
  run_state.save(manager, 2, state, 1.)
  budgeted = steps.build(tiny_config(time_budget='15m'), 10, TOTAL, devices)
  restored, _ = run_state.resume(manager, budgeted.state)
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(restored.params),
                         jax.device_get(state.params))
  assert int(restored.step) == 2


def test_a_checkpoint_of_another_model_is_still_refused(tmp_path):
  devices = jax.devices()[:1]
  _, state = _trained(tiny_config(), devices, 1)
  manager = ocp.CheckpointManager(str(tmp_path), options=ocp.CheckpointManagerOptions(
      enable_async_checkpointing=False))
  run_state.save(manager, 1, _earlier_layout(state), 1.)
  other = steps.build(tiny_config(model=dict(tiny_config().model, num_layers=3)), 10, TOTAL,
                      devices)
  with pytest.raises(run_state.CheckpointError, match='another tree than this recipe'):
    run_state.resume(manager, other.state)
