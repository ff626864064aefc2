"""timm's PyTorch files and ours: a parameter tree exported as the state dict
timm builds for the same model (`to_timm`), a state dict read back as our tree
(`from_timm`, the exact inverse), and the reading of `.safetensors` and
`torch.save` files (`read_state_dict`). Each family that timm covers gives its
name mapping (`Family.to_timm`, `Family.timm_fields`)."""
import json
import math
import os
from typing import Any, Dict, Mapping, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
from etils import epath

from vit_jax import models
from vit_jax.files import torch_save
from vit_jax.files.layout import (Params, check_matches, flatten, published, published_float32,
                                  unflatten)
from vit_jax.files.torch_save import UnsafeFileError
from vit_jax.models.family import CheckpointError, Family, Flat

# A timm state dict saved by torch.save (with `.safetensors`, the files `checkpoint.load` reads).
TORCH_SUFFIXES = ('.pth', '.pth.tar', '.pt', '.bin')
# The index of a state dict in shards, as `save_pretrained(max_shard_size=...)` writes it
# (`model.safetensors.index.json`, `pytorch_model.bin.index.json`): name -> shard file.
INDEX_SUFFIX = '.index.json'
STATE_DICT_SUFFIXES = TORCH_SUFFIXES + ('.safetensors', INDEX_SUFFIX)
# A model, as a zoo name or as its config whole (`models.config_of`).
Model = Union[str, ml_collections.ConfigDict]


def to_timm(params: Mapping[str, Any], model: Model) -> Dict[str, np.ndarray]:
  """A parameter tree as the state dict timm builds for the same model.

  Args:
    params: the tree of the model (any layout `checkpoint.load` reads).
    model: a ViT, hybrid or BiT name, or its config (`models.get_config`).

  Returns:
    name -> float32 array in PyTorch's layout, from the family's `to_timm`:
    what timm's own `.npz` loader makes of our saved file. Wrap the arrays with
    `torch.from_numpy` to load them.
  """
  config = models.config_of(model)
  state = _timm_family(config).to_timm(published_float32(params), config)
  # C order, as file writers that take the raw buffer (safetensors) need.
  return {k: np.ascontiguousarray(v) for k, v in state.items()}


def from_timm(state_dict: Mapping[str, Any], model: Model, **overrides: Any) -> Params:
  """`published_from_timm` as a nested tree.

  Args:
    state_dict: name -> array or CPU tensor.
    model: the model it holds: its name, or its config (`models.get_config`).
    **overrides: architecture fields the state dict does not fix.

  Returns:
    The nested parameter tree in the published layout.
  """
  return unflatten(published_from_timm(state_dict, model, **overrides))


def published_from_timm(state_dict: Mapping[str, Any], model: Model, **overrides: Any) -> Flat:
  """The flat published parameter tree of `model` from a timm `state_dict` (name ->
  array or CPU tensor, PyTorch layout): the exact inverse of `to_timm`.

  The head (class token, attention pooling or mean), the classes and the image
  size come from the state dict; the config given, or `overrides` of a name's,
  set the other architecture fields (a CIFAR model's `patch_size`). A qkv bias the state dict lacks (timm's
  `qkv_bias=False`) loads as zeros; any other difference from the model is a
  CheckpointError listing the keys.

  Args:
    state_dict: name -> array or CPU tensor.
    model: the model it holds: its name, or its config (`models.get_config`).
    **overrides: architecture fields the state dict does not fix.

  Returns:
    The flat parameters in the published layout.
  """
  state = {k: np.asarray(v, np.float32) for k, v in state_dict.items()
           if not k.endswith('num_batches_tracked')}
  config = models.config_of(model, **overrides)
  family = _timm_family(config)
  try:
    fields = family.timm_fields(state, config)
  except KeyError as e:
    raise CheckpointError(
        f'The state dict has no {e.args[0]!r}, which a timm file of {config.name} has: it holds '
        f'another model, or not a timm state dict (its first keys: '
        f'{", ".join(list(state)[:5])}).') from None
  image_size = fields.pop('image_size')
  config = models.with_fields(config, **fields)
  model = models.build_model(config)
  shapes = jax.eval_shape(lambda: published(flatten(model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, image_size, image_size, 3)))['params'])))
  # Number every parameter element and export the numbers: each timm array then
  # says which elements it holds, so the import is the export read backwards.
  starts = np.cumsum([0] + [int(np.prod(s.shape)) for s in shapes.values()])
  index = np.int32 if starts[-1] < 2**31 else np.int64  # ViT-G/14 still fits int32
  numbered = {k: np.arange(start, start + np.prod(s.shape), dtype=index).reshape(s.shape)
              for (k, s), start in zip(shapes.items(), starts)}
  template = family.to_timm(numbered, config)
  # timm's qkv_bias=False: the biases are zeros.
  expected = {k: v for k, v in template.items() if k in state or not k.endswith('qkv.bias')}
  check_matches(state, expected, f'The state dict of {config.name} '
                f'({models.family_of(config).describe(config)})')
  values = np.zeros(starts[-1], np.float32)
  for key, where in template.items():
    if key in state:
      values[where.ravel()] = state[key].ravel()
  return {k: values[start:start + np.prod(s.shape)].reshape(s.shape)
          for (k, s), start in zip(shapes.items(), starts)}


def read_state_dict(path: str) -> Dict[str, np.ndarray]:
  """The arrays of a PyTorch state dict file.

  Args:
    path: a `.safetensors` file, a `torch.save` file (read by `torch_save`,
      which runs nothing the file names; a checkpoint dict holding the weights
      under 'state_dict', 'model' or 'state_dict_ema' is unwrapped), or the index
      of shards of either (`_sharded`). None needs PyTorch.

  Returns:
    name -> float32 numpy array, DistributedDataParallel's `module.` prefix taken
    off the names.
  """
  if os.fspath(path).endswith(INDEX_SUFFIX):
    return _sharded(path, read_state_dict)
  path = epath.Path(path)
  if os.fspath(path).endswith('.safetensors'):
    try:
      arrays = read_safetensors(path.read_bytes())
    except ValueError as e:
      raise CheckpointError(f'{path} is not a readable .safetensors file ({e}).') from e
    return _unwrapped({k: np.asarray(v, np.float32) for k, v in arrays.items()})
  try:
    data = torch_save.load(os.fspath(path), records=('argparse',))
  except UnsafeFileError as e:
    raise CheckpointError(f'{e} A state dict saved by torch.save holds tensors alone.') from None
  for key in ('state_dict', 'model', 'state_dict_ema'):
    if isinstance(data, Mapping) and isinstance(data.get(key), Mapping):
      data = data[key]
      break
  if not isinstance(data, Mapping):
    raise CheckpointError(f'{path} holds a {type(data).__name__}, not a state dict of named '
                          'tensors.')
  return _unwrapped({k: np.asarray(v, np.float32) for k, v in data.items()
                     if isinstance(v, np.ndarray)})


# The .safetensors dtypes (its format's names) as numpy reads them; bfloat16 and
# float8 through ml_dtypes, which safetensors' own numpy reader lacks. Its 4- and
# 6-bit types (F4, F6_E2M3, F6_E3M2) and F8_E8M0 have no numpy type: refused, naming them.
SAFETENSORS_DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
                      'BF16': ml_dtypes.bfloat16, 'F8_E4M3': ml_dtypes.float8_e4m3fn,
                      'F8_E5M2': ml_dtypes.float8_e5m2, 'I64': np.int64, 'I32': np.int32,
                      'I16': np.int16, 'I8': np.int8, 'U64': np.uint64, 'U32': np.uint32,
                      'U16': np.uint16, 'U8': np.uint8, 'BOOL': np.bool_}
# The largest header the safetensors library reads (its MAX_HEADER_SIZE, 100 MB).
SAFETENSORS_MAX_HEADER = 100_000_000


def read_safetensors(data: bytes) -> Dict[str, np.ndarray]:
  """The arrays of a `.safetensors` file's bytes, in their stored dtypes: the
  format's 8-byte little-endian header length, its JSON header (each array's
  dtype, shape and byte range) and the array bytes after it, checked as the
  safetensors library checks them (`safetensors_tensors`).

  Args:
    data: the file's bytes.

  Returns:
    name -> array.

  Raises:
    ValueError: the bytes are not such a file, or one the safetensors library
      refuses.
  """
  header, size = _safetensors_header(data)
  body = memoryview(data)[8 + size:]
  return {name: np.frombuffer(body[start:end], dtype).reshape(shape)
          for name, (dtype, shape, start, end) in safetensors_tensors(header, len(body)).items()}


def safetensors_tensors(header: Mapping[str, Any], body_length: int
                        ) -> Dict[str, Tuple[np.dtype, Tuple[int, ...], int, int]]:
  """The arrays a `.safetensors` header describes, checked as the safetensors
  library validates a header before it reads a byte (`Metadata::validate` in its
  `safetensors/src/tensor.rs`): a known dtype, a shape of non-negative integers,
  byte ranges that follow each other from the data's first byte to its last with
  no gap and no overlap, each as long as its shape and dtype make it; and a
  `__metadata__` of strings.

  Args:
    header: the JSON header (`_safetensors_header`).
    body_length: the bytes after the header.

  Returns:
    name -> (dtype, shape, start, end), the range within the bytes after the header.

  Raises:
    ValueError: saying what the library would refuse.
  """
  metadata = header.get('__metadata__', {})
  if not isinstance(metadata, dict) or not all(
      isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise ValueError('its __metadata__ is not a map of strings to strings')
  tensors = {}
  for name, info in header.items():
    if name == '__metadata__':
      continue
    if not isinstance(info, dict) or not {'dtype', 'shape', 'data_offsets'} <= set(info):
      raise ValueError(f'the entry of {name} has no dtype, shape and data_offsets')
    kind, shape, offsets = info['dtype'], info['shape'], info['data_offsets']
    if kind not in SAFETENSORS_DTYPES:
      raise ValueError(f'{name} has the dtype {kind!r}, which is not read here (these are: '
                       f'{", ".join(SAFETENSORS_DTYPES)}); convert the file to one of them')
    if not (isinstance(shape, list) and all(_natural(n) for n in shape)):
      raise ValueError(f'{name} has the shape {shape!r}, not a list of non-negative integers')
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_natural, offsets))):
      raise ValueError(f'{name} has data_offsets {offsets!r}, not two non-negative integers')
    dtype = np.dtype(SAFETENSORS_DTYPES[kind])
    tensors[name] = (dtype, tuple(shape), offsets[0], offsets[1])
  end = 0
  for name, (dtype, shape, start, stop) in sorted(tensors.items(), key=lambda t: t[1][2:]):
    if start != end:
      raise ValueError(f'the bytes of {name} begin at {start}, where the previous array '
                       f'ends at {end}: the ranges {"overlap" if start < end else "leave a gap"}')
    if stop - start != math.prod(shape) * dtype.itemsize:
      raise ValueError(f'the bytes of {name} are {stop - start}, where its shape {list(shape)} '
                       f'and dtype take {math.prod(shape) * dtype.itemsize}')
    end = stop
  if end != body_length:
    raise ValueError(f'its arrays take {end} bytes, and the file holds {body_length} after its '
                     'header: it is truncated or holds bytes no array owns')
  return tensors


def _natural(value: Any) -> bool:
  """Whether a JSON value is a non-negative integer."""
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unique_keys(pairs: Sequence[Tuple[str, Any]]) -> Dict[str, Any]:
  """A JSON object's pairs as a dict, refusing a key named twice."""
  out = {}
  for key, value in pairs:
    if key in out:
      raise ValueError(f'its header names {key!r} twice')
    out[key] = value
  return out


def _safetensors_header(data: bytes) -> Tuple[Dict[str, Any], int]:
  """A `.safetensors` file's JSON header (name -> dtype, shape, byte range) and its
  length in bytes, from the file's first bytes (at least the header's).

  Raises:
    ValueError: the bytes are not such a header.
  """
  if len(data) < 8:
    raise ValueError('shorter than its header length')
  size = int.from_bytes(data[:8], 'little')
  if size > SAFETENSORS_MAX_HEADER:
    raise ValueError(f'its header length, {size} bytes, is past the format\'s limit of '
                     f'{SAFETENSORS_MAX_HEADER}')
  if len(data) < 8 + size:
    raise ValueError('shorter than its header')
  if data[8:9] != b'{':
    raise ValueError('its header does not begin with a JSON object')
  try:
    header = json.loads(bytes(data[8:8 + size]).decode('utf-8'), object_pairs_hook=_unique_keys)
  except UnicodeDecodeError as e:
    raise ValueError(f'its header is not UTF-8 ({e})') from None
  if not isinstance(header, dict):
    raise ValueError('its header holds no JSON object')
  return header, size


def state_dict_shapes(path: str) -> Dict[str, np.ndarray]:
  """The names and shapes of a PyTorch state dict file's arrays, as float32 zeros
  that hold no memory (`np.broadcast_to`): what a file fixes by its names and shapes
  alone (`Family.timm_fields`) read without its weights. Of a `.safetensors` file
  only the header is read, and checked against the file's length as the
  safetensors library checks it (`safetensors_tensors`); a `torch.save` file is
  read whole (`read_state_dict`).

  Args:
    path: the file.

  Returns:
    name -> array of its shape.
  """
  if os.fspath(path).endswith(INDEX_SUFFIX):
    return _sharded(path, state_dict_shapes)
  if not os.fspath(path).endswith('.safetensors'):
    return read_state_dict(path)
  header, size = safetensors_header(path)
  try:
    tensors = safetensors_tensors(header, epath.Path(path).stat().length - 8 - size)
  except ValueError as e:
    raise CheckpointError(f'{path} is not a readable .safetensors file ({e}).') from e
  zero = np.zeros((), np.float32)
  return _unwrapped({k: np.broadcast_to(zero, shape) for k, (_, shape, _, _) in tensors.items()})


def safetensors_header(path: str) -> Tuple[Dict[str, Any], int]:
  """A `.safetensors` file's JSON header (name -> dtype, shape, byte range, and its
  `__metadata__`) and its length in bytes, reading the header's bytes alone.

  Args:
    path: the file.

  Returns:
    (the header, its length).

  Raises:
    CheckpointError: the file does not begin with such a header.
  """
  try:
    with epath.Path(path).open('rb') as f:
      head = f.read(8)
      size = int.from_bytes(head, 'little')
      return _safetensors_header(head + f.read(min(size, SAFETENSORS_MAX_HEADER + 1)))
  except ValueError as e:
    raise CheckpointError(f'{path} is not a readable .safetensors file ({e}).') from e


def _sharded(index: str, read: Any) -> Dict[str, np.ndarray]:
  """A state dict in shards, read through its index as `from_pretrained` reads it:
  every shard the index names (files beside it, by name alone), each holding the
  tensors the index puts in it and no other.

  Args:
    index: the `*.index.json` file.
    read: the reader of one shard (`read_state_dict`, `state_dict_shapes`).

  Returns:
    name -> array, of all the shards.

  Raises:
    CheckpointError: a damaged index, a shard missing, or one that holds other
      tensors than the index says.
  """
  try:
    with open(index, encoding='utf-8') as f:
      weight_map = json.load(f).get('weight_map')
  except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
    raise CheckpointError(f'{index} is not a readable index of shards ({e}): download it '
                          'again.') from None
  if not (isinstance(weight_map, dict) and weight_map and all(
      isinstance(v, str) and v == os.path.basename(v) and v not in ('', '.', '..')
      for v in weight_map.values())):
    raise CheckpointError(f'{index} has no weight_map of tensor names to shard files beside it: '
                          'the folder is damaged; download it again.')
  shards: Dict[str, set] = {}
  for name, shard in weight_map.items():
    shards.setdefault(shard, set()).add(name)
  folder = os.path.dirname(index)
  missing = sorted(s for s in shards if not os.path.isfile(os.path.join(folder, s)))
  if missing:
    raise CheckpointError(f'{index} names {len(missing)} shard{"s" * (len(missing) > 1)} that '
                          f'{"are" if len(missing) > 1 else "is"} not in {folder} '
                          f'({", ".join(missing[:3])}): download the whole folder.')
  out = {}
  for shard, names in sorted(shards.items()):
    arrays = read(os.path.join(folder, shard))
    if set(arrays) != names:
      other = sorted(set(arrays) ^ names)
      raise CheckpointError(f'{os.path.join(folder, shard)} holds other tensors than {index} '
                            f'says ({", ".join(other[:3])}): the folder is damaged; download it '
                            'again.')
    out.update(arrays)
  return out


DDP_PREFIX = 'module.'  # torch's DistributedDataParallel saves its model's names under it


def _unwrapped(state: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """`state` with DistributedDataParallel's `module.` prefix taken off, where every
  name has it."""
  if state and all(k.startswith(DDP_PREFIX) for k in state):
    return {k[len(DDP_PREFIX):]: v for k, v in state.items()}
  return state


def _timm_family(config: ml_collections.ConfigDict) -> Family:
  family = models.family_of(config)
  if family.to_timm is None:
    exported = [f.title for f in models.FAMILIES.values() if f.to_timm is not None]
    raise ValueError(f'timm layouts cover the {" and ".join(exported)} families, not '
                     f'{config.name}.')
  return family
