"""The original vit_jax's API (google-research/vision_transformer) on this project:
its names, model configs, checkpoint functions, schedule, data and training run,
each checked against the original's documented behaviour or the project's own."""
import importlib
import inspect
import math
import os
import subprocess

import chex
import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from helpers import make_folder
from vit_jax import checkpoint, input_pipeline, models, test_utils, train, utils
from vit_jax.configs import augreg as augreg_config
from vit_jax.configs import common as common_config
from vit_jax.configs import models as models_config
from vit_jax.configs import vit as vit_config
from vit_jax.files.layout import flatten
from vit_jax.original import fields as original_fields
from vit_jax.files import fit
from vit_jax.training import finetune

# Every public name of the original package, module by module (its vit_jax/*.py
# and vit_jax/configs/*.py at commit c6de1e5); none may go missing.
ORIGINAL_NAMES = {
    'vit_jax.checkpoint': ['copy', 'get_augreg_df', 'inspect_params', 'interpolate_posembed',
                           'load', 'load_pretrained', 'recover_tree'],
    'vit_jax.configs.common': ['DATASET_PRESETS', 'flatten', 'get_config', 'with_dataset'],
    'vit_jax.configs.models': [
        'AUGREG_CONFIGS', 'MODEL_CONFIGS', 'get_b16_config', 'get_b16_gap_norep_config',
        'get_b32_config', 'get_b32_gap_norep_config', 'get_b8_config', 'get_h14_config',
        'get_l16_config', 'get_l32_config', 'get_lit_b16b_2_config', 'get_lit_b16b_config',
        'get_lit_l16l_config', 'get_lit_l16s_config', 'get_lit_l16ti_config',
        'get_mixer_b16_config', 'get_mixer_b32_config', 'get_mixer_l16_config',
        'get_r26_b32_config', 'get_r26_s32_config', 'get_r50_b16_config', 'get_r50_l32_config',
        'get_r_ti16_config', 'get_s16_config', 'get_s16_gap_norep_config', 'get_s32_config',
        'get_s32_gap_norep_config', 'get_testing_config', 'get_testing_unpooled_config',
        'get_ti16_config'],
    'vit_jax.configs.vit': ['get_config'],
    'vit_jax.configs.augreg': ['get_config'],
    'vit_jax.configs.mixer_base16_cifar10': ['get_config'],
    'vit_jax.configs.inference_time': ['get_config'],
    'vit_jax.inference_time': ['inference_time'],
    'vit_jax.input_pipeline': ['MAX_IN_MEMORY', 'get_data', 'get_data_from_directory',
                               'get_data_from_tfds', 'get_dataset_info', 'get_datasets',
                               'get_directory_info', 'get_tfds_info', 'prefetch'],
    'vit_jax.main': ['main'],
    'vit_jax.models': ['AddPositionEmbs', 'Encoder', 'Encoder1DBlock', 'LitModel', 'MlpBlock',
                       'MlpMixer', 'VisionTransformer', 'get_model', 'model_configs'],
    'vit_jax.models_lit': ['BASE_PATH', 'BertModel', 'LitModel', 'TextTransformer'],
    'vit_jax.models_mixer': ['MixerBlock', 'MlpBlock', 'MlpMixer'],
    'vit_jax.models_resnet': ['ResNetStage', 'ResidualUnit', 'StdConv', 'weight_standardize'],
    'vit_jax.models_vit': ['AddPositionEmbs', 'Encoder', 'Encoder1DBlock', 'IdentityLayer',
                           'MlpBlock', 'VisionTransformer'],
    'vit_jax.preprocess': ['BertTokenizer', 'PreprocessImages', 'SentencepieceTokenizer',
                           'get_pp', 'get_tokenizer'],
    'vit_jax.test_utils': ['create_checkpoint'],
    'vit_jax.train': ['make_update_fn', 'train_and_evaluate'],
    'vit_jax.utils': ['GFileHandler', 'accumulate_gradient', 'add_gfile_logger',
                      'create_learning_rate_schedule'],
}
# The keyword arguments the original's callers pass by name.
ORIGINAL_KEYWORDS = {
    ('vit_jax.checkpoint', 'load_pretrained'): {'pretrained_path', 'init_params', 'model_config'},
    ('vit_jax.checkpoint', 'inspect_params'): {'params', 'expected', 'fail_if_extra',
                                               'fail_if_missing'},
    ('vit_jax.checkpoint', 'interpolate_posembed'): {'posemb', 'num_tokens', 'has_class_token'},
    ('vit_jax.train', 'make_update_fn'): {'apply_fn', 'accum_steps', 'tx'},
    ('vit_jax.input_pipeline', 'get_data_from_tfds'): {'config', 'mode'},
    ('vit_jax.input_pipeline', 'get_data_from_directory'): {'config', 'directory', 'mode'},
    ('vit_jax.input_pipeline', 'get_data'): {'data', 'mode', 'num_classes', 'image_decoder',
                                             'repeats', 'batch_size', 'image_size',
                                             'shuffle_buffer', 'preprocess'},
    ('vit_jax.utils', 'create_learning_rate_schedule'): {'total_steps', 'base', 'decay_type',
                                                         'warmup_steps', 'linear_end'},
}
# Published parameter counts (vit_jax/configs/models.py names, 1000 classes).
PUBLISHED_PARAMETERS = {'ViT-B_16': 86_567_656, 'ViT-L_16': 304_326_632,
                        'ViT-B_32': 88_224_232, 'R50+ViT-B_16': 98_659_112,
                        'Mixer-B_16': 59_880_472}


@pytest.mark.parametrize('module', sorted(ORIGINAL_NAMES))
def test_every_original_name_is_here(module):
  found = importlib.import_module(module)
  assert [n for n in ORIGINAL_NAMES[module] if not hasattr(found, n)] == []


@pytest.mark.parametrize('module,name', sorted(ORIGINAL_KEYWORDS))
def test_original_keywords(module, name):
  parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters
  assert ORIGINAL_KEYWORDS[(module, name)] <= set(parameters)


def test_model_configs_are_the_originals():
  assert len(models_config.MODEL_CONFIGS) == 28
  assert sorted(models_config.AUGREG_CONFIGS) == sorted([
      'B_16', 'B_16-gap-norep', 'B_32', 'B_32-gap-norep', 'B_8', 'L_16', 'R26_B_32',
      'R26_S_32', 'R50_L_32', 'R_Ti_16', 'S_16', 'S_16-gap-norep', 'S_32', 'S_32-gap-norep',
      'Ti_16'])
  b16 = models_config.MODEL_CONFIGS['ViT-B_16']
  assert (b16.patches.size, b16.hidden_size, b16.transformer.mlp_dim,
          b16.transformer.num_heads, b16.transformer.num_layers) == ((16, 16), 768, 3072, 12, 12)
  assert models_config.MODEL_CONFIGS['ViT-L_16'].transformer.dropout_rate == 0.1
  assert models_config.MODEL_CONFIGS['ViT-L_32'].transformer.dropout_rate == 0.
  assert models_config.MODEL_CONFIGS['R50+ViT-B_16'].resnet.num_layers == (3, 4, 9)
  assert models_config.MODEL_CONFIGS['R+ViT-Ti_16'].patches.size == (8, 8)


@pytest.mark.parametrize('name', sorted(models_config.MODEL_CONFIGS))
def test_every_original_model_builds_the_projects(name):
  """Through the original's class, the same tree (names and shapes) as the
  project's model of that name; the published count where there is one."""
  config = models_config.MODEL_CONFIGS[name]
  if name.startswith('LiT-'):
    inputs = dict(images=jnp.ones((1, 224, 224, 3)), tokens=jnp.ones((1, 16), jnp.int32))
    adapter, ours = models.LitModel(**config), models.get_model(name)
  else:
    inputs = dict(inputs=jnp.ones((1, 224, 224, 3)), train=False)
    cls = models.MlpMixer if name.startswith('Mixer-') else models.VisionTransformer
    adapter, ours = cls(num_classes=1000, **config), models.get_model(name, 1000)
  shapes = jax.eval_shape(lambda: adapter.init(jax.random.PRNGKey(0), **inputs))['params']
  if 'inputs' in inputs:
    inputs = {'images': inputs['inputs']}
  reference = jax.eval_shape(lambda: ours.init(jax.random.PRNGKey(0), **inputs))['params']
  chex.assert_trees_all_equal_shapes_and_dtypes(shapes, reference)
  if name in PUBLISHED_PARAMETERS:
    assert sum(x.size for x in jax.tree_util.tree_leaves(shapes)) == PUBLISHED_PARAMETERS[name]


def test_vit_adapter_computes_the_projects_logits():
  config = models_config.MODEL_CONFIGS['testing']
  model = models.VisionTransformer(num_classes=10, **config)
  images = jax.random.uniform(jax.random.PRNGKey(1), (2, 32, 32, 3), minval=-1, maxval=1)
  variables = model.init(jax.random.PRNGKey(0), inputs=images, train=False)
  variables = jax.tree_util.tree_map(lambda x: x + 0.01, variables)  # a non-zero head
  chex.assert_trees_all_close(model.apply(variables, inputs=images, train=False),
                              models.get_model('testing', 10).apply(variables, images))
  with_bias = models.VisionTransformer(num_classes=3, head_bias_init=-2., **config)
  bias = with_bias.init(jax.random.PRNGKey(0), images, train=False)['params']['head']['bias']
  np.testing.assert_array_equal(bias, -2.)


def test_unsupported_original_fields_are_refused():
  config = dict(models_config.MODEL_CONFIGS['testing'])
  with pytest.raises(ValueError, match='not square'):
    models.VisionTransformer(num_classes=2, **dict(config, patches={'size': (16, 8)})).init(
        jax.random.PRNGKey(0), jnp.ones((1, 32, 32, 3)), train=False)
  with pytest.raises(ValueError, match='transformer=None'):
    models.VisionTransformer(num_classes=2, **dict(config, transformer=None)).init(
        jax.random.PRNGKey(0), jnp.ones((1, 32, 32, 3)), train=False)
  typo = dict(config['transformer'], num_layer=2)
  with pytest.raises(ValueError, match='transformer.num_layer is no field'):
    models.VisionTransformer(num_classes=2, **dict(config, transformer=typo)).init(
        jax.random.PRNGKey(0), jnp.ones((1, 32, 32, 3)), train=False)


def test_a_vit_without_position_embeddings_as_the_originals_encoder_builds_it():
  config = dict(models_config.MODEL_CONFIGS['testing'])
  images = jnp.ones((1, 32, 32, 3))
  params = {flag: models.VisionTransformer(num_classes=2, **dict(
      config, transformer=dict(config['transformer'], add_position_embedding=flag))).init(
          jax.random.PRNGKey(0), images, train=False)['params'] for flag in (True, False)}
  assert 'posembed_input' in params[True]['Transformer']
  assert 'posembed_input' not in params[False]['Transformer']


def test_the_originals_lit_pp_bert_vocabulary_and_folder_dataset(testing_checkpoint):
  """The three behaviours the original's own tests rely on: a LiT model's `pp`
  with attributes (models_test.py), an unknown word mapped to the vocabulary's
  size where it has no [UNK] (preprocess_test.py), and a folder dataset whose `pp`
  names no splits (train_test.py's 'directory' case)."""
  import tempfile
  from vit_jax import preprocess
  model = models.get_model('LiT-testing')
  assert model.pp.max_len == model.pp['max_len'] > 0
  with tempfile.NamedTemporaryFile('w', suffix='.txt') as f:
    f.write('[PAD]\n[CLS]\nsome\ntest\nwords')
    f.flush()
    tokenizer = preprocess.BertTokenizer(vocab_path=f.name, max_len=3)
  np.testing.assert_equal(tokenizer(['some', 'test', 'words', 'xxx']),
                          [[1, 2, 0], [1, 3, 0], [1, 4, 0], [1, 5, 0]])
  config = vit_config.get_config('testing,cifar10')
  config.pretrained_dir = os.path.dirname(testing_checkpoint)
  with tempfile.TemporaryDirectory() as root:
    config.dataset = root
    config.pp = ml_collections.ConfigDict({'crop': 32})
    recipe = train.recipe(config)
  assert (recipe.train_split, recipe.eval_split) == ('train', 'test')
  assert recipe.dataset.endswith(root)


def _schedule_float64(step, total, base, decay, warmup, end):
  """The original utils.create_learning_rate_schedule, written from its docstring."""
  progress = min(max((step - warmup) / (total - warmup), 0.), 1.)
  lr = end + (base - end) * (1 - progress) if decay == 'linear' else (
      base * 0.5 * (1 + math.cos(math.pi * progress)))
  return lr * min(1., step / warmup) if warmup else lr


@pytest.mark.parametrize('decay', ['cosine', 'linear'])
def test_learning_rate_schedule_matches_the_closed_form(decay):
  total, warmup = 1000, 50
  schedule = utils.create_learning_rate_schedule(total, 0.03, decay, warmup)
  got = np.asarray(jax.vmap(schedule)(jnp.arange(total + 1)))
  want = np.array([_schedule_float64(s, total, 0.03, decay, warmup, 1e-5)
                   for s in range(total + 1)])
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-8)
  assert got[-1] == pytest.approx(1e-5 if decay == 'linear' else 0., abs=1e-9)


def test_accumulated_gradient_equals_the_whole_batch():
  w = jnp.array([0.3, -0.2, 0.5])
  images = jax.random.normal(jax.random.PRNGKey(0), (8, 3))
  labels = jax.random.normal(jax.random.PRNGKey(1), (8,))
  loss = lambda p, x, y: jnp.mean((x @ p - y) ** 2)
  whole = jax.value_and_grad(loss)(w, images, labels)
  chex.assert_trees_all_close(
      utils.accumulate_gradient(jax.value_and_grad(loss), w, images, labels, 4), whole,
      rtol=1e-6)
  with pytest.raises(ValueError, match='does not divide'):
    utils.accumulate_gradient(jax.value_and_grad(loss), w, images, labels, 3)


@pytest.fixture
def testing_checkpoint(tmp_path):
  path = str(tmp_path / 'pretrained' / 'testing.npz')
  test_utils.create_checkpoint(models_config.MODEL_CONFIGS['testing'], path)
  return path


def test_load_pretrained_with_the_original_keywords(testing_checkpoint):
  config = models_config.MODEL_CONFIGS['testing']
  model = models.VisionTransformer(num_classes=5, **config)
  init = model.init(jax.random.PRNGKey(3), jnp.ones((1, 48, 48, 3)), train=False)['params']
  params = checkpoint.load_pretrained(pretrained_path=testing_checkpoint, init_params=init,
                                      model_config=config)
  assert isinstance(params, flax.core.FrozenDict)
  ours = fit.load_pretrained(testing_checkpoint, flax.core.unfreeze(init),
                             models.get_config('testing', num_classes=5))
  chex.assert_trees_all_equal(flax.core.unfreeze(params), ours)
  posemb = params['Transformer']['posembed_input']['pos_embedding']
  assert posemb.shape == (1, 1 + 9, 10)  # 1x1 grid at 16 px resized to 3x3 at 48 px
  np.testing.assert_array_equal(params['head']['kernel'], init['head']['kernel'])


def test_interpolate_posembed_as_the_original():
  rng = np.random.RandomState(0)
  posemb = rng.normal(size=(1, 1 + 4, 6)).astype(np.float32)
  resized = np.asarray(checkpoint.interpolate_posembed(posemb, 1 + 16, True))
  np.testing.assert_array_equal(resized[:, :1], posemb[:, :1])
  import scipy.ndimage  # the original's resize: order-1 zoom of the square grid
  grid = scipy.ndimage.zoom(posemb[0, 1:].reshape(2, 2, 6), (2, 2, 1), order=1)
  np.testing.assert_allclose(resized[0, 1:], grid.reshape(16, 6), rtol=1e-6)
  with pytest.raises(ValueError, match='square'):
    checkpoint.interpolate_posembed(posemb, 1 + 15, True)


def test_inspect_params_and_recover_tree():
  tree = checkpoint.recover_tree(['a/b', 'a/c', 'd'], [1, 2, 3])
  assert tree == {'a': {'b': 1, 'c': 2}, 'd': 3}
  expected = {'a': {'b': 0, 'c': 0}, 'd': 0, 'pre_logits': {}}
  assert checkpoint.inspect_params(params=dict(tree), expected=expected)['pre_logits'] == {}
  with pytest.raises(ValueError, match='Missing'):
    checkpoint.inspect_params(params={'d': 1}, expected=expected)
  assert checkpoint.inspect_params(params={'d': 1}, expected=expected,
                                   fail_if_missing=False) == {'d': 1, 'pre_logits': {}}


def test_copy_writes_the_whole_file(tmp_path):
  src = tmp_path / 'a.bin'
  src.write_bytes(os.urandom(3000))
  checkpoint.copy(str(src), str(tmp_path / 'b.bin'), progress=False, block_size=1024)
  assert (tmp_path / 'b.bin').read_bytes() == src.read_bytes()


def test_get_augreg_df(tmp_path):
  (tmp_path / 'index.csv').write_text(
      'name,ds,final_val,filename,adapt_filename\n'
      'Ti/16,i21k,0.5,Ti_16-i21k-300ep-x,Ti_16-i21k-300ep-x--cifar100\n')
  df = checkpoint.get_augreg_df(str(tmp_path))
  assert list(df.filename) == ['Ti_16-i21k-300ep-x'] and df.final_val[0] == 0.5


def test_original_configs():
  config = vit_config.get_config('b16,cifar10')
  assert (config.base_lr, config.total_steps, config.pp.crop, config.pp.train) == (
      0.01, 10_000, 384, 'train[:98%]')
  assert config.model.model_name == 'ViT-B_16'
  assert vit_config.get_config('l16,cifar100').base_lr == 0.03
  augreg = augreg_config.get_config('R_Ti_16')
  assert augreg.model.transformer.dropout_rate == 0 and augreg.pp.resize == 448
  with pytest.raises(ValueError, match='Unknown AugReg model'):
    augreg_config.get_config('X_1')
  flat = dict(common_config.flatten(common_config.with_dataset(common_config.get_config(),
                                                               'imagenet2012')))
  assert flat['config.pp.test'] == 'validation' and flat['config.total_steps'] == 20_000
  with pytest.raises(AttributeError):
    common_config.get_config().not_a_field = 1  # locked, as the original's


def _data_config(dataset, crop=16, batch=8):
  config = common_config.with_dataset(common_config.get_config(), 'cifar10')
  config.dataset = dataset
  config.pp.train, config.pp.test, config.pp.crop = 'train', 'test', crop
  config.batch = config.batch_eval = batch
  return config


def test_get_datasets_from_a_directory(tmp_path):
  root = str(tmp_path / 'images')
  make_folder(root, {'train': [6, 6], 'test': [5, 4]})
  config = _data_config(root)
  ds_train, ds_test = input_pipeline.get_datasets(config)
  devices = jax.local_device_count()
  batch = next(ds_train.as_numpy_iterator())
  chex.assert_shape(batch['image'], (devices, 8 // devices, 16, 16, 3))
  chex.assert_shape(batch['label'], (devices, 8 // devices, 2))
  assert -1 <= batch['image'].min() and batch['image'].max() <= 1
  np.testing.assert_array_equal(batch['label'].sum(-1), 1)  # one-hot
  assert len(list(ds_test.as_numpy_iterator())) == 9 // 8  # the last partial batch dropped
  info = input_pipeline.get_dataset_info(root, 'test')
  assert (info['num_examples'], info['num_classes'], info['int2str'](1)) == (9, 2, 'class_1')


def test_prefetch_gives_device_batches(tmp_path):
  root = str(tmp_path / 'images')
  make_folder(root, {'train': [4, 4], 'test': [4, 4]})
  _, ds_test = input_pipeline.get_datasets(_data_config(root))
  batch = next(input_pipeline.prefetch(ds_test, 1))
  assert isinstance(batch['image'], jax.Array)


def test_make_update_fn_descends():
  config = models_config.MODEL_CONFIGS['testing']
  model = models.VisionTransformer(num_classes=2, **config)
  devices = jax.local_device_count()
  images = jax.random.uniform(jax.random.PRNGKey(0), (devices, 4, 16, 16, 3), minval=-1,
                              maxval=1)
  labels = jax.nn.one_hot(jnp.tile(jnp.array([[0, 1, 0, 1]]), (devices, 1)), 2)
  params = model.init(jax.random.PRNGKey(1), images[0], train=False)['params']
  tx = optax.sgd(0.1, momentum=0.9, accumulator_dtype='bfloat16')
  update = train.make_update_fn(apply_fn=model.apply, accum_steps=2, tx=tx)
  params, opt_state = flax.jax_utils.replicate((params, tx.init(params)))
  rng = flax.jax_utils.replicate(jax.random.PRNGKey(0))
  batch = {'image': images, 'label': labels}
  losses = []
  for _ in range(4):
    params, opt_state, loss, rng = update(params, opt_state, batch, rng)
    losses.append(float(loss[0]))
  assert losses[-1] < losses[0]


@pytest.mark.slow
def test_main_fine_tunes_and_writes_checkpoint_n(tmp_path, testing_checkpoint, warm_python):
  """`python -m vit_jax.main` with the original's config file and fields, on an
  image folder: `checkpoint_N` in the workdir, and `train_and_evaluate`'s
  parameters equal the run's params.npz."""
  root = str(tmp_path / 'images')
  make_folder(root, {'train': [20, 20], 'test': [8, 8]})
  workdir = str(tmp_path / 'run')
  spec = os.path.join(os.path.dirname(models_config.__file__), 'vit.py') + ':testing,cifar10'
  flags = [f'--config.pretrained_dir={os.path.dirname(testing_checkpoint)}',
           f'--config.dataset={root}', '--config.pp.crop=32', '--config.batch=16',
           '--config.batch_eval=16', '--config.total_steps=4', '--config.warmup_steps=1',
           '--config.eval_every=2', '--config.accum_steps=2']
  done = subprocess.run([warm_python, '-m', 'vit_jax.main', f'--workdir={workdir}',
                         f'--config={spec}'] + flags, capture_output=True, text=True,
                        timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'checkpoint_4' in os.listdir(workdir)
  from flax.training import checkpoints as flax_checkpoints
  restored = flax_checkpoints.restore_checkpoint(workdir, None)
  saved = checkpoint.load(os.path.join(workdir, 'params.npz'), 'testing', num_classes=2)
  chex.assert_trees_all_close(flatten(restored['0']), flatten(saved))
  assert int(restored['2']) == 4


@pytest.mark.slow
@pytest.mark.parametrize('spec,flags', [
    ('inference_time.py', ['--config.model_name=testing', '--config.num_classes=3',
                           '--config.image_size=32', '--config.steps=3',
                           '--config.initial_steps=1']),
    ('vit.py:testing,cifar10', ['--config.trainer=inference_time', '--config.pp.crop=32'])])
def test_inference_time_from_the_command_line(tmp_path, spec, flags, warm_python):
  spec = os.path.join(os.path.dirname(models_config.__file__), spec)
  done = subprocess.run(
      [warm_python, '-m', 'vit_jax.main', f'--workdir={tmp_path}', f'--config={spec}',
       '--config.batch=8'] + flags, capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert any(name.startswith('events.out') for name in os.listdir(tmp_path))


@pytest.mark.slow
def test_train_and_evaluate_returns_the_trained_parameters(tmp_path, testing_checkpoint):
  root = str(tmp_path / 'images')
  make_folder(root, {'train': [20, 20], 'test': [8, 8]})
  config = vit_config.get_config('testing,cifar10')
  config.update(dict(pretrained_dir=os.path.dirname(testing_checkpoint), dataset=root,
                     batch=16, batch_eval=16, total_steps=3, warmup_steps=1, eval_every=3,
                     accum_steps=2))
  config.pp.crop = 32
  workdir = str(tmp_path / 'run')
  params = train.train_and_evaluate(config, workdir)
  chex.assert_trees_all_close(
      flatten(params),
      flatten(checkpoint.load(os.path.join(workdir, 'params.npz'), 'testing', num_classes=2)))
  assert os.path.isdir(os.path.join(workdir, 'checkpoint_3'))


def test_recipe_of_an_original_config(testing_checkpoint):
  config = vit_config.get_config('testing,cifar10')
  config.pretrained_dir = os.path.dirname(testing_checkpoint)
  recipe = train.recipe(config)
  assert (recipe.model_name, recipe.model.dtype, recipe.lr, recipe.linear_end,
          recipe.momentum_dtype, recipe.batch_size, recipe.accum_steps, recipe.image_size,
          recipe.train_split) == ('testing', 'float32', 0.03, 1e-5, 'bfloat16', 512, 8, 384,
                                  'train[:98%]')
  assert recipe.pretrained == testing_checkpoint
  from vit_jax.configs import mixer_base16_cifar10
  mixer = train.recipe(mixer_base16_cifar10.get_config())
  assert (mixer.model_name, mixer.model.patch_size, mixer.image_size) == ('Mixer-B_16', 16, 224)
  assert mixer.pretrained == os.path.join('.', 'Mixer-B_16.npz')
  config.dataset = ''
  from vit_jax.errors import ConfigError
  with pytest.raises(ConfigError, match='dataset'):
    train.recipe(config)


def test_lit_towers_return_the_originals_out():
  tokens = jnp.ones((2, 16), jnp.int32)
  lit = models.get_model('LiT-testing')
  variables = lit.init(jax.random.PRNGKey(0), images=jnp.zeros((2, 32, 32, 3)), tokens=tokens)
  _, ztxt, out = lit.apply(variables, tokens=tokens)
  assert {'txt/transformed', 'txt/pre_logits', 'txt/logits', 'txt/norm', 't'} <= set(out)
  chex.assert_trees_all_close(ztxt, out['txt/logits'] / out['txt/norm'], rtol=1e-5)


def test_lit_model_files_and_names(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  lit = models.get_model('LiT-B16B')
  assert lit.vocab_path == 'gs://vit_models/lit/LiT-B16B.txt'
  (tmp_path / 'LiT-B16B.txt').write_text('[PAD]\n[CLS]\nhello\n')
  assert lit.vocab_path == 'LiT-B16B.txt'
  adapter = models.LitModel(**models_config.MODEL_CONFIGS['LiT-L16S'])
  assert adapter.vocab_path.endswith('LiT-L16S.model')
  assert original_fields.project_config(models_config.MODEL_CONFIGS['ViT-B_16']).name == 'ViT-B_16'


def test_preprocess_images_range_and_size():
  from vit_jax import preprocess
  images = [np.full((40, 60, 3), 255, np.uint8), np.zeros((30, 30, 3), np.uint8)]
  out = preprocess.PreprocessImages(size=24)(images)
  chex.assert_shape(out, (2, 24, 24, 3))
  np.testing.assert_allclose(out[0], 1.)
  np.testing.assert_allclose(out[1], -1.)
  with pytest.raises(ValueError, match='Unknown tokenizer'):
    preprocess.get_tokenizer('wordpiece')



def _original_run_checkpoint(workdir, step, num_classes=2, nan=False):
  """`checkpoint_<step>` as the original's train.py leaves it: (params, the state of
  chain(clip_by_global_norm, sgd(momentum 0.9, bfloat16 accumulator)), step), its
  momentum set apart from zero so that taking it on can be seen; with `nan`, the
  head of a run that diverged."""
  from flax.training import checkpoints as flax_checkpoints
  model = models.VisionTransformer(num_classes=num_classes,
                                   **models_config.MODEL_CONFIGS['testing'])
  params = model.init(jax.random.PRNGKey(3), jnp.zeros((1, 32, 32, 3)), train=False)['params']
  params = jax.tree_util.tree_map(lambda p: p + 0.25, params)
  if nan:
    params['head']['bias'] = params['head']['bias'] * np.nan
  tx = optax.chain(optax.clip_by_global_norm(1.),
                   optax.sgd(0.01, momentum=0.9, accumulator_dtype='bfloat16'))
  opt_state = optax.tree_utils.tree_set(
      tx.init(params), trace=jax.tree_util.tree_map(lambda p: (p * 0.5).astype(jnp.bfloat16),
                                                    params))
  flax_checkpoints.save_checkpoint(workdir, (params, opt_state, step), step)
  return params, opt_state


def _folder_bytes(path):
  return {os.path.relpath(os.path.join(d, f), path): open(os.path.join(d, f), 'rb').read()
          for d, _, files in os.walk(path) for f in files}


@pytest.mark.slow
def test_the_original_command_resumes_from_an_original_runs_checkpoint_and_keeps_it(
    tmp_path, testing_checkpoint):
  """The original's `checkpoint_N` is taken on (parameters, momentum, step) and kept
  byte for byte; a run whose total_steps it already reaches trains nothing and
  writes no checkpoint_N of its own; one of another model is refused, kept."""
  import orbax.checkpoint as ocp
  from vit_jax.training import run_state, steps
  from vit_jax.errors import WorkdirError
  root = str(tmp_path / 'images')
  make_folder(root, {'train': [20, 20], 'test': [8, 8]})
  config = vit_config.get_config('testing,cifar10')
  config.update(dict(pretrained_dir=os.path.dirname(testing_checkpoint), dataset=root,
                     batch=16, batch_eval=16, total_steps=12, warmup_steps=1, eval_every=12,
                     accum_steps=1))
  config.pp.crop = 32
  workdir = str(tmp_path / 'run')
  params, opt_state = _original_run_checkpoint(workdir, 10)
  left = _folder_bytes(workdir)
  recipe = train.recipe(config)
  assert train.adopt_original_checkpoint(recipe, workdir) == 10
  source = input_pipeline.get_source(recipe.dataset, recipe.train_split)
  setup = steps.build(recipe, source.num_classes, recipe.total_steps,
                      params=finetune.initial_params(recipe, source.num_classes))
  state, _ = run_state.resume(ocp.CheckpointManager(os.path.join(workdir, 'checkpoints')),
                              setup.state)
  assert int(state.step) == 10
  chex.assert_trees_all_close(flatten(state.params), flatten(params))
  chex.assert_trees_all_close(
      flatten(optax.tree_utils.tree_get(state.opt_state, 'trace')),
      flatten(optax.tree_utils.tree_get(opt_state, 'trace')))
  # The schedule goes on at step 10: the next update's rate is that of an optimizer
  # that made 10 updates from the start.
  zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
  _, taken_on = state.tx.update(zeros, state.opt_state, state.params)
  fresh = setup.state.opt_state
  for _ in range(11):
    _, fresh = state.tx.update(zeros, fresh, state.params)
  rate = float(steps.last_learning_rate(fresh))
  assert rate > 0 and float(steps.last_learning_rate(taken_on)) == pytest.approx(rate, rel=1e-6)
  assert all(int(count) == 10 for _, count in
             optax.tree_utils.tree_get_all_with_path(state.opt_state, 'count'))
  assert train.adopt_original_checkpoint(recipe, workdir) is None  # the project's run now
  train.train_and_evaluate(config, workdir)
  files = _folder_bytes(workdir)
  assert {k: files[k] for k in left} == left
  assert os.path.isdir(os.path.join(workdir, 'checkpoint_12'))

  finished = str(tmp_path / 'finished')
  _original_run_checkpoint(finished, 10)
  left = _folder_bytes(finished)
  config.total_steps = 4
  train.train_and_evaluate(config, finished)
  files = _folder_bytes(finished)
  assert {k: files[k] for k in left} == left
  assert not any(name.startswith('checkpoint_') and name != 'checkpoint_10'
                 for name in os.listdir(finished))

  diverged = str(tmp_path / 'diverged')
  _original_run_checkpoint(diverged, 10, nan=True)
  left = _folder_bytes(diverged)
  with pytest.raises(WorkdirError, match='checkpoint_10, left by an original vit_jax run, holds '
                     'NaN or infinite values'):
    train.train_and_evaluate(config, diverged)
  assert _folder_bytes(diverged) == left

  other = str(tmp_path / 'other')
  _original_run_checkpoint(other, 10, num_classes=3)
  left = _folder_bytes(other)
  with pytest.raises(WorkdirError, match='checkpoint_10, left by an original vit_jax run, does '
                     'not fit'):
    train.train_and_evaluate(config, other)
  assert _folder_bytes(other) == left


def test_the_original_commands_usage_errors_are_one_sentence_in_its_terms(tmp_path, warm_python):
  """A mistyped config path, a config argument without its dataset, a dataset or
  model the configs have no preset for, and a checkpoint missing from
  pretrained_dir: each one sentence whose advice names the original's fields."""
  from vit_jax import entry
  from vit_jax.errors import ConfigError
  spec = os.path.join(os.path.dirname(models_config.__file__), 'vit.py')
  for arg, says in (('testing', 'takes MODEL,DATASET after the colon'),
                    ('testing,fashion_mnist', "no preset for the dataset 'fashion_mnist'; its "
                                              'presets are cifar10'),
                    ('b99,cifar10', "knows no model 'b99'; its models are b16")):
    with pytest.raises(ConfigError, match=says):
      entry.load_recipe(f'{spec}:{arg}')
  config = vit_config.get_config('testing,cifar10')
  config.pretrained_dir = str(tmp_path)
  with pytest.raises(ConfigError, match=r'testing\.npz does not exist: the original\'s config '
                     r'fine-tunes from --config.pretrained_dir \(\S+\), where the file is '
                     r'testing\.npz\. Download it there'):
    train.train_and_evaluate(config, str(tmp_path / 'w'))
  done = subprocess.run([warm_python, '-m', 'vit_jax.main', f'--workdir={tmp_path / "w"}',
                         f'--config={spec}.typo:testing,cifar10'], capture_output=True,
                        text=True, timeout=300, check=False)
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[-1].startswith(
      f'Error: The recipe {spec}.typo does not exist')
  assert not (tmp_path / 'w').exists()
