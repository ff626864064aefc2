"""Files `torch.save` wrote (`.pt`, `.pth`, `.bin`), read without PyTorch and
without running anything the file names.

A `torch.save` file is a zip archive: `<name>/data.pkl`, a pickle of the saved
object whose tensors point by key to raw storages `<name>/data/<key>`, and
`<name>/byteorder`. A pickle is a program: each global it names is called with
arguments it chooses. Here the pickle is run by Python's own pickle machine with
one change, the names it may look up: an allow-list of exact `module.name`
entries (`ALLOWED`), each mapped to a function of this module that builds plain
data (numpy arrays for tensors, dicts, tuples, strings). No module is imported, no
attribute is looked up by a name the file chose, and objects accept state only
where they are arrays or records built here. Any other global, a dotted name
(protocol 4's `Path.unlink`), or a state set on anything else ends the read with
`UnsafeFileError` before the object is built.

Classes of a package the reader is told of (`records`: ViT-Prisma's config) are
read as `Record`s holding their pickled fields and no behaviour.
"""
import collections
import io
import math
import os
import pathlib
import pickle
import struct
import zipfile
import zlib
from typing import Any, BinaryIO, Callable, Dict, Iterable, Tuple, Union

import ml_dtypes
import numpy as np
from etils import epath

# torch's dtypes (`torch.float32` in a pickle) and storage classes (the storage type
# in a tensor's persistent id) as numpy dtypes.
_DTYPES = {
    'float64': np.float64, 'double': np.float64, 'float32': np.float32, 'float': np.float32,
    'float16': np.float16, 'half': np.float16, 'bfloat16': ml_dtypes.bfloat16,
    'int64': np.int64, 'long': np.int64, 'int32': np.int32, 'int': np.int32,
    'int16': np.int16, 'short': np.int16, 'int8': np.int8, 'uint8': np.uint8, 'bool': np.bool_}
_STORAGES = {'DoubleStorage': np.float64, 'FloatStorage': np.float32, 'HalfStorage': np.float16,
             'BFloat16Storage': ml_dtypes.bfloat16, 'LongStorage': np.int64,
             'IntStorage': np.int32, 'ShortStorage': np.int16, 'CharStorage': np.int8,
             'ByteStorage': np.uint8, 'BoolStorage': np.bool_, 'UntypedStorage': np.uint8}


# What zipfile raises on a damaged archive: a bad header or CRC, a name that is not
# UTF-8, a compression method it lacks, a deflate stream cut short, an entry whose
# flags say it is encrypted (RuntimeError). The `.npz` readers catch the same.
ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError,
               zlib.error, RuntimeError)


class UnsafeFileError(ValueError):
  """A file that is not a `torch.save` file, or one that asks for more than data."""


class Record:
  """An object of a class the reader does not import: its pickled fields, as
  attributes, and nothing else."""

  def __setstate__(self, state: Any) -> None:
    if isinstance(state, tuple):  # (the __dict__, the __slots__' values)
      state = {k: v for part in state if part for k, v in part.items()}
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
      raise UnsafeFileError('an object\'s state is not a dict of fields')
    self.__dict__.update(state)


class _StorageType:
  """A storage class named in a tensor's persistent id."""

  def __init__(self, dtype: Any):
    self.dtype = np.dtype(dtype)


def _strided(storage: np.ndarray, offset: int, size: Tuple[int, ...],
             stride: Tuple[int, ...]) -> np.ndarray:
  """A tensor's elements as a new array, after checking that they lie inside its storage."""
  if not isinstance(storage, np.ndarray):
    raise UnsafeFileError('a tensor is built on something other than a storage')
  size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
  if len(size) != len(stride) or min(size + (0,)) < 0 or min(stride + (0,)) < 0 or offset < 0:
    raise UnsafeFileError(f'a tensor of shape {size} and strides {stride} is malformed')
  if 0 in size:
    return np.zeros(size, storage.dtype)
  last = int(offset) + sum((n - 1) * s for n, s in zip(size, stride))
  if last >= storage.size:
    raise UnsafeFileError(f'a tensor of shape {size} reaches element {last} of a storage of '
                          f'{storage.size}')
  if math.prod(size) > storage.size:  # a view that repeats its elements (stride 0, overlaps)
    raise UnsafeFileError(f'a tensor of shape {size} and strides {stride} views a storage of '
                          f'{storage.size} elements, repeating them; save it with '
                          '.contiguous() (the copy of its elements) instead')
  view = np.lib.stride_tricks.as_strided(
      storage[offset:], size, tuple(s * storage.itemsize for s in stride), writeable=False)
  return np.array(view)


def _rebuild_tensor(storage, offset, size, stride, *unused) -> np.ndarray:
  del unused  # requires_grad, backward hooks, metadata: nothing an array keeps
  return _strided(storage, offset, size, stride)


def _rebuild_parameter(data, *unused) -> np.ndarray:
  del unused
  if not isinstance(data, np.ndarray):
    raise UnsafeFileError('a parameter holds something other than a tensor')
  return data


def _rebuild_from_type(func, new_type, args, state) -> Any:
  """A tensor subclass (torch's `_rebuild_from_type_v2`): the tensor alone."""
  del new_type, state
  if func not in (_rebuild_tensor, _rebuild_parameter):
    raise UnsafeFileError('a tensor subclass is rebuilt by a function other than torch\'s')
  return func(*args)


def _numpy_dtype(obj, align=False, copy=False) -> np.dtype:
  del align, copy
  if not isinstance(obj, str):
    raise UnsafeFileError('a numpy dtype is described by something other than its code')
  dtype = np.dtype(obj)
  if dtype.hasobject:
    raise UnsafeFileError('an array of Python objects is not data')
  return dtype


def _numpy_array(subtype, shape, dtype) -> np.ndarray:
  """numpy's `_reconstruct`: an empty ndarray that its pickled state then fills."""
  del shape, dtype
  if subtype is not _NDARRAY:
    raise UnsafeFileError('an array of a class other than numpy.ndarray')
  return np.empty(0, np.uint8)


def _numpy_scalar(dtype, data=b'') -> Any:
  if not isinstance(dtype, np.dtype) or dtype.hasobject or not isinstance(data, bytes):
    raise UnsafeFileError('a numpy scalar that is not a number')
  if len(data) != dtype.itemsize:
    raise UnsafeFileError('a numpy scalar of the wrong size')
  return np.frombuffer(data, dtype)[0]


def _codecs_encode(text, encoding='utf-8') -> bytes:
  """How protocol 2 pickles bytes: a latin-1 string encoded."""
  if not isinstance(text, str) or encoding not in ('latin1', 'latin-1'):
    raise UnsafeFileError('bytes encoded other than as latin-1 text')
  return text.encode('latin1')


def _path(*parts) -> str:
  """A pathlib path in a config: its text, never an object that can act on files."""
  if not all(isinstance(p, str) for p in parts):
    raise UnsafeFileError('a path made of something other than text')
  return str(pathlib.PurePosixPath(*parts))


def _reconstructor(cls, base, state) -> Any:
  """copyreg's protocol 0 and 1 form of a plain object: only a record."""
  if not (isinstance(cls, type) and issubclass(cls, Record)) or base is not object or (
      state is not None):
    raise UnsafeFileError('an object of a class other than a record is rebuilt')
  return cls()


_NDARRAY = object()  # numpy.ndarray, as `_reconstruct` receives it

# Every global a file may name, by its exact name, and what is built for it.
ALLOWED: Dict[str, Any] = {
    'torch._utils._rebuild_tensor_v2': _rebuild_tensor,
    'torch._utils._rebuild_tensor': _rebuild_tensor,
    'torch._utils._rebuild_parameter': _rebuild_parameter,
    'torch._utils._rebuild_parameter_with_state': _rebuild_parameter,
    'torch._tensor._rebuild_from_type_v2': _rebuild_from_type,
    'torch.Size': tuple,
    'torch.device': lambda *args: ':'.join(str(a) for a in args),
    'collections.OrderedDict': collections.OrderedDict,
    # Protocol 2 writes Python 2's module names (`__builtin__`, `copy_reg`).
    **{f'{module}.{name}': builtin for module in ('builtins', '__builtin__')
       for name, builtin in (('set', set), ('frozenset', frozenset), ('complex', complex),
                             ('slice', slice), ('object', object))},
    '_codecs.encode': _codecs_encode,
    'copyreg._reconstructor': _reconstructor, 'copy_reg._reconstructor': _reconstructor,
    'pathlib.Path': _path, 'pathlib.PosixPath': _path, 'pathlib.PurePosixPath': _path,
    'pathlib.WindowsPath': _path, 'pathlib.PureWindowsPath': _path,
    **{f'{core}.multiarray.{name}': builder for core in ('numpy.core', 'numpy._core')
       for name, builder in (('_reconstruct', _numpy_array), ('scalar', _numpy_scalar))},
    'numpy.ndarray': _NDARRAY, 'numpy.dtype': _numpy_dtype,
    **{f'torch.{name}': _StorageType(dtype) for name, dtype in _STORAGES.items()},
    **{f'torch.{name}': np.dtype(dtype) for name, dtype in _DTYPES.items()},
}


class _Unpickler(pickle._Unpickler):  # the Python machine, whose opcodes can be replaced
  """Python's unpickler with `ALLOWED` as its only globals, records for the
  packages in `records`, storages from the archive, and state set on arrays and
  records alone."""

  def __init__(self, data: bytes, storage: Callable[[str, np.dtype, int], np.ndarray],
               records: Iterable[str]):
    super().__init__(io.BytesIO(data))
    self._storage = storage
    self._records = tuple(records)
    self._record_types: Dict[str, type] = {}

  def find_class(self, module: str, name: str) -> Any:
    full = f'{module}.{name}'
    if full in ALLOWED:
      return ALLOWED[full]
    if module.split('.')[0] in self._records and name.isidentifier():
      return self._record_types.setdefault(full, type(name, (Record,), {}))
    raise UnsafeFileError(f'it names {full}, which is not data this reader builds')

  def persistent_load(self, pid: Any) -> np.ndarray:
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == 'storage'
            and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)
            and isinstance(pid[4], int)):
      raise UnsafeFileError(f'it refers to {str(pid)[:80]}, which is not a tensor storage')
    return self._storage(pid[2], pid[1].dtype, pid[4])

  def load_build(self) -> None:
    state = self.stack.pop()
    inst = self.stack[-1]
    if isinstance(inst, Record):
      inst.__setstate__(state)
    elif type(inst) is np.ndarray and isinstance(state, tuple) and len(state) == 5 and (
        isinstance(state[2], np.dtype) and not state[2].hasobject
        and isinstance(state[4], bytes)):
      inst.__setstate__(state)
    elif isinstance(inst, np.dtype) and isinstance(state, tuple) and len(state) >= 2 and (
        state[1] in ('<', '|', '=')) and not any(isinstance(s, (tuple, dict)) for s in state):
      pass  # a little-endian plain dtype: built already as it is
    else:
      raise UnsafeFileError(f'it sets the state of a {type(inst).__name__}, which is not data')

  dispatch = dict(pickle._Unpickler.dispatch)
  dispatch[pickle.BUILD[0]] = load_build


def load(path: Union[str, os.PathLike], records: Iterable[str] = ()) -> Any:
  """The object a `torch.save` file holds, its tensors as numpy arrays.

  Args:
    path: the file (a zip archive, as `torch.save` writes since PyTorch 1.6).
    records: top-level package names whose classes are read as `Record`s.

  Returns:
    the saved object: dicts, lists, tuples, numbers, strings, numpy arrays
    (bfloat16 through ml_dtypes) and records.

  Raises:
    UnsafeFileError: a file that is not such an archive, is damaged, or names
      anything outside `ALLOWED`; its message starts with the path.
  """
  try:
    with epath.Path(path).open('rb') as f:
      return _load(f, records)
  except UnsafeFileError as error:
    raise UnsafeFileError(f'{path} cannot be read as a torch.save file: {error}.') from None


def loads(data: bytes, records: Iterable[str] = ()) -> Any:
  """`load` on a file's bytes; the error's message does not name a file."""
  return _load(io.BytesIO(data), records)


def _load(f: BinaryIO, records: Iterable[str]) -> Any:
  try:
    is_zip = zipfile.is_zipfile(f)
  except ZIP_ERRORS as error:
    raise UnsafeFileError(f'its zip archive is damaged ({_said(error)})') from None
  if not is_zip:
    f.seek(0)
    if f.read(1) == b'\x80':
      raise UnsafeFileError('it is a plain pickle or the format of PyTorch before 1.6; load '
                            'it with that PyTorch and save it again with torch.save, or as '
                            '.safetensors')
    raise UnsafeFileError('it is not a zip archive')
  f.seek(0, io.SEEK_END)
  length = f.tell()
  try:
    archive = zipfile.ZipFile(f)
    names = archive.namelist()
  except ZIP_ERRORS as error:
    raise UnsafeFileError(f'its zip archive is damaged ({_said(error)})') from None
  pickles = [n for n in names if n == 'data.pkl' or n.endswith('/data.pkl')]
  if len(pickles) != 1:
    raise UnsafeFileError(f'it holds {len(pickles)} data.pkl entries where torch.save '
                          'writes one')
  prefix = pickles[0][:-len('data.pkl')]
  order = _entry(archive, prefix + 'byteorder', 16) if prefix + 'byteorder' in names else b'little'
  if order not in (b'little', b'big'):
    raise UnsafeFileError(f'its byte order {order[:16]!r} is neither little nor big')
  loaded: Dict[str, np.ndarray] = {}

  def storage(key: str, dtype: np.dtype, count: int) -> np.ndarray:
    if key not in loaded:
      name = f'{prefix}data/{key}'
      if name not in names:
        raise UnsafeFileError(f'a tensor\'s storage {key!r} is missing')
      size = count * dtype.itemsize
      raw = _entry(archive, name, size)
      if len(raw) != size:
        raise UnsafeFileError(f'storage {key!r} holds {len(raw)} bytes of its {size}')
      array = np.frombuffer(raw, dtype if order == b'little' else dtype.newbyteorder())
      loaded[key] = array.astype(dtype) if order == b'big' else array
    return loaded[key]

  try:
    return _Unpickler(_entry(archive, pickles[0], length), storage, records).load()
  except UnsafeFileError:
    raise
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
          AttributeError, struct.error, RecursionError, MemoryError, OverflowError) as error:
    raise UnsafeFileError(f'its pickle is damaged ({type(error).__name__}: '
                          f'{_said(error) or "it ends early"})') from None


def _said(error: BaseException) -> str:
  """An error's message on one line, at most 200 characters."""
  return ' '.join(str(error).split())[:200]


def _entry(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
  """An entry's bytes, refused when it says it is larger than `limit` or is
  compressed (torch.save stores its entries as they are; a compressed entry could
  unpack to any size)."""
  info = archive.getinfo(name)
  if info.compress_type != zipfile.ZIP_STORED:
    raise UnsafeFileError(f'its entry {name} is compressed, as torch.save never writes')
  if info.file_size > limit:
    raise UnsafeFileError(f'its entry {name} is {info.file_size} bytes where {limit} are '
                          'expected')
  try:
    return archive.read(name)
  except ZIP_ERRORS as error:
    raise UnsafeFileError(f'its entry {name} is damaged ({_said(error)})') from None
