"""What the trainer prints: its own lines, one per interval, evaluation and save;
the libraries' notes only with --verbosity; a refusal after the libraries have
loaded as its warnings and one Error line."""
import logging
import os
import re
import subprocess

import pytest

from helpers import damage, make_folder
from xla_flags import with_devices
from vit_jax import console
from vit_jax.training import budget

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT_LINE = re.compile(r'\d\d:\d\d:\d\d ')  # the project's loggers: the time, the message


@pytest.mark.parametrize('seconds,text', [(0.4, '0s'), (42.4, '42s'), (185.2, '3m05s'),
                                          (3600, '1h00m00s'), (3725, '1h02m05s')])
def test_durations_are_written_as_budgets_are_and_read_back(seconds, text):
  assert console.duration(seconds) == text
  assert budget.parse_duration(text) == round(seconds)


def test_a_training_line_says_the_step_schedule_rate_and_time_left():
  metrics = {'loss': 1.23456, 'learning_rate': 0.0012}
  assert console.training_line(400, 6084, 0.1412, metrics, 480.4, 750, budgeted=True) == (
      'step 400/6084 (schedule 14.1%): loss 1.2346, lr 1.20e-03, 480 images/s, 12m30s of the '
      'budget left')
  assert console.training_line(400, 6084, 0.0657, metrics, 480.4, 750, budgeted=False) == (
      'step 400/6084 (schedule 6.6%): loss 1.2346, lr 1.20e-03, 480 images/s, about 12m30s '
      'left')
  # The budget spent during the last step: nothing left, not a negative time.
  assert console.training_line(1339, 6250, 1., metrics, 94., -0.6, budgeted=True).endswith(
      ', 94 images/s, 0s of the budget left')
  assert console.training_line(1, 6084, 0., metrics, 0., 0., budgeted=False) == (
      'step 1/6084 (schedule 0.0%): loss 1.2346, lr 1.20e-03')


def test_the_libraries_repeats_of_a_reported_failure_are_left_out():
  def passes(name, level, message, pathname='x.py'):
    record = logging.LogRecord(name, level, pathname, 1, message, (), None)
    return console._drop_library_notes(record)
  # orbax's sibling tasks of a failed read or write, logged as they are collected
  assert not passes('asyncio', logging.ERROR, 'Task exception was never retrieved')
  assert not passes('asyncio', logging.ERROR, '_GatheringFuture exception was never retrieved')
  assert passes('asyncio', logging.ERROR, 'Unclosed event loop')
  assert not passes('absl', logging.WARNING, 'cache', f'{os.sep}tensorflow_datasets{os.sep}a.py')
  assert passes('absl', logging.ERROR, 'failed', f'{os.sep}tensorflow_datasets{os.sep}a.py')
  assert passes('absl', logging.WARNING, 'a warning')


def _train(python, workdir, folder, *extra):
  return subprocess.run(
      [python, '-m', 'vit_jax.train', '--config', 'configs/quickstart_vit.py',
       '--workdir', str(workdir), f'--config.dataset={folder}', '--config.image_size=8',
       '--config.model.hidden_size=16', '--config.model.mlp_dim=32',
       '--config.model.num_layers=1', '--config.model.num_heads=2', '--config.batch_size=16',
       '--config.eval_batch_size=16', '--config.total_steps=4', '--config.warmup_steps=1',
       '--config.log_every=2', '--config.eval_every=4', '--config.checkpoint_every=2',
       *extra], cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, XLA_FLAGS=with_devices(2)))


@pytest.mark.slow
@pytest.mark.e2e  # the train command whole, three times; its parts are tested above and in
# tests/test_faults.py (damaged checkpoints)
def test_the_console_holds_the_projects_lines_and_a_refusal_only_its_error(tmp_path, warm_python):
  folder = make_folder(str(tmp_path / 'images'), {'train': [8, 8], 'test': [4, 4]},
                       size=(8, 8))
  run = _train(warm_python, tmp_path / 'run', folder)
  assert run.returncode == 0, run.stderr
  lines = run.stderr.splitlines()
  assert all(PROJECT_LINE.match(line) for line in lines), run.stderr
  said = [line[9:] for line in lines]
  assert [s.split(':')[0] for s in said if s.startswith('step ') and 'schedule' in s] == [
      'step 2/4 (schedule 50.0%)', 'step 4/4 (schedule 100.0%)']
  assert sum('checkpoint saved' in s for s in said) == 2
  assert sum('evaluation on 8 images: accuracy' in s for s in said) == 1
  assert run.stdout.splitlines()[-1].startswith('Final evaluation on 8 images: accuracy')
  # --verbosity=0 brings back the libraries' notes: orbax's, per checkpoint.
  verbose = _train(warm_python, tmp_path / 'verbose', folder, '--verbosity=0')
  assert verbose.returncode == 0 and 'checkpoint_manager.py' in verbose.stderr
  # Every checkpoint damaged: a warning per checkpoint, then the one error.
  for step in os.listdir(tmp_path / 'run' / 'checkpoints'):
    damage(tmp_path / 'run' / 'checkpoints' / step, stride=256)
  refused = _train(warm_python, tmp_path / 'run', folder)
  lines = refused.stderr.splitlines()
  assert refused.returncode == 1 and lines[-1].startswith('Error: No checkpoint in')
  # The splits' image counts come first, as in every run.
  assert [line[9:].split(':')[0] for line in lines[:2]] == ['folder'] * 2, refused.stderr
  assert len(lines) == 5 and all('cannot be used' in line for line in lines[2:4]), refused.stderr
