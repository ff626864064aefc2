"""`.npz` parameter files in the published layouts: reading and writing them.

A file maps '/'-joined parameter paths to arrays, as the public ViT, BiT and
Mixer checkpoints (`PUBLIC_DIRS`) do. Paths may be local or any filesystem
`etils.epath` knows (gs:// through TensorFlow's gfile). Files of a family in
another layout (current-Flax names, big_vision) are read through the family's
`published` (`vit_jax.files.layout`); timm's PyTorch files through
`vit_jax.files.timm_files`; fine-tuning's fit of a file to a new model is
`vit_jax.training.finetune`.
"""
import io
import math
import os
import zipfile
from typing import Any, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath

from vit_jax import models
from vit_jax.files import hf_files, torch_save
from vit_jax.files.atomic import atomic_write
from vit_jax.files.layout import Params, flatten, published, unflatten
from vit_jax.files.timm_files import (INDEX_SUFFIX, STATE_DICT_SUFFIXES, TORCH_SUFFIXES, Model,
                                      published_from_timm, read_state_dict)
from vit_jax.models.family import CheckpointError, Flat

# Where the published checkpoints live: ViT (and AugReg ViT), BiT, MLP-Mixer.
PUBLIC_DIRS = ('gs://vit_models/imagenet21k/', 'gs://vit_models/augreg/', 'gs://bit_models/',
               'gs://mixer_models/', 'gs://vit_models/lit/')
WHERE_PUBLIC = (f'Public checkpoints live under {", ".join(PUBLIC_DIRS)} (e.g. '
                f'{PUBLIC_DIRS[0]}ViT-B_16.npz)')


WEIGHT_SUFFIXES = ('.npz', '.safetensors') + TORCH_SUFFIXES
# The weights of a transformers folder, in the order `from_pretrained` looks for them.
TRANSFORMERS_WEIGHTS = ('model.safetensors', 'model.safetensors' + INDEX_SUFFIX,
                        'pytorch_model.bin', 'pytorch_model.bin' + INDEX_SUFFIX)


def weights_file(directory: str) -> str:
  """The weights file in `directory`: a training workdir's params.npz, a
  `transformers` folder's (`TRANSFORMERS_WEIGHTS`, in `from_pretrained`'s order:
  a Trainer's checkpoint folder's beside its optimizer's files, the index of a
  sharded one), or the one weights file of a download folder. The Hub cache's
  folder of a model is refused, naming its snapshot.

  Args:
    directory: the folder.

  Returns:
    The file's path.

  Raises:
    CheckpointError: none there, or several to choose from.
  """
  params = os.path.join(directory, 'params.npz')
  if os.path.exists(params):
    return params
  check_not_hub_cache(directory)
  for name in TRANSFORMERS_WEIGHTS:  # a transformers folder's, beside its training files
    if os.path.isfile(os.path.join(directory, name)):
      return os.path.join(directory, name)
  found = sorted(n for n in os.listdir(directory) if n.endswith(WEIGHT_SUFFIXES)
                 and os.path.isfile(os.path.join(directory, n)))
  safetensors = [n for n in found if n.endswith('.safetensors')]
  if len(found) == 1 or len(safetensors) == 1:  # a download's .bin beside its .safetensors
    return os.path.join(directory, (safetensors or found)[0])
  if found:
    raise CheckpointError(f'{directory} holds {len(found)} weights files ({", ".join(found)}): '
                          'give the one to load as the checkpoint.')
  raise CheckpointError(
      f'{directory} holds no weights file (params.npz, .npz, .safetensors, .pth, .bin): if it '
      'is a training workdir, finish its training first (rerun the training command, which '
      'resumes from its checkpoint); else give the file itself.')


def check_not_hub_cache(directory: str) -> None:
  """Refuses the Hugging Face Hub cache's folder of a model (`models--org--name`,
  holding `blobs/`, `refs/` and `snapshots/`), naming the snapshot to give.

  Args:
    directory: a folder.

  Raises:
    CheckpointError: it is such a folder.
  """
  snapshots = os.path.join(directory, 'snapshots')
  if not (os.path.isdir(snapshots) and os.path.isdir(os.path.join(directory, 'refs'))):
    return
  main = os.path.join(directory, 'refs', 'main')
  revision = open(main).read().strip() if os.path.isfile(main) else None
  names = sorted(os.listdir(snapshots))
  snapshot = revision if revision in names else (names[-1] if names else None)
  raise CheckpointError(f'{directory} is the Hugging Face Hub cache\'s folder of a model: give '
                        'its snapshot, ' + (os.path.join(snapshots, snapshot) if snapshot else
                                            f'a folder under {snapshots}') + '.')


def load(path: str, model_name: Optional[Model] = None, **overrides: Any) -> Params:
  """`read` as a nested parameter dict of numpy arrays.

  Args:
    path: as in `read`.
    model_name: as in `read`.
    **overrides: as in `read`.

  Returns:
    The nested parameter tree, numpy arrays.
  """
  return unflatten(read(path, model_name, **overrides))


def read(path: str, model_name: Optional[Model] = None, **overrides: Any) -> Flat:
  """Reads a published (or our) `.npz` as flat parameters ('a/b/kernel' -> numpy array).

  Files in a family's other layouts (current-Flax block names, big_vision ViT
  files) load under the published names. Pickled objects are refused. A timm
  state dict (`.safetensors`, or `.pth`/`.pth.tar`/`.pt`/`.bin` with torch
  installed) loads through `published_from_timm`, which needs the model it holds:
  its name and `overrides` of its architecture fields, or its config whole. A LiT
  file loads whole with a LiT model; without one (or with a ViT), its image tower
  loads alone. With a model, the tree is that of the model's module
  (`Family.module_layout`: a ViT with `scan_layers=True` gets its blocks stacked).

  Args:
    path: the file, local or gs://; or a folder holding one (`weights_file`).
    model_name: the model it holds, a `models.get_config` name or a config from
      it; needed for a timm file and a whole LiT file.
    **overrides: architecture fields of that model (a CIFAR model's
      `patch_size`).

  Returns:
    The flat parameters, numpy arrays.

  Raises:
    CheckpointError: a missing file, or one that is not a readable `.npz`.
  """
  path = epath.Path(path)
  try:
    exists = path.exists()
  except Exception as e:  # noqa: BLE001  (gs:// through TensorFlow: no network, no credentials, ...)
    raise CheckpointError(f'{path} cannot be reached ({type(e).__name__}: '
                          f'{" ".join(str(e).split())[:200]}): download it where there is a '
                          'network and give its local path.') from e
  if not exists:
    raise CheckpointError(f'Checkpoint {path} does not exist. {WHERE_PUBLIC}; download one or '
                          'point to your own .npz.')
  if path.is_dir() and hf_files.is_folder(os.fspath(path)):
    config, flat = hf_files.read(os.fspath(path), weights_file(os.fspath(path)))
    return models.family_of(config).module_layout(flat, config)
  if path.is_dir():
    path = epath.Path(weights_file(os.fspath(path)))
  torch = os.fspath(path).endswith(STATE_DICT_SUFFIXES)
  if model_name is None:
    if torch:
      raise CheckpointError(f'{path} is a PyTorch state dict: name the model it holds, '
                            f"checkpoint.load(path, model_name='ViT-B_16').")
    return published(_read_npz(path))
  config = models.config_of(model_name, **overrides)
  family = models.family_of(config)
  flat = (published_from_timm(read_state_dict(path), config) if torch
          else family.to_published(_read_npz(path)))
  return family.module_layout(flat, config)


def from_pretrained(folder: str) -> Tuple[nn.Module, Params]:
  """The model a `transformers` folder holds and its parameters, with no model name:
  the folder's `config.json` gives the fields (`hf_files`).

  Args:
    folder: the folder (`config.json`, `model.safetensors`).

  Returns:
    (the Flax module, its nested parameters).
  """
  if not hf_files.is_folder(folder):
    check_not_hub_cache(folder)
    raise CheckpointError(f'{folder} is not a transformers model folder (no {hf_files.CONFIG} '
                          'naming a model_type); give the folder save_pretrained wrote.')
  config, flat = hf_files.read(folder, weights_file(folder))
  return (models.build_model(config),
          unflatten(models.family_of(config).module_layout(flat, config)))


def _read_npz(path: epath.Path) -> Flat:
  """The arrays of an `.npz` file, or a CheckpointError saying what it is instead."""
  source = os.fspath(path) if '://' not in os.fspath(path) else io.BytesIO(path.read_bytes())
  try:
    with np.load(source, allow_pickle=False) as data:
      _check_member_sizes(path, data.zip)
      flat = {key: data[key] for key in data.files}
  except CheckpointError:
    raise
  except ValueError as e:
    if 'pickle' not in str(e):
      raise CheckpointError(f'{path} is not a readable .npz parameter file ({e}).') from e
    raise CheckpointError(
        f'{path} is not an .npz parameter file (numpy reads no arrays in it: it is text, a '
        'pickle or another format). Point to the .npz itself, or download it again.') from e
  except torch_save.ZIP_ERRORS as e:  # a damaged archive (its ValueErrors caught above)
    raise CheckpointError(
        f'{path} is not a readable .npz parameter file ({type(e).__name__}: {e}). It may be '
        'truncated or corrupt: download it again or use an earlier copy.') from e
  if not flat:
    raise CheckpointError(f'{path} holds no arrays.')
  return flat


def _check_member_sizes(path: epath.Path, archive: zipfile.ZipFile) -> None:
  """Refuses an `.npz` whose arrays' headers declare more bytes than their members
  hold, from the headers alone: numpy would allocate the declared array first."""
  for info in archive.infolist():
    if not info.filename.endswith('.npy'):
      continue
    with archive.open(info) as member:
      version = np.lib.format.read_magic(member)
      shape, _, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                         np.lib.format.read_array_header_2_0)(member)
    declared = math.prod(shape) * dtype.itemsize
    if declared > info.file_size:
      raise CheckpointError(f'{path} is not a readable .npz parameter file: its array '
                            f'{info.filename[:-4]} declares {shape} {dtype} ({declared} bytes) '
                            f'in a member of {info.file_size}; it is damaged: download it '
                            'again or use an earlier copy.')


FORMATS = ('npz', 'transformers')


def save(path: str, params: Mapping[str, Any],
         format: str = 'npz',  # pylint: disable=redefined-builtin  (numpy's and jax's word)
         config: Optional[ml_collections.ConfigDict] = None, image_size: Optional[int] = None,
         labels: Optional[Sequence[str]] = None, model_type: Optional[str] = None) -> None:
  """Writes `params` (or `{'params': params}`) as a published-layout `.npz`, or as
  a Hugging Face `transformers` folder (`hf_files.write`).

  Floating arrays are stored as float32, as in the public files. A LiT tree is
  written as it is (its image tower keeps its 'img/' prefix). The file is
  written beside the target and renamed over it, so a kill never leaves a
  partial file under `path`.

  Args:
    path: where to write, local or gs:// (for 'transformers', the folder).
    params: the parameter tree (nested or flat, any array type).
    format: 'npz', or 'transformers': `config.json`, `model.safetensors` and
      `preprocessor_config.json` that `transformers` loads, which need `config`
      and `image_size`.
    config: the model config (`models.get_config`), for 'transformers'.
    image_size: the images' side in pixels, for 'transformers'.
    labels: the classes' names, for 'transformers' (LABEL_<i> if None).
    model_type: for 'transformers', the `model_type` to write where the model can
      be more than one (an attention-pooling ViT as SigLIP 2's
      'siglip2_vision_model'); None, the one its fields make.

  Raises:
    ValueError: an unknown format, or 'transformers' without the model's config
      or image size.
    CheckpointError: a model `transformers` cannot hold, or a folder holding what
      this did not write (`hf_files.write`); an `.npz` path that is a folder.
    WorkdirError: a full disk, the target left as it was.
  """
  if format == 'transformers':
    if config is None or image_size is None:
      raise ValueError("format='transformers' writes the model's config.json: give config= "
                       '(models.get_config(...)) and image_size=.')
    hf_files.write(path, params['params'] if 'params' in params else params, config, image_size,
                   labels, model_type)
    return
  if format != 'npz':
    raise ValueError(f'Unknown checkpoint format {format!r}; use one of {", ".join(FORMATS)}.')
  if os.path.isdir(path):
    raise CheckpointError(f'{path} is a folder: give the .npz file to write, e.g. '
                          f'{os.path.join(path, "params.npz")}.')
  arrays = {}
  for key, value in published(flatten(params)).items():
    value = np.asarray(value)
    arrays[key] = value.astype(np.float32) if jnp.issubdtype(value.dtype, jnp.floating) else value
  with atomic_write(path, 'wb') as f:
    np.savez(f, **arrays)
