"""`.npz` parameter files in the published layouts, and fine-tuning from them.

A file maps '/'-joined parameter paths to arrays, as the public ViT, BiT and
Mixer checkpoints (`PUBLIC_DIRS`) do. Paths may be local or any filesystem
`etils.epath` knows (gs:// through TensorFlow's gfile). Files of a family in
another layout (current-Flax names, big_vision) are read through the family's
`published`; `to_timm` exports through the family's `to_timm`.
"""
import io
import os
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath

from vit_jax import augreg, models
from vit_jax.atomic import atomic_write
from vit_jax.models import lit
from vit_jax.models.family import CheckpointError, Flat

Params = Dict[str, Any]
# Where the published checkpoints live: ViT (and AugReg ViT), BiT, MLP-Mixer.
PUBLIC_DIRS = ('gs://vit_models/imagenet21k/', 'gs://vit_models/augreg/', 'gs://bit_models/',
               'gs://mixer_models/', 'gs://vit_models/lit/')
WHERE_PUBLIC = (f'Public checkpoints live under {", ".join(PUBLIC_DIRS)} (e.g. '
                f'{PUBLIC_DIRS[0]}ViT-B_16.npz)')
# A timm state dict saved by torch.save (with `.safetensors`, the files `load` reads as one).
TORCH_SUFFIXES = ('.pth', '.pth.tar', '.pt', '.bin')


def published(flat: Flat) -> Flat:
  """`flat` in the published layout: every family reads its own other layouts."""
  for family in models.FAMILIES.values():
    flat = family.published(flat)
  return dict(flat)


def _flatten(params: Mapping[str, Any]) -> Dict[str, Any]:
  params = flax.core.unfreeze(params)
  if set(params) == {'params'}:
    params = params['params']
  return flax.traverse_util.flatten_dict(params, sep='/')


def _unflatten(flat: Mapping[str, Any]) -> Params:
  return flax.traverse_util.unflatten_dict(dict(flat), sep='/')


def load(path: str, model_name: Optional[str] = None, **overrides) -> Params:
  """Reads a published (or our) `.npz` as a nested parameter dict of numpy arrays.

  Files in a family's other layouts (current-Flax block names, big_vision ViT
  files) load under the published names. Pickled objects are refused. A timm
  state dict (`.safetensors`, or `.pth`/`.pth.tar`/`.pt`/`.bin` with torch
  installed) loads through `from_timm`, which needs the `model_name` it holds
  and `overrides` of its architecture fields. A LiT file loads whole with a LiT
  `model_name`; without one (or with a ViT's), its image tower loads alone.
  With `model_name`, the tree is
  that of the model's module (`Family.module_layout`: a ViT with
  `scan_layers=True` gets its blocks stacked).
  """
  path = epath.Path(path)
  if not path.exists():
    raise CheckpointError(f'Checkpoint {path} does not exist. {WHERE_PUBLIC}; download one or '
                          'point to your own .npz.')
  if os.fspath(path).endswith(TORCH_SUFFIXES + ('.safetensors',)):
    if model_name is None:
      raise CheckpointError(f'{path} is a PyTorch state dict: name the model it holds, '
                            f"checkpoint.load(path, model_name='ViT-B_16').")
    flat = _flatten(from_timm(read_state_dict(path), model_name, **overrides))
  elif model_name is not None and lit.is_lit(models.get_config(model_name, **overrides)):
    return _unflatten(_read_npz(path))  # LiT files have one layout, the published one
  else:
    flat = published(_read_npz(path))
  if model_name is None:
    return _unflatten(flat)
  config = models.get_config(model_name, **overrides)
  return _unflatten(models.family_of(config).module_layout(flat, config))


def _read_npz(path: epath.Path) -> Flat:
  """The arrays of an `.npz` file, or a CheckpointError saying what it is instead."""
  source = os.fspath(path) if '://' not in os.fspath(path) else io.BytesIO(path.read_bytes())
  try:
    with np.load(source, allow_pickle=False) as data:
      flat = {key: data[key] for key in data.files}
  except ValueError as e:
    if 'pickle' not in str(e):
      raise CheckpointError(f'{path} is not a readable .npz parameter file ({e}).') from e
    raise CheckpointError(
        f'{path} is not an .npz parameter file (numpy reads no arrays in it: it is text, a '
        'pickle or another format). Point to the .npz itself, or download it again.') from e
  except (zipfile.BadZipFile, EOFError, OSError) as e:
    raise CheckpointError(
        f'{path} is not a readable .npz parameter file ({type(e).__name__}: {e}). It may be '
        'truncated or corrupt: download it again or use an earlier copy.') from e
  if not flat:
    raise CheckpointError(f'{path} holds no arrays.')
  return flat


def save(path: str, params: Mapping[str, Any]) -> None:
  """Writes `params` (or `{'params': params}`) as a published-layout `.npz`.

  Floating arrays are stored as float32, as in the public files. A LiT tree is
  written as it is (its image tower keeps its 'img/' prefix). The file is
  written beside the target and renamed over it, so a kill never leaves a
  partial file under `path`.
  """
  flat = _flatten(params)
  if not lit.is_two_tower(flat):
    flat = published(flat)
  arrays = {}
  for key, value in flat.items():
    value = np.asarray(value)
    arrays[key] = value.astype(np.float32) if jnp.issubdtype(value.dtype, jnp.floating) else value
  with atomic_write(path, 'wb') as f:
    np.savez(f, **arrays)


def load_pretrained(path: str, init_params: Mapping[str, Any], model_config: Any,
                    grid_shape: Optional[Sequence[int]] = None, keep_head: bool = False
                    ) -> Params:
  """Parameters for fine-tuning: the checkpoint at `path` fitted to a new model.

  `init_params` are the new model's freshly initialised parameters and
  `model_config` its config (`vit_jax.models.get_config`); `path` is an `.npz`
  or a timm state dict of that model (`load`). The head is taken
  from `init_params`; the family fits the rest (`Family.fit_checkpoint`: for a
  ViT, `pre_logits` dropped without a representation size and position
  embeddings resized to the new grid, `grid_shape` inferred when square).
  Anything else that differs raises a CheckpointError listing missing,
  unexpected and wrongly shaped keys, and so does an array (the head aside) with
  NaN or infinity. `keep_head` keeps the checkpoint's head
  instead (a second stage of fine-tuning on the same classes).
  """
  fields = {k: v for k, v in model_config.items() if k not in ('family', 'name', 'num_classes')}
  restored = _flatten(load(path, model_config.name, **fields))  # fields: for a timm file
  init = _flatten(init_params)
  family = models.family_of(model_config)
  if not keep_head:
    restored = {k: v for k, v in restored.items() if not k.startswith(family.head)}
    restored.update({k: v for k, v in init.items() if k.startswith(family.head)})
  broken = non_finite(restored)
  if broken:
    raise CheckpointError(
        f'{path} holds NaN or infinity in {len(broken)} array(s), first {broken[0]}: it is '
        'damaged or from a diverged run; fine-tune from another checkpoint.')
  restored = family.fit_checkpoint(restored, init, model_config, grid_shape, str(path))
  check_matches(restored, init, str(path))
  return _unflatten({k: np.asarray(v, dtype=init[k].dtype) for k, v in restored.items()})


def non_finite(tree) -> List[str]:
  """The key paths of the floating arrays of `tree` that hold NaN or infinity."""
  return [jax.tree_util.keystr(path)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
          if np.issubdtype(np.asarray(leaf).dtype, np.floating) and not np.all(np.isfinite(leaf))]


def check_matches(flat: Mapping[str, Any], reference: Mapping[str, Any], source: str) -> None:
  """Raises a CheckpointError naming every missing, unexpected and misshaped key."""
  missing = sorted(set(reference) - set(flat))
  unexpected = sorted(set(flat) - set(reference))
  misshaped = sorted(f'{k}: checkpoint {tuple(np.shape(flat[k]))}, model '
                     f'{tuple(np.shape(reference[k]))}'
                     for k in set(flat) & set(reference)
                     if np.shape(flat[k]) != np.shape(reference[k]))
  if missing or unexpected or misshaped:
    lines = [f'{source} does not fit the model:']
    for title, keys in (('missing', missing), ('unexpected', unexpected),
                        ('wrongly shaped', misshaped)):
      if keys:
        lines.append(f'  {len(keys)} {title}: ' + ', '.join(keys[:20]) +
                     (', ...' if len(keys) > 20 else ''))
    lines.append('Check that the model name and its overrides match the checkpoint.')
    raise CheckpointError('\n'.join(lines))


def to_timm(params: Mapping[str, Any], model_name: str) -> Dict[str, np.ndarray]:
  """The timm `state_dict` (name -> float32 array in PyTorch's layout) of a
  parameter tree of `model_name`, from its family's `to_timm`: what timm's own
  `.npz` loader would produce from our saved file. Wrap the arrays with
  `torch.from_numpy` to load them."""
  state = _timm_family(model_name).to_timm({k: np.asarray(v, np.float32)
                                            for k, v in published(_flatten(params)).items()})
  # C order, as file writers that take the raw buffer (safetensors) need.
  return {k: np.ascontiguousarray(v) for k, v in state.items()}


def from_timm(state_dict: Mapping[str, Any], model_name: str, **overrides) -> Params:
  """The published parameter tree of `model_name` from a timm `state_dict` (name ->
  array or CPU tensor, PyTorch layout): the exact inverse of `to_timm`.

  The head (class token, attention pooling or mean), the classes and the image
  size come from the state dict; `overrides` set the other architecture fields
  (a CIFAR model's `patch_size`). A qkv bias the state dict lacks (timm's
  `qkv_bias=False`) loads as zeros; any other difference from the model is a
  CheckpointError listing the keys.
  """
  state = {k: np.asarray(v, np.float32) for k, v in state_dict.items()
           if not k.endswith('num_batches_tracked')}
  family = _timm_family(model_name)
  fields = family.timm_fields(state, models.get_config(model_name, **overrides))
  image_size = fields.pop('image_size')
  config = models.get_config(model_name, **{**overrides, **fields})
  model = models.build_model(config)
  shapes = jax.eval_shape(lambda: published(_flatten(model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, image_size, image_size, 3)))['params'])))
  # Number every parameter element and export the numbers: each timm array then
  # says which elements it holds, so the import is the export read backwards.
  starts = np.cumsum([0] + [int(np.prod(s.shape)) for s in shapes.values()])
  index = np.int32 if starts[-1] < 2**31 else np.int64  # ViT-G/14 still fits int32
  numbered = {k: np.arange(start, start + np.prod(s.shape), dtype=index).reshape(s.shape)
              for (k, s), start in zip(shapes.items(), starts)}
  template = family.to_timm(numbered)
  # timm's qkv_bias=False: the biases are zeros.
  expected = {k: v for k, v in template.items() if k in state or not k.endswith('qkv.bias')}
  check_matches(state, expected, f'The state dict of {model_name} '
                f'({models.family_of(config).describe(config)})')
  values = np.zeros(starts[-1], np.float32)
  for key, where in template.items():
    if key in state:
      values[where.ravel()] = state[key].ravel()
  return _unflatten({k: values[start:start + np.prod(s.shape)].reshape(s.shape)
                     for (k, s), start in zip(shapes.items(), starts)})


def read_state_dict(path: str) -> Dict[str, np.ndarray]:
  """The arrays of a PyTorch state dict file: `.safetensors` (no torch needed), or
  a `torch.save` file (torch needed; a checkpoint dict holding the weights under
  'state_dict', 'model' or 'state_dict_ema' is unwrapped)."""
  path = epath.Path(path)
  if os.fspath(path).endswith('.safetensors'):
    from safetensors.numpy import load as load_safetensors
    try:
      return load_safetensors(path.read_bytes())
    except Exception as e:  # safetensors raises its own error types
      raise CheckpointError(f'{path} is not a readable .safetensors file ({e}).') from e
  try:
    import torch
  except ImportError as e:
    raise CheckpointError(
        f'{path} is a torch.save file, and reading it needs PyTorch, which is not installed: '
        'pip install torch (the CPU build is enough), or save the state dict as .safetensors '
        '(safetensors.torch.save_file) and load that.') from e
  with path.open('rb') as f:
    data = torch.load(io.BytesIO(f.read()), map_location='cpu', weights_only=True)
  for key in ('state_dict', 'model', 'state_dict_ema'):
    if isinstance(data, Mapping) and isinstance(data.get(key), Mapping):
      data = data[key]
      break
  return {k: v.float().numpy() for k, v in data.items() if hasattr(v, 'numpy')}


def _timm_family(model_name: str):
  family = models.family_of(models.get_config(model_name))
  if family.to_timm is None:
    exported = [f.title for f in models.FAMILIES.values() if f.to_timm is not None]
    raise ValueError(f'timm layouts cover the {" and ".join(exported)} families, not '
                     f'{model_name}.')
  return family


def missing_pretrained(config: ml_collections.ConfigDict) -> Optional[str]:
  """What is wrong with `config.pretrained`: an AugReg name that the index does not
  resolve or that is another model than the config's, or a local file that is not
  there."""
  path = config.pretrained
  if not path:
    return None
  if path.startswith(augreg.AUGREG_PREFIX):
    try:
      path, row = augreg.lookup(path[len(augreg.AUGREG_PREFIX):], config.augreg_dir)
    except CheckpointError as e:
      return str(e)
    expected = augreg.model_name(row['name'])
    if expected != config.model_name:
      return (f'{config.pretrained} is a {expected} checkpoint but the recipe builds '
              f'{config.model_name}; set --config.model_name={expected}.')
  if '://' in path or os.path.exists(path):
    return None
  return (f'the pretrained checkpoint {path} does not exist. {WHERE_PUBLIC}; download one and '
          'set --config.pretrained=<path>, or --config.pretrained=None to train from scratch.')
