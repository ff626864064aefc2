"""The papers' ablation switches (position embeddings, skip removal, local
attention) against independent references, and the sweep command end to end."""
import json
import os
import re
import subprocess

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import ablations, papers
from helpers import TINY_VIT, apply, apply_with_intermediates, images, init, make_folder, \
    perturbed, tiny_sweep, tiny_vit
from vit_jax import checkpoint, models, sweep
from vit_jax.files import fit
from vit_jax.models import attention, vit
from vit_jax.training import loop, settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flat(params):
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep='/')


@pytest.mark.parametrize('overrides,expected', [
    (dict(posemb='learn2d'), {'posembed_input/pos_embedding_row': (4, 16),
                              'posembed_input/pos_embedding_col': (4, 16),
                              'posembed_input/pos_embedding_extra': (1, 32)}),
    (dict(posemb='learn2d', classifier='gap'), {'posembed_input/pos_embedding_row': (4, 16),
                                                'posembed_input/pos_embedding_col': (4, 16)}),
    (dict(posemb='relative'), {'posembed_input/relative_embedding': (31, 4, 8)}),
    (dict(posemb='relative', posemb_where='every_layer'),
     {'posembed_0/relative_embedding': (31, 4, 8), 'posembed_1/relative_embedding': (31, 4, 8)}),
    (dict(posemb='relative', posemb_where='every_layer_shared'),
     {'posembed_input/relative_embedding': (31, 4, 8)}),
    (dict(posemb='learn', posemb_where='every_layer'),
     {'posembed_0/pos_embedding': (1, 17, 32), 'posembed_1/pos_embedding': (1, 17, 32)}),
    (dict(posemb='learn', posemb_where='every_layer_shared'),
     {'posembed_input/pos_embedding': (1, 17, 32)}),
    (dict(posemb='sincos2d', posemb_where='every_layer'), {}),
    (dict(attention_window=3), {'posembed_input/pos_embedding': (1, 17, 32)}),
    (dict(skip_removed=((0, 'sa'),)), {'posembed_input/pos_embedding': (1, 17, 32)}),
])
def test_trees_and_shapes(overrides, expected):
  model = tiny_vit(5, **overrides)
  variables = init(model, 32)
  position = {k[len('Transformer/'):]: v.shape for k, v in flat(variables['params']).items()
              if k.startswith('Transformer/posembed')}
  assert position == expected
  classifier = overrides.get('classifier', 'token')
  baseline = {k for k in flat(init(tiny_vit(5, classifier=classifier), 32)['params'])
              if not k.startswith('Transformer/posembed')}
  assert baseline == {k for k in flat(variables['params'])
                      if not k.startswith('Transformer/posembed')}
  chex.assert_shape(apply(model, variables, images(2, 32)), (2, 5))


def test_learn2d_is_row_and_column_tables_concatenated():
  layer = vit.AddPositionEmbs((2, 3), 'learn2d')
  x = np.zeros((1, 7, 6), np.float32)  # a class token and a 2x3 grid, width 6
  variables = jax.jit(layer.init)(jax.random.PRNGKey(0), x)
  p = variables['params']
  out = np.asarray(layer.apply(variables, x))[0]
  np.testing.assert_array_equal(out[0], p['pos_embedding_extra'][0])
  for r in range(2):
    for c in range(3):
      np.testing.assert_array_equal(
          out[1 + 3 * r + c], np.concatenate([p['pos_embedding_row'][r],
                                              p['pos_embedding_col'][c]]))


def test_relative_logits_match_numpy():
  rng = np.random.RandomState(0)
  q = rng.randn(2, 1 + 6, 3, 4).astype(np.float32)  # class token + 6 patches, 3 heads of 4
  table = rng.randn(11, 3, 4).astype(np.float32)
  logits = np.asarray(attention.relative_logits(jnp.asarray(q), jnp.asarray(table), extra=1))
  expected = np.zeros((2, 3, 7, 7))
  for b in range(2):
    for h in range(3):
      for i in range(6):
        for j in range(6):
          # Offset p_q - p_k, shifted to index the table from its most negative offset.
          expected[b, h, 1 + i, 1 + j] = q[b, 1 + i, h] @ table[i - j + 5, h] / 2.
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('grid,window', [((4, 4), 3), ((4, 4), 2), ((5, 3), 4), ((3, 5), 5)])
def test_window_mask_is_the_brute_force_neighbourhood(grid, window):
  mask = attention.window_mask(grid, window, extra=1)
  cells = [(r, c) for r in range(grid[0]) for c in range(grid[1])]
  for i, (qr, qc) in enumerate(cells):
    for j, (kr, kc) in enumerate(cells):
      inside = all(-(window // 2) <= k - q <= (window - 1) // 2 for q, k in ((qr, kr), (qc, kc)))
      assert mask[1 + i, 1 + j] == inside
  assert mask[0].all() and mask[:, 0].all()  # the class token stays global
  assert mask[1:, 1:].sum(1).max() == min(window, grid[0]) * min(window, grid[1])


@pytest.mark.parametrize('overrides', [dict(posemb='relative', attention_window=3),
                                       dict(attention_window=2, classifier='gap')])
def test_fused_equals_explicit_with_bias_and_mask(overrides):
  model = tiny_vit(5, attention_impl='explicit', **overrides)
  variables = perturbed(init(model, 32))
  x = images(2, 32)
  explicit = apply(model, variables, x)
  fused = apply(model.clone(attention_impl='xla'), variables, x)
  np.testing.assert_allclose(fused, explicit, rtol=1e-4, atol=1e-5)
  # A window as wide as the grid attends everywhere: the global model.
  model = tiny_vit(5, attention_impl='explicit', **{**overrides, 'attention_window': 7})
  np.testing.assert_allclose(
      apply(model, variables, x),
      apply(model.clone(attention_window=0), variables, x), rtol=1e-5, atol=1e-6)


def test_skip_removal_changes_only_the_named_branch():
  variables = perturbed(init(tiny_vit(5), 32))
  x = images(2, 32)
  _, base = apply_with_intermediates(tiny_vit(5), variables, x)
  _, cut = apply_with_intermediates(tiny_vit(5, skip_removed=((1, 'mlp'),)), variables, x)
  for name in ('encoderblock_0/+sa', 'encoderblock_0/+mlp', 'encoderblock_1/+sa',
               'encoderblock_1/mlp'):
    np.testing.assert_array_equal(cut[f'Transformer/{name}'], base[f'Transformer/{name}'])
  # The branch output replaces the stream instead of adding to it.
  np.testing.assert_array_equal(cut['Transformer/encoderblock_1/+mlp'],
                                cut['Transformer/encoderblock_1/mlp'])
  assert not np.allclose(cut['Transformer/encoderblock_1/+mlp'],
                         base['Transformer/encoderblock_1/+mlp'])
  with pytest.raises(ValueError, match='names no skip connection'):
    init(tiny_vit(5, skip_removed=((2, 'sa'),)), 32)


@pytest.mark.parametrize('posemb', ['learn2d', 'relative'])
def test_fine_tuning_resizes_every_learned_kind(posemb, tmp_path):
  config = models.get_config('ViT-Ti_16', num_classes=3, posemb=posemb, posemb_where='every_layer',
                             **TINY_VIT)
  upstream = {k: np.asarray(v) for k, v in
              flat(perturbed(init(models.build_model(config), 32))['params']).items()}
  path = str(tmp_path / 'upstream.npz')
  checkpoint.save(path, flax.traverse_util.unflatten_dict(upstream, sep='/'))
  fresh = init(models.build_model(config), 48)['params']  # a 6x6 grid
  fitted = flat(fit.load_pretrained(path, fresh, config))
  for key, value in fitted.items():
    assert value.shape == flat(fresh)[key].shape, key
  if posemb == 'learn2d':
    rows = upstream['Transformer/posembed_0/pos_embedding_row']  # (4, 16) -> (6, 16)
    new = fitted['Transformer/posembed_0/pos_embedding_row']
    np.testing.assert_allclose(new[[0, -1]], rows[[0, -1]], rtol=1e-6)
    # Linear with corners kept: row 3 of 6 sits at 3 * 3/5 = 1.8 of the old rows.
    np.testing.assert_allclose(new[3], 0.2 * rows[1] + 0.8 * rows[2], rtol=1e-5, atol=1e-6)
  else:
    table = upstream['Transformer/posembed_1/relative_embedding']  # 31 -> 71 offsets
    new = fitted['Transformer/posembed_1/relative_embedding']
    np.testing.assert_allclose(new[[0, 35, -1]], table[[0, 15, -1]], rtol=1e-5, atol=1e-6)


def test_sweep_trains_each_row_writes_its_table_and_resumes(tmp_path, monkeypatch, warm_python):
  folder = make_folder(str(tmp_path / 'images'), {'train': [8, 8], 'test': [4, 4]},
                       size=(10, 10))
  workdir = str(tmp_path / 'sweep')
  # One row by name: the table holds it alone; a name of no row is refused.
  assert [r['label'] for r in sweep.run_sweep(tiny_sweep(folder), workdir, ['k3'])] == ['k3']
  assert '| global |' not in open(os.path.join(workdir, 'tiny.md')).read()
  with pytest.raises(sweep.ConfigError, match="--rows names k4, not a row of sweep 'tiny'; "
                     'its rows: global, k3'):
    sweep.run_sweep(tiny_sweep(folder), workdir, ['k4'])
  results = sweep.run_sweep(tiny_sweep(folder), workdir)
  assert [r['label'] for r in results] == ['global', 'k3']
  assert results[1]['fields'] == {'model': {'attention_window': 3}}
  assert all(0 <= r['eval_accuracy'] <= 1 for r in results)
  assert all(0 <= r['eval_ece'] <= 1 and 0 <= r['eval_brier'] <= 2 for r in results)
  table = open(os.path.join(workdir, 'tiny.md')).read()
  assert '| test accuracy | ECE | Brier |' in table
  assert f"| k3 | model={{'attention_window': 3}} | {100 * results[1]['eval_accuracy']:.1f}% | " \
         f"{results[1]['eval_ece']:.3f} | {results[1]['eval_brier']:.3f} |" in table
  assert os.path.getsize(os.path.join(workdir, 'tiny.png')) > 0
  assert len(open(os.path.join(workdir, 'tiny.csv')).read().splitlines()) == 3

  def no_training(*args, **kwargs):
    raise AssertionError('a finished row was trained again')
  monkeypatch.setattr(loop, 'train_and_evaluate', no_training)
  assert sweep.run_sweep(tiny_sweep(folder), workdir) == results

  # The analysis command reads a row's model from the sweep recipe and its workdir.
  recipe = tmp_path / 'tiny_sweep.py'
  recipe.write_text('import ml_collections\n\n\ndef get_config():\n  return '
                    f'ml_collections.ConfigDict({tiny_sweep(folder).to_dict()!r})\n')
  out = tmp_path / 'analysis'
  subprocess.run([warm_python, '-m', 'analysis', 'norm_ratio', '--config', str(recipe),
                  '--row', 'k3', '--workdir', os.path.join(workdir, 'k3'), '--num_images', '8',
                  '--batch_size', '8', '--out', str(out)], check=True, cwd=ROOT)
  assert list(json.loads((out / 'norm_ratio.json').read_text())) == ['tiny_k3']
  # Several rows in one command, from the sweep's directory: CKA across them, and the
  # same-layer curve of the two rows (one architecture).
  both = tmp_path / 'both'
  subprocess.run([warm_python, '-m', 'analysis', 'cka', '--config', str(recipe),
                  '--rows', 'global,k3', '--workdir', workdir, '--num_images', '8',
                  '--batch_size', '8', '--out', str(both)], check=True, cwd=ROOT)
  result = json.loads((both / 'cka.json').read_text())
  assert list(result['cka']) == ['tiny_global', 'tiny_global vs tiny_k3', 'tiny_k3']
  assert (both / 'joint_cka_same_layer.png').exists()
  assert 'same layer: first' in (both / 'report.md').read_text()
  refused = subprocess.run([warm_python, '-m', 'analysis', 'cka', '--config', str(recipe),
                            '--rows', 'global,k3', '--row', 'k3', '--workdir', workdir],
                           cwd=ROOT, capture_output=True, text=True)
  assert refused.returncode != 0 and '--rows takes a sweep recipe' in refused.stderr


def test_row_fields_from_a_recipe_are_stored_as_plain_json(tmp_path, monkeypatch):
  # The data sweep's ResNet rows carry the ResNet recipe's `model`, a ConfigDict.
  config = ablations.get_config('data')
  monkeypatch.setattr(loop, 'train_and_evaluate',
                      lambda row, workdir: {'eval_accuracy': 0.5, 'eval_loss': 1.,
                                           'eval_ece': 0.1, 'eval_brier': 0.6})
  result = sweep.run_row(config, 'resnet-6%', str(tmp_path))
  stored = json.loads((tmp_path / 'resnet-6%' / sweep.RESULT).read_text())
  assert stored == result and stored['fields']['model']['num_layers'] == [1, 1, 1]
  sweep.write_table('data', [result], str(tmp_path))


@pytest.mark.parametrize('tier', [ablations, papers])
def test_every_tiers_sweep_rows_build(tier):
  for name in ablations.SWEEPS:
    config = tier.get_config(name)
    for label, _ in config.sweep.rows:
      row = sweep.row_config(config, label)
      assert 'sweep' not in row
      settings.check(row)
      models.get_config(row.model_name, **row.model)
  pool = [label for label, _ in tier.get_config('pool').sweep.rows]
  assert pool[:3] == [f'token-lr{tier.get_config("vit" if tier is papers else "pool").lr * f:g}'
                      for f in (0.5, 1, 2)]


def test_sweep_rows_bad_rows_are_named():
  data = sweep.row_config(ablations.get_config('data'), 'resnet-6%')
  assert data.model_name == 'BiT-M-R50x1' and 'hidden_size' not in data.model
  assert (data.train_split, data.total_steps) == ('train[:6%]', ablations.STEPS)
  # `--config.total_steps` sets the steps of every row, as for the tier's rows trained
  # at the steps its ViT reached.
  config = papers.get_config('data')
  config.total_steps = 2635
  assert {sweep.row_config(config, label).total_steps
          for label, _ in config.sweep.rows} == {2635}
  config = ablations.get_config('window')
  config.sweep.rows = (('bad', dict(lr_typo=1.)),)
  with pytest.raises(ValueError, match=r"sets \['lr_typo'\]"):
    sweep.row_config(config, 'bad')
  with pytest.raises(ValueError, match='Unknown sweep'):
    ablations.get_config('posembs')


def test_the_buildup_sweep_adds_msa_blocks_from_the_end_of_the_last_stage():
  """Park & Kim's build-up order: MSAs replace conv blocks one at a time from the end
  of the last stage, alternating, then from the end of each earlier stage."""
  from vit_jax.models import alternet
  rows = ablations._buildup_rows((2, 2, 4))
  assert list(rows) == ['msa-0-0-0', 'msa-0-0-1', 'msa-0-0-2', 'msa-0-1-2', 'msa-1-1-2']
  last_stage = [alternet.block_kinds(4, rows[r]['model']['num_msa'][2]) for r in rows]
  assert last_stage[:3] == [('conv',) * 4, ('conv', 'conv', 'conv', 'msa'),
                            ('conv', 'msa', 'conv', 'msa')]
  # The sweep over the quick-start AlterNet's layout ends at the quick-start AlterNet.
  config = ablations.get_config('buildup')
  assert config.model_name == 'AlterNet-50' and config.total_steps == ablations.STEPS
  assert [label for label, _ in config.sweep.rows] == ['msa-0-0-0', 'msa-0-0-1', 'msa-0-1-1']
  assert config.sweep.rows[-1][1]['model']['num_msa'] == tuple(config.model.num_msa)


def test_the_paper_like_tier_is_park_and_kims_cifar_models_and_recipe():
  """configs/cifar10_vit.yaml and models/{vit,resnet,alternet}.py of
  github.com/xxxnell/how-do-vits-work, at 28 px."""
  from vit_jax.models import alternet
  vit, resnet, net = (papers.get_config(name) for name in papers.MODELS)
  for name in papers.MODELS:
    tier, authors = papers.get_config(name), papers.get_config(name + papers.AUTHORS)
    for config in (tier, authors):
      settings.check(config)
      assert (config.tier, config.time_budget, config.batch_size, config.decay) == (
          'paper-like', papers.BUDGET, 96, 'cosine')
      assert (config.grad_clip, config.label_smoothing) == (5., 0.1)
      assert config.warmup_steps == round(papers.STEPS / 60)  # 5 of 300 epochs
      assert config.keep_params_at == 'warmup'  # Park & Kim's Fig. 4 reads early training
    # The authors' recipe unchanged, on the same model.
    assert authors.model == tier.model
    assert (authors.optimizer, authors.lr, authors.weight_decay) == ('adam', 1.25e-4,
                                                                     1.25e-4 * 0.05)
    assert (authors.input.mixup_alpha, authors.input.randaugment) == (1., (2, 9))
    # The tier's: flips only, the quick start's learning rates.
    assert (tier.input.mixup_alpha, tier.input.randaugment, tier.input.crop) == (0., None, False)
  assert (vit.optimizer, vit.lr, vit.weight_decay) == ('adam', 1e-3, 1e-3 * 0.05)
  for config in (resnet, net):
    assert config.optimizer == 'sgd' and config.lr == pytest.approx(0.1 * 96 / 128)
  # 2 px patches: 14x14 tokens and a class token, as 16x16 on 32 px CIFAR.
  assert (vit.image_size // vit.model.patch_size) ** 2 == 196
  assert vit.model.classifier == 'token' and vit.model.stochastic_depth == 0.1
  assert tuple(resnet.model.num_layers) == (3, 4, 6, 3)  # ResNet-50's bottleneck units
  assert (tuple(net.model.num_layers), tuple(net.model.num_msa),
          tuple(net.model.num_heads)) == ((3, 4, 6, 4), (0, 1, 3, 2), (3, 6, 12, 24))
  # MSA blocks alternate with conv blocks from the end of each stage.
  assert alternet.block_kinds(6, 3) == ('conv', 'msa') * 3
  with pytest.raises(ValueError, match='Unknown recipe'):
    papers.get_config('vits')


def test_the_tier_script_trains_and_analyses_rows_its_sweeps_have():
  """scripts/papers.sh names each sweep row it trains and analyses; a renamed row
  would stop it hours in."""
  with open(os.path.join(ROOT, 'scripts', 'papers.sh')) as f:
    script = f.read().replace('\\\n', ' ')
  (trained,) = re.findall(r'^for sweep_rows in (.*); do$', script, re.M)
  named = [pair.split(':') for pair in trained.split()]
  named += re.findall(r'configs/papers\.py:([\w-]+) --rows? ([\w.%,-]+)', script)
  assert {sweep for sweep, _ in named} == {'window', 'pool', 'data'}
  for sweep_name, labels in named:
    rows = dict(papers.get_config(sweep_name).sweep.rows)
    assert set(labels.split(',')) <= set(rows), (sweep_name, labels)
  for recipe in re.findall(r'configs/papers\.py:([\w-]+)"?\s', script):
    papers.get_config(recipe)
