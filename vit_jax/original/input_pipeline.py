"""The original vit_jax's input pipeline functions (docs/original.md): batches with a
leading device axis and one-hot labels, on the project's sources and image
operations (`vit_jax.input_pipeline`). Imported as `vit_jax.input_pipeline.<name>`.
"""
import os
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Sequence, Tuple

import grain
import jax
import numpy as np

from vit_jax.data import (Batches, EXAMPLE_DRAWS, FOLDER_PREFIX, Source, eval_resize, get_source,
                          inception_crop, mirrored, model_input, one_hot, random_draws)
from vit_jax.errors import DataError

ORIGINAL_NAMES = ('MAX_IN_MEMORY', 'get_data', 'get_data_from_directory', 'get_data_from_tfds',
                  'get_dataset_info', 'get_datasets', 'get_directory_info', 'get_tfds_info',
                  'prefetch')


MAX_IN_MEMORY = 200_000


def _source_info(source: Source, examples_glob: Optional[str]) -> Dict[str, Any]:
  names = source.class_names or tuple(str(i) for i in range(source.num_classes))
  return dict(num_examples=source.num_examples, num_classes=source.num_classes,
              int2str=lambda id_: names[id_], examples_glob=examples_glob)


def _single(dataset: str, split: str, data_dir: Optional[str] = None) -> Source:
  """The whole of a split, read by this process (the original's data is not split
  over processes)."""
  return get_source(dataset, split, data_dir, process_index=0, process_count=1)


def get_tfds_info(dataset: str, split: str) -> Dict[str, Any]:
  """`get_dataset_info` of a TFDS dataset."""
  return _source_info(_single(dataset, split), None)


def get_directory_info(directory: str) -> Dict[str, Any]:
  """`get_dataset_info` of a directory of class sub-directories."""
  root, split = os.path.split(os.path.normpath(directory))
  return _source_info(_single(FOLDER_PREFIX + root, split), f'{directory}/*/*.jpg')


def get_dataset_info(dataset: str, split: str) -> Dict[str, Any]:
  """What a split holds: `num_examples`, `num_classes`, `int2str` (class id ->
  name) and `examples_glob` (None for TFDS).

  Args:
    dataset: a TFDS name, or a directory with `{split}/CLASS/*.jpg`.
    split: the split.

  Returns:
    The dict.
  """
  directory = os.path.join(dataset, split)
  if os.path.isdir(directory):
    return get_directory_info(directory)
  return get_tfds_info(dataset, split)


def get_datasets(config: Any) -> Tuple[Batches, Batches]:
  """The training and test batches of an original config (`config.dataset` a
  TFDS name, with splits `config.pp.train` and `config.pp.test`, or a directory
  with `train/` and `test/`).

  Args:
    config: the config.

  Returns:
    (ds_train, ds_test).
  """
  if os.path.isdir(config.dataset):
    train_dir, test_dir = (os.path.join(config.dataset, s) for s in ('train', 'test'))
    if not os.path.isdir(train_dir) or not os.path.isdir(test_dir):
      raise DataError(f'{config.dataset} is a directory without {train_dir} and {test_dir}; '
                      'put the images in train/CLASS/ and test/CLASS/.')
    return (get_data_from_directory(config=config, directory=train_dir, mode='train'),
            get_data_from_directory(config=config, directory=test_dir, mode='test'))
  return (get_data_from_tfds(config=config, mode='train'),
          get_data_from_tfds(config=config, mode='test'))


def _from_source(source: Source, config: Any, mode: str) -> Batches:
  return get_data(data=source.examples, mode=mode, num_classes=source.num_classes,
                  image_decoder=lambda image: image, repeats=None if mode == 'train' else 1,
                  batch_size=config.batch_eval if mode == 'test' else config.batch,
                  image_size=config.pp['crop'],
                  shuffle_buffer=min(source.num_examples, config.shuffle_buffer))


def get_data_from_directory(*, config: Any, directory: str, mode: str) -> Batches:
  """`get_data` of the images in `directory/CLASS/`.

  Args:
    config: the original config (batch sizes, `pp.crop`, `shuffle_buffer`).
    directory: the split's directory.
    mode: 'train' or 'test'.

  Returns:
    The batches.
  """
  root, split = os.path.split(os.path.normpath(directory))
  return _from_source(_single(FOLDER_PREFIX + root, split), config, mode)


def get_data_from_tfds(*, config: Any, mode: str) -> Batches:
  """`get_data` of the split `config.pp[mode]` of TFDS dataset `config.dataset`.

  Args:
    config: the original config.
    mode: 'train' or 'test'.

  Returns:
    The batches.
  """
  source = _single(config.dataset, config.pp[mode], config.get('tfds_data_dir'))
  return _from_source(source, config, mode)


def get_data(*, data: Sequence[Dict[str, Any]], mode: str, num_classes: int,
             image_decoder: Callable[[Any], np.ndarray], repeats: Optional[int],
             batch_size: int, image_size: int, shuffle_buffer: int,
             preprocess: Optional[Callable[[Any], Any]] = None) -> Batches:
  """Batches of {'image': (devices, b / devices, s, s, 3) in [-1, 1], 'label':
  (devices, b / devices, classes) one-hot} from examples {'image', 'label'}.

  Training shuffles (all of `data`, so `shuffle_buffer` has no effect), takes
  Inception crops (`augment.inception_crop`) and random flips, with draws seeded
  once per pipeline; testing resizes. Both drop the last partial batch, as the
  original does.

  Args:
    data: the examples, random access (a `Source`'s examples, a TFDS data source).
    mode: 'train' or 'test'.
    num_classes: the classes.
    image_decoder: `features['image']` -> uint8 image, after shuffling.
    repeats: passes over the data (None: endless).
    batch_size: the batch over every local device.
    image_size: the images' side.
    shuffle_buffer: unused (the shuffle is global).
    preprocess: applied to each example before the decoding.

  Returns:
    The batches.
  """
  del shuffle_buffer
  if mode not in ('train', 'test'):
    raise ValueError(f'mode must be "train" or "test", not {mode!r}.')
  devices = jax.local_device_count()
  if batch_size % devices:
    raise DataError(f'The batch size {batch_size} does not split over the {devices} local '
                    f'devices; choose a multiple of {devices}.')
  seed = int(np.random.default_rng().integers(2**31))  # drawn once per pipeline
  data = grain.MapDataset.source(data)
  if mode == 'train':
    data = data.shuffle(seed=seed)
  data = data.repeat(repeats)

  def example(position: int, features: Dict[str, Any]) -> Dict[str, np.ndarray]:
    features = preprocess(features) if preprocess is not None else features
    image = image_decoder(features['image'])
    if mode == 'train':
      draws = random_draws(seed, EXAMPLE_DRAWS, position)
      image = inception_crop(image, image_size, draws)
      mirror = mirrored(1, draws)
    else:
      image, mirror = eval_resize(image, image_size), None
    return {'image': model_input([image], 1, image_size, mirror)[0],
            'label': one_hot(features['label'], num_classes)}

  per_device = lambda x: x.reshape((devices, -1) + x.shape[1:])
  batches = data.map_with_index(example).batch(batch_size, drop_remainder=True)
  return Batches(batches.map(lambda batch: {k: per_device(v) for k, v in batch.items()}))


def prefetch(dataset: Iterable[Any], n_prefetch: int) -> Iterator[Any]:
  """The batches of `dataset` as numpy arrays, `n_prefetch` of them moved to the
  local devices ahead (`flax.jax_utils.prefetch_to_device`).

  Args:
    dataset: device-axis batches (`get_data`).
    n_prefetch: batches moved ahead (0: stay numpy).

  Returns:
    The iterator.
  """
  import flax.jax_utils  # pylint: disable=import-outside-toplevel
  batches = iter(dataset)
  return flax.jax_utils.prefetch_to_device(batches, n_prefetch) if n_prefetch else batches
