"""Input-pipeline throughput against what a small ViT's training step consumes.

    python benchmarks/input_pipeline.py [--seconds 20]

Measures, in one run on this machine: training-pipeline images/s for
Fashion-MNIST at 32 px (offline copy, prepared on first use) and for a
generated JPEG folder at 224 px with Inception crop; and the images/s that one
training step (forward, backward, SGD update) of a ViT-Ti-width model with
patch 4 at 32 px consumes. The pipeline should deliver at least 3x that.
"""
import argparse
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tensorflow as tf

from vit_jax import input_pipeline, models

BATCH = 128


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


def train_step_rate(seconds: float) -> float:
  model = models.get_model('ViT-Ti_16', 10, patch_size=4)
  images = jnp.zeros((BATCH, 32, 32, 3))
  labels = jax.nn.one_hot(jnp.zeros(BATCH, jnp.int32), 10)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), images[:1])['params']
  optimizer = optax.sgd(0.01, momentum=0.9)
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state):
    loss = lambda p: optax.softmax_cross_entropy(model.apply({'params': p}, images), labels).mean()
    grads = jax.grad(loss)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params, opt_state = jax.block_until_ready(step(params, opt_state))
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    params, opt_state = jax.block_until_ready(step(params, opt_state))
    count += BATCH
  return count / (time.perf_counter() - start)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--seconds', type=float, default=20)
  args = parser.parse_args()

  fashion = input_pipeline.get_source('fashion_mnist', 'train', shuffle_files=True)
  fashion_rate = pipeline_rate(
      input_pipeline.train_dataset(fashion, batch_size=BATCH, image_size=32), args.seconds)
  with tempfile.TemporaryDirectory() as root:
    folder = input_pipeline.get_source(jpeg_folder(root), 'train', shuffle_files=True)
    folder_rate = pipeline_rate(
        input_pipeline.train_dataset(folder, batch_size=32, image_size=224), args.seconds)
  consumed = train_step_rate(args.seconds)

  print(f'pipeline, Fashion-MNIST 32 px:         {fashion_rate:8.0f} img/s')
  print(f'pipeline, JPEG folder 224 px (crop):   {folder_rate:8.0f} img/s')
  print(f'train step, ViT-Ti width /4 at 32 px:  {consumed:8.0f} img/s')
  print(f'Fashion-MNIST pipeline / train step:   {fashion_rate / consumed:8.1f}x (target >= 3)')


if __name__ == '__main__':
  main()
