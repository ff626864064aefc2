"""Input pipelines for TFDS datasets and image folders, on Grain.

A dataset is named by a string: a TFDS name (`fashion_mnist`, `cifar10`,
`imagenet2012`, ...) or `folder:/path/to/root` for images in
`root/{train,test}/<class>/*.{jpg,jpeg,png}`. Split strings are TFDS's
(`train[:98%]`). TFDS data is read through `tfds.data_source`, which needs it
prepared in the ArrayRecord format and no TensorFlow. Each process reads its
own slice of a split; batches come out as numpy, shaped for the process's devices.

Train: Inception crop (or a resize and optional shifts), random flip, optional
RandAugment and mixup (`vit_jax.data.augment`), over a global shuffle redrawn every
epoch. Every draw is seeded by the stream's seed and the position of its example
or batch, so batch k is a function of (seed, k): a resumed run reads exactly the
batches an uninterrupted run reads. Eval: resize (or resize-small then central
crop), every example exactly once, the last batch padded and masked. Images
leave in [-1, 1] with 3 channels; labels one-hot.
"""
import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import itertools
import math
import os
import socket
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import cv2
import grain
import jax
import numpy as np
import PIL.Image
import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.proto import tf_example_pb2

from vit_jax.data import augment, datasets
from vit_jax.errors import DataError

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
FOLDER_PREFIX = 'folder:'
# Streams of draws, so the example and batch draws of one position and the
# epochs' orders differ.
EXAMPLE_DRAWS, BATCH_DRAWS, ORDER_DRAWS = 0, 1, 2
# The training stream's last batch: endless in practice.
_ENDLESS = 2**62


class Examples:
  """Random access to a contiguous slice of a split's examples, read in batches
  where the underlying data reads several records at once (TFDS's data sources):
  `{'image': uint8 HWC, 'label': int}`.

  Args:
    records: the split's records (`__len__`, `__getitem__`, optionally `__getitems__`).
    decode: a record -> its example.
    start: the slice's first record.
    end: the record after its last.
  """

  def __init__(self, records: Any, decode: Callable[[Any], Dict[str, Any]], start: int = 0,
               end: Optional[int] = None):
    self.records, self.decode = records, decode
    self.start, self.end = start, len(records) if end is None else end

  def __len__(self) -> int:
    return self.end - self.start

  def __getitem__(self, index: int) -> Dict[str, Any]:
    return self.read([index])[0]

  def read(self, indices: Sequence[int]) -> List[Dict[str, Any]]:
    """The examples at `indices` of the slice.

    Args:
      indices: positions in the slice.

    Returns:
      The examples, in that order.
    """
    keys = [self.start + int(i) for i in indices]
    if any(not self.start <= k < self.end for k in keys):
      raise IndexError(f'Indices {list(indices)} reach outside the {len(self)} examples.')
    if hasattr(self.records, '__getitems__'):
      records = self.records.__getitems__(keys)
    else:
      records = [self.records[k] for k in keys]
    return [self.decode(r) for r in records]

  def first(self, n: int) -> 'Examples':
    """The slice's first n examples.

    Args:
      n: how many (at most all of them).

    Returns:
      Their slice.
    """
    return Examples(self.records, self.decode, self.start, self.start + min(n, len(self)))


@dataclasses.dataclass
class Source:
  """One process's slice of a split, random access: `{'image': uint8 HWC, 'label': int}`."""
  examples: Examples
  num_examples: int          # in this process's slice
  max_examples: int          # in the largest slice of any process (for equal step counts)
  num_classes: int
  name: str
  class_names: Tuple[str, ...] = ()  # label i is class_names[i]
  # What a run records of the whole split, found when first read (a folder's digest
  # reads every file's size; the analysis opens a split on every pass).
  find_identity: Callable[[], Dict[str, Any]] = dict

  @functools.cached_property
  def identity(self) -> Dict[str, Any]:
    """The split's identity (`folder_identity`; TFDS: name, version, split, size,
    classes), against which a resume or an analysis is checked."""
    return self.find_identity()

  def first(self, n: int) -> 'Source':
    """The slice's first n examples, as a source.

    Args:
      n: how many (at most `num_examples`).

    Returns:
      The source.
    """
    return dataclasses.replace(self, examples=self.examples.first(n), num_examples=n,
                               max_examples=n)


class Batches:
  """A pipeline's batches: iterate for numpy dicts. `as_numpy_iterator()` gives
  the same, as tf.data's datasets did for code written against them."""

  def __init__(self, dataset: grain.MapDataset):
    self.dataset = dataset
    threads = min(16, os.cpu_count() or 1)  # batches made at once, each in a thread
    self._options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)

  def __iter__(self) -> Iterator[Dict[str, np.ndarray]]:
    return iter(self.dataset.to_iter_dataset(self._options))

  def as_numpy_iterator(self) -> Iterator[Dict[str, np.ndarray]]:
    """The batches (as `iter(self)`)."""
    return iter(self)


# ---------------------------------------------------------------------------
# Sources


# TFDS fetches most datasets from its Google Cloud Storage mirror first.
DOWNLOAD_HOST = ('storage.googleapis.com', 443)


def can_download(timeout: float = 3.) -> bool:
  """Whether TFDS's download host answers within `timeout` seconds.

  Args:
    timeout: seconds to wait.

  Returns:
    Whether it answered.
  """
  try:
    socket.create_connection(DOWNLOAD_HOST, timeout=timeout).close()
    return True
  except OSError:
    return False


def unavailable(dataset: str, data_dir: Optional[str] = None) -> Optional[str]:
  """Why `dataset` cannot be read now, or None when it can: a folder that is
  not there, an unknown TFDS name, or TFDS data that is neither prepared in
  `data_dir` nor shipped offline nor downloadable (no network). Decided in
  seconds, before anything is downloaded.

  Args:
    dataset: a TFDS name or `folder:` root.
    data_dir: TFDS's data directory.

  Returns:
    The reason in one sentence, or None.
  """
  if dataset.startswith(FOLDER_PREFIX):
    root = dataset[len(FOLDER_PREFIX):]
    if not os.path.isdir(root):
      return f'the image folder {root} does not exist (expected {root}/train/<class>/*.jpg).'
    return None
  if os.path.isdir(dataset):
    return (f'{dataset!r} is a directory, not a TFDS dataset name: for a folder of images '
            f'write "{FOLDER_PREFIX}{dataset}".')
  try:
    builder = tfds.builder(dataset, data_dir=data_dir)
  except (tfds.core.registered.DatasetNotFoundError, ValueError):  # unknown, or not a name
    return (f'{dataset!r} is not a TFDS dataset name: use a name from tfds.list_builders() or '
            f'"{FOLDER_PREFIX}/path/to/images".')
  offline = datasets.OFFLINE.get(dataset)
  if builder.is_prepared() or (offline is not None and offline.local_files() is not None):
    return None
  if can_download():
    return None
  hint = (' Run scripts/get_data.sh to install its offline copy.' if offline else
          f' Prepare it on a machine with network (tfds.builder({dataset!r}).'
          'download_and_prepare(), or for manual datasets such as imagenet2012 TFDS\'s '
          'manual directory) and copy the data directory here, or set --config.data_dir to '
          'where it is.')
  return (f'TFDS dataset {dataset!r} is not prepared in {builder.data_dir} and '
          f'{DOWNLOAD_HOST[0]} cannot be reached to download it.{hint}')


def _prepared_builder(name: str, data_dir: Optional[str]) -> tfds.core.DatasetBuilder:
  """A TFDS builder for `name` with its data prepared as ArrayRecord: TFDS's own
  when its data is there, else the project's offline builder when its files are
  there, else TFDS's download, prepared here."""
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except (tfds.core.registered.DatasetNotFoundError, ValueError) as e:  # unknown, not a name
    raise DataError(f'Unknown dataset {name!r}: not a TFDS dataset name. Use a name from '
                    f'tfds.list_builders() or "{FOLDER_PREFIX}/path/to/images".') from e
  # TFDS warns of a missing version folder when asked about one never prepared.
  if epath.Path(builder.data_dir).exists() and builder.is_prepared():
    if builder.info.file_format != tfds.core.FileFormat.ARRAY_RECORD:
      raise DataError(
          f'TFDS dataset {name!r} is prepared in {builder.data_dir} as '
          f'{builder.info.file_format.value}, which only TensorFlow reads; convert it to '
          f'ArrayRecord (with TensorFlow installed: tfds convert_format --dataset_dir='
          f'{builder.data_dir} --out_file_format=array_record) or prepare it again.')
    return builder
  offline = datasets.OFFLINE.get(name)
  if offline is not None:
    manual_dir = offline.local_files()
    if manual_dir is not None:
      offline_builder = offline(data_dir=data_dir, file_format='array_record')
      if not offline_builder.is_prepared():
        offline_builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
      return offline_builder
  builder = tfds.builder(name, data_dir=data_dir, file_format='array_record')
  try:
    builder.download_and_prepare()
  except Exception as e:  # TFDS raises many kinds for a failed download.
    hint = (' Run scripts/get_data.sh to install the offline copy.' if offline else
            ' Preparing most TFDS datasets needs TensorFlow: pip install tensorflow-cpu.')
    raise DataError(
        f'Could not prepare TFDS dataset {name!r} in {builder.data_dir} '
        f'({type(e).__name__}: {e}). With no network, download it elsewhere and copy the '
        f'data dir here, or pass data_dir=<where it is>.{hint}') from e
  return builder


def _process_slice(n: int, process_index: int, process_count: int) -> Tuple[int, int]:
  """[start, end) of this process's contiguous slice of n examples (as tfds.even_splits)."""
  start = n * process_index // process_count
  return start, n * (process_index + 1) // process_count


def _image_and_label(example: Dict[str, Any]) -> Dict[str, Any]:
  return {'image': example['image'], 'label': int(example['label'])}


class RecordDecoder:
  """A TFDS record's image and label, decoded from the serialized `tf.train.Example`
  by those two features' own `decode_example_np`: what TFDS's decoding of the
  whole example gives for them, without its generic walk over every feature
  (which costs more than reading the record). For images stored as one value or
  a tensor of fixed shape (encoded images, fixed-shape tensors);
  `serialized_shape_is_fixed` tells.

  Args:
    features: the dataset's features, with 'image' and 'label'.
  """

  def __init__(self, features: tfds.features.FeaturesDict):
    self.image, self.info = features['image'], features['image'].get_serialized_info()

  @staticmethod
  def serialized_shape_is_fixed(features: tfds.features.FeaturesDict) -> bool:
    """Whether the images' serialized form is one tensor of fixed shape.

    Args:
      features: the dataset's features.

    Returns:
      Whether `RecordDecoder` decodes them.
    """
    info = features['image'].get_serialized_info()
    return isinstance(info, tfds.features.TensorInfo) and None not in info.shape

  def __call__(self, record: bytes) -> Dict[str, Any]:
    feature = tf_example_pb2.Example.FromString(record).features.feature
    stored = feature['image']
    values = getattr(stored, stored.WhichOneof('kind')).value
    if self.info.shape:
      image = np.array(values, self.info.np_dtype).reshape(self.info.shape)
    else:
      image = values[0]  # encoded bytes
    return {'image': self.image.decode_example_np(image),
            'label': int(feature['label'].int64_list.value[0])}


def tfds_source(name: str, split: str, data_dir: Optional[str] = None, *,
                process_index: int, process_count: int) -> Source:
  """This process's slice of `split` of TFDS dataset `name`, prepared in `data_dir`.

  Args:
    name: the TFDS name.
    split: the split (TFDS slicing allowed).
    data_dir: TFDS's data directory.
    process_index: this process.
    process_count: the processes reading the split.

  Returns:
    The `Source`.
  """
  builder = _prepared_builder(name, data_dir)
  if builder.info.splits:  # (none under tfds.testing.mock_data)
    try:
      size = builder.info.splits[split].num_examples
    except (KeyError, ValueError) as e:
      raise DataError(f'{name} has no split {split!r}; its splits are '
                      f'{sorted(builder.info.splits)}.') from e
  features = builder.info.features
  if builder.info.splits and not size:
    data, decode = [], _image_and_label
  elif RecordDecoder.serialized_shape_is_fixed(features):
    data = builder.as_data_source(split=split,
                                   deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
    decode = RecordDecoder(features)
  else:
    data, decode = builder.as_data_source(split=split), _image_and_label
  slices = [_process_slice(len(data), i, process_count) for i in range(process_count)]
  start, end = slices[process_index]
  if end == start:
    raise DataError(f'Split {split!r} of {name} holds no images' + (
        ' for this process' if process_count > 1 else '') + '; give a split with images, such '
        'as train or train[:10%].')
  identity = {'kind': 'tfds', 'name': name, 'version': str(builder.info.version),
              'split': split, 'examples': len(data), 'classes': list(features['label'].names)}
  return Source(Examples(data, decode, start, end), end - start, max(e - s for s, e in slices),
                features['label'].num_classes, name, tuple(features['label'].names),
                lambda: identity)


def read_image(path: str) -> np.ndarray:
  """An image file as a uint8 (H, W, 3) array, decoded by OpenCV: gray and
  palette images in RGB, an alpha channel dropped, EXIF orientation ignored (as
  PIL's `convert('RGB')` and TensorFlow's decoders give them), 16-bit PNGs by
  their high bytes (as TensorFlow's `decode_png`).

  Args:
    path: a JPEG or PNG file.

  Returns:
    The image.

  Raises:
    DataError: the file does not decode.
  """
  try:
    data = np.fromfile(path, np.uint8)
  except OSError as e:
    raise DataError(f'{path} can no longer be read ({e.strerror}): it was deleted, moved or '
                    'made unreadable while the run read its folder. Restore it, or train '
                    'into a new workdir on the folder as it is now.') from None
  image = cv2.imdecode(data, cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION)
  if image is None:
    raise DataError(f'Damaged image file {path} (it does not decode): replace or remove it.')
  return image


def _class_files(class_dir: str) -> List[str]:
  """The image files under a class directory, at any depth (as torchvision's
  ImageFolder reads them, links to directories followed), in sorted order;
  directories named like images are walked into, never read as images.

  Raises:
    DataError: a link to nothing, naming it.
  """
  found = []
  for base, dirs, names in os.walk(class_dir, followlinks=True):
    dirs.sort()
    check_names(base, dirs + names)
    for name in sorted(names):
      if name.lower().endswith(IMAGE_EXTENSIONS):
        path = os.path.join(base, name)
        if not os.path.exists(path):
          raise DataError(f'{path} is a link to {os.readlink(path)}, which does not exist: '
                          'remove the link or restore what it points to.')
        found.append(path)
  return found


def folder_identity(split_dir: str, classes: Sequence[str], files: Sequence[str],
                    labels: Sequence[int]) -> Dict[str, Any]:
  """What a run records of a folder split (`workdir.data_changes` compares it): the
  classes in label order, the images per class, and a SHA-256 digest of every
  file's class, path under its class directory and size.

  Args:
    split_dir: the split's directory.
    classes: the class names, label i being classes[i].
    files: the image paths.
    labels: their labels.

  Returns:
    The identity, JSON-ready.
  """
  digest = hashlib.sha256()
  for path, label in zip(files, labels):
    inside = os.path.relpath(path, os.path.join(split_dir, classes[label]))
    digest.update(f'{classes[label]}\t{inside}\t{os.path.getsize(path)}\n'.encode('utf-8'))
  return {'kind': 'folder', 'classes': list(classes),
          'images_per_class': np.bincount(labels, minlength=len(classes)).tolist(),
          'files': len(files), 'digest': digest.hexdigest()}


def folder_source(root: str, split: str, *, process_index: int, process_count: int) -> Source:
  """Images in `root/<split>/<class>/` (sub-folders of a class included); classes
  are the sorted sub-directory names.

  Args:
    root: the folder.
    split: its sub-folder (itself a link, if need be, to a folder elsewhere).
    process_index: this process.
    process_count: the processes reading the split.

  Returns:
    This process's `Source`.
  """
  split_dir = os.path.join(root, split)
  parts = os.path.normpath(split).split(os.sep)
  if os.path.isabs(split) or '..' in parts:
    raise DataError(f'The split {split!r} leads outside the image folder {root}; name a '
                    'sub-directory of it, such as train or test.')
  if not os.path.isdir(split_dir):
    raise DataError(f'Image folder {split_dir} does not exist; expected '
                    f'{root}/{{train,test}}/<class>/*.jpg.')
  classes = sorted(d for d in os.listdir(split_dir) if os.path.isdir(os.path.join(split_dir, d)))
  check_names(split_dir, classes)
  files, labels = [], []
  for label, name in enumerate(classes):
    found = _class_files(os.path.join(split_dir, name))
    if not found:
      raise DataError(f'The class directory {os.path.join(split_dir, name)} holds no '
                      f'{"/".join(IMAGE_EXTENSIONS)} images: add some, or remove it (from '
                      'every split) if the class is not meant to be there.')
    files += found
    labels += [label] * len(found)
  if not files:
    raise DataError(f'Image folder {split_dir} holds no {"/".join(IMAGE_EXTENSIONS)} files '
                    'in class sub-directories.')
  start, end = _process_slice(len(files), process_index, process_count)
  largest = -(-len(files) // process_count)  # the biggest slice _process_slice makes
  check_images(tuple(files[start:end]))
  examples = Examples(list(zip(files, labels)), lambda file_and_label: {
      'image': read_image(file_and_label[0]), 'label': file_and_label[1]}, start, end)
  return Source(examples, end - start, largest, len(classes), f'{FOLDER_PREFIX}{root}',
                tuple(classes), functools.partial(folder_identity, split_dir, classes, files,
                                                  labels))


def image_problem(path: str) -> Optional[str]:
  """What is wrong with the image file at `path`, or None: not JPEG or PNG (an
  empty file among them), cut short, lacking its format's end marker (JPEG's
  EOI, ff d9, among its last 64 bytes, as some writers pad after it; PNG's IEND
  chunk, its last 8 bytes), or damaged inside: a PNG whose chunks fail their
  checksums (which the decoder refuses mid-training), a JPEG whose
  header or data PIL cannot decode (at 1/8 scale, its cheapest decode).

  Args:
    path: the file.

  Returns:
    The problem in words, or None.
  """
  with open(path, 'rb') as f:
    head = f.read(4)
    f.seek(max(os.fstat(f.fileno()).st_size - 64, 0))
    tail = f.read()
  if head[:3] == b'\xff\xd8\xff':
    whole = b'\xff\xd9' in tail
  elif head == b'\x89PNG':
    whole = tail.endswith(b'IEND\xaeB`\x82')
  else:
    return f'Unreadable image file {path} (neither JPEG nor PNG): replace or remove it.'
  if not whole:
    return f'Truncated image file {path} (it ends before its last byte): replace or remove it.'
  try:
    with PIL.Image.open(path) as image:
      if image.format == 'PNG':
        image.verify()
      else:
        image.draft('RGB', (1, 1))
        image.load()
  except PIL.Image.DecompressionBombError:
    return None  # whole (its end marker found) and only larger than PIL checks: read as is
  except (OSError, SyntaxError, ValueError) as e:  # PIL's errors for damaged data
    return f'Damaged image file {path} ({e}): replace or remove it.'
  return None


def check_names(directory: str, names: Sequence[str]) -> None:
  """Refuses a file or folder name in `directory` that is not UTF-8 (class names
  are written as UTF-8 text into checkpoints and reports), naming it as its bytes.

  Args:
    directory: where the names are.
    names: the names (undecodable bytes as `os.listdir` gives them, escaped).

  Raises:
    DataError: a name is not UTF-8.
  """
  for name in names:
    try:
      name.encode('utf-8')
    except UnicodeEncodeError:
      raise DataError(f'{os.fsencode(directory)!r} holds {os.fsencode(name)!r}, whose name is '
                      'not UTF-8 text: rename it (e.g. convmv -f latin1 -t utf-8).') from None


@functools.lru_cache(maxsize=None)
def check_images(paths: Tuple[str, ...]) -> None:
  """Raises a DataError naming the first of `paths` that is not a whole JPEG or
  PNG file (`image_problem`), and how many are not; reads each (a PNG's chunks,
  a JPEG decoded at 1/8 scale), so a bad file is found before training rather
  than when its batch comes. A split
  is checked once per process, however often it is opened (the analysis opens
  it for every pass).

  Args:
    paths: the split's image files.

  Raises:
    DataError: a file is not a whole JPEG or PNG.
  """
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    problems = [p for p in pool.map(image_problem, paths) if p]
  if problems:
    more = f' ({len(problems) - 1} more files are bad too.)' if len(problems) > 1 else ''
    raise DataError(problems[0] + more)


def check_same_classes(train: Source, evaluation: Source) -> None:
  """Raises a DataError unless both splits name the same classes in the same order:
  labels are positions in the class list, so they must mean the same in both.

  Args:
    train: the training split's source.
    evaluation: the evaluation split's.

  Raises:
    DataError: their classes differ.
  """
  if train.class_names and evaluation.class_names and train.class_names != evaluation.class_names:
    only = lambda a, b: sorted(set(a.class_names) - set(b.class_names))
    raise DataError(
        f'The splits of {train.name} name different classes (only in training: '
        f'{only(train, evaluation)}; only in evaluation: {only(evaluation, train)}; training '
        f'{list(train.class_names)}, evaluation {list(evaluation.class_names)}): give both '
        'splits the same class directories.')


def get_source(dataset: str, split: str, data_dir: Optional[str] = None, *,
               process_index: Optional[int] = None,
               process_count: Optional[int] = None) -> Source:
  """This process's slice of `split` of a TFDS dataset or `folder:` root.

  Args:
    dataset: a TFDS name or `folder:` root.
    split: the split (TFDS slicing allowed).
    data_dir: TFDS's data directory.
    process_index: this process (JAX's if None).
    process_count: the processes (JAX's if None).

  Returns:
    The `Source`.
  """
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  kwargs = dict(process_index=process_index, process_count=process_count)
  if dataset.startswith(FOLDER_PREFIX):
    return folder_source(dataset[len(FOLDER_PREFIX):], split, **kwargs)
  return tfds_source(dataset, split, data_dir, **kwargs)


# ---------------------------------------------------------------------------
# Preprocessing


def random_draws(seed: int, stream: int, position: int) -> np.random.Generator:
  """The generator of one example's or batch's random draws."""
  return np.random.default_rng((seed, stream, position))


def model_input(images: Iterable[np.ndarray], count: int, size: int,
                 mirror: Optional[np.ndarray] = None) -> np.ndarray:
  """A float32 (count, size, size, 3) batch in [-1, 1] from uint8 or float [0, 255]
  images (gray ones repeated over 3 channels), `mirror`ed ones flipped left-right.
  Each image is written and scaled as it comes, while it is in the cache.

  Args:
    images: `count` images of size x size.
    count: how many.
    size: their side.
    mirror: a bool per image, or None.

  Returns:
    The batch.
  """
  out = np.empty((count, size, size, 3), np.float32)
  for i, image in enumerate(images):
    if mirror is not None and mirror[i]:
      image = cv2.flip(image, 1).reshape(image.shape)
    np.multiply(image, np.float32(1 / 127.5), out=out[i], casting='unsafe')
    out[i] -= 1
  return out


def one_hot(labels: Sequence[int], num_classes: int) -> np.ndarray:
  return np.eye(num_classes, dtype=np.float32)[np.asarray(labels)]


def _local_batch_size(batch_size: int, process_count: int,
                      local_devices: Optional[int] = None) -> int:
  """This process's share of a global batch, which must split evenly over every device."""
  local_devices = jax.local_device_count() if local_devices is None else local_devices
  devices = process_count * local_devices
  if batch_size % devices:
    raise DataError(f'The batch size {batch_size} does not split over the {devices} devices '
                    f'({process_count} processes of {local_devices}); choose a multiple of '
                    f'{devices}.')
  return batch_size // process_count


class EpochOrder:
  """The training stream's order: epoch e visits the n examples in a random
  permutation drawn from (seed, e); position p of the stream is example
  `permutation(p // n)[p % n]`. The last two epochs' permutations are kept.

  Args:
    n: the examples.
    seed: the stream's seed.
  """

  def __init__(self, n: int, seed: int):
    self.n, self.seed = n, seed
    self.permutation = functools.lru_cache(maxsize=2)(self._permutation)

  def _permutation(self, epoch: int) -> np.ndarray:
    return np.random.default_rng((self.seed, ORDER_DRAWS, epoch)).permutation(self.n)

  def positions(self, start: int, count: int) -> np.ndarray:
    """The examples at stream positions start, ..., start + count - 1.

    Args:
      start: the first position.
      count: how many.

    Returns:
      Their indices in the slice.
    """
    position = np.arange(start, start + count)
    epochs = position // self.n
    out = np.empty(count, np.int64)
    for epoch in np.unique(epochs):
      where = epochs == epoch
      out[where] = self.permutation(int(epoch))[position[where] % self.n]
    return out


def train_dataset(source: Source, *, batch_size: int, image_size: int, seed: int = 0,
                  mixup_alpha: float = 0., randaugment: Optional[Tuple[int, int]] = None,
                  process_count: Optional[int] = None, crop: bool = True,
                  crop_padding: int = 0, start_step: int = 0,
                  local_devices: Optional[int] = None) -> Batches:
  """Endless stream of this process's batches: {'image' (b, s, s, 3), 'label' (b, C)}.

  `crop=False` replaces the Inception crop by a resize (where the images are not
  already of the size), which `crop_padding` > 0 follows with `pad_and_crop`
  (random shifts). `start_step` resumes the stream after that many batches.

  `batch_size` is global. Batch k is a function of (seed, k): each epoch is a
  permutation of the whole slice drawn from (seed, epoch) (`EpochOrder`; batches
  run across epochs' ends), each example's draws
  (crop, shift, RandAugment) come from (seed, its position in the stream), each
  batch's (flip, mixup) from (seed, k). So a run resumed at step k reads the
  batches an uninterrupted run reads from step k.

  Args:
    source: this process's slice.
    batch_size: the global batch size.
    image_size: the images' side.
    seed: the stream's seed.
    mixup_alpha: mixup's Beta parameter (0: none).
    randaugment: (layers, magnitude), or None.
    process_count: the processes (JAX's if None).
    crop: the Inception crop, else a resize.
    crop_padding: with `crop=False`, the random shift's padding.
    start_step: batches to skip (resuming).
    local_devices: this process's devices (JAX's if None).

  Returns:
    The batches.
  """
  process_count = jax.process_count() if process_count is None else process_count
  local_batch = _local_batch_size(batch_size, process_count, local_devices)
  if crop and crop_padding:
    raise ValueError('crop_padding shifts resized images; it does not combine with the '
                     'Inception crop. Turn one off.')

  def example(position: int, ex: Dict[str, Any]) -> np.ndarray:
    image = ex['image']
    if crop or crop_padding or randaugment is not None:
      draws = random_draws(seed, EXAMPLE_DRAWS, position)
    if crop:
      image = augment.inception_crop(image, image_size, draws)
    elif image.shape[:2] != (image_size, image_size):
      image = augment.resize(image, (image_size, image_size))
    if crop_padding:
      image = augment.pad_and_crop(image, crop_padding, draws)
    if randaugment is not None:
      image = augment.randaugment(augment.to_rgb(image), *randaugment, draws)
    return image

  def batch(index: int, indices: np.ndarray) -> Dict[str, np.ndarray]:
    examples = source.examples.read(indices)
    draws = random_draws(seed, BATCH_DRAWS, index)
    images = (example(index * local_batch + i, ex) for i, ex in enumerate(examples))
    out = {'image': model_input(images, len(examples), image_size,
                                 augment.mirrored(len(examples), draws)),
           'label': one_hot([ex['label'] for ex in examples], source.num_classes)}
    return augment.mixup(out, mixup_alpha, draws) if mixup_alpha > 0 else out

  order = EpochOrder(source.num_examples, seed)
  steps = grain.MapDataset.range(start_step, _ENDLESS)
  return Batches(steps.map(lambda k: batch(k, order.positions(k * local_batch, local_batch))))


def eval_dataset(source: Source, *, batch_size: int, image_size: int,
                 resize_small: Optional[int] = None, process_count: Optional[int] = None,
                 local_devices: Optional[int] = None) -> Batches:
  """One pass over this process's slice: {'image', 'label', 'mask'} batches.

  Padding examples (mask 0) fill the last batch, and every process yields the
  same number of batches (that of the largest slice), so each example is
  counted exactly once whatever the batch size. Batches split evenly over
  `local_devices` (default: all of this process's).

  Args:
    source: this process's slice.
    batch_size: the global batch size.
    image_size: the images' side.
    resize_small: the short side before the centre crop, or None.
    process_count: the processes (JAX's if None).
    local_devices: this process's devices (JAX's if None).

  Returns:
    The batches.
  """
  process_count = jax.process_count() if process_count is None else process_count
  local_batch = _local_batch_size(batch_size, process_count, local_devices)
  num_batches = math.ceil(source.max_examples / local_batch)

  def image(ex: Dict[str, Any]) -> np.ndarray:
    if resize_small is not None or ex['image'].shape[:2] != (image_size, image_size):
      return augment.eval_resize(ex['image'], image_size, resize_small)
    return ex['image']

  def batch(index: int) -> Dict[str, np.ndarray]:
    position = index * local_batch + np.arange(local_batch)
    real = position[position < source.num_examples]
    examples = source.examples.read(real)
    padding = [np.zeros((image_size, image_size, 3), np.uint8)] * (local_batch - len(real))
    images = itertools.chain((image(ex) for ex in examples), padding)
    return {'image': model_input(images, local_batch, image_size),
            'label': one_hot([ex['label'] for ex in examples] + [0] * len(padding),
                              source.num_classes),
            'mask': (position < source.num_examples).astype(np.float32)}

  return Batches(grain.MapDataset.range(num_batches).map(batch))


# ---------------------------------------------------------------------------
# To the devices


def prefetch_to_devices(batches: Iterator, sharding: jax.sharding.Sharding,
                        size: int = 2) -> Iterator:
  """Global jax.Arrays from per-process numpy batches, `size` steps ahead.

  Transfers are asynchronous, so the next batches move while a step runs.

  Args:
    batches: per-process numpy batches.
    sharding: how the global arrays are laid out.
    size: batches moved ahead.

  Returns:
    The global batches.
  """
  queue = collections.deque()

  def put(batch):
    return jax.tree_util.tree_map(
        lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)

  for batch in batches:
    queue.append(put(batch))
    if len(queue) > size:
      yield queue.popleft()
  while queue:
    yield queue.popleft()
