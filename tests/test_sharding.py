"""Sharded computation on 8 simulated CPU devices: a forward pass with the batch
split equals one device; a fully sharded (fsdp) training step equals the
replicated one, holds an eighth of the state per device, and its checkpoint
resumes on another number of devices."""
import chex
import flax
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from configs import common
from helpers import TINY_VIT, assert_close_at_scale, images, init, perturbed, tiny_bit, tiny_vit
from vit_jax import checkpoint, errors
from vit_jax.models import vit_layouts
from vit_jax.training import finetune, run_state, sharding, steps


@pytest.mark.parametrize('make', [tiny_vit, tiny_bit])
def test_sharded_forward_equals_single_device(make):
  assert jax.device_count() == 8
  model = make()
  variables = perturbed(init(model))
  x = images(16)
  single = jax.jit(model.apply)(variables, x)

  mesh = Mesh(np.array(jax.devices()), ('data',))
  x_sharded = jax.device_put(x, NamedSharding(mesh, P('data')))
  replicated = jax.device_put(variables, NamedSharding(mesh, P()))
  sharded = jax.jit(model.apply, out_shardings=NamedSharding(mesh, P('data')))(
      replicated, x_sharded)
  assert len(sharded.sharding.device_set) == 8
  chex.assert_shape(sharded.addressable_shards[0].data, (2, 10))
  # Same program per example; only the reduction order of XLA's kernels may differ.
  chex.assert_trees_all_close(np.asarray(sharded), np.asarray(single), rtol=1e-5, atol=1e-6)


# Fully sharded training (`config.sharding='fsdp'`, vit_jax/training/sharding.py).


def test_fsdp_splits_the_largest_divisible_axis():
  assert sharding.leaf_spec((3, 3, 3, 64), 8, 'fsdp') == P(None, None, None, 'data')
  assert sharding.leaf_spec((256, 64), 8, 'fsdp') == P('data', None)
  assert sharding.leaf_spec((64, 64), 8, 'fsdp') == P('data', None)  # the first of equals
  assert sharding.leaf_spec((10,), 8, 'fsdp') == P()  # no divisible axis: replicated
  assert sharding.leaf_spec((), 8, 'fsdp') == P()
  assert sharding.leaf_spec((256, 64), 1, 'fsdp') == P()
  assert sharding.leaf_spec((256, 64), 8, 'data') == P()
  with pytest.raises(ValueError, match='Unknown sharding'):
    sharding.leaf_spec((8,), 8, 'zero3')


def test_tensor_parallel_rules_split_heads_and_hidden_units():
  """The model axis splits q/k/v and out kernels by head and the MLP by hidden unit
  (axes counted from the end, so stacked blocks and optimizer state follow); fsdp
  then takes the largest other axis the data axis divides."""
  block = 'Transformer/encoderblock_0/'
  attention, mlp = block + 'MultiHeadDotProductAttention_1/', block + 'MlpBlock_3/'
  spec = lambda shape, path, devices=1, rule='data': sharding.leaf_spec(shape, devices, rule,
                                                                        path, model=4)
  assert spec((32, 4, 8), attention + 'query/kernel') == P(None, 'model', None)
  assert spec((4, 8), attention + 'value/bias') == P('model', None)
  assert spec((4, 8, 32), attention + 'out/kernel') == P('model', None, None)
  assert spec((32,), attention + 'out/bias') == P()
  assert spec((32, 64), mlp + 'Dense_0/kernel') == P(None, 'model')
  assert spec((64,), mlp + 'Dense_0/bias') == P('model')
  assert spec((64, 32), mlp + 'Dense_1/kernel') == P('model', None)
  assert spec((32,), block + 'LayerNorm_0/scale') == P()
  # With fsdp over 2 data devices; a scanned block's layer axis comes first.
  assert spec((32, 4, 8), attention + 'key/kernel', 2, 'fsdp') == P('data', 'model', None)
  assert spec((2, 64, 32), 'Transformer/encoderblock/MlpBlock_3/Dense_1/kernel', 2,
              'fsdp') == P(None, 'model', 'data')
  # The Adam moments of a kernel sit under the optimizer state's own fields.
  assert spec((32, 64), '1/0/mu/' + mlp + 'Dense_0/kernel') == P(None, 'model')
  with pytest.raises(errors.ConfigError, match='model_parallel=4 does not divide'):
    spec((32, 6, 8), attention + 'query/kernel')
  with pytest.raises(errors.ConfigError, match='model_parallel=3 does not divide the 8'):
    sharding.make_mesh(jax.devices(), 3)


def _config(model, **overrides):
  """A tiny recipe whose every parameter has an axis 8 divides (8 classes)."""
  fields = common.base_config().to_dict()
  fields.update(model, image_size=16, batch_size=16, eval_batch_size=16, total_steps=4,
                optimizer='adam', lr=1e-3, warmup_steps=0, weight_decay=1e-4)
  fields.update(overrides)
  return ml_collections.ConfigDict(fields)


MODELS = [dict(model_name='ViT-Ti_16', model=dict(TINY_VIT, patch_size=4)),
          dict(model_name='BiT-M-R50x1', model=dict(num_layers=(1,), width_factor=0.5))]


def _batch(seed):
  rng = np.random.RandomState(seed)
  return {'image': images(16, 16, seed=seed), 'label': np.eye(8)[rng.randint(0, 8, 16)]}


def _steps(setup, state, first, count):
  for i in range(first, first + count):
    state, metrics = setup.train_step(state, setup.shard_batch(_batch(i)))
  return state, metrics


def _train(config, devices, steps_to_run=2):
  setup = steps.build(config, 8, config.total_steps, devices,
                      params=finetune.initial_params(config, 8))
  return (setup, *_steps(setup, setup.state, 0, steps_to_run))


@pytest.mark.numerics
@pytest.mark.parametrize('model', MODELS, ids=['vit', 'bit'])
def test_a_fully_sharded_step_equals_the_replicated_one(model):
  _, data_state, data_metrics = _train(_config(model, sharding='data'), jax.devices())
  setup, fsdp_state, fsdp_metrics = _train(_config(model, sharding='fsdp'), jax.devices())
  # Every leaf with a divisible axis is split; each device holds an eighth of the state.
  largest = max(jax.tree_util.tree_leaves(fsdp_state.params), key=lambda leaf: leaf.size)
  assert len(largest.sharding.device_set) == 8 and not largest.sharding.is_fully_replicated
  whole = sharding.bytes_per_device(data_state, jax.devices()[0])
  split = sharding.bytes_per_device(fsdp_state, jax.devices()[0])
  assert split <= whole / 8 * 1.05, (split, whole)
  # The same update; sums run in another order (reduce-scatters instead of all-reduces).
  np.testing.assert_allclose(float(fsdp_metrics['loss']), float(data_metrics['loss']), rtol=1e-5)
  assert_close_at_scale(jax.device_get(fsdp_state.params), jax.device_get(data_state.params),
                        rtol=1e-4)
  # The evaluation takes the sharded parameters as they are.
  sums = setup.eval_step(fsdp_state.params, setup.shard_batch({**_batch(9), 'mask': np.ones(16)}))
  assert float(sums['count']) == 16


def test_the_moving_average_of_the_weights_is_sharded_as_the_weights():
  _, state, _ = _train(_config(MODELS[0], sharding='fsdp', ema_decay=0.9), jax.devices(), 1)
  chex.assert_trees_all_equal_structs(state.ema_params, state.params)
  for ema, params in zip(jax.tree_util.tree_leaves(state.ema_params),
                         jax.tree_util.tree_leaves(state.params)):
    assert ema.sharding == params.sharding


@pytest.mark.numerics
def test_a_fully_sharded_scanned_step_equals_the_replicated_unrolled_one(tmp_path):
  """fsdp with `scan_layers`, both fine-tuned from one file (the two forms draw
  different initial parameters): the stacked leaves are split like any other and
  the update is the unrolled replicated one."""
  vit = MODELS[0]
  start = str(tmp_path / 'start.npz')
  checkpoint.save(start, jax.device_get(
      steps.build(_config(vit), 8, 4, jax.devices()[:1]).state.params))
  _, data_state, data_metrics = _train(_config(vit, sharding='data', pretrained=start),
                                       jax.devices())
  scanned = dict(vit, model=dict(vit['model'], scan_layers=True))
  setup, scan_state, scan_metrics = _train(
      _config(scanned, sharding='fsdp', pretrained=start), jax.devices())
  np.testing.assert_allclose(float(scan_metrics['loss']), float(data_metrics['loss']), rtol=1e-5)
  params = flax.traverse_util.flatten_dict(jax.device_get(data_state.params), sep='/')
  expected = vit_layouts.module_layout(params, setup.model_cfg)
  actual = flax.traverse_util.flatten_dict(jax.device_get(scan_state.params), sep='/')
  assert_close_at_scale(actual, expected, rtol=1e-4)
  kernel = scan_state.params['Transformer']['encoderblock']['MlpBlock_3']['Dense_0']['kernel']
  assert kernel.shape[0] == 2 and not kernel.sharding.is_fully_replicated


@pytest.mark.numerics
@pytest.mark.parametrize('scan', [False, True], ids=['unrolled', 'scanned'])
def test_a_tensor_parallel_step_equals_the_replicated_one(scan, tmp_path):
  """A 2 x 4 (data x model) mesh, fsdp over the data axis, heads and hidden units
  over the model axis: the update of the replicated step on 8 devices."""
  vit = MODELS[0]
  start = str(tmp_path / 'start.npz')
  checkpoint.save(start, jax.device_get(
      steps.build(_config(vit), 8, 4, jax.devices()[:1]).state.params))
  _, data_state, data_metrics = _train(_config(vit, pretrained=start), jax.devices())
  parallel = dict(vit, model=dict(vit['model'], scan_layers=scan))
  setup, state, metrics = _train(
      _config(parallel, sharding='fsdp', model_parallel=4, pretrained=start), jax.devices())
  assert dict(setup.mesh.shape) == {'data': 2, 'model': 4}
  block = state.params['Transformer']['encoderblock' if scan else 'encoderblock_0']
  assert 'model' in block['MlpBlock_3']['Dense_0']['kernel'].sharding.spec
  assert 'model' in block['MultiHeadDotProductAttention_1']['query']['kernel'].sharding.spec
  moments = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state)
             if sharding.path_string(path).endswith('MlpBlock_3/Dense_0/kernel')]
  assert moments and all('model' in m.sharding.spec for m in moments)
  np.testing.assert_allclose(float(metrics['loss']), float(data_metrics['loss']), rtol=1e-5)
  params = flax.traverse_util.flatten_dict(jax.device_get(data_state.params), sep='/')
  expected = vit_layouts.module_layout(params, setup.model_cfg)
  actual = flax.traverse_util.flatten_dict(jax.device_get(state.params), sep='/')
  assert_close_at_scale(actual, expected, rtol=1e-4)


def test_a_fully_sharded_checkpoint_resumes_on_fewer_devices(tmp_path):
  """Written on 8 devices, restored onto 2 (orbax reshards), two more steps: the
  parameters of four uninterrupted steps on 8."""
  config = _config(MODELS[0], sharding='fsdp')
  _, whole, _ = _train(config, jax.devices(), steps_to_run=4)
  _, half, _ = _train(config, jax.devices())
  manager = ocp.CheckpointManager(str(tmp_path / 'checkpoints'),
                                  options=ocp.CheckpointManagerOptions(
                                      enable_async_checkpointing=False))
  run_state.save(manager, 2, half)
  manager.wait_until_finished()
  two = steps.build(config, 8, config.total_steps, jax.devices()[:2])
  restored, _ = run_state.resume(manager, two.state)
  assert int(restored.step) == 2
  assert all(len(leaf.sharding.device_set) == 2 for leaf in jax.tree_util.tree_leaves(restored))
  resumed, _ = _steps(two, restored, 2, 2)
  assert_close_at_scale(jax.device_get(resumed.params), jax.device_get(whole.params), rtol=1e-4)


@pytest.mark.parametrize('model_parallel', [1, 4])
def test_the_train_command_runs_fully_sharded(model_parallel, tmp_path):
  """`--config.sharding=fsdp` end to end, alone and on a 2 x 4 (data x model)
  mesh: trains, evaluates, and writes the whole parameters in the published
  layout."""
  from helpers import make_folder
  from vit_jax.training import loop
  folder = make_folder(str(tmp_path / 'images'), {'train': [12, 12, 8], 'test': [5, 4, 4]},
                       size=(10, 10))
  config = _config(MODELS[0], sharding='fsdp', model_parallel=model_parallel, dataset=folder,
                   image_size=8,
                   total_steps=2, log_every=1, eval_every=2, checkpoint_every=2)
  summary = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert summary['eval_examples'] == 13
  params = checkpoint.load(str(tmp_path / 'run' / 'params.npz'))
  assert params['head']['kernel'].shape == (32, 3)


@pytest.mark.parametrize('name, millions', [('DINOv3-7B_16', 6716), ('AIMv2-3B_14', 2721),
                                            ('PE-Core-G_14', 1880)])
@pytest.mark.parametrize('model_parallel', [1, 2])
def test_the_largest_of_todays_vits_shard_an_eighth_to_each_device(name, millions,
                                                                   model_parallel):
  """DINOv3 7B, AIMv2 3B and Perception Encoder G with their blocks scanned
  (`scan_layers`, one stacked tree) hold the published parameters (headless, at
  their files' resolution, in millions: facebookresearch/dinov3's README; timm's
  aimv2_3b and vit_pe_core_gigantic files, to a million), and fully sharded over the 8
  devices, alone or with the heads and MLP units split over a model axis of 2,
  no device holds more than an eighth of them. Shapes only: nothing is
  allocated."""
  from vit_jax import models
  from vit_jax.models.vit import TIMM_VARIANTS
  config = models.get_config(name, num_classes=0, scan_layers=True)
  model = models.build_model(config)
  side = TIMM_VARIANTS[name].resolution  # the file's: PE G's table is 32 x 32
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          jax.ShapeDtypeStruct((1, side, side, 3), np.float32))['params']
  assert 'encoderblock' in shapes['Transformer']  # one stacked tree of all the blocks
  total = sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(shapes))
  assert abs(total / 1e6 - millions) < 1, total
  mesh = sharding.make_mesh(jax.devices(), model_parallel)
  shardings = sharding.state_shardings(shapes, mesh, 'fsdp')
  leaves = list(zip(jax.tree_util.tree_leaves(shapes), jax.tree_util.tree_leaves(shardings)))
  per_device = sum(int(np.prod(s.shard_shape(leaf.shape))) for leaf, s in leaves)
  # The model axis splits the blocks' kernels; the rest (embeddings, norms, biases: under
  # 0.2% of the parameters) is split along the data axis alone.
  split = sum(int(np.prod(leaf.shape)) for leaf, s in leaves
              if sharding.MODEL_AXIS in s.spec) if model_parallel > 1 else total
  assert split >= 0.998 * total, (split, total)
  bound = split / 8 + (total - split) / (8 // model_parallel)
  assert per_device <= bound * 1.001, (per_device, total)
