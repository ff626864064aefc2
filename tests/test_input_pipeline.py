"""Input pipelines on mock TFDS data, generated image folders and generated IDX files."""
import gzip
import os

import chex
import jax
import numpy as np
import PIL.Image
import pytest
import tensorflow_datasets as tfds
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax import input_pipeline
from vit_jax.data import datasets
from vit_jax.data.datasets import fashion_mnist_idx

from helpers import make_folder


def take(dataset, n):
  return [b for _, b in zip(range(n), dataset)]


def repeated(image, n=64):
  """A source of one image n times, label 0 of two classes."""
  examples = input_pipeline.Examples([{'image': image, 'label': 0}] * n, lambda ex: ex)
  return input_pipeline.Source(examples, n, n, 2, 'asymmetric', ('a', 'b'))


class OneByOne:
  """Records read one at a time: tfds.testing.mock_data's `__getitems__` lacks its
  `self` (tensorflow-datasets 4.9.10), its `__getitem__` does not."""

  def __init__(self, records):
    self.records = records

  def __len__(self):
    return len(self.records)

  def __getitem__(self, key):
    return self.records[key]


@pytest.fixture
def mock_cifar10():
  with tfds.testing.mock_data(num_examples=37):
    source = input_pipeline.get_source('cifar10', 'test', process_index=0, process_count=1)
    source.examples.records = OneByOne(source.examples.records)
    yield source


def test_train_batches(mock_cifar10):
  batches = take(input_pipeline.train_dataset(mock_cifar10, batch_size=8, image_size=24), 6)
  for batch in batches:
    chex.assert_shape(batch['image'], (8, 24, 24, 3))
    chex.assert_shape(batch['label'], (8, 10))
    assert batch['image'].dtype == np.float32
    assert -1 <= batch['image'].min() and batch['image'].max() <= 1
    np.testing.assert_array_equal(batch['label'].sum(1), 1)
    assert set(np.unique(batch['label'])) <= {0., 1.}
  # 6 batches of 8 run past the 37 examples: the stream repeats.
  assert len(batches) == 6


def test_same_seed_same_batches(mock_cifar10):
  make = lambda seed, **kw: take(input_pipeline.train_dataset(
      mock_cifar10, batch_size=8, image_size=24, seed=seed, **kw), 6)
  chex.assert_trees_all_equal(make(1), make(1))
  chex.assert_trees_all_equal(make(1, mixup_alpha=0.2, randaugment=(2, 10)),
                              make(1, mixup_alpha=0.2, randaugment=(2, 10)))
  assert not np.array_equal(make(1)[0]['image'], make(2)[0]['image'])


@pytest.mark.parametrize('image_size', [8, 6])
def test_flips_each_image_on_its_own(image_size):
  # One left-right asymmetric image, over and over: each output is it or its mirror.
  image = np.arange(8 * 8, dtype=np.uint8).reshape(8, 8, 1) * 3
  source = repeated(image)
  batch = take(input_pipeline.train_dataset(source, batch_size=32, image_size=image_size,
                                            crop=False, process_count=1), 1)[0]
  expected = take(input_pipeline.eval_dataset(source, batch_size=32, image_size=image_size,
                                              process_count=1, local_devices=1), 1)[0]['image'][0]
  flipped = np.all(np.isclose(batch['image'], expected[:, ::-1], atol=1e-6), axis=(1, 2, 3))
  kept = np.all(np.isclose(batch['image'], expected, atol=1e-6), axis=(1, 2, 3))
  assert np.all(flipped | kept) and flipped.any() and kept.any()


def test_crop_padding_shifts_each_image():
  # Each output is the image (or its mirror) shifted by at most 2 px, zeros shifted in.
  image = (np.arange(8 * 8, dtype=np.uint8).reshape(8, 8, 1) + 1) * 3
  source = repeated(image)
  batch = take(input_pipeline.train_dataset(source, batch_size=64, image_size=8, crop=False,
                                            crop_padding=2, process_count=1), 1)[0]
  padded = np.pad(image[..., 0], 2).astype(np.float32) / 127.5 - 1
  windows = [padded[dy:dy + 8, dx:dx + 8] for dy in range(5) for dx in range(5)]
  found = set()
  for out in batch['image'][..., 0]:
    matches = [i for i, w in enumerate(windows)
               if np.allclose(out, w, atol=1e-6) or np.allclose(out, w[:, ::-1], atol=1e-6)]
    assert matches, 'an output is no shift of the image'
    found.add(matches[0])
  assert len(found) > 10  # many of the 25 shifts occur among 64 draws


@pytest.mark.parametrize('augmentation', [dict(crop=False), dict(
    crop=True, randaugment=(2, 9), mixup_alpha=0.2)])
def test_a_stream_resumed_at_a_step_reads_the_batches_of_an_uninterrupted_one(
    mock_cifar10, augmentation):
  make = lambda start_step: take(input_pipeline.train_dataset(
      mock_cifar10, batch_size=8, image_size=24, seed=3, start_step=start_step,
      **augmentation), 8 - start_step)
  uninterrupted = make(0)
  for start_step in (1, 5):
    chex.assert_trees_all_equal(make(start_step), uninterrupted[start_step:])


def test_each_epoch_reads_every_example_once_in_a_new_order():
  # Example i's image holds i: a 16-example epoch is two batches of 8.
  examples = input_pipeline.Examples(
      [{'image': np.full((2, 2, 1), i, np.uint8), 'label': 0} for i in range(16)], lambda ex: ex)
  source = input_pipeline.Source(examples, 16, 16, 2, 'indices')
  batches = take(input_pipeline.train_dataset(source, batch_size=8, image_size=2, crop=False,
                                              process_count=1, local_devices=1), 6)
  order = [np.rint((b['image'][:, 0, 0, 0] + 1) * 127.5).astype(int) for b in batches]
  epochs = [np.concatenate(order[i:i + 2]) for i in (0, 2, 4)]
  for epoch in epochs:
    np.testing.assert_array_equal(np.sort(epoch), np.arange(16))
  assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])


def test_the_epoch_order_is_a_function_of_the_position():
  order = input_pipeline.EpochOrder(16, seed=5)
  stream = order.positions(0, 48)  # three epochs
  for epoch in stream.reshape(3, 16):
    np.testing.assert_array_equal(np.sort(epoch), np.arange(16))
  # Any window, across an epoch's end too, read on its own by a fresh order.
  np.testing.assert_array_equal(input_pipeline.EpochOrder(16, seed=5).positions(10, 12),
                                stream[10:22])
  assert not np.array_equal(input_pipeline.EpochOrder(16, seed=6).positions(0, 16), stream[:16])


def test_crop_padding_needs_the_plain_resize(mock_cifar10):
  with pytest.raises(ValueError, match='Inception crop'):
    input_pipeline.train_dataset(mock_cifar10, batch_size=8, image_size=24, crop_padding=2)


def test_mixup_mixes_labels(mock_cifar10):
  batch = take(input_pipeline.train_dataset(mock_cifar10, batch_size=8, image_size=24,
                                            mixup_alpha=1.0), 1)[0]
  np.testing.assert_allclose(batch['label'].sum(1), 1, rtol=1e-6)
  assert np.any((batch['label'] > 0) & (batch['label'] < 1))
  # Example i is mixed with example 7 - i by one weight w: their labels
  # w*a + (1-w)*b and w*b + (1-w)*a sum to a + b for every pair.
  pair_sums = batch['label'] + batch['label'][::-1]
  chex.assert_trees_all_close(pair_sums[:4], pair_sums[4:][::-1], atol=1e-6)


@pytest.mark.parametrize('batch_size', [8, 16, 40])
def test_eval_sees_every_example_once(mock_cifar10, batch_size):
  batches = list(input_pipeline.eval_dataset(mock_cifar10, batch_size=batch_size, image_size=32))
  assert len(batches) == -(-37 // batch_size)
  mask = np.concatenate([b['mask'] for b in batches])
  assert mask.sum() == 37 and np.all(mask[:37] == 1) and np.all(mask[37:] == 0)
  reference = [mock_cifar10.examples[i]['image'] for i in range(37)]
  images = np.concatenate([b['image'] for b in batches])[:37]
  np.testing.assert_allclose(images, np.stack(reference) / 127.5 - 1, atol=1e-6)


def test_batch_must_split_over_devices(mock_cifar10):
  with pytest.raises(input_pipeline.DataError, match='The batch size 12 does not split over the 8 devices'):
    input_pipeline.eval_dataset(mock_cifar10, batch_size=12, image_size=32)


def test_unknown_dataset_and_split_are_named(mock_cifar10):
  with pytest.raises(input_pipeline.DataError, match="Unknown dataset 'not_a_dataset'"):
    input_pipeline.get_source('not_a_dataset', 'train')


def test_missing_data_without_network_is_explained(tmp_path, monkeypatch):
  def no_network(self, *args, **kwargs):
    raise ConnectionError('name resolution failed')
  monkeypatch.setattr(tfds.core.DatasetBuilder, 'download_and_prepare', no_network)
  with pytest.raises(input_pipeline.DataError,
                     match=r"Could not prepare TFDS dataset 'mnist'.*ConnectionError.*data_dir"):
    input_pipeline.get_source('mnist', 'train', data_dir=str(tmp_path))


# ---------------------------------------------------------------------------
# Image folders


def test_image_folder(tmp_path):
  name = make_folder(str(tmp_path), {'train': [5, 4, 6], 'test': [3, 1, 2]})
  source = input_pipeline.get_source(name, 'train')
  assert (source.num_examples, source.num_classes) == (15, 3)
  assert source.class_names == ('class_0', 'class_1', 'class_2')
  batch = take(input_pipeline.train_dataset(source, batch_size=8, image_size=16), 1)[0]
  chex.assert_shape(batch['image'], (8, 16, 16, 3))
  test = input_pipeline.get_source(name, 'test')
  batches = list(input_pipeline.eval_dataset(test, batch_size=8, image_size=16,
                                             resize_small=18))
  labels = np.concatenate([b['label'][b['mask'] == 1] for b in batches]).argmax(1)
  np.testing.assert_array_equal(np.bincount(labels, minlength=3), [3, 1, 2])


def test_processes_read_disjoint_slices_that_cover_the_split(tmp_path):
  name = make_folder(str(tmp_path), {'test': [4, 3, 4]}, size=(8, 8))
  seen = []
  for index in range(2):
    source = input_pipeline.get_source(name, 'test', process_index=index, process_count=2)
    assert source.max_examples == 6
    batches = list(input_pipeline.eval_dataset(source, batch_size=16, image_size=8,
                                               process_count=2))
    assert len(batches) == 1  # both processes take the same number of steps
    seen.append(np.concatenate([b['image'][b['mask'] == 1] for b in batches]))
  assert len(seen[0]) + len(seen[1]) == 11
  all_images = np.concatenate(seen).reshape(11, -1)
  assert len(np.unique(all_images, axis=0)) == 11


def test_image_folder_errors(tmp_path):
  with pytest.raises(input_pipeline.DataError, match='does not exist'):
    input_pipeline.get_source(f'folder:{tmp_path}/none', 'train')
  os.makedirs(tmp_path / 'empty' / 'train' / 'a')
  with pytest.raises(input_pipeline.DataError, match='holds no'):
    input_pipeline.get_source(f'folder:{tmp_path}/empty', 'train')
  name = make_folder(str(tmp_path / 'bad'), {'train': [2]})
  bad = tmp_path / 'bad' / 'train' / 'class_0' / 'broken.jpg'
  for text in ('not an image', ''):  # an empty file too
    bad.write_text(text)
    with pytest.raises(input_pipeline.DataError, match=f'^Unreadable image file {bad} '):
      input_pipeline.get_source(name, 'train')


@pytest.mark.parametrize('kind', ['0.JPEG', '1.png'])
def test_a_truncated_image_is_named_when_its_split_is_opened(tmp_path, kind):
  name = make_folder(str(tmp_path), {'train': [3]}, size=(16, 16))
  path = tmp_path / 'train' / 'class_0' / kind
  data = path.read_bytes()
  path.write_bytes(data[:len(data) * 2 // 3])
  with pytest.raises(input_pipeline.DataError,
                     match=f'^Truncated image file {path} \\(it ends before its last byte\\): '
                           'replace or remove it.$'):
    input_pipeline.get_source(name, 'train')
  # What the check passes, the pipeline decodes; bytes after JPEG's end marker are allowed.
  for whole in (data, data + b'\0' * 10 if kind.endswith('JPEG') else data):
    path.write_bytes(whole)
    assert len(list(input_pipeline.eval_dataset(
        input_pipeline.get_source(name, 'train'), batch_size=8, image_size=8
    ))) == 1


def test_a_png_with_damaged_pixel_data_is_named_before_training(tmp_path):
  """Bytes of the PNG's image data overwritten (its end marker intact): the decoder
  refuses it mid-training; the split's check names the file first."""
  name = make_folder(str(tmp_path), {'train': [3]}, size=(16, 16))
  path = tmp_path / 'train' / 'class_0' / '1.png'
  data = bytearray(path.read_bytes())
  middle = len(data) // 2
  data[middle:middle + 8] = bytes(255 - b for b in data[middle:middle + 8])
  path.write_bytes(bytes(data))
  with pytest.raises(input_pipeline.DataError, match='does not decode'):  # mid-training
    input_pipeline.read_image(str(path))
  with pytest.raises(input_pipeline.DataError, match=f'^Damaged image file {path} \\(.*\\): '
                                                     'replace or remove it.$'):
    input_pipeline.get_source(name, 'train')


@pytest.mark.parametrize('mode,ext', [('RGB', 'jpg'), ('L', 'jpg'), ('RGB', 'png'), ('L', 'png'),
                                      ('P', 'png'), ('RGBA', 'png'), ('LA', 'png')])
def test_image_files_decode_as_pil_converts_them_to_rgb(tmp_path, mode, ext):
  pixels = np.random.default_rng(0).integers(0, 256, (9, 13, 4)).astype(np.uint8)
  picture = PIL.Image.fromarray(pixels if 'A' in mode else pixels[..., :3]).convert(mode)
  path = str(tmp_path / f'image.{ext}')
  exif = PIL.Image.Exif()
  exif[0x0112] = 6  # orientation: rotated, which the pipeline, as TensorFlow's decoders, ignores
  picture.save(path, exif=exif) if ext == 'jpg' else picture.save(path)
  image = input_pipeline.read_image(path)
  with PIL.Image.open(path) as reference:
    np.testing.assert_array_equal(image, np.asarray(reference.convert('RGB')))
  assert image.dtype == np.uint8 and image.shape == (9, 13, 3)


def test_a_16_bit_png_decodes_to_its_high_bytes(tmp_path):
  # As TensorFlow's decode_png gives it at uint8 (PIL's convert('RGB') clips instead).
  pixels = np.random.default_rng(1).integers(0, 2**16, (5, 7)).astype(np.uint16)
  PIL.Image.fromarray(pixels).save(tmp_path / 'deep.png')
  image = input_pipeline.read_image(str(tmp_path / 'deep.png'))
  np.testing.assert_array_equal(image, np.repeat((pixels >> 8)[..., None], 3, -1))


@pytest.mark.parametrize('where', ['class', 'file'])
def test_a_name_that_is_not_utf8_is_named_as_its_bytes(tmp_path, where):
  name = make_folder(str(tmp_path), {'train': [2, 2]}, size=(8, 8))
  latin1 = b'caf\xe9'  # 'café' in Latin-1, not UTF-8
  if where == 'class':
    os.rename(tmp_path / 'train' / 'class_1', os.fsencode(tmp_path / 'train') + b'/' + latin1)
  else:
    os.rename(tmp_path / 'train' / 'class_1' / '0.JPEG',
              os.fsencode(tmp_path / 'train' / 'class_1') + b'/' + latin1 + b'.jpg')
  with pytest.raises(input_pipeline.DataError, match=r"holds b'caf\\xe9.*not UTF-8 text: rename "
                                                     'it'):
    input_pipeline.get_source(name, 'train')


def test_folders_are_checked_against_each_other_and_their_root(tmp_path):
  name = make_folder(str(tmp_path / 'data'), {'train': [2, 2], 'test': [2, 2]})
  os.rename(tmp_path / 'data' / 'test' / 'class_1', tmp_path / 'data' / 'test' / 'class_x')
  train = input_pipeline.get_source(name, 'train')
  test = input_pipeline.get_source(name, 'test')
  with pytest.raises(input_pipeline.DataError, match=r"only in training: \['class_1'\]; only "
                     r"in evaluation: \['class_x'\]"):
    input_pipeline.check_same_classes(train, test)
  input_pipeline.check_same_classes(train, train)
  os.makedirs(tmp_path / 'data' / 'train' / 'class_2')
  with pytest.raises(input_pipeline.DataError, match='train/class_2 holds no'):
    input_pipeline.get_source(name, 'train')
  make_folder(str(tmp_path / 'other'), {'train': [2]})
  with pytest.raises(input_pipeline.DataError, match='leads outside the image folder'):
    input_pipeline.get_source(name, '../other/train')


# ---------------------------------------------------------------------------
# Offline Fashion-MNIST


def write_idx(path, array):
  header = bytes([0, 0, 0x08, array.ndim]) + b''.join(
      int(d).to_bytes(4, 'big') for d in array.shape)
  with gzip.open(path, 'wb') as f:
    f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def idx_dir(tmp_path):
  rng = np.random.RandomState(0)
  arrays = {'train': (rng.randint(0, 256, (23, 28, 28)), rng.randint(0, 10, 23)),
            'test': (rng.randint(0, 256, (9, 28, 28)), rng.randint(0, 10, 9))}
  for split, (images_file, labels_file) in fashion_mnist_idx.FILES.items():
    write_idx(str(tmp_path / images_file), arrays[split][0])
    write_idx(str(tmp_path / labels_file), arrays[split][1])
  return str(tmp_path), arrays


def test_read_idx_rejects_bad_files(tmp_path):
  path = tmp_path / 'x.gz'
  write_idx(str(path), np.zeros((4, 3)))
  chex.assert_shape(fashion_mnist_idx.read_idx(str(path)), (4, 3))
  with gzip.open(path, 'rb') as f:
    data = f.read()
  with gzip.open(path, 'wb') as f:
    f.write(data[:-2])
  with pytest.raises(ValueError, match='truncated'):
    fashion_mnist_idx.read_idx(str(path))


def test_offline_builder_stands_in_for_tfds_fashion_mnist(idx_dir, tmp_path, monkeypatch):
  manual_dir, arrays = idx_dir
  monkeypatch.setattr(fashion_mnist_idx.FashionMnistIdx, 'local_files',
                      classmethod(lambda cls: manual_dir))
  data_dir = str(tmp_path / 'tfds')
  source = input_pipeline.get_source('fashion_mnist', 'train', data_dir=data_dir,
                                     process_index=0, process_count=1)
  assert source.num_examples == 23 and source.num_classes == 10
  assert source.class_names[:2] == ('T-shirt/top', 'Trouser')
  examples = [source.examples[i] for i in range(source.num_examples)]
  order = np.argsort([ex['label'] * 1e6 + ex['image'].sum() for ex in examples])
  expected = np.argsort(arrays['train'][1] * 1e6 + arrays['train'][0].reshape(23, -1).sum(1))
  np.testing.assert_array_equal(np.stack([ex['image'][..., 0] for ex in examples])[order],
                                arrays['train'][0][expected])
  # TFDS's fashion_mnist's examples: a (28, 28, 1) uint8 image and the same class label.
  official = tfds.builder('fashion_mnist').info.features
  ours = tfds.builder('fashion_mnist_idx', data_dir=data_dir).info.features
  for features in (official, ours):
    assert (features['image'].shape, features['image'].np_dtype) == ((28, 28, 1), np.uint8)
  assert ours['label'].names == official['label'].names
  with pytest.raises(input_pipeline.DataError, match=r"no split 'validation'.*'test', 'train'"):
    input_pipeline.get_source('fashion_mnist', 'validation', data_dir=data_dir)
  # Two processes split the 9 test examples 5 + 4 (TFDS's even split), disjoint and
  # covering the split, and take the same number of evaluation batches.
  slices = [input_pipeline.get_source('fashion_mnist', 'test', data_dir=data_dir,
                                      process_index=i, process_count=2) for i in range(2)]
  assert [s.num_examples for s in slices] == [4, 5] and slices[0].max_examples == 5
  read = [np.stack([s.examples[i]['image'][..., 0] for i in range(s.num_examples)])
          for s in slices]
  order = lambda images: images[np.lexsort(images.reshape(len(images), -1).T)]
  np.testing.assert_array_equal(order(np.concatenate(read)), order(arrays['test'][0]))
  batches = [list(input_pipeline.eval_dataset(s, batch_size=4, image_size=28, process_count=2,
                                              local_devices=1)) for s in slices]
  assert [len(b) for b in batches] == [3, 3]
  assert [sum(batch['mask'].sum() for batch in b) for b in batches] == [4, 5]


IMAGE_FEATURES = {
    'encoded PNG': tfds.features.Image(shape=(None, None, 3)),
    'encoded PNG, gray': tfds.features.Image(shape=(6, 5, 1)),
    'tensor as bytes': tfds.features.Tensor(shape=(6, 5, 1), dtype=np.uint8,
                                            encoding=tfds.features.Encoding.BYTES),
    'tensor as integers': tfds.features.Tensor(shape=(6, 5, 3), dtype=np.uint8),
    'tensor as zlib': tfds.features.Tensor(shape=(6, 5, 3), dtype=np.uint8,
                                           encoding=tfds.features.Encoding.ZLIB),
}


@pytest.mark.parametrize('kind', IMAGE_FEATURES)
def test_records_decode_as_tfds_decodes_them(kind):
  features = tfds.features.FeaturesDict({'image': IMAGE_FEATURES[kind],
                                         'label': tfds.features.ClassLabel(num_classes=7),
                                         'extra': tfds.features.Text()})
  assert input_pipeline.RecordDecoder.serialized_shape_is_fixed(features)
  channels = features['image'].shape[-1]
  image = np.random.default_rng(0).integers(0, 256, (6, 5, channels)).astype(np.uint8)
  record = features.serialize_example({'image': image, 'label': 4, 'extra': 'words'})
  ours = input_pipeline.RecordDecoder(features)(record)
  theirs = features.deserialize_example_np(record)
  np.testing.assert_array_equal(ours['image'], theirs['image'])
  np.testing.assert_array_equal(ours['image'], image)
  assert ours['image'].dtype == np.uint8 and ours['label'] == theirs['label'] == 4


def test_images_of_a_varying_serialized_shape_take_tfds_own_decoding():
  features = tfds.features.FeaturesDict({
      'image': tfds.features.Tensor(shape=(None, 5, 3), dtype=np.uint8),
      'label': tfds.features.ClassLabel(num_classes=7)})
  assert not input_pipeline.RecordDecoder.serialized_shape_is_fixed(features)


def test_tfds_data_prepared_for_tensorflow_is_refused_with_the_conversion(idx_dir, tmp_path,
                                                                         monkeypatch):
  manual_dir, _ = idx_dir
  monkeypatch.setattr(fashion_mnist_idx.FashionMnistIdx, 'local_files',
                      classmethod(lambda cls: manual_dir))
  data_dir = str(tmp_path / 'tfds')
  input_pipeline.get_source('fashion_mnist', 'test', data_dir=data_dir)  # prepares it
  # The same data as TFDS's TFRecord files, as TFDS prepared datasets by default before.
  monkeypatch.setattr(tfds.core.DatasetInfo, 'file_format',
                      property(lambda self: tfds.core.FileFormat.TFRECORD))
  with pytest.raises(input_pipeline.DataError,
                     match=r'prepared in .* as tfrecord, which only TensorFlow reads; convert it '
                           r'to ArrayRecord .*tfds convert_format --dataset_dir='):
    input_pipeline.get_source('fashion_mnist_idx', 'test', data_dir=data_dir)


@pytest.mark.slow
@pytest.mark.skipif(datasets.FashionMnistIdx.local_files() is None,
                    reason='Debian package dataset-fashion-mnist not installed '
                           '(scripts/get_data.sh installs it)')
def test_debian_fashion_mnist_in_full(tmp_path):
  source_dir = datasets.FashionMnistIdx.local_files()
  for split, count in (('train', 60_000), ('test', 10_000)):
    source = input_pipeline.get_source('fashion_mnist', split, data_dir=str(tmp_path),
                                       process_index=0, process_count=1)
    images_file, labels_file = fashion_mnist_idx.FILES[split]
    images = fashion_mnist_idx.read_idx(os.path.join(source_dir, images_file))
    labels = fashion_mnist_idx.read_idx(os.path.join(source_dir, labels_file))
    assert source.num_examples == count == len(labels)
    label_counts = np.zeros(10, np.int64)
    pixel_sum = 0
    for start in range(0, count, 5000):
      batch = source.examples.read(range(start, start + 5000))
      label_counts += np.bincount([ex['label'] for ex in batch], minlength=10)
      pixel_sum += sum(int(ex['image'].astype(np.int64).sum()) for ex in batch)
    np.testing.assert_array_equal(label_counts, np.bincount(labels, minlength=10))
    assert pixel_sum == int(images.astype(np.int64).sum())


# ---------------------------------------------------------------------------
# Devices


def test_prefetch_to_devices_shards_the_batch(mock_cifar10):
  mesh = Mesh(np.array(jax.devices()), ('data',))
  sharding = NamedSharding(mesh, P('data'))
  batches = take(input_pipeline.eval_dataset(mock_cifar10, batch_size=16, image_size=8), 3)
  on_devices = list(input_pipeline.prefetch_to_devices(iter(batches), sharding, size=2))
  assert len(on_devices) == 3
  for host, device in zip(batches, on_devices):
    assert device['image'].sharding == sharding
    chex.assert_shape(device['image'].addressable_shards[0].data, (2, 8, 8, 3))
    np.testing.assert_array_equal(np.asarray(device['image']), host['image'])


def test_class_folders_are_read_at_any_depth_and_split_folders_may_be_links(tmp_path):
  """As torchvision's ImageFolder: images in sub-folders of a class are its images,
  a directory named like an image is walked into; train/ may link to a folder
  elsewhere; a link to nothing is refused naming it."""
  make_folder(str(tmp_path / 'elsewhere'), {'train': [3, 2]}, size=(8, 8))
  root = tmp_path / 'data'
  make_folder(str(root), {'test': [2, 2]}, size=(8, 8))
  os.symlink(tmp_path / 'elsewhere' / 'train', root / 'train')
  deeper = tmp_path / 'elsewhere' / 'train' / 'class_1' / 'a.jpg' / 'b'
  deeper.mkdir(parents=True)
  os.rename(tmp_path / 'elsewhere' / 'train' / 'class_1' / '0.JPEG', deeper / '0.JPEG')
  source = input_pipeline.get_source(f'folder:{root}', 'train')
  assert source.num_examples == 5 and source.class_names == ('class_0', 'class_1')
  assert source.identity['images_per_class'] == [3, 2]
  files = [path for path, _ in source.examples.records]
  assert any(f.endswith(os.path.join('class_1', 'a.jpg', 'b', '0.JPEG')) for f in files)
  os.symlink(tmp_path / 'gone.jpg', tmp_path / 'elsewhere' / 'train' / 'class_0' / 'link.jpg')
  with pytest.raises(input_pipeline.DataError, match=r'link\.jpg is a link to \S+gone\.jpg, '
                     'which does not exist: remove the link'):
    input_pipeline.get_source(f'folder:{root}', 'train')


def test_an_image_larger_than_pils_bomb_limit_is_read_as_it_is(tmp_path, monkeypatch):
  """A whole PNG and JPEG past PIL's decompression-bomb limit (lowered here to 100
  pixels, so that a 40 x 30 image passes it twice over) are images like any other."""
  import PIL.Image
  monkeypatch.setattr(PIL.Image, 'MAX_IMAGE_PIXELS', 100)
  pixels = np.random.RandomState(0).randint(0, 256, (30, 40, 3), np.uint8)
  for name in ('big.png', 'big.jpg'):
    PIL.Image.fromarray(pixels).save(tmp_path / name)
    assert input_pipeline.image_problem(str(tmp_path / name)) is None
    assert input_pipeline.read_image(str(tmp_path / name)).shape == (30, 40, 3)
