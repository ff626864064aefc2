"""Every recipe in configs/ loads, names a zoo model that builds, and has every field."""
import ast
import importlib
import os
import re
import subprocess

import jax
import jax.numpy as jnp
import pytest
from absl import flags
from ml_collections import config_flags

from configs import common
from vit_jax import entry, errors, models
from vit_jax.models.vit import TIMM_VARIANTS
from vit_jax.training import settings, steps, workdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RECIPES = [('quickstart_vit', None), ('quickstart_resnet', None), ('quickstart_alternet', None),
           ('vit_s16_i1k', None), ('mixer_b16', 'cifar10'), ('mixer_b16', 'imagenet2012'),
           ('vit_b16', 'cifar10'), ('vit_b16', 'cifar100'), ('vit_b16', 'imagenet2012'),
           ('vit_b16', 'pretrain'), ('bit_r50x1', 'cifar10'), ('bit_r50x1', 'oxford_iiit_pet'),
           ('bit_r50x1', 'imagenet2012'), ('papers', 'vit'), ('papers', 'resnet'),
           ('papers', 'alternet'), ('papers', 'vit-authors')] + [
               ('timm_models', name) for name in TIMM_VARIANTS]


def load(name, arg):
  module = importlib.import_module(f'configs.{name}')
  return module.get_config() if arg is None else module.get_config(arg)


@pytest.mark.parametrize('name,arg', RECIPES)
def test_recipe_builds(name, arg):
  config = load(name, arg)
  assert set(config) == set(common.base_config())
  model = models.build_model(steps.model_config(config, 10))
  size = config.image_size
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, size, size, 3)))
  out = jax.eval_shape(model.apply, variables, jnp.zeros((2, size, size, 3)))
  assert out.shape == (2, 10)
  steps.make_optimizer(config, total_steps=config.total_steps or 1000)


def test_published_recipe_figures():
  s16 = load('vit_s16_i1k', None)
  assert (s16.batch_size, s16.lr, s16.weight_decay, s16.warmup_steps, s16.num_epochs) == (
      1024, 1e-3, 1e-4, 10_000, 90)
  assert (s16.input.randaugment, s16.input.mixup_alpha, s16.model.classifier, s16.model.posemb) == (
      (2, 10), 0.2, 'gap', 'sincos2d')
  b16 = load('vit_b16', 'cifar10')
  assert (b16.batch_size, b16.total_steps, b16.image_size, b16.optimizer, b16.grad_clip) == (
      512, 10_000, 384, 'sgd', 1.0)
  # BiT-HyperRule: small images train at 128 px, large at 384; schedule from dataset size.
  assert (load('bit_r50x1', 'cifar10').image_size, load('bit_r50x1', 'cifar10').total_steps,
          load('bit_r50x1', 'cifar10').input.mixup_alpha) == (128, 10_000, 0.1)
  pets = load('bit_r50x1', 'oxford_iiit_pet')
  assert (pets.image_size, pets.total_steps, pets.input.mixup_alpha) == (384, 500, 0.)
  assert load('bit_r50x1', 'imagenet2012').total_steps == 20_000
  with pytest.raises(ValueError, match="Unknown arg 'svhn'"):
    load('bit_r50x1', 'svhn')


# A value other than every recipe's for each field, as typed on the command line.
OVERRIDES = {
    'model_name': None, 'tier': 'mine', 'pretrained': 'some/file.npz', 'keep_head': 'True',
    'augreg_dir': '/data/augreg', 'dataset': 'cifar10', 'data_dir': '/data/tfds',
    'train_split': 'train[:90%]', 'eval_split': 'train[90%:]', 'image_size': '224',
    'input.crop': 'False', 'input.crop_padding': '3', 'input.mixup_alpha': '0.4',
    'input.randaugment': '(3, 11)', 'batch_size': '48', 'eval_batch_size': '40',
    'accum_steps': '3',
    'num_epochs': '7.5', 'total_steps': '321', 'time_budget': '17m', 'optimizer': 'adam',
    'momentum': '0.8', 'momentum_dtype': 'bfloat16', 'lr': '0.0123', 'warmup_steps': '77',
    'decay': 'linear', 'linear_end': '1e-05',
    'weight_decay': '0.05', 'grad_clip': '2.5', 'ema_decay': '0.999', 'ema_warmup': 'True', 'loss': 'sigmoid',
    'label_smoothing': '0.2',
    'lr_mults': "(('^head/', 0.5),)", 'seed': '7', 'log_every': '9', 'eval_every': '99',
    'checkpoint_every': '98', 'keep_checkpoints': '4', 'keep_params_at': 'warmup,500',
    'sharding': 'fsdp',
    'model_parallel': '2'}


def _parse(path, arg, args):
  """The recipe as `--config` and `args` make it, through the flag parser."""
  argv = ['prog', '--config', path + (f':{arg}' if arg else '')] + list(args)
  values = flags.FlagValues()
  entry.define_recipe_flag('config', '', flag_values=values, sys_argv=argv)
  values(argv)
  return settings.check(values.config)


def test_every_field_of_every_recipe_is_set_from_the_command_line():
  assert set(OVERRIDES) == set(settings.FIELDS) - {'model'}
  for name, arg in sorted(set(RECIPES)):
    path = os.path.join(ROOT, 'configs', f'{name}.py')
    own = load(name, arg).model_name  # another published model of its family
    family = models.MODELS[own]['family']
    overrides = dict(OVERRIDES, model_name=next(
        n for n in sorted(models.MODELS) if models.MODELS[n]['family'] == family and n != own))
    if not models.FAMILIES[family].can(models.TENSOR_PARALLEL):
      overrides['model_parallel'] = '1'  # refused for it (below)
    config = _parse(path, arg, [f'--config.{k}={v}' for k, v in overrides.items()])
    for key, value in overrides.items():
      expected = value if key == 'time_budget' or value[0] not in '(0123456789TF' else (
          ast.literal_eval(value))
      assert config[key] == expected, (name, arg, key)
    for key in config.model:  # every architecture field of the recipe's model too
      value = config.model[key]
      if isinstance(value, bool) or not isinstance(value, (int, str)):
        continue
      # Ints doubled (patches of 1 px), so the architecture still fits the image.
      new = 'bfloat16' if key == 'dtype' else (1 if key == 'patch_size' else 2 * value) if (
          isinstance(value, int)) else value
      assert _parse(path, arg, [f'--config.model.{key}={new}']).model[key] == new
    assert _parse(path, arg, ['--config.pretrained=None']).pretrained is None


@pytest.mark.parametrize('override,says', [
    ('lr=-0.1', "config.lr is -0.1; it must be a number > 0"),
    ('total_steps=-5', 'config.total_steps is -5; it must be an integer >= 0'),
    ('eval_every=0', 'config.eval_every is 0; it must be an integer >= 1'),
    ('checkpoint_every=0', 'config.checkpoint_every is 0'),
    ('log_every=0', 'config.log_every is 0'),
    ('keep_checkpoints=0', 'config.keep_checkpoints is 0; it must be an integer >= 1'),
    ('keep_params_at=warm', "config.keep_params_at is 'warm'; it must be '' or steps"),
    ('time_budget=10s', "config.time_budget is '10s'; it must be a duration of at least 30 s"),
    ('time_budget=15min', "config.time_budget is '15min'"),
    ('optimizer=adamw', "config.optimizer is 'adamw'; it must be one of 'sgd', 'adam'"),
    ('label_smoothing=1.0', 'config.label_smoothing is 1.0'),
    ('input.randaugment=(2,)', 'config.input.randaugment is \\(2,\\)'),
    ('model_name=ViT-Q_16', "Unknown model 'ViT-Q_16'"),
    ('model_name=LiT-B16B', r'LiT-B16B \(LiT\) cannot classify images.*vit_jax.zeroshot'),
])
def test_a_value_a_field_does_not_allow_is_named(override, says):
  with pytest.raises(errors.ConfigError, match=says):
    _parse(os.path.join(ROOT, 'configs', 'quickstart_vit.py'), None, [f'--config.{override}'])


@pytest.mark.parametrize('field,value,says', [
    ('num_registers', True, 'config.model.num_registers is True; it must be an integer, as its '
                            'default 0 is.'),
    ('num_heads', False, 'config.model.num_heads is False; it must be an integer'),
    ('dropout_rate', True, 'config.model.dropout_rate is True; it must be a number'),
])
def test_a_boolean_where_a_count_belongs_is_refused(field, value, says):
  """A recipe that writes `num_registers = True` (an int to Python) is refused."""
  config = entry.load_recipe(os.path.join(ROOT, 'configs', 'quickstart_vit.py'))
  config.model[field] = value
  with pytest.raises(errors.ConfigError, match=re.escape(says)):
    settings.check(config)


@pytest.mark.parametrize('fields,says', [
    (dict(num_registers=-1), 'config.model.num_registers is -1; give a whole number'),
    (dict(num_registers=2, posemb_where='every_layer'),
     "num_registers 2 needs posemb_where='input'"),
])
def test_registers_that_cannot_be_built_are_refused_with_the_settings(fields, says):
  with pytest.raises(errors.ConfigError, match=re.escape(says)):
    settings.check_geometry(models.get_config('ViT-Ti_16', **fields), 224)


def test_every_field_of_the_model_family_can_be_set_though_the_recipe_leaves_it_out():
  """The quick-start ViT recipe sets 7 architecture fields; the rest of its family's
  (registers, LayerScale, a representation size) are set from the command line too,
  and a field the family does not have is still refused with the family's fields."""
  path = os.path.join(ROOT, 'configs', 'quickstart_vit.py')
  assert 'num_registers' not in entry.load_recipe(path).model
  config = _parse(path, None, ['--config.model.num_registers=4',
                               '--config.model.layer_scale_init=0.1',
                               '--config.model.representation_size=32'])
  assert (config.model.num_registers, config.model.layer_scale_init,
          config.model.representation_size) == (4, 0.1, 32)
  model = models.get_config(config.model_name, **config.model)
  assert model.num_registers == 4 and model.hidden_size == 64
  argv = ['prog', '--config', path, '--config.model.num_register=4']
  with pytest.raises(errors.ConfigError, match='names no field of the recipe. Did you mean '
                                               'num_registers'):
    entry.check_recipe_overrides(argv, ['config'])


@pytest.mark.parametrize('body,says', [
    ('def get_config():\n  return {"lr": 0.1}\n', 'returns a dict, not an ml_collections'),
    ('def get_config():\n  raise RuntimeError("no")\n',
     r'failed in get_config\(\) \(RuntimeError: no\)'),
    ('import not_a_module_here\ndef get_config():\n  pass\n',
     'imports not_a_module_here, which is not installed'),
    ('def get_config(arg):\n  pass\n', r'needs an argument \(arg\): give it as'),
    ('1 / 0\n', r'failed while loading \(ZeroDivisionError'),
])
def test_a_recipe_file_that_fails_is_one_sentence(tmp_path, body, says):
  path = tmp_path / 'recipe.py'
  path.write_text(body)
  with pytest.raises(errors.ConfigError, match=says):
    entry.load_recipe(str(path))


def test_model_parallelism_is_refused_for_a_family_that_cannot_split():
  with pytest.raises(errors.ConfigError, match=r'BiT-M-R50x1 \(BiT\) cannot split its heads.*'
                     r'Models that can: ViT, hybrid\.'):
    _parse(os.path.join(ROOT, 'configs', 'quickstart_resnet.py'), None,
           ['--config.model_parallel=2'])


@pytest.mark.parametrize('arg,says', [
    ('--config.learning_rate=0.1', 'config.learning_rate names no field of the recipe. Did you '
                                   'mean lr?'),
    ('--config.batchsize=64', 'Did you mean batch_size?'),
    ('--config.warmup_step=3', 'Did you mean warmup_steps?'),
    ('--config.model.hiden_size=3', 'config.model.hiden_size names no field of the recipe. '
                                    'Did you mean hidden_size?'),
    ('--config.lr.x=3', 'config.lr has no fields'),
    ('--config.inception_crop=False', 'Did you mean input.crop?'),
    ('--config.input.crp=False', 'config.input.crp names no field of the recipe. Did you mean '
                                 'crop?'),
])
def test_a_field_no_recipe_has_is_named_with_the_one_meant(arg, says):
  recipe = entry.load_recipe(os.path.join(ROOT, 'configs', 'quickstart_vit.py'))
  with pytest.raises(errors.ConfigError, match=re.escape(says)):
    settings.check_overrides(['prog', arg], recipe)


def test_a_recipe_of_the_flat_augmentation_fields_is_told_where_they_are():
  recipe = entry.load_recipe(os.path.join(ROOT, 'configs', 'quickstart_vit.py'))
  recipe.mixup_alpha = 0.2
  with pytest.raises(errors.ConfigError, match=re.escape(
      "fields no recipe has: ['mixup_alpha']. Did you mean input.mixup_alpha?")):
    settings.check(recipe)


def test_a_workdir_recorded_with_the_flat_augmentation_fields_has_the_same_settings():
  recipe = entry.load_recipe(os.path.join(ROOT, 'configs', 'quickstart_vit.py'))
  now = workdir.settings_of(recipe)
  before = {k: v for k, v in now.items() if k != 'input'}
  before.update(inception_crop=False, crop_padding=0, mixup_alpha=0.0, randaugment=None)
  assert workdir.differences(before, now) == []
  before['mixup_alpha'] = 0.3
  assert workdir.differences(before, now) == ['input.mixup_alpha: 0.3 -> 0.0']


def test_a_recipe_that_cannot_load_is_named():
  with pytest.raises(errors.ConfigError, match="bit_r50x1.py:svhn: Unknown arg 'svhn'"):
    entry.load_recipe(os.path.join(ROOT, 'configs', 'bit_r50x1.py:svhn'))
  with pytest.raises(errors.ConfigError, match='recipe .*nope.py does not exist'):
    entry.load_recipe(os.path.join(ROOT, 'configs', 'nope.py'))


@pytest.mark.parametrize('override,says', [
    ('--config.seed=-1', 'config.seed is -1; it must be an integer from 0 to 2\\*\\*32 - 1'),
    ('--config.model.dtype=float8', "dtype 'float8' is not a dtype these models compute in"),
])
def test_a_seed_or_dtype_no_generator_or_model_takes_is_refused_before_the_workdir(
    override, says, tmp_path, warm_python):
  done = subprocess.run([warm_python, '-m', 'vit_jax.train', '--config',
                         'configs/quickstart_vit.py', '--workdir', str(tmp_path / 'run'), override],
                        cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 1 and re.search(says, done.stderr), done.stderr[-2000:]
  assert 'Traceback' not in done.stderr and not (tmp_path / 'run').exists()
