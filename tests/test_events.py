"""TensorBoard events written without TensorFlow, read back by TensorBoard's own
loader and event accumulator (and by TensorFlow's reader where it is installed)."""
import glob
import io
import subprocess
import sys

import numpy as np
import PIL.Image
import pytest
from tensorboard.backend.event_processing import event_accumulator

from helpers import read_events
from vit_jax.training import events


@pytest.fixture
def logdir(tmp_path):
  writer = events.EventWriter(str(tmp_path))
  writer.write_scalars(3, {'train/loss': 0.25, 'accuracy': 0.875})
  writer.write_scalars(7, {'train/loss': 0.125})
  pixels = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)
  writer.write_images(0, {'figure': pixels})
  writer.write_hparams({'lr': 0.1, 'model': {'name': 'ViT-Ti_16', 'layers': (1, 2)}})
  writer.close()
  return tmp_path


def test_scalars_and_images_read_back(logdir):
  values = read_events(logdir)
  assert {k: {s: float(v) for s, v in steps.items()} for k, steps in values.items()
          if k != 'figure'} == {'train/loss': {3: 0.25, 7: 0.125}, 'accuracy': {3: 0.875}}
  width, height, *pngs = values['figure'][0]
  assert (int(width), int(height), len(pngs)) == (6, 4, 2)
  pixels = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)
  for png, expected in zip(pngs, pixels):
    np.testing.assert_array_equal(np.asarray(PIL.Image.open(io.BytesIO(png))), expected)


def test_tensorboard_shows_them_in_its_plugins(logdir):
  accumulator = event_accumulator.EventAccumulator(str(logdir), size_guidance={'tensors': 0})
  accumulator.Reload()
  tags = accumulator.Tags()
  assert {'train/loss', 'accuracy', 'figure'} <= set(tags['tensors'])
  assert accumulator.SummaryMetadata('train/loss').plugin_data.plugin_name == 'scalars'
  assert accumulator.SummaryMetadata('figure').plugin_data.plugin_name == 'images'
  hparams = accumulator.PluginTagToContent('hparams')
  assert len(hparams) == 1  # the session-start record, settings dotted ('model.name')
  content = next(iter(hparams.values()))
  assert b'model.name' in content and b'ViT-Ti_16' in content


def test_tensorflow_reads_the_same_scalars(logdir):
  tf = pytest.importorskip('tensorflow')
  found = {}
  for path in glob.glob(str(logdir / 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name == 'scalars':
          found[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
  assert found == {('train/loss', 3): 0.25, ('accuracy', 3): 0.875, ('train/loss', 7): 0.125}


def test_without_a_logdir_nothing_is_written(tmp_path):
  writer = events.EventWriter(None, log=True)
  writer.write_scalars(1, {'loss': 1.0})
  writer.close()
  assert not list(tmp_path.iterdir())


def test_writing_events_never_imports_tensorflow(tmp_path):
  """Where TensorFlow is installed, TensorBoard's own writer imports it (seconds, and its
  start-up lines on the console); ours does not."""
  script = ('import sys; from vit_jax.training import events; '
            f'writer = events.EventWriter({str(tmp_path)!r}); '
            "writer.write_scalars(1, {'loss': 1.0}); writer.write_hparams({'lr': 0.1}); "
            "writer.close(); print('tensorflow' in sys.modules)")
  run = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                       check=True)
  assert run.stdout.split() == ['False'] and not run.stderr, run.stderr
  assert read_events(tmp_path) == {'loss': {1: 1.0}}


def test_the_analysis_events_of_a_run_it_cannot_write_into_go_to_its_out(tmp_path, caplog):
  """A finished run on a read-only mount (here: its `analysis` a file, which even
  root cannot make a folder of): the events go to --out, said, and the run is left
  as it was; a writable run gets them beside its training events."""
  from analysis.cli import command
  run, out = tmp_path / 'run', tmp_path / 'out'
  run.mkdir()
  assert command._events_folder(str(run), str(out), 'vit') == str(run / 'analysis')
  blocked = tmp_path / 'blocked'
  blocked.mkdir()
  (blocked / 'analysis').write_text('not a folder')
  assert command._events_folder(str(blocked), str(out), 'vit') == str(out / 'tensorboard' / 'vit')
  assert 'cannot be written' in caplog.text
  assert (blocked / 'analysis').read_text() == 'not a folder'
  assert command._events_folder(None, str(out), 'vit') == str(out / 'tensorboard' / 'vit')
