"""`torch.save` files read without PyTorch and without running anything: the
same arrays as `torch.load(weights_only=True)` on real files, a corpus of
hostile pickles refused with nothing in their folder changed, and damaged files
(truncations, byte flips, wrong headers) through every reader of the project,
image files included, ending in one sentence that names the file, or in a
correct result."""
import collections
import dataclasses
import io
import os
import pathlib
import pickle
import zipfile

import hypothesis
import hypothesis.strategies as st
import numpy as np
import PIL.Image
import pytest
import safetensors.numpy

from analysis.runtime import sae_files
from helpers import write_saev_file
from vit_jax.files import torch_save
from vit_jax.files.timm_files import read_state_dict
from vit_jax.models.family import CheckpointError

torch = pytest.importorskip('torch', reason='the files are written by torch (test-only: '
                            'requirements-timm.txt)')


def _state():
  g = torch.Generator().manual_seed(0)
  base = torch.randn(4, 6, generator=g)
  return collections.OrderedDict([
      ('w', base), ('w_t', base.t()), ('row', base[2]), ('strided', base[:, ::2]),
      ('half', torch.randn(3, generator=g).half()),
      ('bf16', torch.randn(5, generator=g).bfloat16()),
      ('long', torch.arange(7)), ('flag', torch.tensor([True, False])),
      ('empty', torch.zeros(0, 3)), ('scalar', torch.tensor(2.5)),
      ('param', torch.nn.Parameter(torch.ones(2, 2)))])


def _same(ours, theirs):
  if isinstance(theirs, torch.Tensor):
    want = theirs.detach().float().numpy() if theirs.dtype == torch.bfloat16 else (
        theirs.detach().numpy())
    np.testing.assert_array_equal(np.asarray(ours, np.float32 if theirs.dtype == torch.bfloat16
                                             else want.dtype), want)
    assert np.shape(ours) == tuple(theirs.shape)
  elif isinstance(theirs, dict):
    assert list(ours) == list(theirs)
    for k in theirs:
      _same(ours[k], theirs[k])
  else:
    assert ours == theirs


@pytest.mark.parametrize('payload', ['state', 'checkpoint', 'shared'])
def test_torch_save_files_read_as_torch_load_reads_them(tmp_path, payload):
  state = _state()
  saved = {'state': state,
           'checkpoint': {'epoch': 3, 'state_dict': state, 'lr': 0.1, 'name': 'vit',
                          'shape': torch.Size([2, 3]), 'dtype': torch.float16},
           'shared': [state['w'], state['w_t'], (1, 2.5, None, b'\x00\xff', {3, 4})]}[payload]
  path = tmp_path / 'file.pth'
  torch.save(saved, path)
  theirs = torch.load(path, weights_only=True)
  ours = torch_save.load(path)
  if payload == 'checkpoint':
    _same(ours['state_dict'], theirs['state_dict'])
    assert (ours['epoch'], ours['lr'], ours['name'], ours['shape']) == (3, 0.1, 'vit', (2, 3))
    assert ours['dtype'] == np.float16
  elif payload == 'shared':
    _same(ours[0], theirs[0])
    _same(ours[1], theirs[1])
    assert ours[2] == (1, 2.5, None, b'\x00\xff', {3, 4})
  else:
    _same(ours, theirs)


def test_a_config_object_of_a_named_package_is_read_as_its_fields(tmp_path, monkeypatch):
  """ViT-Prisma's config class, pickled by reference, is read as its fields alone."""
  import sys
  import types
  config = dataclasses.make_dataclass(
      'VisionModelSAERunnerConfig', [('d_sae', int, 8), ('hook_point', str, 'blocks.1'),
                                     ('path', pathlib.PosixPath, pathlib.PosixPath('/data'))])
  config.__module__ = 'vit_prisma.sae.config'
  module = types.ModuleType('vit_prisma.sae.config')
  module.VisionModelSAERunnerConfig = config
  for name in ('vit_prisma', 'vit_prisma.sae', 'vit_prisma.sae.config'):
    monkeypatch.setitem(sys.modules, name, module)
  path = tmp_path / 'sae.pt'
  torch.save({'cfg': config(), 'state_dict': {'b': torch.ones(2)}}, path)
  loaded = torch_save.load(path, records=('vit_prisma',))
  assert isinstance(loaded['cfg'], torch_save.Record)
  assert vars(loaded['cfg']) == {'d_sae': 8, 'hook_point': 'blocks.1', 'path': '/data'}
  with pytest.raises(torch_save.UnsafeFileError, match='names vit_prisma.sae.config.Vision'):
    torch_save.load(path)


# The hostile corpus. Each entry writes a file into the scratch folder whose reading
# would change that folder (delete `victim`, write `written`) or run a command.
class _Reduces:
  def __init__(self, *reduced):
    self.reduced = reduced

  def __reduce__(self):
    return self.reduced


def _torch_file(path, obj, protocol=2):
  torch.save(obj, path, pickle_protocol=protocol)


def _zip_with(path, data_pkl: bytes, extra=(), compress=zipfile.ZIP_STORED):
  with zipfile.ZipFile(path, 'w', compress) as z:
    z.writestr('archive/data.pkl', data_pkl)
    z.writestr('archive/byteorder', 'little')
    for name, data in extra:
      z.writestr(name, data)


def _tensor_pickle(offset=0, size=(2, 2), stride=(2, 1), numel=4):
  """A pickle of one tensor on storage '0' as torch writes it: `_rebuild_tensor_v2`
  on a persistent id ('storage', torch.FloatStorage, key, location, numel)."""
  class Storage:
    pass

  class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
      if isinstance(obj, Storage):
        return ('storage', torch.FloatStorage, '0', 'cpu', numel)
      return None
  buf = io.BytesIO()
  Pickler(buf, protocol=2).dump(_Reduces(torch._utils._rebuild_tensor_v2, (
      Storage(), offset, size, stride, False, collections.OrderedDict())))
  return buf.getvalue()


def _raw(*opcodes: bytes) -> bytes:
  return b''.join(opcodes)


def _global(module, name):
  return b'c' + module.encode() + b'\n' + name.encode() + b'\n'


def _hostile(tmp: pathlib.Path):
  victim, written = tmp / 'victim.txt', tmp / 'written.pth'
  cmd = f'touch {tmp / "ran"}'
  corpus = {
      'os.system': lambda p: _torch_file(p, {'x': _Reduces(os.system, (cmd,))}),
      'Path.unlink (protocol 4 dotted name)': lambda p: _torch_file(
          p, _Reduces(pathlib.Path.unlink, (victim,)), protocol=4),
      'Path.write_text (protocol 4 dotted name)': lambda p: _torch_file(
          p, _Reduces(pathlib.Path.write_text, (written, 'import os')), protocol=4),
      'builtins.exec': lambda p: _torch_file(
          p, _Reduces(exec, (f'import os; os.system({cmd!r})',))),
      'builtins.eval': lambda p: _torch_file(
          p, _Reduces(eval, (f'__import__("os").remove({str(victim)!r})',))),
      '__import__': lambda p: _torch_file(p, _Reduces(__import__, ('os',))),
      'getattr chain': lambda p: _torch_file(
          p, _Reduces(getattr, (_Reduces(__import__, ('os',)), 'remove'))),
      'os.remove': lambda p: _torch_file(p, _Reduces(os.remove, (str(victim),))),
      'INST opcode': lambda p: _zip_with(p, _raw(b'(', b'S' + repr(cmd).encode() + b'\n',
                                                 b'ios\nsystem\n', b'.')),
      'OBJ opcode': lambda p: _zip_with(p, _raw(b'(', _global('os', 'system'),
                                                b'S' + repr(cmd).encode() + b'\n', b'o.')),
      'STACK_GLOBAL dotted': lambda p: _zip_with(p, _raw(
          b'\x80\x04', b'\x8c\x07pathlib', b'\x8c\x0bPath.unlink', b'\x93',
          b'\x8c\x07pathlib', b'\x8c\x04Path', b'\x93', b'\x8c' + bytes([len(str(victim))]) +
          str(victim).encode(), b'\x85R\x85R.')),
      'BUILD on a class': lambda p: _zip_with(p, _raw(
          b'\x80\x02', _global('collections', 'OrderedDict'), b'N}', b'\x8c\x07__len__',
          _global('builtins', 'object'), b's\x86b.')),
      'BUILD on a dict': lambda p: _zip_with(p, _raw(b'\x80\x02}', b'}\x8c\x01aK\x01sb.')),
      'setstate of a numpy dtype': lambda p: _zip_with(p, _raw(
          b'\x80\x02', _global('numpy', 'dtype'), b'\x8c\x02f8\x89\x88\x87R',
          b'(K\x03\x8c\x01>NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb.')),
      'numpy object array': lambda p: _torch_file(p, np.array([os.system], dtype=object)),
      'copyreg extension of another class': lambda p: _zip_with(p, _raw(
          b'\x80\x02', _global('copyreg', '_reconstructor'), _global('os', 'system'), b'\x85.')),
      'tensor beyond its storage': lambda p: _zip_with(
          p, _tensor_pickle(offset=0, size=(64, 64), stride=(64, 1), numel=4),
          [('archive/data/0', np.zeros(4, np.float32).tobytes())]),
      'compressed storage (zip bomb)': lambda p: _zip_with(
          p, _tensor_pickle(numel=4), [('archive/data/0', b'\x00' * (1 << 20))],
          compress=zipfile.ZIP_DEFLATED),
      'nested zip in a storage': lambda p: _zip_with(
          p, _tensor_pickle(numel=4), [('archive/data/0', _nested_zip(cmd))]),
      'two data.pkl': lambda p: _zip_with(p, pickle.dumps({}), [('other/data.pkl', b'.')]),
      'persistent id that is no storage': lambda p: _zip_with(
          p, _raw(b'\x80\x02', b'S"x"\n', b'Q.')),
      'plain pickle': lambda p: p.write_bytes(pickle.dumps(_Reduces(os.system, (cmd,)))),
  }
  return corpus, victim


def _nested_zip(cmd):
  buf = io.BytesIO()
  _zip_with(buf, pickle.dumps(_Reduces(os.system, (cmd,))))
  return buf.getvalue()


def _folder(tmp: pathlib.Path):
  return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in tmp.rglob('*')}


_CASES = sorted(_hostile(pathlib.Path('/nonexistent'))[0])


@pytest.mark.parametrize('case', _CASES)
@pytest.mark.parametrize('reader', ['torch_save', 'state_dict', 'sae'])
def test_a_hostile_file_is_refused_in_one_sentence_and_changes_nothing(tmp_path, case, reader):
  scratch = tmp_path / 'scratch'
  scratch.mkdir()
  corpus, victim = _hostile(scratch)
  victim.write_text('kept')
  path = scratch / 'hostile.pt'
  corpus[case](path)
  before = _folder(scratch)
  read = {'torch_save': torch_save.load, 'state_dict': read_state_dict,
          'sae': sae_files.read}[reader]
  with pytest.raises(ValueError) as refused:
    read(str(path))
  message = str(refused.value)
  assert str(path) in message and '\n' not in message, message
  assert _folder(scratch) == before
  assert victim.read_text() == 'kept'
  assert not (scratch / 'ran').exists() and not (scratch / 'written.pth').exists()


def test_the_tensor_beyond_its_storage_says_so(tmp_path):
  corpus, _ = _hostile(tmp_path)
  corpus['tensor beyond its storage'](tmp_path / 'f.pt')
  with pytest.raises(torch_save.UnsafeFileError, match='reaches element 4095 of a storage of 4'):
    torch_save.load(tmp_path / 'f.pt')


# Damaged files through every reader: a correct result or one sentence naming the file.
def _valid_files(tmp: pathlib.Path):
  arrays = {'w': np.arange(12, dtype=np.float32).reshape(3, 4), 'b': np.ones(4, np.float32)}
  files = {}
  files['state_dict.pth'] = tmp / 'state_dict.pth'
  torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, files['state_dict.pth'])
  files['weights.safetensors'] = tmp / 'weights.safetensors'
  safetensors.numpy.save_file(arrays, str(files['weights.safetensors']))
  files['params.npz'] = tmp / 'params.npz'
  np.savez(files['params.npz'], **arrays)
  rng = np.random.RandomState(0)
  sae = {'W_enc': rng.normal(size=(4, 8)).astype(np.float32), 'b_enc': np.zeros(8, np.float32),
         'W_dec': rng.normal(size=(8, 4)).astype(np.float32), 'b_dec': np.zeros(4, np.float32)}
  files['saev.sae'] = tmp / 'saev.sae'
  write_saev_file(str(files['saev.sae']), sae, {'schema': 5, 'cfg': {
      'd_model': 4, 'd_sae': 8, 'activation': {'cls': 'TopK', 'params': {'top_k': 2}}}})
  files['prisma.pt'] = tmp / 'prisma.pt'
  torch.save({k: torch.from_numpy(v) for k, v in sae.items()}, files['prisma.pt'])
  (tmp / 'config.json').write_text('{"d_sae": 8, "activation_fn_str": "relu", '
                                   '"hook_point": "blocks.0.hook_resid_post"}')
  pixels = rng.randint(0, 256, (12, 10, 3)).astype(np.uint8)
  for name in ('image.png', 'image.jpg'):
    files[name] = tmp / name
    PIL.Image.fromarray(pixels).save(files[name])
  return files


def _read(name, path):
  from vit_jax import checkpoint, input_pipeline
  if name.startswith('image.'):  # as a folder split checks, then decodes, each image
    problem = input_pipeline.image_problem(str(path))
    if problem:
      raise ValueError(problem)
    return {'image': input_pipeline.read_image(str(path))}
  if name in ('state_dict.pth', 'weights.safetensors'):
    return read_state_dict(str(path))
  if name == 'params.npz':
    return checkpoint.load(str(path))
  return sae_files.read(str(path))[0]


@pytest.fixture(scope='module')
def valid_files(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('valid')
  files = _valid_files(tmp)
  return tmp, files, {name: _read(name, path) for name, path in files.items()}


@pytest.mark.parametrize('name', ['state_dict.pth', 'weights.safetensors', 'params.npz',
                                  'saev.sae', 'prisma.pt', 'image.png', 'image.jpg'])
@hypothesis.settings(max_examples=25, deadline=None, derandomize=True,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(damage=st.one_of(
    st.tuples(st.just('truncate'), st.floats(0., 0.999)),
    st.tuples(st.just('flip'), st.lists(st.tuples(st.floats(0., 0.999), st.integers(1, 255)),
                                        min_size=1, max_size=4)),
    st.tuples(st.just('header'), st.binary(max_size=16))))
def test_a_damaged_file_gives_one_sentence_naming_it_or_the_right_arrays(valid_files, name,
                                                                          damage):
  tmp, files, intact = valid_files
  data = bytearray(files[name].read_bytes())
  kind, how = damage
  if kind == 'truncate':
    data = data[:int(len(data) * how)]
  elif kind == 'flip':
    for where, xor in how:
      data[int(len(data) * where)] ^= xor
  else:
    data[:len(how)] = how
  folder = tmp / 'damaged'
  folder.mkdir(exist_ok=True)
  (folder / 'config.json').write_bytes((tmp / 'config.json').read_bytes())
  path = folder / name
  path.write_bytes(bytes(data))
  before = _folder(folder)
  try:
    got = _read(name, path)
  except (ValueError, CheckpointError) as error:
    message = str(error)
    assert str(path) in message and '\n' not in message, message
  else:  # a flip in bytes no reader checks (a zip's comment, padding) reads as it was
    if name.startswith('image.'):  # JPEG has no checksum: a flip that decodes is an image
      assert got['image'].dtype == np.uint8 and got['image'].shape[2] == 3
      return
    flat = lambda t: {k: np.asarray(v) for k, v in (t.items() if isinstance(t, dict) else t)}
    want, have = flat(intact[name]), flat(got)
    if name.endswith('.safetensors'):  # its header has no checksum: a name may change,
      assert len(want) == len(have)    # which the state dict's key check then refuses
    else:
      assert set(want) == set(have)
    for k in set(want) & set(have):
      if isinstance(want[k], np.ndarray) and want[k].dtype != object:
        assert want[k].shape == have[k].shape
  assert _folder(folder) == before


def test_a_view_repeating_its_storage_is_refused_before_it_is_copied(tmp_path):
  """`torch.ones(1).expand(20000, 20000)` saves in 1.6 KB and would read as 1.6 GB:
  a tensor of more elements than its storage is refused."""
  path = tmp_path / 'expanded.pt'
  torch.save({'w': torch.ones(1).expand(20000, 20000)}, path)
  assert path.stat().st_size < 4000
  with pytest.raises(torch_save.UnsafeFileError, match=r'shape \(20000, 20000\) and strides '
                     r'\(0, 0\) views a storage of 1 elements, repeating them'):
    torch_save.load(str(path))
