"""Per-parameter learning-rate factors and freezing, the kept head, and the
fine-tuning-cases sweep."""
import os

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import finetune_cases
from helpers import TINY_VIT, init, make_folder, perturbed, tiny_config, tiny_sweep, tiny_vit
from vit_jax import checkpoint, models, sweep
from vit_jax.files import fit
from vit_jax.training import steps

BODY = finetune_cases.BODY


@pytest.fixture(scope='module')
def params_and_grads():
  params = perturbed(init(tiny_vit(num_classes=3), 8))['params']
  grads = jax.tree_util.tree_map(
      lambda x: jnp.asarray(np.random.RandomState(x.size).normal(size=x.shape), x.dtype), params)
  return params, grads


def updates(config, params, grads, steps_=2):
  """Updates of `steps_` optimizer steps on the same gradients."""
  tx = steps.make_optimizer(config, 10)
  state = tx.init(params)
  for _ in range(steps_):
    update, state = tx.update(grads, state, params)
  return update, state


def split(tree):
  flat = flax.traverse_util.flatten_dict(tree, sep='/')
  return ({k: v for k, v in flat.items() if not k.startswith('head/')},
          {k: v for k, v in flat.items() if k.startswith('head/')})


@pytest.mark.parametrize('optimizer', ['adam', 'sgd'])
def test_a_factor_scales_exactly_the_matching_updates(params_and_grads, optimizer):
  params, grads = params_and_grads
  base = dict(optimizer=optimizer, warmup_steps=0, weight_decay=1e-3)
  plain, _ = updates(tiny_config(**base), params, grads)
  scaled, _ = updates(tiny_config(lr_mults=((BODY, 0.1),), **base), params, grads)
  (plain_body, plain_head), (scaled_body, scaled_head) = split(plain), split(scaled)
  chex.assert_trees_all_close(scaled_head, plain_head, rtol=1e-6)
  chex.assert_trees_all_close(scaled_body, jax.tree_util.tree_map(lambda u: 0.1 * u, plain_body),
                              rtol=1e-5, atol=1e-9)


def test_factor_zero_freezes_without_state_or_clipping_share(params_and_grads):
  params, grads = params_and_grads
  config = tiny_config(warmup_steps=0, grad_clip=0.05, lr_mults=((BODY, 0.),))
  frozen, state = updates(config, params, grads)
  body, head = split(frozen)
  assert all(np.all(u == 0) for u in body.values()) and any(np.any(u != 0) for u in head.values())
  # The frozen body's gradient neither counts in the clipping norm nor holds Adam moments.
  head_grads = flax.traverse_util.path_aware_map(
      lambda path, g: g if path[0] == 'head' else jnp.zeros_like(g), grads)
  reference, _ = updates(tiny_config(warmup_steps=0, grad_clip=0.05), params, head_grads)
  chex.assert_trees_all_close(split(frozen)[1], split(reference)[1], rtol=1e-6)
  moments = sum(x.size for x in jax.tree_util.tree_leaves(state))
  _, full_state = updates(tiny_config(warmup_steps=0), params, grads)
  head_size = sum(x.size for x in split(params)[1].values())
  assert moments < 2 * head_size + 10 < sum(x.size for x in jax.tree_util.tree_leaves(full_state))


def test_first_matching_pattern_wins_and_bad_patterns_are_named(params_and_grads):
  params, _ = params_and_grads
  labels = flax.traverse_util.flatten_dict(steps.lr_labels(
      params, (('encoderblock_0/', 0.), ('Transformer/', 0.5))), sep='/')
  assert labels['Transformer/encoderblock_0/LayerNorm_0/scale'] == 'frozen'
  assert labels['Transformer/encoderblock_1/LayerNorm_0/scale'] == 'lr_x0.5'
  assert labels['head/kernel'] == 'lr_x1'
  with pytest.raises(ValueError, match=r"\['Transformr/'\] match no parameter"):
    steps.lr_labels(params, (('Transformr/', 0.1),))
  with pytest.raises(ValueError, match='must be >= 0'):
    steps.make_optimizer(tiny_config(lr_mults=((BODY, -1.),)), 10)


def test_keep_head_keeps_the_checkpoint_head(tmp_path):
  model = tiny_vit(num_classes=3)
  trained = perturbed(init(model, 16))['params']
  path = str(tmp_path / 'up.npz')
  checkpoint.save(path, trained)
  config = models.get_config('ViT-Ti_16', num_classes=3, **TINY_VIT)
  fresh = init(models.build_model(config), 16, seed=5)['params']
  kept = fit.load_pretrained(path, fresh, config, keep_head=True)
  chex.assert_trees_all_equal(kept['head'], jax.tree_util.tree_map(np.asarray, trained['head']))
  new = fit.load_pretrained(path, fresh, config)
  chex.assert_trees_all_equal(new['head'], jax.tree_util.tree_map(np.asarray, fresh['head']))


def test_a_row_starts_from_another_rows_model(tmp_path):
  folder = make_folder(str(tmp_path / 'images'), {'train': [8, 8], 'test': [4, 4]},
                       size=(10, 10))
  config = tiny_sweep(folder)
  config.sweep.rows = (('head-then-all', dict(pretrained='row:head-only', keep_head=True)),
                       ('head-only', dict(lr_mults=((BODY, 0.),))))
  workdir = str(tmp_path / 'sweep')
  results = sweep.run_sweep(config, workdir)
  assert [r['label'] for r in results] == ['head-then-all', 'head-only']
  first = checkpoint.load(os.path.join(workdir, 'head-only', 'params.npz'))
  second = checkpoint.load(os.path.join(workdir, 'head-then-all', 'params.npz'))
  row = sweep.row_config(config, 'head-only')
  model_cfg = steps.model_config(row, 2)
  fresh = steps.init_params(row, models.build_model(model_cfg), 8)
  # Head-only training left the body at its initial values; the second stage moved it.
  chex.assert_trees_all_close(first['Transformer'], jax.tree_util.tree_map(
      np.asarray, fresh['Transformer']), rtol=0, atol=0)
  assert not np.allclose(second['Transformer']['encoder_norm']['scale'],
                         first['Transformer']['encoder_norm']['scale'])
  config.sweep.rows = (('loop', dict(pretrained='row:loop')),)
  with pytest.raises(ValueError, match='not another row'):
    sweep.run_sweep(config, str(tmp_path / 'bad'))


def test_the_finetune_cases_recipe_builds_every_row():
  config = finetune_cases.get_config()
  labels = [label for label, _ in config.sweep.rows]
  assert labels == ['scratch', 'all', 'head-only', 'body-lr0.1', 'head-then-all']
  for label in labels:
    row = sweep.row_config(config, label)
    optax_tx = steps.make_optimizer(row, 100)
    assert isinstance(optax_tx, optax.GradientTransformation)
  assert sweep.row_config(config, 'scratch').pretrained is None


def test_adding_registers_folds_the_class_row_into_the_class_token_as_timm_does(tmp_path):
  """A token-head checkpoint without registers, fine-tuned into a model with 4: the
  class token becomes cls + the position table's class row, written out from
  timm's `_convert_dinov2` (timm/models/vision_transformer.py: `cls_token +
  pos_embed[:, 0]`, `pos_embed[:, 1:]`), so the first block sees the same token."""
  source = perturbed(init(tiny_vit(num_classes=3, classifier='token'), 16))['params']
  path = str(tmp_path / 'plain.npz')
  checkpoint.save(path, source)
  target = tiny_vit(num_classes=5, classifier='token', num_registers=4)
  config = models.get_config('ViT-Ti_16', num_classes=5, classifier='token', num_registers=4,
                             **TINY_VIT)
  fitted = fit.load_pretrained(path, init(target, 16)['params'], config)
  table = np.asarray(source['Transformer']['posembed_input']['pos_embedding'])
  expected_cls = np.asarray(source['cls']) + table[:, 0][:, None]  # timm: cls + pos_embed[:, 0]
  np.testing.assert_allclose(fitted['cls'], expected_cls, rtol=1e-6)
  np.testing.assert_array_equal(fitted['Transformer']['posembed_input']['pos_embedding'],
                                table[:, 1:])


def test_fine_tuning_names_what_it_drops(tmp_path, caplog):
  """Registers, the class token and pre_logits the new model has no place for are
  named in a warning, never dropped silently."""
  source = perturbed(init(tiny_vit(num_classes=3, classifier='token', num_registers=2,
                                   representation_size=16), 16))['params']
  path = str(tmp_path / 'registers.npz')
  checkpoint.save(path, source)
  target = tiny_vit(num_classes=5, classifier='gap')
  config = models.get_config('ViT-Ti_16', num_classes=5, classifier='gap', **TINY_VIT)
  with caplog.at_level('WARNING'):
    fitted = fit.load_pretrained(path, init(target, 16)['params'], config)
  said = caplog.text
  assert 'no registers (num_registers 0): registers' in said
  assert "no class token (classifier 'gap'): cls" in said
  assert 'no representation_size: pre_logits/bias, pre_logits/kernel' in said
  assert 'registers' not in fitted and 'cls' not in fitted
