"""The representation tools end to end on tiny models of each family."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from analysis import features
from analysis import landscape_tools as lt
from analysis import representation_tools as rt
from helpers import TINY_VIT, init, perturbed
from vit_jax import checkpoint, models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subject(name, label, **overrides):
  config = models.get_config(name, num_classes=3, **overrides)
  params = perturbed(init(models.build_model(config), 32))['params']
  return features.Subject(label, config, params, 32)


def batches(split):
  rng = np.random.RandomState(0 if split == 'train' else 1)
  for _ in range(3):
    yield rng.uniform(-1, 1, (12, 32, 32, 3)).astype(np.float32), np.arange(12) % 3


@pytest.fixture(scope='module')
def subjects():
  return [subject('ViT-Ti_16', 'vit', **TINY_VIT),
          subject('ViT-Ti_16', 'vit_gap', **{**TINY_VIT, 'classifier': 'gap'}),
          subject('BiT-M-R50x1', 'bit', num_layers=(1, 1))]


def test_cka_within_and_across_models(subjects, tmp_path):
  result = rt.run_cka(subjects[::2], batches, str(tmp_path))
  json.dumps(result)
  vit, across = np.array(result['cka']['vit']), np.array(result['cka']['vit vs bit'])
  assert vit.shape == (5, 5) and across.shape == (5, 3)  # embedding + 2 x 2 branches; root + 2
  np.testing.assert_allclose(np.diag(vit), 1., rtol=1e-6)
  assert result['num_examples'] == 36
  assert all(os.path.exists(f) for f in result['figures'])


@pytest.mark.parametrize('tool', ['attention_distance', 'localisation', 'vit_figures'])
@pytest.mark.parametrize('index', [0, 1])
def test_vit_tools(subjects, tool, index, tmp_path):
  result = getattr(rt, f'run_{tool}')(subjects[index], batches, str(tmp_path))
  json.dumps(result)
  assert result['figures'] and all(os.path.exists(f) for f in result['figures'])
  if tool == 'attention_distance':
    distances = np.array(result['distance_per_layer_head'])
    assert distances.shape == (2, 4)
    # Between 0 and the diagonal of the 32 px image.
    assert np.all(distances > 0) and np.all(distances < 32 * np.sqrt(2))


@pytest.mark.parametrize('index', [0, 2])
def test_norm_ratio_erf_probes(subjects, index, tmp_path):
  s = subjects[index]
  ratios = rt.run_norm_ratio(s, batches, str(tmp_path))['ratios']
  assert len(ratios) == (4 if s.family == 'vit' else 2)
  assert all(v > 0 for row in ratios.values() for v in row.values())
  first = 'block0/attention' if s.family == 'vit' else 'block1/unit01'
  assert ('cls' in ratios[first]) == (s.family == 'vit')
  fields = rt.run_erf(s, batches, str(tmp_path), num_images=4)
  assert len(fields['fields']) == len(features.block_names(s))
  # The embedding sees one 8x8 patch; later layers see at least as much.
  if s.family == 'vit':
    assert fields['half_mass_pixels'][0] <= 64 <= fields['half_mass_pixels'][-1]
  result = rt.run_probes(s, batches, str(tmp_path), shots=(1, 5, 20))
  json.dumps(result)
  assert set(result['few_shot_pre_logits']) == {1, 5} and result['shots_left_out'] == [20]
  for rows in result['probes'].values():
    assert all(0 <= r['accuracy'] <= 1 for r in rows)


@pytest.mark.slow
def test_command_line_on_the_quick_start_vit(tmp_path):
  """`python -m analysis all` on the quick-start ViT recipe with fresh parameters.

  The ResNet side of every runner is tested above on a tiny BiT; a second model
  on the command line would add minutes of ResNet Hessian compilation."""
  sys.path.insert(0, ROOT)
  from configs import quickstart_vit
  config = quickstart_vit.get_config()
  model = models.get_model(config.model_name, 10, **config.model)
  path = str(tmp_path / 'vit.npz')
  checkpoint.save(path, perturbed(init(model, 28), scale=0.02)['params'])
  out = tmp_path / 'out'
  subprocess.run(
      [sys.executable, '-m', 'analysis', 'all', '--config', 'configs/quickstart_vit.py',
       '--checkpoint', path, '--num_images', '60', '--batch_size', '30',
       '--hessian_batches', '2', '--lanczos_steps', '4', '--out', str(out)],
      check=True, cwd=ROOT)
  from analysis.__main__ import TOOLS
  for tool in TOOLS:
    assert json.loads((out / f'{tool}.json').read_text())['quickstart_vit' if tool != 'cka'
                                                           else 'cka']
  assert len(list(out.glob('*.png'))) >= 15

@pytest.mark.parametrize('index', [0, 2])
def test_landscape_tools(subjects, index, tmp_path):
  s = subjects[index]
  result = lt.run_hessian(s, batches, str(tmp_path), num_minibatches=2, top_k=3, steps_top=8,
                          steps_density=10)
  json.dumps(result)
  assert np.array(result['top_per_minibatch']).shape == (2, 3)
  np.testing.assert_allclose(np.sum(result['slq_weights'], axis=1), 1., rtol=1e-6)
  assert 0 <= result['negative_fraction'] <= 1
  result = lt.run_fourier(s, batches, str(tmp_path))
  json.dumps(result)
  curves = np.array(result['curves'])
  assert curves.shape == (len(result['layers']), 9)
  np.testing.assert_allclose(curves[:, 0], 0., atol=1e-6)
  assert np.all(np.array(result['variance']) > 0)
  assert len(result['attention_layers']) == (2 if s.family == 'vit' else 0)
  result = lt.run_robustness(s, batches, str(tmp_path))
  json.dumps(result)
  assert len(result['accuracy_drop']) == 5
  assert all(os.path.exists(f) for f in result['figures'])
