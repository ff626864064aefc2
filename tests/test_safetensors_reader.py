"""`.safetensors` files read here as the safetensors library reads them: hypothesis
draws headers (names, dtypes, shapes, byte ranges, metadata) and bytes, some
valid, most damaged in one of the ways a file can be (a range shifted, shortened
or doubled, a key named twice, bytes cut or added), and `timm_files` gives the
library's arrays wherever it reads the file, and refuses it wherever the library
does."""
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors import SafetensorError
from safetensors.numpy import load as reference_load

from vit_jax import checkpoint
from vit_jax.files import timm_files
from vit_jax.models.family import CheckpointError

# The dtypes safetensors' numpy reader reads (it has no bfloat16 or float8).
DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'I64': np.int64,
          'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}


def as_file(entries, body, duplicate=None, metadata=None):
  """The bytes of a file with these header entries, in this order (a name given as
  `duplicate` written twice), then `body`."""
  pairs = [(k, json.dumps(v)) for k, v in entries]
  if duplicate is not None:
    pairs.append((duplicate, json.dumps(dict(entries)[duplicate])))
  if metadata is not None:
    pairs.append(('__metadata__', json.dumps(metadata)))
  text = ('{' + ','.join(f'{json.dumps(k)}:{v}' for k, v in pairs) + '}').encode()
  return len(text).to_bytes(8, 'little') + text + body


@st.composite
def files(draw):
  """A file's bytes: valid tensors, then at most one damage."""
  names = draw(st.lists(st.text('abcxyz.', min_size=1, max_size=4), min_size=0, max_size=4,
                        unique=True))
  entries, body = [], b''
  for name in names:
    kind = draw(st.sampled_from(sorted(DTYPES)))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    size = int(np.prod(shape)) * np.dtype(DTYPES[kind]).itemsize
    raw = draw(st.binary(min_size=size, max_size=size))
    if kind == 'BOOL':
      raw = bytes(b & 1 for b in raw)
    entries.append([name, {'dtype': kind, 'shape': shape,
                           'data_offsets': [len(body), len(body) + size]}])
    body += raw
  damage = draw(st.sampled_from(['none', 'shift', 'resize', 'reshape', 'duplicate', 'cut',
                                 'extra', 'dtype', 'metadata', 'order']))
  duplicate = metadata = None
  if damage in ('shift', 'resize', 'reshape', 'duplicate', 'dtype') and entries:
    index = draw(st.integers(0, len(entries) - 1))
    info = entries[index][1]
    if damage == 'shift':
      delta = draw(st.integers(-8, 8))
      info['data_offsets'] = [max(0, o + delta) for o in info['data_offsets']]
    elif damage == 'resize':
      info['data_offsets'][1] = max(0, info['data_offsets'][1] + draw(st.integers(-4, 4)))
    elif damage == 'reshape':
      info['shape'] = draw(st.lists(st.integers(0, 4), max_size=3))
    elif damage == 'dtype':
      info['dtype'] = draw(st.sampled_from(sorted(DTYPES) + ['F8_E4M3', 'Q4', 'f32']))
    else:
      duplicate = entries[index][0]
  elif damage == 'cut' and body:
    body = body[:draw(st.integers(0, len(body) - 1))]
  elif damage == 'extra':
    body += draw(st.binary(min_size=1, max_size=4))
  elif damage == 'metadata':
    metadata = draw(st.sampled_from([{'format': 'pt'}, {'format': 1}, ['pt'], {}]))
  elif damage == 'order':
    entries = list(reversed(entries))
  return as_file(entries, body, duplicate, metadata), damage


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files())
def test_a_file_is_read_as_the_safetensors_library_reads_it_or_refused(drawn):
  """A key named twice is refused even where both entries agree, which the
  library reads (its JSON reader keeps the last): which of two entries a file
  means is not the reader's guess."""
  data, damage = drawn
  try:
    reference = reference_load(data)
  except (KeyError, TypeError):  # float8, which its numpy reader lacks: read here
    return                       # (tests/test_faults.py compares bfloat16 the same way)
  except (SafetensorError, ValueError):
    reference = None
  try:
    ours = timm_files.read_safetensors(data)
  except ValueError:
    ours = None
  if reference is None or ours is None:
    assert ours is None and (reference is None or damage == 'duplicate')
    return
  assert set(ours) == set(reference)
  for name, array in reference.items():
    assert ours[name].dtype == array.dtype and ours[name].shape == array.shape
    np.testing.assert_array_equal(ours[name], array)


def test_the_shapes_read_from_the_header_alone_are_checked_against_the_file(tmp_path):
  """A header whose ranges overlap, or that promises more bytes than the file
  holds (a 10^11-element array in a file of 8), is refused before anything is
  allocated, with the library's reasons, in one sentence."""
  body = np.arange(4, dtype=np.float32).tobytes()
  overlapping = as_file([['a', {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]}],
                         ['b', {'dtype': 'F32', 'shape': [2], 'data_offsets': [8, 16]}]], body)
  huge = as_file([['a', {'dtype': 'F32', 'shape': [10**11], 'data_offsets': [0, 4 * 10**11]}]],
                 body[:8])
  for name, data, says in (('overlap', overlapping, 'the ranges overlap'),
                           ('huge', huge, r'its arrays take 400000000000 bytes, and the file '
                                          r'holds 8')):
    path = tmp_path / f'{name}.safetensors'
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=f'is not a readable .safetensors file .*{says}'):
      timm_files.state_dict_shapes(str(path))
    with pytest.raises(CheckpointError, match=says):
      checkpoint.load(str(path), 'ViT-Ti_16')


def test_float8_arrays_are_read_and_a_dtype_without_numpy_type_is_named(tmp_path):
  import ml_dtypes
  values = np.array([0.5, -2.0, 448.0], ml_dtypes.float8_e4m3fn)
  data = as_file([['a', {'dtype': 'F8_E4M3', 'shape': [3], 'data_offsets': [0, 3]}]],
                 values.tobytes())
  np.testing.assert_array_equal(timm_files.read_safetensors(data)['a'], values)
  path = tmp_path / 'f4.safetensors'
  path.write_bytes(as_file([['a', {'dtype': 'F4', 'shape': [2], 'data_offsets': [0, 1]}]],
                           b'\0'))
  with pytest.raises(CheckpointError, match=r"a has the dtype 'F4', which is not read here"):
    timm_files.read_state_dict(str(path))
