"""Sparse autoencoders' files: this project's dictionaries written and read
(`save`, `load`: `.npz` or `.safetensors`), and those trained elsewhere read into
`sparse_autoencoder`'s parameters and `Spec` with the forward pass their code runs.

- **saev** (OSU-NLP-Group/saev, src/saev/nn/modeling.py: `dump` and `load`): one
  JSON header line ('schema' 1-5, or none for the first files: then the config
  itself, with 'd_vit' and 'exp_factor', and a ReLU; schema 1 and its 'commit'
  tell whether b_dec is subtracted before encoding), then `torch.save` of the
  module's state dict: W_enc (d, m), b_enc (m,), W_dec (m, d), b_dec (d,), and
  for BatchTopK the buffer 'activation.threshold'. The activation's class (Relu,
  TopK, BatchTopK) and 'top_k' are in the header. The file does not say which
  layer it read.
- **ViT-Prisma** (soniajoseph/ViT-Prisma, src/vit_prisma/sae/sae.py:
  `save_model` and `load_from_pretrained`): `torch.save` of the state dict (the
  same four names) with the training config in a `config.json` beside it, or, in
  the older files, of {'cfg': the config object, 'state_dict': ...} pickled with
  ViT-Prisma's config class, which is read here without the package: only the
  config's fields are kept. 'activation_fn_str' ('relu', 'topk' with
  'activation_fn_kwargs' {'k': ...}), 'normalize_activations' and 'hook_point'
  ('blocks.L.hook_resid_post', TransformerLens' names) come from the config; the
  gated and JumpReLU architectures are refused.
"""
import dataclasses
import json
import os
import re
from typing import Any, Dict, Optional, Tuple, Union

import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

from analysis.measures import sparse_autoencoder
from vit_jax import files

PARAMS = ('W_enc', 'b_enc', 'W_dec', 'b_dec')  # a dictionary's arrays, in every format
FORMATS = ('npz', 'safetensors')  # this project's files
SOURCES = ('saev', 'vit_prisma')  # the files of others read
_SAEV_ACTIVATIONS = {'Relu': 'relu_l1', 'TopK': 'topk', 'BatchTopK': 'batch_topk'}
# The saev commits that wrote schema 1 files and encoded x W_enc + b_enc: e7ca004
# ("don't remove decoder bias", 2025-07-31) up to 8d38c23, which wrote schema 2.
# Every other schema 1 file, and every file without a schema, was written by code
# that encoded (x - b_dec) W_enc + b_enc (src/saev/nn/modeling.py, `forward`).
_SAEV_SCHEMA1_WITHOUT_PRE_BIAS = (
    'e7ca004660a3ab414da7002fcecfc157d5b786aa', 'ab690dc03fe95926b0f9215476db0fca46a06a2b',
    'fad99298d1458e372361f3f16693cbd672f9d71a', '795479bf1f82bb1c16f7e3bbb06ff71e35730e24',
    '5056de48451e471a2978972abcf2196b291da32c', '9f39cf867fc2bcf75bdbb04dfb6f2ffa1531e932',
    '6845bc22bdfe38d2a3e1b401b067ba8fa1a555be', '5fee417720e4c3cacca1ad2d8177c1455877838a',
    'ea2c9f59a17924f1a66b60a03fecbad66fbe9848', '8aecac1833f6412b9f6262b28b90248da6d49d26',
    'f5d892c65a1b2cec1603651f820b884c13656a93', '65c5a2b55e11c380d1b0ae537524977b240b346d')


def _saev_encoder(header: Dict[str, Any]) -> str:
  """'saev_pre_bias' for a file written before saev stopped subtracting b_dec
  before encoding, else 'saev'. A schema 1 file whose commit is unknown is taken
  as pre-bias, as all but one day's schema 1 code was."""
  schema = header.get('schema')
  if schema is None:
    return 'saev_pre_bias'
  if schema != 1:
    return 'saev'
  commit = str(header.get('commit', '')).lower()
  late = len(commit) >= 7 and any(h.startswith(commit) for h in _SAEV_SCHEMA1_WITHOUT_PRE_BIAS)
  return 'saev' if late else 'saev_pre_bias'
_PRISMA_ACTIVATIONS = {'relu': 'relu_l1', 'topk': 'topk'}


def _torch_load(data: Union[str, bytes], path: str) -> Any:
  """What a `torch.save` file (or its bytes) holds, read by `vit_jax.files.torch_save`:
  tensors as numpy arrays and ViT-Prisma's classes as records of their fields,
  nothing the file names run. What cannot be read is a ValueError naming `path`."""
  try:
    if isinstance(data, bytes):
      return files.torch_loads(data, records=('vit_prisma',))
    return files.torch_load(data, records=('vit_prisma',))
  except files.UnsafeFileError as error:
    message = str(error)
    raise ValueError(message if message.startswith(path) else
                     f'{path} cannot be read: its weights {message}.') from None


def _params(state: Dict[str, Any], path: str) -> Dict[str, jnp.ndarray]:
  if not isinstance(state, dict):
    raise ValueError(f'{path} holds a {type(state).__name__} where a state dict of arrays '
                     'belongs: it is not a sparse autoencoder.')
  missing = [k for k in PARAMS if not isinstance(state.get(k), np.ndarray)]
  if missing:
    raise ValueError(f'{path} holds no {", ".join(missing)}: it is not a sparse autoencoder '
                     f'(its arrays: {", ".join(sorted(state)) or "none"}).')
  return {k: jnp.asarray(np.asarray(state[k], np.float32)) for k in PARAMS}


def read_saev(path: str) -> Tuple[Dict[str, jnp.ndarray], sparse_autoencoder.Spec, Dict[str, str]]:
  """A dictionary saev's `dump` wrote.

  Args:
    path: the file.

  Returns:
    (its parameters, its spec, what the file says of it).

  Raises:
    ValueError: a file that is not one, or an activation saev's reader would not know.
  """
  with open(path, 'rb') as f:
    try:
      header = json.loads(f.readline())
    except ValueError:
      raise ValueError(f'{path} does not start with saev\'s JSON header line: it is not a '
                       'saev SAE file.') from None
    weights = f.read()
  cfg = header.get('cfg', header) if isinstance(header, dict) and 'schema' in header else header
  if not isinstance(cfg, dict):
    raise ValueError(f'{path}: saev\'s header line holds no config.')
  activation = cfg.get('activation')
  if 'schema' not in header:  # the first files: a ReLU SAE
    name, settings = 'Relu', {}
  elif isinstance(activation, dict) and isinstance(activation.get('params', {}), dict):
    name, settings = activation.get('cls'), activation.get('params', {})
  else:  # schema 1's first form: the class in the header
    name, settings = header.get('cls'), {'top_k': cfg.get('top_k', 32)}
  if name not in _SAEV_ACTIVATIONS:
    raise ValueError(f'{path}: saev activation {name!r} is not one of '
                     f'{", ".join(_SAEV_ACTIVATIONS)}.')
  state = _torch_load(weights, path)
  params = _params(state, path)
  width = int(params['W_enc'].shape[1])
  if 'd_sae' in cfg:
    width = int(cfg['d_sae'])
  elif 'd_vit' in cfg and 'exp_factor' in cfg:
    width = int(cfg['d_vit']) * int(cfg['exp_factor'])
  threshold = state.get('activation.threshold')
  encoder = _saev_encoder(header)
  spec = sparse_autoencoder.Spec(
      architecture=_SAEV_ACTIVATIONS[name], width=width, k=int(settings.get('top_k', 32)),
      encoder=encoder, threshold=float(np.asarray(threshold)) if threshold is not None else 0.)
  check_file(params, spec, path)
  about = {'source': 'saev', 'schema': str(header.get('schema', 0)),
           'commit': str(header.get('commit', '')), 'normalisation': 'none',
           'encoder': encoder}
  return params, spec, about


def _prisma_site(hook_point: str) -> Optional[str]:
  """The residual-stream entry (`Layers.labels`) of a TransformerLens hook point:
  'blocks.L.hook_resid_pre' is the entry before block L, '.hook_resid_mid' the
  stream after its attention, '.hook_resid_post' after its MLP; None for others."""
  found = re.fullmatch(r'blocks\.(\d+)\.hook_resid_(pre|mid|post)', hook_point or '')
  if not found:
    return None
  block, where = int(found.group(1)), found.group(2)
  if where == 'pre':
    return f'block{block - 1}/+mlp' if block else 'embedding'
  return f'block{block}/' + ('+sa' if where == 'mid' else '+mlp')


def read_vit_prisma(path: str
                    ) -> Tuple[Dict[str, jnp.ndarray], sparse_autoencoder.Spec, Dict[str, str]]:
  """A dictionary ViT-Prisma's `save_model` wrote, its config from the file or from
  `config.json` beside it.

  Args:
    path: the `.pt` file.

  Returns:
    (its parameters, its spec, what its config says of it: 'hook_point', 'site'
    (the residual-stream entry, where the hook point is one), 'model').

  Raises:
    ValueError: no config, or an architecture or activation not read here.
  """
  saved = _torch_load(path, path)
  if isinstance(saved, dict) and 'cfg' in saved and 'state_dict' in saved:
    cfg, state = saved['cfg'], saved['state_dict']
    cfg = cfg if isinstance(cfg, dict) else vars(cfg)
  else:
    beside = os.path.join(os.path.dirname(path), 'config.json')
    if not os.path.isfile(beside):
      raise ValueError(f'{path} holds parameters without their config, and no config.json is '
                       'beside it: put the config.json published with it in its folder.')
    with open(beside) as f:
      cfg, state = json.load(f), saved
  architecture = cfg.get('architecture', 'standard')
  activation = cfg.get('activation_fn_str', 'relu')
  if architecture != 'standard' or activation not in _PRISMA_ACTIVATIONS:
    raise ValueError(f'{path} is a ViT-Prisma {architecture} SAE with activation {activation!r}; '
                     'the standard architecture with relu or topk is read here.')
  params = _params(state, path)
  width = int(params['W_enc'].shape[1])
  if cfg.get('d_sae') is not None:
    width = int(cfg['d_sae'])
  k = (cfg.get('activation_fn_kwargs') or {}).get('k', 32)
  spec = sparse_autoencoder.Spec(
      architecture=_PRISMA_ACTIVATIONS[activation], width=width, k=int(k),
      normalisation=cfg.get('normalize_activations') or 'none')
  check_file(params, spec, path)
  hook_point = str(cfg.get('hook_point', ''))
  site = _prisma_site(hook_point)
  about = {'source': 'vit_prisma', 'hook_point': hook_point,
           'model': str(cfg.get('model_name', '')), 'normalisation': spec.normalisation,
           **({'site': site} if site else {})}
  return params, spec, about


def read(path: str) -> Tuple[Dict[str, jnp.ndarray], sparse_autoencoder.Spec, Dict[str, str]]:
  """Any dictionary file: this project's (`load`: `.npz`,
  `.safetensors`), saev's (a JSON line first) or ViT-Prisma's (`.pt`, `.pth`).

  Args:
    path: the file.

  Returns:
    (its parameters, its spec, what the file says of it).

  Raises:
    ValueError: a file none of them wrote.
  """
  if path.endswith(('.npz', '.safetensors')):
    return load(path)
  with open(path, 'rb') as f:
    first = f.read(1)
  if first == b'{':
    return read_saev(path)
  if path.endswith(('.pt', '.pth')):
    return read_vit_prisma(path)
  raise ValueError(f'{path} is neither this project\'s dictionary (.npz, .safetensors), saev\'s '
                   '(a JSON header line, then the weights) nor ViT-Prisma\'s (.pt).')


def save(path: str, trained: sparse_autoencoder.Trained, about: Dict[str, str]) -> None:
  """Writes the dictionary: its parameters under their names (`PARAMS`), its spec
  and `about` (the site, the model, the activations' normalisation). A path ending
  in `.safetensors` gets a safetensors file, the spec and `about` as JSON in its
  header's metadata ('spec', 'about'), which PyTorch code reads with
  `safetensors.torch.load_file`; any other an `.npz`, the spec as 'spec/<field>'
  and `about` as 'about/<key>'.

  Args:
    path: the file.
    trained: the SAE.
    about: what it was trained on, as strings.
  """
  arrays = {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in trained.params.items()}
  if path.endswith('.safetensors'):
    safetensors.numpy.save_file(arrays, path, metadata={
        'spec': json.dumps(dataclasses.asdict(trained.spec)), 'about': json.dumps(about)})
    return
  arrays.update({f'spec/{k}': np.asarray(v) for k, v in dataclasses.asdict(trained.spec).items()})
  arrays.update({f'about/{k}': np.asarray(v) for k, v in about.items()})
  with open(path, 'wb') as f:
    np.savez(f, **arrays)


def load(path: str) -> Tuple[sparse_autoencoder.Params, sparse_autoencoder.Spec, Dict[str, str]]:
  """Reads a dictionary `save` wrote, `.safetensors` or `.npz`.

  Args:
    path: the file.

  Returns:
    (its parameters, its spec, what it was trained on).

  Raises:
    ValueError: a file without the SAE's parameters, naming those it lacks.
  """
  fields = {f.name for f in dataclasses.fields(sparse_autoencoder.Spec)}
  try:
    if path.endswith('.safetensors'):
      with safetensors.safe_open(path, 'np') as f:
        arrays = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata() or {}
      written = json.loads(metadata.get('spec', '{}'))
      about = json.loads(metadata.get('about', '{}'))
    else:
      with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if '/' not in k}
        written = {k[len('spec/'):]: data[k].item() for k in data.files if k.startswith('spec/')}
        about = {k[len('about/'):]: str(data[k]) for k in data.files if k.startswith('about/')}
  except (*files.ZIP_ERRORS, KeyError, safetensors.SafetensorError) as e:  # damaged
    raise ValueError(f'{path} is not a readable SAE dictionary ({type(e).__name__}: '
                     f'{" ".join(str(e).split())[:200]}).') from None
  if not isinstance(written, dict) or not isinstance(about, dict):
    raise ValueError(f'{path}: its header\'s spec and about are not JSON objects.')
  missing = [k for k in PARAMS if k not in arrays]
  if missing:
    raise ValueError(f'{path} holds no {", ".join(missing)}: it is not an SAE dictionary '
                     f'this project wrote (its arrays: {", ".join(sorted(arrays)) or "none"}).')
  spec = sparse_autoencoder.Spec(**{k: v for k, v in written.items() if k in fields})
  params = {k: jnp.asarray(arrays[k]) for k in PARAMS}
  check_file(params, spec, path)
  return params, spec, about


def check_file(params: sparse_autoencoder.Params, spec: sparse_autoencoder.Spec, path: str) -> None:
  """Refuses a dictionary whose arrays disagree with each other or with its spec.

  Args:
    params: its `PARAMS`.
    spec: what its file says it is.
    path: the file, for the message.

  Raises:
    ValueError: naming the file and the array: W_enc not (d, m); b_enc, W_dec or
      b_dec not (m,), (m, d), (d,); m not the spec's width; a topk or batch_topk
      k not below m.
  """
  shapes = {k: tuple(np.shape(params[k])) for k in PARAMS}
  if len(shapes['W_enc']) != 2:
    raise ValueError(f'{path}: W_enc is {shapes["W_enc"]}, not (inputs, latents).')
  d, m = shapes['W_enc']
  for name, want in (('b_enc', (m,)), ('W_dec', (m, d)), ('b_dec', (d,))):
    if shapes[name] != want:
      raise ValueError(f'{path}: {name} is {shapes[name]} where W_enc {(d, m)} needs {want}.')
  if spec.width != m:
    raise ValueError(f'{path} says it has {spec.width} latents; its arrays hold {m}.')
  if spec.architecture != 'relu_l1' and not 0 < spec.k < m:
    raise ValueError(f'{path} keeps k={spec.k} of its {m} latents: a {spec.architecture} SAE '
                     'keeps fewer than it has.')
