"""TensorBoard event files, written without TensorFlow: scalars, images and a
run's settings, as `tf.summary` writes them (TensorBoard's scalars, images and
hparams plugins), through TensorBoard's record format and protocol buffers.

TensorBoard's `EventFileWriter` is not used: it imports TensorFlow where TensorFlow
is installed, which takes seconds and writes TensorFlow's start-up lines to the
console.
"""
import io
import itertools
import os
import socket
import time
from typing import Any, Mapping, Optional

import numpy as np
from absl import logging
from etils import epath
from PIL import Image
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.record_writer import RecordWriter

from vit_jax.training import workdir

_FILES = itertools.count()  # tells apart the event files one process opens in a second


def _event_file(logdir: str) -> RecordWriter:
  """A new event file in `logdir` (made if missing), named as TensorBoard's writers name
  theirs, its first record the file version TensorBoard reads."""
  folder = epath.Path(logdir)
  folder.mkdir(parents=True, exist_ok=True)
  name = (f'events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.'
          f'{os.getpid()}.{next(_FILES)}')
  records = RecordWriter((folder / name).open('wb'))
  records.write(event_pb2.Event(wall_time=time.time(),
                                file_version='brain.Event:2').SerializeToString())
  records.flush()
  return records


def _metadata(plugin: str) -> summary_pb2.SummaryMetadata:
  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin))


def _png(pixels: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(np.asarray(pixels, np.uint8).squeeze(-1) if pixels.shape[-1] == 1
                  else np.asarray(pixels, np.uint8)).save(buffer, format='PNG')
  return buffer.getvalue()


class EventWriter:
  """One run's TensorBoard events in `logdir` (None: none, as on all but the
  first process); with `log`, scalars also go to the log."""

  def __init__(self, logdir: Optional[str], log: bool = False):
    self._writer = _event_file(logdir) if logdir is not None else None
    self._log = log

  def _write(self, step: int, summary: summary_pb2.Summary) -> None:
    if self._writer is not None:
      self._writer.write(event_pb2.Event(wall_time=time.time(), step=int(step),
                                         summary=summary).SerializeToString())

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """Scalars at `step`, each a float32 tensor of the scalars plugin.

    Args:
      step: the step.
      scalars: tag -> value.
    """
    values = [summary_pb2.Summary.Value(
        tag=tag, metadata=_metadata('scalars'),
        tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[float(value)],
                                      tensor_shape=tensor_shape_pb2.TensorShapeProto()))
              for tag, value in scalars.items()]
    self._write(step, summary_pb2.Summary(value=values))
    if self._log:
      logging.info('[%d] %s', step, ', '.join(f'{k}={float(v):.6g}' for k, v in scalars.items()))

  def write_images(self, step: int, images: Mapping[str, np.ndarray]) -> None:
    """Images at `step`, each (N, H, W, C) uint8, as PNGs of the images plugin.

    Args:
      step: the step.
      images: tag -> images.
    """
    values = []
    for tag, batch in images.items():
      encoded = [str(batch.shape[2]).encode(), str(batch.shape[1]).encode()]
      encoded += [_png(image) for image in batch]
      values.append(summary_pb2.Summary.Value(
          tag=tag, metadata=_metadata('images'),
          tensor=tensor_pb2.TensorProto(
              dtype=types_pb2.DT_STRING, string_val=encoded,
              tensor_shape=tensor_shape_pb2.TensorShapeProto(
                  dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=len(encoded))]))))
    self._write(step, summary_pb2.Summary(value=values))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """A run's settings, for TensorBoard's hparams plugin (nested keys dotted,
    values other than numbers and strings as text).

    Args:
      hparams: the settings.
    """
    fields = {key: value if isinstance(value, (bool, int, float, str)) else str(value)
              for key, value in workdir.flat(dict(hparams)).items()}
    self._write(0, hparams_summary.hparams_pb(fields))

  def flush(self) -> None:
    """Writes what is buffered."""
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    """Writes what is buffered and closes the file."""
    if self._writer is not None:
      self._writer.close()
