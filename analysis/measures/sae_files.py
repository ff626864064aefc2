"""Sparse autoencoders trained elsewhere, read into `sparse_autoencoder`'s
parameters and `Spec` with the forward pass their code runs.

- **saev** (OSU-NLP-Group/saev, src/saev/nn/modeling.py: `dump` and `load`): one
  JSON header line ('schema' 1-5, or none for the first files: then the config
  itself, with 'd_vit' and 'exp_factor', and a ReLU), then `torch.save` of the
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
import io
import json
import os
import pickle
import re
import types
from typing import Any, Dict, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from analysis.measures import sparse_autoencoder

SOURCES = ('saev', 'vit_prisma')
_SAEV_ACTIVATIONS = {'Relu': 'relu_l1', 'TopK': 'topk', 'BatchTopK': 'batch_topk'}
_PRISMA_ACTIVATIONS = {'relu': 'relu_l1', 'topk': 'topk'}


def _torch_load(data: Any, path: str, restricted: bool) -> Any:
  """`torch.load` on the CPU: tensors only, or with `restricted` through
  `_Unpickler` (a file that pickles other objects); what cannot be read is a
  ValueError naming `path`."""
  import torch  # only to read PyTorch files
  # torch.load reads a zip file through `Unpickler` and a legacy one through `load`.
  module = types.SimpleNamespace(Unpickler=_Unpickler, __name__='restricted',
                                 load=lambda f, **kwargs: _Unpickler(f, **kwargs).load())
  try:
    if not restricted:
      return torch.load(data, map_location='cpu', weights_only=True)
    return torch.load(data, map_location='cpu', weights_only=False, pickle_module=module)
  except Exception as error:  # torch raises many kinds for a file it cannot read
    raise ValueError(f'{path}: its weights cannot be read ({type(error).__name__}: '
                     f'{error or "the file ends early"}).') from None


class _Record:
  """An object of a class the reader does not import: its pickled fields."""

  def __setstate__(self, state: Any) -> None:
    if isinstance(state, tuple):  # (the __dict__, the __slots__' values)
      state = {k: v for part in state if part for k, v in part.items()}
    self.__dict__.update(state)


class _Unpickler(pickle.Unpickler):
  """Tensors, containers and numbers as `torch.load` builds them; any class of
  ViT-Prisma as a `_Record` of its fields; anything else refused, so that reading
  a file runs none of its code."""
  ALLOWED = re.compile(r'(torch(\..*)?|collections|copyreg|numpy(\..*)?|pathlib|_codecs)$')

  def find_class(self, module: str, name: str) -> Any:
    if module.split('.')[0] == 'vit_prisma':
      return type(name, (_Record,), {})
    if self.ALLOWED.match(module) or (module == 'builtins' and name in (
        'set', 'frozenset', 'slice', 'complex', 'bytearray')):
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f'the file pickles {module}.{name}, which an SAE file '
                                 'does not hold')


def _params(state: Dict[str, Any], path: str) -> Dict[str, jnp.ndarray]:
  missing = [k for k in sparse_autoencoder.PARAMS if k not in state]
  if missing:
    raise ValueError(f'{path} holds no {", ".join(missing)}: it is not a sparse autoencoder '
                     f'(its arrays: {", ".join(sorted(state)) or "none"}).')
  return {k: jnp.asarray(np.asarray(state[k].float() if hasattr(state[k], 'float') else state[k],
                                    np.float32)) for k in sparse_autoencoder.PARAMS}


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
  cfg = header.get('cfg', header) if 'schema' in header else header
  activation = cfg.get('activation')
  if 'schema' not in header:  # the first files: a ReLU SAE
    name, settings = 'Relu', {}
  elif isinstance(activation, dict):
    name, settings = activation.get('cls'), activation.get('params', {})
  else:  # schema 1's first form: the class in the header
    name, settings = header.get('cls'), {'top_k': cfg.get('top_k', 32)}
  if name not in _SAEV_ACTIVATIONS:
    raise ValueError(f'{path}: saev activation {name!r} is not one of '
                     f'{", ".join(_SAEV_ACTIVATIONS)}.')
  state = _torch_load(io.BytesIO(weights), path, restricted=False)
  params = _params(state, path)
  width = int(params['W_enc'].shape[1])
  threshold = state.get('activation.threshold')
  spec = sparse_autoencoder.Spec(
      architecture=_SAEV_ACTIVATIONS[name], width=width,
      k=min(int(settings.get('top_k', 32)), width), encoder='saev',
      threshold=float(threshold) if threshold is not None else 0.)
  about = {'source': 'saev', 'schema': str(header.get('schema', 0)),
           'commit': str(header.get('commit', '')), 'normalisation': 'none'}
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
  saved = _torch_load(path, path, restricted=True)
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
  k = (cfg.get('activation_fn_kwargs') or {}).get('k', 32)
  spec = sparse_autoencoder.Spec(
      architecture=_PRISMA_ACTIVATIONS[activation], width=width, k=min(int(k), width),
      normalisation=cfg.get('normalize_activations') or 'none')
  hook_point = str(cfg.get('hook_point', ''))
  site = _prisma_site(hook_point)
  about = {'source': 'vit_prisma', 'hook_point': hook_point,
           'model': str(cfg.get('model_name', '')), 'normalisation': spec.normalisation,
           **({'site': site} if site else {})}
  return params, spec, about


def read(path: str) -> Tuple[Dict[str, jnp.ndarray], sparse_autoencoder.Spec, Dict[str, str]]:
  """Any dictionary file: this project's (`sparse_autoencoder.load`: `.npz`,
  `.safetensors`), saev's (a JSON line first) or ViT-Prisma's (`.pt`, `.pth`).

  Args:
    path: the file.

  Returns:
    (its parameters, its spec, what the file says of it).

  Raises:
    ValueError: a file none of them wrote.
  """
  if path.endswith(('.npz', '.safetensors')):
    return sparse_autoencoder.load(path)
  with open(path, 'rb') as f:
    first = f.read(1)
  if first == b'{':
    return read_saev(path)
  if path.endswith(('.pt', '.pth')):
    return read_vit_prisma(path)
  raise ValueError(f'{path} is neither this project\'s dictionary (.npz, .safetensors), saev\'s '
                   '(a JSON header line, then the weights) nor ViT-Prisma\'s (.pt).')
