"""Input-pipeline throughput: the Grain pipeline against tf.data, side by side, and
against what a small ViT's training step consumes.

    python benchmarks/data.py [--seconds 20]

Measures, in one run on this machine, training-pipeline images/s (each pipeline
twice, in the order A B C D D C B A, the mean of the two) on:
  * the quick-start data: Fashion-MNIST's 60,000 training images with the
    quick-start recipe's augmentation (28 px, flips; configs/quickstart_vit.py);
  * a generated folder of 500 x 375 JPEGs at 224 px with the ViT-B/16 recipe's
    augmentation (Inception crop, flips; configs/vit_b16.py).
The Grain pipeline is `vit_jax.input_pipeline`. Where TensorFlow is installed
(`pip install tensorflow-cpu`), the same work in tf.data runs beside it, as the
project's pipeline did it before Grain: Fashion-MNIST as PNG-encoded TFRecords
(the former offline builder's format) through a 10,000-example shuffle buffer,
the JPEGs decoded, cropped (`tf.image.sample_distorted_bounding_box`) and resized
in parallel map calls. Last, the images/s one training step of the quick-start
recipe consumes (random images, the CPU split into devices as the train command
splits it); the pipeline should deliver at least 3x that.
"""
import argparse
import collections
import gc
import importlib.util
import io
import os
import tempfile
import time
from typing import Iterable, Optional

import jax
import numpy as np
import PIL.Image

from timing import train_step_and_batches
from vit_jax import cpu_devices, data

BATCH = 128
JPEG_BATCH = 32
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pipeline_rate(batches: Iterable, seconds: float) -> float:
  """Images/s of a pipeline after its first batch (start-up: files, buffers, threads)."""
  iterator = iter(batches)
  next(iterator)
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    count += len(next(iterator)['image'])
  rate = count / (time.perf_counter() - start)
  del iterator
  gc.collect()  # its threads stop before the next pipeline is measured
  return rate


def jpeg_folder(root: str, num_images: int = 256) -> str:
  """500 x 375 JPEGs of smooth random images (they compress like photographs)."""
  rng = np.random.RandomState(0)
  for i in range(num_images):
    directory = os.path.join(root, 'train', f'class_{i % 4}')
    os.makedirs(directory, exist_ok=True)
    pixels = data.resize(rng.uniform(0, 255, (12, 16, 3)), (375, 500))
    PIL.Image.fromarray(pixels.astype(np.uint8)).save(os.path.join(directory, f'{i}.jpg'),
                                                      quality=90)
  return root


def tf_fashion_records(tf, directory: str) -> str:
  """Fashion-MNIST's training images as PNG-encoded TFRecords written in `directory`
  (the former offline builder's format); their path."""
  path = os.path.join(directory, 'fashion_mnist-train.tfrecord')
  images_file, labels_file = data.FILES['train']
  manual_dir = data.FashionMnistIdx.local_files()
  images = data.read_idx(os.path.join(manual_dir, images_file))
  labels = data.read_idx(os.path.join(manual_dir, labels_file))
  with tf.io.TFRecordWriter(path) as writer:
    for image, label in zip(images, labels):
      buffer = io.BytesIO()
      PIL.Image.fromarray(image).save(buffer, format='PNG')
      png = buffer.getvalue()
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          'image': tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
          'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))
      })).SerializeToString())
  return path


def tf_fashion_mnist(tf, path: str, seed: int = 0):
  """The quick-start stream in tf.data from the TFRecords at `path`."""
  spec = {'image': tf.io.FixedLenFeature([], tf.string),
          'label': tf.io.FixedLenFeature([], tf.int64)}

  def decode(record):
    example = tf.io.parse_single_example(record, spec)
    return {'image': tf.io.decode_png(example['image'], channels=1), 'label': example['label']}

  def flip_and_scale(index, batch):
    seeds = tf.random.experimental.stateless_split(tf.stack([tf.cast(seed, tf.int64), index]))
    images = tf.image.stateless_random_flip_left_right(batch['image'], seeds[0])
    return {'image': tf.image.grayscale_to_rgb(tf.cast(images, tf.float32)) / 127.5 - 1,
            'label': tf.one_hot(batch['label'], 10)}

  dataset = tf.data.TFRecordDataset(path).map(decode, tf.data.AUTOTUNE)
  dataset = dataset.shuffle(10_000, seed=seed).repeat().batch(BATCH, drop_remainder=True)
  return dataset.enumerate().map(flip_and_scale, tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def tf_jpeg_folder(tf, root: str, seed: int = 0):
  """The ViT-B/16 recipe's augmentation in tf.data on the folder's JPEGs."""
  files = sorted(os.path.join(d, f) for d, _, names in os.walk(os.path.join(root, 'train'))
                 for f in names)

  def crop(index, path):
    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.constant([[[0., 0., 1., 1.]]]),
        seed=tf.stack([tf.cast(seed, tf.int64), index]), area_range=(0.05, 1.0),
        aspect_ratio_range=(3 / 4, 4 / 3), min_object_covered=0.,
        use_image_if_no_bounding_boxes=True)
    return tf.image.resize(tf.slice(image, begin, size), (224, 224))

  def flip_and_scale(index, images):
    flipped = tf.image.stateless_random_flip_left_right(
        images, tf.stack([tf.cast(seed, tf.int64), index]))
    return {'image': flipped / 127.5 - 1}

  dataset = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=seed).repeat()
  dataset = dataset.enumerate().map(crop, tf.data.AUTOTUNE, deterministic=True)
  dataset = dataset.batch(JPEG_BATCH, drop_remainder=True).enumerate()
  return dataset.map(flip_and_scale, tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


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


def tensorflow() -> Optional[object]:
  try:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  tf.config.set_visible_devices([], 'GPU')
  return tf


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--seconds', type=float, default=20,
                      help='seconds of measurement per pipeline (in two halves)')
  args = parser.parse_args()
  config = quickstart_recipe()
  cpu_devices.split_cpu_into_devices(config, 0)  # as the train command does
  consumed = train_step_rate(config, args.seconds)  # first: no pipeline threads running yet
  tf = tensorflow()
  with tempfile.TemporaryDirectory() as root:
    fashion = data.get_source('fashion_mnist', 'train', process_index=0,
                              process_count=1)
    folder = data.get_source(f'folder:{jpeg_folder(root)}', 'train',
                             process_index=0, process_count=1)
    pipelines = {
        ('Fashion-MNIST, quick-start recipe', 'Grain'): lambda: data.train_dataset(
            fashion, batch_size=BATCH, image_size=28, crop=False, process_count=1,
            local_devices=1),
        ('JPEG folder, ViT-B/16 recipe, 224 px', 'Grain'): lambda: data.train_dataset(
            folder, batch_size=JPEG_BATCH, image_size=224, process_count=1, local_devices=1),
    }
    if tf is not None:
      fashion_records = tf_fashion_records(tf, root)
      pipelines['Fashion-MNIST, quick-start recipe', 'tf.data'] = lambda: tf_fashion_mnist(
          tf, fashion_records).as_numpy_iterator()
      pipelines['JPEG folder, ViT-B/16 recipe, 224 px', 'tf.data'] = lambda: tf_jpeg_folder(
          tf, root).as_numpy_iterator()
    # Each pipeline twice, in the order A B C D D C B A, so a drift in the machine's
    # speed over the run weighs on all alike; the rate is the mean of the two.
    order = list(pipelines) + list(pipelines)[::-1]
    measured = collections.defaultdict(list)
    for key in order:
      measured[key].append(pipeline_rate(pipelines[key](), args.seconds / 2))
    rates = {key: float(np.mean(values)) for key, values in measured.items()}

  for (dataset, pipeline), rate in rates.items():
    print(f'{pipeline:8s} {dataset:38s} {rate:8.0f} img/s')
  print(f'train step, quick-start ViT (28 px): {consumed:8.0f} img/s')
  grain_rate = rates['Fashion-MNIST, quick-start recipe', 'Grain']
  print(f'Grain on Fashion-MNIST / train step: {grain_rate / consumed:8.1f}x (target >= 3)')
  if tf is None:
    print('tf.data not measured: TensorFlow is not installed (pip install tensorflow-cpu).')
  for dataset in ('Fashion-MNIST, quick-start recipe', 'JPEG folder, ViT-B/16 recipe, 224 px'):
    if (dataset, 'tf.data') in rates:
      print(f'Grain / tf.data, {dataset}: '
            f'{rates[dataset, "Grain"] / rates[dataset, "tf.data"]:.2f}x')


if __name__ == '__main__':
  main()
