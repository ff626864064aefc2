"""`.npz` parameter files in the published layouts, and fine-tuning from them.

A file maps '/'-joined parameter paths to arrays, as the public ViT
(gs://vit_models/imagenet21k/, gs://vit_models/augreg/) and BiT
(gs://bit_models/) checkpoints do. Paths may be local or any filesystem
`etils.epath` knows (gs:// through TensorFlow's gfile).
"""
import io
import logging
import math
import os
import re
import zipfile
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import flax
import jax.numpy as jnp
import numpy as np
import scipy.ndimage
from etils import epath

Params = Dict[str, Any]
POSEMBED = 'Transformer/posembed_input/pos_embedding'
# Current Flax auto-names the parts of an encoder block per type; the published
# files were written when the counter ran over all children of the block.
_CURRENT_TO_PUBLISHED = {
    'LayerNorm_1': 'LayerNorm_2',
    'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
    'MlpBlock_0': 'MlpBlock_3',
}
_BLOCK = re.compile(r'encoderblock_\d+$')


class CheckpointError(ValueError):
  """A checkpoint file that cannot be read or does not fit the model."""


def published_names(flat: Mapping[str, Any]) -> Dict[str, Any]:
  """Renames encoder-block children written with current Flax auto-names
  (`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`) to the
  published ones; trees already in the published form are returned as they are."""
  if not any('/MultiHeadDotProductAttention_0/' in k for k in flat):
    return dict(flat)
  renamed = {}
  for key, value in flat.items():
    parts = key.split('/')
    for i in range(1, len(parts)):
      if _BLOCK.match(parts[i - 1]):
        parts[i] = _CURRENT_TO_PUBLISHED.get(parts[i], parts[i])
    renamed['/'.join(parts)] = value
  return renamed


def _flatten(params: Mapping[str, Any]) -> Dict[str, Any]:
  params = flax.core.unfreeze(params)
  if set(params) == {'params'}:
    params = params['params']
  return flax.traverse_util.flatten_dict(params, sep='/')


def _unflatten(flat: Mapping[str, Any]) -> Params:
  return flax.traverse_util.unflatten_dict(dict(flat), sep='/')


def load(path: str) -> Params:
  """Reads a published (or our) `.npz` as a nested parameter dict of numpy arrays.

  Files with current-Flax block names load under the published names. Pickled
  objects are refused.
  """
  path = epath.Path(path)
  if not path.exists():
    raise CheckpointError(f'Checkpoint {path} does not exist. Public ones live under '
                          'gs://vit_models/imagenet21k/, gs://vit_models/augreg/ and '
                          'gs://bit_models/; download one or point to your own .npz.')
  source = os.fspath(path) if '://' not in os.fspath(path) else io.BytesIO(path.read_bytes())
  try:
    with np.load(source, allow_pickle=False) as data:
      flat = {key: data[key] for key in data.files}
  except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
    raise CheckpointError(
        f'{path} is not a readable .npz parameter file ({type(e).__name__}: {e}). It may be '
        'truncated or corrupt: download it again or use an earlier copy.') from e
  if not flat:
    raise CheckpointError(f'{path} holds no arrays.')
  return _unflatten(published_names(flat))


def save(path: str, params: Mapping[str, Any]) -> None:
  """Writes `params` (or `{'params': params}`) as a published-layout `.npz`.

  Floating arrays are stored as float32, as in the public files. The file is
  written beside the target and renamed over it, so a kill never leaves a
  partial file under `path`.
  """
  flat = published_names(_flatten(params))
  arrays = {}
  for key, value in flat.items():
    value = np.asarray(value)
    arrays[key] = value.astype(np.float32) if jnp.issubdtype(value.dtype, jnp.floating) else value
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / f'.{path.name}.tmp-{os.getpid()}'
  if '://' in os.fspath(path):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    tmp.write_bytes(buffer.getvalue())
    tmp.rename(path)
    return
  try:
    with open(tmp, 'wb') as f:
      np.savez(f, **arrays)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _square_side(n: int) -> Optional[int]:
  side = math.isqrt(n)
  return side if side * side == n else None


def interpolate_posembed(posemb: np.ndarray, old_grid: Tuple[int, int],
                         new_grid: Tuple[int, int]) -> np.ndarray:
  """Resizes grid position embeddings (1, gh*gw, D) to (1, nh*nw, D).

  Bilinear interpolation with corners kept on corners, as
  `scipy.ndimage.zoom(order=1)`; class-token rows are the caller's to keep apart.
  """
  grid = np.asarray(posemb)[0].reshape(tuple(old_grid) + (-1,))
  zoom = (new_grid[0] / old_grid[0], new_grid[1] / old_grid[1], 1)
  return scipy.ndimage.zoom(grid, zoom, order=1).reshape(1, new_grid[0] * new_grid[1], -1)


def _split_posembed(n: int, what: str) -> Tuple[int, Tuple[int, int]]:
  """(extra rows, square grid) of a posembed with n rows: n = g*g or 1 + g*g."""
  for extra in (0, 1):
    side = _square_side(n - extra)
    if side:
      return extra, (side, side)
  raise CheckpointError(f'The {what} position embeddings have {n} rows, which is neither a '
                        'square grid nor a class token plus a square grid; pass grid_shape.')


def _fit_posembed(posemb: np.ndarray, target: np.ndarray, has_token: bool,
                  grid_shape: Optional[Tuple[int, int]]) -> np.ndarray:
  old_extra, old_grid = _split_posembed(posemb.shape[1], 'checkpoint')
  new_extra = int(has_token)
  if grid_shape is None:
    side = _square_side(target.shape[1] - new_extra)
    if side is None:
      raise CheckpointError(
          f'The model has {target.shape[1] - new_extra} patches, not a square grid: pass '
          'grid_shape=(rows, cols) to load_pretrained.')
    grid_shape = (side, side)
  grid = posemb[:, old_extra:]
  if old_grid != tuple(grid_shape):
    grid = interpolate_posembed(grid, old_grid, tuple(grid_shape))
    logging.info('Resized position embeddings from grid %s to %s.', old_grid, grid_shape)
  # A class-token row comes from the checkpoint when it has one, else from init.
  token = posemb[:, :1] if old_extra else np.asarray(target[:, :1])
  return np.concatenate([token, grid], axis=1) if new_extra else grid


def load_pretrained(path: str, init_params: Mapping[str, Any], model_config: Any,
                    grid_shape: Optional[Sequence[int]] = None) -> Params:
  """Parameters for fine-tuning: the checkpoint at `path` fitted to a new model.

  `init_params` are the new model's freshly initialised parameters and
  `model_config` its config (`vit_jax.models.get_config`). The head is taken
  from `init_params`; `pre_logits` is dropped when the config has no
  representation size; ViT position embeddings are resized to the new grid
  (`grid_shape`, inferred when square). Anything else that differs raises a
  CheckpointError listing missing, unexpected and wrongly shaped keys.
  """
  restored = _flatten(load(path))
  init = _flatten(init_params)
  head = 'resnet/head/' if model_config.family == 'bit' else 'head/'
  restored = {k: v for k, v in restored.items() if not k.startswith(head)}
  restored.update({k: v for k, v in init.items() if k.startswith(head)})

  if model_config.family == 'vit':
    has_token = model_config.classifier in ('token', 'token_unpooled')
    if model_config.representation_size is None:
      restored = {k: v for k, v in restored.items() if not k.startswith('pre_logits/')}
    elif not any(k.startswith('pre_logits/') for k in restored):
      logging.info('%s has no pre_logits; they start from initialisation.', path)
      restored.update({k: v for k, v in init.items() if k.startswith('pre_logits/')})
    if not has_token:
      restored.pop('cls', None)
    elif 'cls' not in restored and 'cls' in init:
      restored['cls'] = init['cls']
    if POSEMBED in restored and POSEMBED in init:
      restored[POSEMBED] = _fit_posembed(restored[POSEMBED], init[POSEMBED], has_token,
                                         grid_shape)

  check_matches(restored, init, str(path))
  return _unflatten({k: np.asarray(v, dtype=init[k].dtype) for k, v in restored.items()})


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
