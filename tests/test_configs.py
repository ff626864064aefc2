"""Every recipe in configs/ loads, names a zoo model that builds, and has every field."""
import importlib

import jax
import jax.numpy as jnp
import pytest

from configs import common
from vit_jax import models, steps

RECIPES = [('quickstart_vit', None), ('quickstart_resnet', None), ('quickstart_alternet', None),
           ('vit_s16_i1k', None), ('mixer_b16', 'cifar10'), ('mixer_b16', 'imagenet2012'),
           ('vit_b16', 'cifar10'), ('vit_b16', 'cifar100'), ('vit_b16', 'imagenet2012'),
           ('vit_b16', 'pretrain'), ('bit_r50x1', 'cifar10'), ('bit_r50x1', 'oxford_iiit_pet'),
           ('bit_r50x1', 'imagenet2012')]


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
  assert (s16.randaugment, s16.mixup_alpha, s16.model.classifier, s16.model.posemb) == (
      (2, 10), 0.2, 'gap', 'sincos2d')
  b16 = load('vit_b16', 'cifar10')
  assert (b16.batch_size, b16.total_steps, b16.image_size, b16.optimizer, b16.grad_clip) == (
      512, 10_000, 384, 'sgd', 1.0)
  # BiT-HyperRule: small images train at 128 px, large at 384; schedule from dataset size.
  assert (load('bit_r50x1', 'cifar10').image_size, load('bit_r50x1', 'cifar10').total_steps,
          load('bit_r50x1', 'cifar10').mixup_alpha) == (128, 10_000, 0.1)
  pets = load('bit_r50x1', 'oxford_iiit_pet')
  assert (pets.image_size, pets.total_steps, pets.mixup_alpha) == (384, 500, 0.)
  assert load('bit_r50x1', 'imagenet2012').total_steps == 20_000
  with pytest.raises(ValueError, match="Unknown arg 'svhn'"):
    load('bit_r50x1', 'svhn')
