"""Faults and mistakes a user meets, each answered before any work where it can be
known then, in one sentence, without losing what the workdir held: settings,
a second trainer, changed settings, damaged checkpoints, a full disk,
preemption, sweeps, files that are not what they say."""
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import chex
import pytest

from helpers import damage, make_folder, tiny_config
from xla_flags import with_devices
from vit_jax import checkpoint, entry, errors, sweep
from vit_jax.files import fit, run_folder
from vit_jax.training import loop, run_state, workdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  return make_folder(str(tmp_path_factory.mktemp('images')),
                     {'train': [8, 8, 8], 'test': [5, 4, 4]}, size=(8, 8))


def _files(root):
  """Every file under `root` with the digest of its bytes: what a refusal must leave."""
  out = {}
  for base, _, names in os.walk(root):
    for name in names:
      path = os.path.join(base, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return out


def _train_command(workdir_path, *overrides, env=None, **kwargs):
  """`python -m vit_jax.train` on the quick-start recipe, 8 simulated devices."""
  env = dict(os.environ if env is None else env,
             XLA_FLAGS=with_devices(8), PYTHONUNBUFFERED='1')
  return subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.train', '--config', 'configs/quickstart_vit.py',
       '--workdir', str(workdir_path)] + list(overrides),
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


# A case of the same kind as one the default pass runs (a field's bound, an unparsable
# value): run whole in CI's end-to-end pass; every message is also checked in-process
# (tests/test_configs.py).
SAME_KIND = pytest.mark.e2e


@pytest.mark.parametrize('override,says', [
    ('--config.lr=-0.1', 'Error: config.lr is -0.1; it must be a number > 0.'),
    pytest.param('--config.total_steps=-5',
                 'Error: config.total_steps is -5; it must be an integer >= 0', marks=SAME_KIND),
    pytest.param('--config.eval_every=0',
                 'Error: config.eval_every is 0; it must be an integer >= 1.', marks=SAME_KIND),
    pytest.param('--config.keep_checkpoints=0',
                 'Error: config.keep_checkpoints is 0', marks=SAME_KIND),
    ('--config.time_budget=20s', "Error: config.time_budget is '20s'; it must be a duration"),
    pytest.param('--config.lr=inf',
                 'Error: config.lr is inf; it must be a number > 0.', marks=SAME_KIND),
    ('--config.model.num_heads=5', 'Error: config.model: hidden_size 64 is not divisible by '
                                   'num_heads 5'),
    ('--config.image_size=2', 'Error: config.model.patch_size 4 is larger than '
                              'config.image_size 2'),
    ('--config.image_size=30', 'Error: config.image_size 30 is not a multiple of '
                               'config.model.patch_size 4'),
    ('--config.eval_batch_size=500', 'Error: config.eval_batch_size 500 does not split over '
                                     'the 8 devices; choose a multiple of 8.'),
    pytest.param('--config.num_epochs=inf',
                 'Error: config.num_epochs is inf; it must be a number > 0.', marks=SAME_KIND),
    ('--config.learning_rate=0.1', 'Error: --config.learning_rate names no field of the recipe. '
                                   'Did you mean lr?'),
    ('--config.batch_size=abc', 'Error: --config.batch_size=abc is not an integer; the recipe '
                                'has 128, e.g. --config.batch_size=128.'),
    pytest.param('--config.lr=fast',
                 'Error: --config.lr=fast is not a number; the recipe has 0.002', marks=SAME_KIND),
    ("--config.lr_mults=(('[abc', 0.),)", "Error: config.lr_mults is (('[abc', 0.0),); it must "
                                          'be (regex, factor >= 0) pairs, each regex valid.'),
])
def test_a_wrong_setting_is_one_line_within_seconds_and_touches_nothing(tmp_path, override,
                                                                         says):
  start = time.perf_counter()
  run = _train_command(tmp_path / 'w', override)
  output, _ = run.communicate(timeout=60)
  seconds = time.perf_counter() - start
  assert run.returncode == 1, output
  errors_said = [line for line in output.splitlines() if line.startswith('Error:')]
  assert len(errors_said) == 1 and errors_said[0].startswith(says), output
  assert 'Traceback' not in output
  assert seconds < 10, seconds  # imports included
  assert not (tmp_path / 'w').exists()


def test_a_recipe_that_is_not_one_is_named(tmp_path):
  broken, bare = tmp_path / 'broken.py', tmp_path / 'bare.py'
  broken.write_text('def get_config(:\n')
  bare.write_text('x = 1\n')
  with pytest.raises(errors.ConfigError, match=r'broken.py is not valid Python \(invalid syntax, '
                                               r'line 1\); correct it.'):
    entry.load_recipe(str(broken))
  with pytest.raises(errors.ConfigError, match='bare.py defines no get_config'):
    entry.load_recipe(str(bare))


def test_a_pretrained_file_with_inf_is_named_with_its_array(tmp_path):
  import jax
  import numpy as np
  from helpers import TINY_VIT, init
  from vit_jax import models
  config = models.get_config('ViT-Ti_16', num_classes=3, **TINY_VIT)
  params = init(models.build_model(config), 16)['params']
  broken = jax.tree_util.tree_map(np.array, params)
  broken['Transformer']['encoderblock_0']['MlpBlock_3']['Dense_0']['kernel'][0, 0] = np.inf
  path = str(tmp_path / 'inf.npz')
  checkpoint.save(path, broken)
  with pytest.raises(checkpoint.CheckpointError,
                     match=r"inf.npz holds NaN or infinity in 1 array\(s\), first "
                           r"\['Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel'\]"):
    fit.load_pretrained(path, params, config)


def test_changed_settings_are_refused_naming_them_and_nothing_changes(folder, tmp_path):
  config = tiny_config(folder)
  loop.train_and_evaluate(config, str(tmp_path))
  before = _files(tmp_path)
  for changed, says in ((dict(lr=2e-2), 'lr: 0.01 -> 0.02'),
                        (dict(total_steps=9), 'total_steps: 6 -> 9'),
                        (dict(model_name='BiT-M-R50x1', model=dict(num_layers=(1, 1))),
                         "model_name: 'ViT-Ti_16' -> 'BiT-M-R50x1'")):
    with pytest.raises(errors.WorkdirError, match=f'other settings \\(.*{says}.*--reconfigure'):
      loop.train_and_evaluate(tiny_config(folder, **changed), str(tmp_path))
    assert _files(tmp_path) == before
  # Free fields change nothing the files mean: the run goes on (here: nothing left to train).
  loop.train_and_evaluate(tiny_config(folder, log_every=2, eval_every=2), str(tmp_path))
  # Asked to go on with another model or other registers, no checkpoint fits it:
  # refused in one sentence naming the shapes, never a silent restart.
  before = _files(tmp_path)
  for changed, says in (
      (dict(model_name='BiT-M-R50x1', model=dict(num_layers=(1, 1))), 'the shapes of '),
      (dict(model=dict(tiny_config(folder).model, num_registers=2)),
       r'shapes of 2 parameter\(s\) they hold \(Transformer/posembed_input/pos_embedding '
       r'\(1, 5, 32\) -> \(1, 4, 32\); registers None -> \(1, 2, 32\)\)\. Train into '
       'a new workdir, from its parameters with --config.pretrained=')):
    with pytest.raises(errors.WorkdirError, match='--reconfigure cannot go on from the '
                                                  f'checkpoints in .*{says}'):
      loop.train_and_evaluate(tiny_config(folder, **changed), str(tmp_path), reconfigure=True)
    assert _files(tmp_path) == before
  # With a longer schedule the run goes on from its checkpoint.
  summary = loop.train_and_evaluate(tiny_config(folder, total_steps=9), str(tmp_path),
                                     reconfigure=True)
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['3', '6', '9']
  assert 0 <= summary['eval_accuracy'] <= 1
  assert json.loads((tmp_path / run_folder.RECORD).read_text())['total_steps'] == 9
  # A finished run trains nothing more: --reconfigure would only record settings its
  # parameters were not trained with.
  before = _files(tmp_path)
  with pytest.raises(errors.WorkdirError, match=r'is finished \(step 9 of 9\).*lr: 0.01 -> 0.02'):
    loop.train_and_evaluate(tiny_config(folder, total_steps=9, lr=2e-2), str(tmp_path),
                             reconfigure=True)
  assert _files(tmp_path) == before
  # Without its record, a run's files are refused, unless --reconfigure records anew.
  (tmp_path / run_folder.RECORD).unlink()
  before = _files(tmp_path)
  with pytest.raises(errors.WorkdirError, match='no record of the settings'):
    loop.train_and_evaluate(tiny_config(folder, total_steps=9, lr=2e-2), str(tmp_path))
  assert _files(tmp_path) == before


def test_damaged_checkpoints_are_skipped_and_none_usable_is_refused(folder, tmp_path, caplog):
  config = tiny_config(folder)
  loop.train_and_evaluate(config, str(tmp_path / 'straight'))
  loop.train_and_evaluate(config, str(tmp_path))
  damage(tmp_path / 'checkpoints' / '6')
  os.remove(tmp_path / 'params.npz')
  loop.train_and_evaluate(config, str(tmp_path))  # from step 3, the same steps again
  assert 'Checkpoint at step 6' in caplog.text and 'cannot be used' in caplog.text
  chex.assert_trees_all_equal(checkpoint.load(str(tmp_path / 'params.npz')),
                              checkpoint.load(str(tmp_path / 'straight' / 'params.npz')))
  for step in os.listdir(tmp_path / 'checkpoints'):
    damage(tmp_path / 'checkpoints' / step, stride=256)
  with pytest.raises(checkpoint.CheckpointError, match='No checkpoint in .* can be used'):
    loop.train_and_evaluate(config, str(tmp_path))


def test_a_restored_state_that_is_not_finite_is_not_used():
  import numpy as np
  assert run_state._problem({'w': np.array([1., np.nan])}, None).startswith('1 arrays hold NaN')
  state = {'w': np.arange(3.)}
  assert run_state._problem(state, run_state.checksums(state)) is None
  assert 'differ from what was saved' in run_state._problem({'w': np.arange(3.) + 1},
                                                            run_state.checksums(state))


@contextlib.contextmanager
def small_filesystem(path, size):
  """A tmpfs of `size` at `path` where this process may mount one (root on Linux)."""
  os.makedirs(path, exist_ok=True)
  mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
                           capture_output=True).returncode == 0
  if not mounted:
    pytest.skip('cannot mount a small filesystem here (needs root)')
  try:
    yield path
  finally:
    subprocess.run(['umount', '--lazy', str(path)], check=True)


def test_a_full_disk_is_named_before_training_or_when_it_fills(folder, tmp_path, monkeypatch):
  with small_filesystem(tmp_path / 'small', '300k') as small:
    with pytest.raises(errors.WorkdirError, match=r'has \d+\.\d KB free, and this run needs about'):
      loop.train_and_evaluate(tiny_config(folder), str(small / 'w'))
    assert not os.path.exists(small / 'w' / 'checkpoints' / '3')
    # The check passed, the disk then fills during a save: one sentence, partial files gone.
    monkeypatch.setattr(workdir, 'check_space', lambda *args: None)
    with pytest.raises(errors.WorkdirError, match='No space left under .*: (no checkpoint was '
                       'saved yet|the last good checkpoint is step 3)'):
      loop.train_and_evaluate(tiny_config(folder), str(small / 'w'))
    left = os.listdir(small / 'w' / 'checkpoints') if os.path.isdir(
        small / 'w' / 'checkpoints') else []
    assert not [name for name in left if 'tmp' in name]
    assert not [name for name in os.listdir(small / 'w') if '.tmp-' in name]


def test_partial_files_a_failed_save_still_writes_are_removed_once_it_settles(tmp_path):
  partial = tmp_path / 'checkpoints' / '3.orbax-checkpoint-tmp'

  def write_on():  # a writer thread of the failed save, still going
    for _ in range(3):
      time.sleep(0.2)
      (partial / 'd').mkdir(parents=True, exist_ok=True)
  (partial / 'd').mkdir(parents=True)
  writer = threading.Thread(target=write_on)
  writer.start()
  workdir.remove_partial_files(str(tmp_path), settle=0.5)
  writer.join()
  assert not os.path.exists(partial)


def test_a_text_file_named_npz_says_so(tmp_path):
  path = tmp_path / 'ViT-B_16.npz'
  path.write_text('<html>Not found</html>')
  with pytest.raises(checkpoint.CheckpointError, match='is not an .npz parameter file'):
    checkpoint.load(str(path))


def test_a_run_that_could_not_mean_anything_is_refused_before_it_trains(folder, tmp_path):
  """One class (accuracy 1.0 whatever the model), or parameters kept at a step the
  run never reaches."""
  with pytest.raises(errors.DataError, match="Split 'train\\[:0\\]' of fashion_mnist holds no"):
    loop.train_and_evaluate(tiny_config('fashion_mnist', train_split='train[:0]'),
                             str(tmp_path / 'z'))
  one = make_folder(str(tmp_path / 'one'), {'train': [8], 'test': [4]}, size=(8, 8))
  with pytest.raises(errors.DataError, match='has 1 class: a classifier needs at least two'):
    loop.train_and_evaluate(tiny_config(one), str(tmp_path / 'a'))
  with pytest.raises(errors.ConfigError, match="keep_params_at names step 500, beyond the "
                                               "run's 6 steps"):
    loop.train_and_evaluate(tiny_config(folder, keep_params_at='2,500'), str(tmp_path / 'b'))
  assert not (tmp_path / 'a' / 'checkpoints').exists()
  assert not (tmp_path / 'b' / 'params.npz').exists()


def test_a_workdir_that_is_a_file_or_cannot_be_written_is_refused(tmp_path):
  (tmp_path / 'file').write_text('mine')
  with pytest.raises(errors.WorkdirError, match='is a file; give a directory'):
    with workdir.claim(str(tmp_path / 'file'), tiny_config('fashion_mnist')):
      pass
  assert (tmp_path / 'file').read_text() == 'mine'
  with pytest.raises(errors.WorkdirError, match='cannot be created'):
    with workdir.claim(str(tmp_path / 'file' / 'run'), tiny_config('fashion_mnist')):
      pass
  if os.geteuid() != 0:  # root writes anywhere
    locked = tmp_path / 'locked'
    locked.mkdir(mode=0o500)
    with pytest.raises(errors.WorkdirError, match='is not writable'):
      with workdir.claim(str(locked), tiny_config('fashion_mnist')):
        pass


def test_sweep_rows_are_checked(folder, tmp_path):
  import ml_collections
  config = tiny_config(folder)
  rows = (('a', dict(lr=1e-2)), ('b', dict(lr=2e-2)))
  config.sweep = ml_collections.ConfigDict(dict(name='s', rows=rows))
  sweep.run_sweep(config, str(tmp_path))
  before = _files(tmp_path)
  changed = tiny_config(folder)
  changed.sweep = ml_collections.ConfigDict(dict(name='s', rows=(rows[0], ('b', dict(lr=3e-2)))))
  with pytest.raises(errors.WorkdirError, match="row 'b' .* other settings \\(lr: 0.02 -> 0.03"):
    sweep.run_sweep(changed, str(tmp_path))
  assert _files(tmp_path) == before
  (tmp_path / 'a' / sweep.RESULT).write_text('{not json')
  with pytest.raises(errors.WorkdirError, match='a/result.json is not a sweep result'):
    sweep.run_sweep(config, str(tmp_path))
  escaping = tiny_config(folder)
  escaping.sweep = ml_collections.ConfigDict(dict(name='s', rows=(('../../x', {}),)))
  with pytest.raises(errors.ConfigError, match='is not a plain directory name'):
    sweep.run_sweep(escaping, str(tmp_path))
  assert not (tmp_path.parent.parent / 'x').exists()
  # Rows checked before the first trains: a repeated label, an unknown field and a
  # reference to no other row, each in a row after one that would train.
  for rows, message in (((('c', {}), ('c', dict(lr=2e-2))), "more than one row labelled c"),
                        ((('c', {}), ('d', dict(lr_typo=1.))), r"sets \['lr_typo'\]"),
                        ((('c', {}), ('d', dict(pretrained='row:e'))), "not another row")):
    bad = tiny_config(folder)
    bad.sweep = ml_collections.ConfigDict(dict(name='t', rows=rows))
    with pytest.raises(errors.ConfigError, match=message):
      sweep.run_sweep(bad, str(tmp_path / 'bad'))
    assert not (tmp_path / 'bad' / 'c').exists()


@pytest.mark.slow
def test_a_second_trainer_is_refused_and_sigterm_saves_a_checkpoint_to_resume(folder,
                                                                            tmp_path):
  """Two real trainers on one workdir; the first preempted by SIGTERM, then resumed
  to the end. (That a resumed run's parameters equal an uninterrupted run's is
  tested in-process: test_train.py, test_interrupted_and_resumed_equals_uninterrupted.)"""
  overrides = [f'--config.dataset={folder}', '--config.image_size=8',
               '--config.model.hidden_size=16', '--config.model.mlp_dim=32',
               '--config.model.num_layers=1', '--config.model.num_heads=2',
               '--config.batch_size=16', '--config.eval_batch_size=16',
               '--config.total_steps=600', '--config.warmup_steps=2', '--config.log_every=1',
               '--config.eval_every=1000', '--config.checkpoint_every=1000']
  first = _train_command(tmp_path / 'run', *overrides)
  lock = tmp_path / 'run' / run_folder.LOCK
  events = tmp_path / 'run'
  deadline = time.time() + 120
  while not (lock.exists() and any(n.startswith('events') for n in os.listdir(events))):
    assert first.poll() is None and time.time() < deadline, first.communicate()[0]
    time.sleep(0.2)
  start = time.perf_counter()
  second = _train_command(tmp_path / 'run', *overrides)
  output, _ = second.communicate(timeout=60)
  assert second.returncode == 1 and time.perf_counter() - start < 10
  assert f'is in use by the trainer of process {first.pid}' in output, output
  first.send_signal(signal.SIGTERM)
  output, _ = first.communicate(timeout=60)
  assert first.returncode == 1, output
  said = [line for line in output.splitlines() if line.startswith('Error: Stopped by SIGTERM')]
  assert said and 'Rerun the same command to resume' in said[0], output
  step = int(said[0].split('at step ')[1].split()[0])
  assert os.listdir(tmp_path / 'run' / 'checkpoints') == [str(step)] and 0 < step < 600
  assert not lock.exists()
  resumed = _train_command(tmp_path / 'run', *overrides)
  output, _ = resumed.communicate(timeout=300)
  assert resumed.returncode == 0 and f'Resumed from step {step}' in output, output
  assert json.loads((tmp_path / 'run' / 'results.json').read_text())['step'] == 600


def test_ctrl_c_asks_for_a_save_and_a_second_stops_at_once():
  """Ctrl-C while training is noted as SIGTERM is (the loop saves at the next step
  and stops); pressed again, it interrupts at once; the handlers are restored."""
  before = signal.getsignal(signal.SIGINT)
  with loop.Preemption() as preemption:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)
    assert preemption.signalled and preemption.name == 'Ctrl-C'
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.1)
  assert signal.getsignal(signal.SIGINT) is before
  with loop.Preemption() as preemption:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    assert preemption.signalled and preemption.name == 'SIGTERM'


def test_analysis_inputs_are_checked_before_any_model_loads(tmp_path):
  from analysis.cli import command as cli
  from absl.testing import flagsaver
  from analysis import tool
  from analysis.tools import common
  for amounts, says in (((0, 10), '--num_images is 0'), ((-3, 10), '--num_images is -3'),
                        ((100, 0), '--batch_size is 0; it must be between 1 and --num_images'),
                        ((100, 200), '--batch_size is 200')):
    with pytest.raises(errors.ConfigError, match=says):
      cli.check_amounts(*amounts)
  with flagsaver.flagsaver(lanczos_steps=0):
    with pytest.raises(errors.ConfigError, match='--lanczos_steps is 0; it must be at least 1'):
      tool.TOOLS['hessian'].read_options()
  with pytest.raises(errors.ConfigError, match='exceed the 50 parameters of m'):
    common.check_lanczos(100, 50, 'm')
  with pytest.raises(errors.ConfigError, match='GiB basis, more than half'):
    common.check_lanczos(40, 10 ** 12, 'm')
  run = subprocess.run(
      [sys.executable, '-m', 'analysis', 'hessian', '--config', 'configs/quickstart_vit.py',
       '--checkpoint', str(tmp_path / 'none.npz'), '--lanczos_steps', '0'],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 1 and 'Traceback' not in run.stderr
  assert run.stderr.strip().splitlines()[-1] == (
      'Error: --lanczos_steps is 0; it must be at least 1.')


def test_analysis_refuses_a_head_of_other_classes_nan_parameters_and_a_used_out(tmp_path):
  import numpy as np
  from analysis.cli import command as cli, out_folder, report
  from analysis.runtime import features
  from configs import quickstart_vit
  from helpers import init
  from vit_jax import models
  recipe = quickstart_vit.get_config()
  model = models.get_model(recipe.model_name, 3, **recipe.model)
  params = init(model, 28)['params']
  path = str(tmp_path / 'three.npz')
  checkpoint.save(path, params)
  subject = features.load_subject(recipe.model_name, path, 28, dict(recipe.model), 'vit', recipe)
  with pytest.raises(errors.DataError, match='head of vit has 3 classes but fashion_mnist has 10'):
    cli.check_data([subject], None, 100, ['eval'])
  with pytest.raises(errors.DataError, match=r'^fashion_mnist:test has 10000 images, fewer than '
                                             r'--num_images=20000: give --num_images=10000 or'):
    cli.check_data([subject], None, 20000, ['train', 'eval'])
  (tmp_path / 'unfinished').mkdir()
  with pytest.raises(checkpoint.CheckpointError,
                     match='holds no weights file .* finish its training first'):
    features.load_subject(recipe.model_name, str(tmp_path / 'unfinished'), 28)
  params['head']['bias'] = np.full_like(params['head']['bias'], np.nan)
  checkpoint.save(path, params)
  with pytest.raises(checkpoint.CheckpointError, match='NaN or infinite parameters in 1 arrays'):
    features.load_subject(recipe.model_name, path, 28, dict(recipe.model), 'vit', recipe)
  out = tmp_path / 'out'
  out.mkdir()
  earlier = {'vit': {'model_name': 'ViT-Ti_16', 'source': 'a.npz', 'family': 'vit'}}
  (out / report.SUBJECTS_FILE).write_text(json.dumps(earlier))
  (out / 'cka.json').write_text('{}')
  out_folder.claim_out(str(out), earlier, overwrite=False)  # the same models: allowed
  other = {'vit': {'model_name': 'ViT-Ti_16', 'source': 'b.npz', 'family': 'vit'}}
  with pytest.raises(errors.WorkdirError, match='holds the analysis of other models .*a.npz'):
    out_folder.claim_out(str(out), other, overwrite=False)
  assert (out / 'cka.json').exists()
  out_folder.claim_out(str(out), other, overwrite=True)
  assert not (out / 'cka.json').exists() and not (out / report.SUBJECTS_FILE).exists()


def test_an_out_keeps_what_the_analysis_did_not_write(tmp_path):
  """--overwrite removes the files of the manifest alone; an --out holding a run or
  a file is refused; the same names and sources with other parameters (a model
  retrained in place) are other models."""
  from analysis.cli import out_folder, report
  from analysis.reporting import plots
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'notes.json').write_text('{"mine": 1}')  # the user's, before any analysis
  before = out_folder.files_in(str(out))
  about = {'vit': {'model_name': 'ViT-Ti_16', 'source': 'w', 'params_checksum': 'aa'}}
  (out / report.SUBJECTS_FILE).write_text(json.dumps(about))
  (out / 'cka.json').write_text('{}')
  plots.SAVED.add(str(out / 'cka_vit.png'))  # a figure the analysis saved
  (out / 'cka_vit.png').write_bytes(b'png')
  (out / 'tensorboard' / 'vit').mkdir(parents=True)
  (out / 'tensorboard' / 'vit' / 'events.out').write_bytes(b'events')
  # Saved by the user while the analysis ran: never the analysis's to remove.
  (out / 'my_figure.png').write_bytes(b'mine')
  (out / 'notes2.json').write_text('{"mine": 2}')
  out_folder.record_manifest(str(out), before)
  assert set(json.loads((out / out_folder.MANIFEST).read_text())) == {
      report.SUBJECTS_FILE, 'cka.json', 'cka_vit.png',
      os.path.join('tensorboard', 'vit', 'events.out'), out_folder.MANIFEST}
  retrained = {'vit': {**about['vit'], 'params_checksum': 'bb'}}
  with pytest.raises(errors.WorkdirError, match='before they changed'):
    out_folder.claim_out(str(out), retrained, overwrite=False)
  out_folder.claim_out(str(out), about, overwrite=False)  # the same parameters: allowed
  out_folder.claim_out(str(out), retrained, overwrite=True)
  assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
      'my_figure.png', 'notes.json', 'notes2.json']
  run = tmp_path / 'run'
  run.mkdir()
  (run / run_folder.RECORD).write_text('{}')
  (run / 'results.json').write_text('{}')
  with pytest.raises(errors.WorkdirError, match='holds a training run'):
    out_folder.claim_out(str(run), about, overwrite=True)
  assert (run / run_folder.RECORD).exists() and (run / 'results.json').exists()
  (tmp_path / 'file').write_text('')
  with pytest.raises(errors.WorkdirError, match='is a file'):
    out_folder.claim_out(str(tmp_path / 'file'), about, overwrite=False)
  import numpy as np
  from analysis.runtime import features
  zeros = {'a': np.zeros((2, 3), np.float32)}
  assert features.params_checksum(zeros) == features.params_checksum(
      {'a': np.zeros((2, 3), np.float32)})
  assert features.params_checksum(zeros) != features.params_checksum(
      {'a': np.zeros((3, 2), np.float32)})
  assert features.params_checksum(zeros) != features.params_checksum(
      {'a': np.full((2, 3), 1e-8, np.float32)})


def test_an_analysis_notes_a_signal_and_stops_at_its_next_batch_a_second_ctrl_c_at_once(tmp_path):
  """SIGTERM or Ctrl-C during an analysis is noted, not raised where it lands: the
  next unit of work (`Progress.advance`) or tool (`stopping.check`) stops with one
  line naming the signal; Ctrl-C again stops at once (`errors.Interrupted`); the
  handlers come back, and outside an analysis `check` does nothing."""
  from analysis.runtime import progress, stopping
  before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  for sent, name in ((signal.SIGINT, 'Ctrl-C'), (signal.SIGTERM, 'SIGTERM')):
    done = progress.Progress('test', 3, 'batches')
    with pytest.raises(stopping.Stopped, match=f'^Stopped by {name}; the tools that finished '
                       f'kept their results in {tmp_path} '):
      with stopping.on_signals(str(tmp_path)):
        done.advance()
        os.kill(os.getpid(), sent)
        time.sleep(0.1)  # noted: the work in hand goes on
        done.advance()
    assert done.done == 1
  with pytest.raises(errors.Interrupted, match='^Stopped by Ctrl-C'):
    with stopping.on_signals(str(tmp_path)):
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.1)
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.1)
  assert {s: signal.getsignal(s) for s in before} == before
  stopping.check()


def test_ctrl_c_twice_while_an_analysis_compiles_ends_it_in_one_line_without_a_crash(tmp_path):
  """A real SIGINT as the Hessian tool starts compiling, and another a second later:
  Python delivers the second inside the wait for an XLA compilation that goes on in
  another thread; the process ends with the one line, exit status 1, --out
  released, and no crash of JAX's client torn down under the compilation."""
  from helpers import quickstart_vit_checkpoint
  first = quickstart_vit_checkpoint(tmp_path)
  out = tmp_path / 'out'
  command = _analysis_command(out, first, 'hessian', '--hessian_batches', '2',
                              '--lanczos_steps', '4')
  running = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED='1'),
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    assert running.stdout.readline().strip() == 'hessian: running', running.communicate()
    running.send_signal(signal.SIGINT)
    time.sleep(1)
    running.send_signal(signal.SIGINT)
    stdout, stderr = running.communicate(timeout=120)
  finally:
    running.kill()
  assert running.returncode == 1, stderr[-3000:]
  assert 'Fatal Python error' not in stderr and 'Traceback' not in stderr, stderr[-3000:]
  assert stderr.strip().splitlines()[-1].startswith(
      'Error: Stopped by Ctrl-C; the tools that finished kept their results in'), stderr
  assert not (out / 'analysis_lock.json').exists() and not (out / 'hessian.json').exists()


@contextlib.contextmanager
def _ctrl_c_in_the_next_gc_callback():
  """Within: the next garbage collection's callback receives a Ctrl-C and runs
  Python code, where its handler runs. Yields what landed there: 'in the callback'
  once that handler raised KeyboardInterrupt inside it."""
  import gc
  landed = []

  def callback(phase, info):
    del info
    if phase == 'start' and not landed:
      landed.append('sent')
      try:
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):
          pass
      except KeyboardInterrupt:
        landed[-1] = 'in the callback'
        raise

  gc.callbacks.append(callback)
  try:
    yield landed
  finally:
    gc.callbacks.remove(callback)


def test_a_second_ctrl_c_raised_where_python_drops_exceptions_comes_again(capsys):
  """The second Ctrl-C lands in a garbage collector's callback (as in JAX's, during
  a compilation): Python drops the KeyboardInterrupt raised there, printing a
  traceback. It is delivered again instead, unprinted, and raises where the code
  runs."""
  import gc
  from vit_jax.training import signals
  with signals.NotedSignals('stopping'):
    signal.raise_signal(signal.SIGINT)  # the first: noted
    with _ctrl_c_in_the_next_gc_callback() as landed:
      with pytest.raises(KeyboardInterrupt):
        gc.collect()
        deadline = time.time() + 30
        while time.time() < deadline:
          time.sleep(0.01)
  assert landed == ['in the callback']
  assert 'Exception ignored' not in capsys.readouterr().err


def test_a_ctrl_c_to_come_again_is_not_sent_once_the_command_left_the_signals_context():
  """The KeyboardInterrupt dropped just before the context closes: no Ctrl-C reaches
  the handler that was there before."""
  import gc
  from vit_jax.training import signals
  received = []
  previous = signal.signal(signal.SIGINT, lambda *_: received.append('Ctrl-C'))
  try:
    with signals.NotedSignals('stopping'):
      signal.raise_signal(signal.SIGINT)
      with _ctrl_c_in_the_next_gc_callback() as landed:
        gc.collect()
    time.sleep(0.3)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert landed == ['in the callback'] and received == []


def _analysis_command(out, checkpoint_path, tool='all', *extra):
  """`python -m analysis` on the quick-start ViT recipe and the .npz `checkpoint_path`."""
  return [sys.executable, '-m', 'analysis', tool, '--config', 'configs/quickstart_vit.py',
          '--checkpoint', str(checkpoint_path), '--num_images', '40', '--batch_size', '20',
          '--out', str(out), '--notensorboard', *extra]


def test_an_analysis_out_is_locked_stopped_in_one_line_and_never_mixes_models(tmp_path):
  """Two real analyses into one --out: the second is refused while the first runs;
  Ctrl-C (a real SIGINT) stops the first with one line; a later analysis of another
  model into that --out is refused (the stopped one's results are never shown under
  the new model), and with --overwrite it removes them and keeps the user's file."""
  import numpy as np
  from helpers import quickstart_vit_checkpoint
  from analysis.cli import report
  first = quickstart_vit_checkpoint(tmp_path)
  other = tmp_path / 'other.npz'
  params = checkpoint.load(first)
  params['head']['bias'] = np.asarray(params['head']['bias']) + 1.
  checkpoint.save(str(other), params)
  out = tmp_path / 'out'
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  running = subprocess.Popen(_analysis_command(out, first), cwd=ROOT, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    deadline = time.time() + 240
    while not (out / 'cka.json').exists():  # the first tool has written its results
      assert running.poll() is None, running.communicate()
      assert time.time() < deadline
      time.sleep(0.2)
    (out / 'mine.txt').write_text('the user\'s')  # saved while the analysis runs
    start = time.perf_counter()
    second = subprocess.run(_analysis_command(out, first, 'norm_ratio'), cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 1 and 'Traceback' not in second.stderr
    assert second.stderr.strip().splitlines()[-1].startswith(
        f'Error: {out} is in use by the analysis of process {running.pid}'), second.stderr
    assert time.perf_counter() - start < 60
    running.send_signal(signal.SIGINT)
    stdout, stderr = running.communicate(timeout=120)
  finally:
    running.kill()
  assert running.returncode == 1 and 'Traceback' not in stderr, stderr[-3000:]
  assert stderr.strip().splitlines()[-1].startswith(
      'Error: Stopped by Ctrl-C; the tools that finished kept their results in'), stderr
  assert not (out / 'analysis_lock.json').exists()
  manifest = json.loads((out / 'analysis_files.json').read_text())
  assert 'cka.json' in manifest and report.SUBJECTS_FILE in manifest
  assert 'mine.txt' not in manifest
  refused = subprocess.run(_analysis_command(out, other, 'norm_ratio'), cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
  assert refused.returncode == 1 and 'holds the analysis of other models' in refused.stderr
  assert (out / 'cka.json').exists() and (out / 'mine.txt').exists()
  again = subprocess.run(_analysis_command(out, other, 'norm_ratio', '--overwrite'), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert not (out / 'cka.json').exists() and (out / 'mine.txt').exists()
  assert json.loads((out / report.SUBJECTS_FILE).read_text())['quickstart_vit']['source'] == \
      str(other)
  assert '## Representation similarity' not in (out / 'report.md').read_text()


def _lock_taker(barrier, path, results, rounds):
  """A process that tries to take the lock at `path` each round, at once with another."""
  from vit_jax import errors as errs
  from vit_jax.training import workdir as wd
  for i in range(rounds):
    barrier.wait()
    try:
      wd.take_lock(path)
      results.put((i, os.getpid()))
    except errs.WorkdirError:
      results.put((i, None))
    except Exception as e:  # a crash is a failure of the test, not a hang
      results.put((i, repr(e)))
    barrier.wait()


def test_two_processes_taking_a_stale_lock_at_once_one_gets_it(tmp_path):
  """Two real processes released together on a stale lock, round after round:
  exactly one takes it over each time, and the file names that one."""
  import multiprocessing
  import socket
  ended = subprocess.Popen([sys.executable, '-c', 'pass'])
  ended.wait()
  stale = json.dumps({'host': socket.gethostname(), 'pid': ended.pid, 'since': 'earlier'})
  path = str(tmp_path / run_folder.LOCK)
  rounds = 500
  context = multiprocessing.get_context('fork')
  barrier, results = context.Barrier(3), context.Queue()
  workers = [context.Process(target=_lock_taker, args=(barrier, path, results, rounds))
             for _ in range(2)]
  for w in workers:
    w.start()
  try:
    for i in range(rounds):
      with open(path, 'w') as f:
        f.write(stale)
      barrier.wait(timeout=60)
      barrier.wait(timeout=60)
      outcomes = [pid for _, pid in (results.get(timeout=60) for _ in range(2))]
      assert not [o for o in outcomes if isinstance(o, str)], f'round {i}: {outcomes}'
      taken = [pid for pid in outcomes if pid]
      assert len(taken) == 1, f'round {i}: {len(taken)} processes hold the lock'
      assert json.loads(open(path).read())['pid'] == taken[0]
  finally:
    for w in workers:
      w.join(timeout=10)
      if w.is_alive():
        w.kill()
  assert sorted(os.listdir(tmp_path)) == [run_folder.LOCK]


def test_a_lock_whose_process_has_ended_is_taken_over(tmp_path, caplog):
  import socket
  ended = subprocess.Popen([sys.executable, '-c', 'pass'])
  ended.wait()
  (tmp_path / run_folder.LOCK).write_text(json.dumps(
      {'host': socket.gethostname(), 'pid': ended.pid, 'since': 'earlier'}))
  with workdir.claim(str(tmp_path), tiny_config('fashion_mnist')) as record:
    held = json.loads((tmp_path / run_folder.LOCK).read_text())
    assert held['pid'] == os.getpid()
    record()
  assert 'Taking over the stale lock' in caplog.text
  assert not (tmp_path / run_folder.LOCK).exists()
  assert json.loads((tmp_path / run_folder.RECORD).read_text())['lr'] == 1e-2
  # Another host's lock cannot be checked: refused, naming the file to delete.
  (tmp_path / run_folder.LOCK).write_text(json.dumps({'host': 'elsewhere', 'pid': 1, 'since': 'x'}))
  with pytest.raises(errors.WorkdirError, match=f'delete {tmp_path}/{run_folder.LOCK}'):
    with workdir.claim(str(tmp_path), tiny_config('fashion_mnist')):
      pass


def _tools_with_requirements():
  from analysis import tool
  from analysis.tools import TOOLS
  return [n for n, t in TOOLS.items() if t.runs_on == tool.ATTENTION or t.needs]


@pytest.mark.parametrize('name', _tools_with_requirements())
def test_a_tool_with_nothing_to_compute_on_the_models_is_refused_not_empty(name, capsys):
  """A tool that reads attention heads or tokens, named alone on a ResNet (head_cka:
  on one model), is refused before any work, never `{}` with exit 0; `all` leaves
  it out and says why."""
  from analysis.cli import command as cli
  from helpers import subject
  resnet = subject('BiT-M-R50x1', 'resnet', num_layers=(1, 1))
  with pytest.raises(errors.ConfigError, match=name):
    cli.check_tools([resnet], [name], name)
  kept = cli.check_tools([resnet], [name, 'norm_ratio'], 'all')
  assert kept == ['norm_ratio'] and f'{name}: not run (' in capsys.readouterr().out


def test_a_second_models_flags_without_its_recipe_are_refused(tmp_path):
  for flag in ('--workdir2', '--checkpoint2'):
    run = subprocess.run(
        [sys.executable, '-m', 'analysis', 'cka', '--config', 'configs/quickstart_vit.py',
         '--checkpoint', str(tmp_path / 'none.npz'), flag, str(tmp_path / 'other'),
         '--out', str(tmp_path / 'out')], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and 'Traceback' not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(
        f'Error: {flag} name a second model, whose recipe is --config2')
    assert 'USAGE' not in run.stderr  # one sentence, not the flags' help
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('given,says', [
    ('0', "Error: --time_budget '0' has no unit: write 0s, 0m or 0h."),
    pytest.param('90',
                 "Error: --time_budget '90' has no unit: write 90s, 90m or 90h.", marks=SAME_KIND),
    ('0s', 'Error: --time_budget=0s leaves no time; give a duration such as 6m'),
])
def test_an_analysis_budget_without_unit_or_time_is_refused_at_once(tmp_path, given, says):
  run = subprocess.run(
      [sys.executable, '-m', 'analysis', 'cka', '--config', 'configs/quickstart_vit.py',
       '--checkpoint', str(tmp_path / 'none.npz'), f'--time_budget={given}',
       '--out', str(tmp_path / 'out')], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 1 and run.stderr.strip().splitlines()[-1].startswith(says), run.stderr


def test_a_download_folder_as_checkpoint_loads_its_weights_file(tmp_path):
  """A Hugging Face snapshot folder (config.json beside model.safetensors and
  pytorch_model.bin) loads its .safetensors, and still does beside other weights
  files (`from_pretrained`'s names come first); a folder of several files of one
  kind, none of those names, names them."""
  from vit_jax.files import timm_files
  from helpers import init, perturbed, tiny_vit
  params = perturbed(init(tiny_vit(num_classes=3), 16))['params']
  state = timm_files.to_timm(params, 'ViT-Ti_16')
  folder = tmp_path / 'snapshot'
  folder.mkdir()
  (folder / 'config.json').write_text('{"architecture": "vit_tiny_patch16_224"}')
  from safetensors.numpy import save_file
  save_file(state, str(folder / 'model.safetensors'))
  (folder / 'pytorch_model.bin').write_bytes(b'not read')
  from helpers import TINY_VIT
  loaded = checkpoint.load(str(folder), 'ViT-Ti_16', **TINY_VIT)
  chex.assert_trees_all_close(loaded, params)
  (folder / 'other.safetensors').write_bytes(b'')
  chex.assert_trees_all_close(checkpoint.load(str(folder), 'ViT-Ti_16', **TINY_VIT), params)
  os.rename(folder / 'model.safetensors', folder / 'weights.safetensors')
  os.remove(folder / 'pytorch_model.bin')
  with pytest.raises(checkpoint.CheckpointError, match=r'holds 2 weights files \(other.safetensors,'
                     r' weights.safetensors\): give the one'):
    checkpoint.load(str(folder), 'ViT-Ti_16', **TINY_VIT)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_timm_files_with_ddp_names_or_bfloat16_load_and_other_keys_are_named(tmp_path, dtype):
  """A .safetensors in bfloat16 reads (safetensors' numpy reader cannot), its
  float32 twin reads as safetensors' own reader does; DistributedDataParallel's
  `module.` prefix is taken off; a state dict of another model names a key it lacks."""
  import ml_dtypes
  import numpy as np
  from safetensors.numpy import load as reference_load, save_file
  from vit_jax.files import timm_files
  from helpers import TINY_VIT, init, perturbed, tiny_vit
  params = perturbed(init(tiny_vit(num_classes=3), 16))['params']
  state = timm_files.to_timm(params, 'ViT-Ti_16')
  stored = {('module.' + k): np.asarray(v).astype(getattr(ml_dtypes, dtype, dtype))
            for k, v in state.items()}
  path = tmp_path / 'ddp.safetensors'
  if dtype == 'float32':
    save_file(stored, str(path))
    read = timm_files.read_safetensors(path.read_bytes())
    reference = reference_load(path.read_bytes())
    assert set(read) == set(reference)
    for k in read:
      np.testing.assert_array_equal(read[k], reference[k])
  else:  # written by hand: the header, then each array's bytes
    header, offset, body = {}, 0, b''
    for k, v in stored.items():
      raw = np.ascontiguousarray(v).tobytes()
      header[k] = {'dtype': 'BF16', 'shape': list(v.shape), 'data_offsets': [offset,
                                                                            offset + len(raw)]}
      offset, body = offset + len(raw), body + raw
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, 'little') + text + body)
  loaded = checkpoint.load(str(path), 'ViT-Ti_16', **TINY_VIT)
  tolerance = 0 if dtype == 'float32' else 2 ** -8  # bfloat16 keeps 8 significant bits
  chex.assert_trees_all_close(loaded, params, rtol=tolerance, atol=1e-30)
  save_file({'foo': np.zeros(3, np.float32)}, str(tmp_path / 'other.safetensors'))
  with pytest.raises(checkpoint.CheckpointError, match=r"The state dict has no 'pos_embed', "
                                                       r'.*its first keys: foo'):
    checkpoint.load(str(tmp_path / 'other.safetensors'), 'ViT-Ti_16', **TINY_VIT)


def _swap(a, b):
  os.rename(a, a + '.tmp')
  os.rename(b, a)
  os.rename(a + '.tmp', b)


@pytest.mark.slow
def test_a_resume_on_other_data_is_refused_saying_what_changed(tmp_path):
  """A run on a folder records its data (data.json); each change a rerun meets (class
  folders swapped, images added, a class added, files replaced) is refused in one
  sentence before training, and --reconfigure goes on and records the change."""
  root = str(tmp_path / 'images')
  folder = make_folder(root, {'train': [8, 8, 8], 'test': [4, 4, 4]}, size=(8, 8))
  workdir = str(tmp_path / 'run')
  config = tiny_config(folder, total_steps=2, eval_every=2, checkpoint_every=2)
  loop.train_and_evaluate(config, workdir)
  recorded = json.load(open(os.path.join(workdir, 'data.json')))['splits']
  assert recorded['train']['classes'] == ['class_0', 'class_1', 'class_2']
  assert recorded['train']['images_per_class'] == [8, 8, 8]
  before = {name: open(os.path.join(workdir, name), 'rb').read()
            for name in os.listdir(workdir) if os.path.isfile(os.path.join(workdir, name))}

  def refused(says):
    with pytest.raises(errors.DataError, match=says):
      loop.train_and_evaluate(config, workdir)
    assert {name: open(os.path.join(workdir, name), 'rb').read() for name in before} == before

  for split in ('train', 'test'):
    _swap(os.path.join(root, split, 'class_0'), os.path.join(root, split, 'class_1'))
  refused(r"train: the same number of images, but files renamed, replaced or moved")
  for split in ('train', 'test'):
    _swap(os.path.join(root, split, 'class_0'), os.path.join(root, split, 'class_1'))
  extra = os.path.join(root, 'train', 'class_2', 'deeper')
  os.makedirs(extra)
  make_folder(str(tmp_path / 'more'), {'train': [2]}, size=(8, 8))
  for name in os.listdir(tmp_path / 'more' / 'train' / 'class_0'):
    os.rename(tmp_path / 'more' / 'train' / 'class_0' / name, os.path.join(extra, name))
  refused(r'train: 24 images then, 26 now\. Train into a new workdir, or rerun with '
          r'--reconfigure')
  for split, n in (('train', 3), ('test', 2)):
    make_folder(str(tmp_path / f'new_{split}'), {split: [n]}, size=(8, 8))
    os.rename(tmp_path / f'new_{split}' / split / 'class_0', os.path.join(root, split, 'class_3'))
  refused(r"train: classes added \['class_3'\] \(3 classes then, 4 now\)")
  import shutil
  for split in ('train', 'test'):
    shutil.rmtree(os.path.join(root, split, 'class_3'))
  loop.train_and_evaluate(config, workdir, reconfigure=True)  # the sub-folder's images accepted
  record = json.load(open(os.path.join(workdir, 'data.json')))
  assert record['splits']['train']['images_per_class'] == [8, 8, 10]
  assert record['accepted'][0]['changes'] == ['train: 24 images then, 26 now']


@pytest.mark.slow
def test_an_analysis_on_classes_other_than_the_runs_is_refused(tmp_path):
  root = str(tmp_path / 'images')
  folder = make_folder(root, {'train': [8, 8], 'test': [4, 4]}, size=(8, 8))
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(tiny_config(folder, total_steps=2, eval_every=2, checkpoint_every=2),
                          workdir)
  other = make_folder(str(tmp_path / 'other'), {'train': [4, 4], 'test': [4, 4]}, size=(8, 8))
  for split in ('train', 'test'):
    for old, new in (('class_0', 'cat'), ('class_1', 'dog')):
      os.rename(tmp_path / 'other' / split / old, tmp_path / 'other' / split / new)
  from analysis.cli import command as cli
  from analysis.runtime import features
  recipe = tiny_config(folder)
  subject = features.load_subject(recipe.model_name, workdir, 8, dict(recipe.model), 'tiny',
                                  recipe)
  cli.check_data([subject], None, 4, ['eval'], {'tiny': workdir})
  with pytest.raises(errors.DataError, match=r"tiny was trained on the classes \['class_0', "
                     r"'class_1'\] .* but folder:\S+ names \['cat', 'dog'\]"):
    cli.check_data([subject], other, 4, ['eval'], {'tiny': workdir})


@pytest.mark.slow
def test_a_file_deleted_during_training_stops_the_run_after_saving_its_steps(tmp_path,
                                                                            monkeypatch):
  """The folder's images are deleted after the third step: the run stops with one
  sentence naming a file and the checkpoint of the last step it trained, which a
  rerun on the restored folder resumes from."""
  import shutil
  root = str(tmp_path / 'images')
  folder = make_folder(root, {'train': [12, 12], 'test': [4, 4]}, size=(8, 8))
  shutil.copytree(root, str(tmp_path / 'copy'))
  real = loop.device_batches

  def deleting(*args, **kwargs):
    for step, batch in enumerate(real(*args, **kwargs), 1):
      yield batch
      if step == 3:
        shutil.rmtree(os.path.join(root, 'train'))
  monkeypatch.setattr(loop, 'device_batches', deleting)
  workdir = str(tmp_path / 'run')
  config = tiny_config(folder, total_steps=40, eval_every=40, checkpoint_every=40)
  with pytest.raises(errors.DataError, match=r'class_\d/\S+ can no longer be read \(No such file '
                     r'or directory\): .* Stopped at step (\d+) of 40; the checkpoint is '
                     r'\S+/checkpoints/\1\.$') as stopped:
    loop.train_and_evaluate(config, workdir)
  saved = int(str(stopped.value).rsplit('/', 1)[1].rstrip('.'))
  assert saved >= 3
  monkeypatch.setattr(loop, 'device_batches', real)
  shutil.rmtree(root)
  shutil.copytree(str(tmp_path / 'copy'), root)
  with open(os.path.join(workdir, 'data.json')) as f:
    assert json.load(f)['splits']['train']['files'] == 24
  loop.train_and_evaluate(config, workdir)
  assert json.load(open(os.path.join(workdir, 'results.json')))['step'] == 40
