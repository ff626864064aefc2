"""The project runs where TensorFlow is not installed: the commands run in a
Python whose imports of TensorFlow (and TensorFlow Text, Keras) fail as they
would there, whether or not this machine has it."""
import os
import subprocess
import sys

import pytest

from helpers import make_folder
from xla_flags import with_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# sitecustomize.py, loaded at start-up: TensorFlow's modules are not found.
HIDE_TENSORFLOW = '''
import importlib.abc, importlib.util, sys
HIDDEN = ('tensorflow', 'tensorflow_text', 'keras')
def hidden(name):
  return any(name == h or name.startswith(h + '.') for h in HIDDEN)
class Hide(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if hidden(name):
      raise ModuleNotFoundError(f"No module named '{name}'", name=name)
sys.meta_path.insert(0, Hide())
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if hidden(name) else find_spec(name, package))
'''


@pytest.fixture
def without_tensorflow(tmp_path):
  """The environment of a Python without TensorFlow."""
  site = tmp_path / 'site'
  site.mkdir()
  (site / 'sitecustomize.py').write_text(HIDE_TENSORFLOW)
  path = os.pathsep.join(p for p in (str(site), os.environ.get('PYTHONPATH')) if p)
  return dict(os.environ, PYTHONPATH=path, XLA_FLAGS=with_devices(2))


def run(env, *command):
  return subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True,
                        timeout=600, env=env)


def test_tensorflow_is_hidden(without_tensorflow):
  check = run(without_tensorflow, '-c', 'import tensorflow')
  assert check.returncode != 0 and "No module named 'tensorflow'" in check.stderr


@pytest.mark.slow
def test_training_resuming_and_the_analysis_run_without_tensorflow(without_tensorflow,
                                                                    tmp_path):
  folder = make_folder(str(tmp_path / 'images'), {'train': [8, 8], 'test': [4, 4]}, size=(8, 8))
  train = ['-m', 'vit_jax.train', '--config', 'configs/quickstart_vit.py',
           '--workdir', str(tmp_path / 'run'), f'--config.dataset={folder}',
           '--config.image_size=8', '--config.model.hidden_size=16', '--config.model.mlp_dim=32',
           '--config.model.num_layers=1', '--config.model.num_heads=2',
           '--config.batch_size=16', '--config.eval_batch_size=16', '--config.warmup_steps=1',
           '--config.log_every=2', '--config.eval_every=4', '--config.checkpoint_every=2',
           '--config.input.randaugment=(2,9)', '--config.input.mixup_alpha=0.2']
  first = run(without_tensorflow, *train, '--config.total_steps=2')
  assert first.returncode == 0, first.stderr
  resumed = run(without_tensorflow, *train, '--config.total_steps=4', '--reconfigure')
  assert resumed.returncode == 0, resumed.stderr
  assert 'Resumed from step 2' in resumed.stderr
  assert any(name.startswith('events.out.tfevents') for name in os.listdir(tmp_path / 'run'))
  analysis = run(without_tensorflow, '-m', 'analysis', 'fourier', '--config',
                 'configs/quickstart_vit.py', '--workdir', str(tmp_path / 'run'),
                 f'--config.dataset={folder}', '--config.image_size=8',
                 '--config.model.hidden_size=16', '--config.model.mlp_dim=32',
                 '--config.model.num_layers=1', '--config.model.num_heads=2',
                 '--num_images', '8', '--batch_size', '8', '--out', str(tmp_path / 'analysis'))
  assert analysis.returncode == 0, analysis.stderr
  assert (tmp_path / 'analysis' / 'fourier.json').exists()
