"""The analysis as TensorBoard events beside a model's training events: per tool,
its scalar series (`Tool.scalars`; the step is the layer, branch, minibatch or
frequency index) and the figures that show the model, as images.
"""
import os
from typing import Mapping

import numpy as np
from PIL import Image

from analysis import tool
from vit_jax.training import EventWriter


def write_events(results: Mapping[str, Mapping], logdirs: Mapping[str, str],
                 out: str) -> None:
  """Writes every model's scalars and figures to its logdir (label -> directory);
  figures are read from `out`, where the tools wrote them.

  Args:
    results: each tool's JSON.
    logdirs: each model label's TensorBoard directory.
    out: the analysis directory.
  """
  for label, logdir in logdirs.items():
    writer = EventWriter(logdir)  # TensorBoard only, not the log
    for name, result in results.items():
      record = tool.TOOLS[name]
      for tag, values in record.scalars(result, label).items():
        for step, value in enumerate(values):
          if value is not None:  # a step without a value (null in the JSON) is a gap
            writer.write_scalars(step, {f'analysis/{tag}': float(value)})
      for figure in record.figures(result):
        if label not in figure.models:
          continue
        image_name = os.path.splitext(os.path.basename(figure.path))[0]
        with Image.open(os.path.join(out, os.path.basename(figure.path))) as image:
          pixels = np.asarray(image.convert('RGB'))
        writer.write_images(0, {f'analysis/{name}/{image_name}': pixels[None]})
    writer.close()
