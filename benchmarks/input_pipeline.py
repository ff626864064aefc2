"""Input-pipeline throughput against what a small ViT's training step consumes.

    python benchmarks/input_pipeline.py [--seconds 20]

Measures, in one run on this machine: training-pipeline images/s for
Fashion-MNIST at 32 px (offline copy, prepared on first use) and for a
generated JPEG folder at 224 px with Inception crop; and the images/s that one
training step of the quick-start recipe (configs/quickstart_vit.py) consumes,
on random images with the CPU split into devices as the train command splits
it. The pipeline should deliver at least 3x that.
"""
import argparse
import importlib.util
import os
import tempfile
import time

import jax
import numpy as np
import tensorflow as tf

from timing import train_step_and_batches
from vit_jax import cpu_devices, input_pipeline

BATCH = 128
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pipeline_rate(dataset, seconds: float) -> float:
  iterator = dataset.as_numpy_iterator()
  next(iterator)  # start-up: file opening, shuffle buffer, first map calls
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    count += len(next(iterator)['image'])
  return count / (time.perf_counter() - start)


def jpeg_folder(root: str, num_images: int = 256) -> str:
  rng = np.random.RandomState(0)
  for i in range(num_images):
    directory = os.path.join(root, 'train', f'class_{i % 4}')
    os.makedirs(directory, exist_ok=True)
    # Smooth images compress like photographs, unlike white noise.
    pixels = tf.image.resize(rng.uniform(0, 255, (12, 16, 3)), (375, 500)).numpy()
    with open(os.path.join(directory, f'{i}.jpg'), 'wb') as f:
      f.write(tf.io.encode_jpeg(pixels.astype(np.uint8), quality=90).numpy())
  return f'folder:{root}'


def quickstart_recipe():
  spec = importlib.util.spec_from_file_location(
      'quickstart_vit', os.path.join(REPO, 'configs', 'quickstart_vit.py'))
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)
  return recipe.get_config()


def train_step_rate(config, seconds: float) -> float:
  """Images/s one training step of the recipe consumes (batch on all devices), a
  different random batch each step as in training."""
  step, state, batches = train_step_and_batches(config, 10, num_batches=16)
  state, metrics = jax.block_until_ready(step(state, batches[0]))
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    state, metrics = jax.block_until_ready(
        step(state, batches[count // config.batch_size % 16]))
    count += config.batch_size
  return count / (time.perf_counter() - start)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--seconds', type=float, default=20)
  args = parser.parse_args()
  config = quickstart_recipe()
  cpu_devices.split_cpu_into_devices(config, 0)  # as the train command does
  consumed = train_step_rate(config, args.seconds)  # first: no pipeline threads running yet

  fashion = input_pipeline.get_source('fashion_mnist', 'train', shuffle_files=True)
  fashion_rate = pipeline_rate(
      input_pipeline.train_dataset(fashion, batch_size=BATCH, image_size=32), args.seconds)
  with tempfile.TemporaryDirectory() as root:
    folder = input_pipeline.get_source(jpeg_folder(root), 'train', shuffle_files=True)
    folder_rate = pipeline_rate(
        input_pipeline.train_dataset(folder, batch_size=32, image_size=224), args.seconds)

  print(f'pipeline, Fashion-MNIST 32 px:         {fashion_rate:8.0f} img/s')
  print(f'pipeline, JPEG folder 224 px (crop):   {folder_rate:8.0f} img/s')
  print(f'train step, quick-start ViT (28 px):  {consumed:8.0f} img/s')
  print(f'Fashion-MNIST pipeline / train step:   {fashion_rate / consumed:8.1f}x (target >= 3)')


if __name__ == '__main__':
  main()
