"""Hugging Face `transformers` folders (`config.json` beside `model.safetensors`, as
`save_pretrained` writes them and the Hub serves them) read as this project's
parameters, with no PyTorch and no `transformers`: the folder's `model_type` names
the family that reads it (`Family.transformers_types`), its config the model's
fields (`Family.transformers_fields`), its weights are renamed to timm's names
(`Family.from_transformers`) and read as timm files are
(`timm_files.published_from_timm`), and `preprocessor_config.json`'s pixel
statistics become the model's. `write` is the other way (`Family.to_transformers`;
`check_writable` refuses a model before it is trained, `vit_jax.export` writes a
finished run). Anything the model cannot express is refused in one sentence naming
it.
"""
import json
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from safetensors.numpy import save_file

from vit_jax import models
from vit_jax.models.family import CheckpointError, Family, Flat
from vit_jax.layout import published_float32
from vit_jax.timm_files import published_from_timm, read_state_dict, state_dict_shapes

CONFIG = 'config.json'
PREPROCESSOR = 'preprocessor_config.json'


def _json(path: str) -> Dict[str, Any]:
  """A JSON object from `path`, or a CheckpointError saying what the file is instead."""
  try:
    with open(path, encoding='utf-8') as f:
      data = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise CheckpointError(f'{path} is not readable JSON ({e}): the folder is damaged; download '
                          'it again.') from None
  if not isinstance(data, dict):
    raise CheckpointError(f'{path} holds no JSON object: the folder is damaged; download it '
                          'again.')
  return data


def is_folder(path: str) -> bool:
  """Whether `path` is a `transformers` model folder: a `config.json` naming a
  `model_type`.

  Args:
    path: a file or folder.

  Returns:
    Whether it is one.
  """
  config = os.path.join(path, CONFIG)
  if not os.path.isdir(path) or not os.path.isfile(config):
    return False
  return 'model_type' in _json(config)


def _pixel_fields(folder: str) -> Dict[str, Any]:
  """`preprocessor_config.json`'s mean and std as the model's pixel statistics."""
  path = os.path.join(folder, PREPROCESSOR)
  if not os.path.isfile(path):
    return {}
  pre = _json(path)
  if 'image_mean' not in pre or 'image_std' not in pre:
    return {}
  for key in ('image_mean', 'image_std'):
    value = pre[key]
    if not (isinstance(value, list) and len(value) == 3 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)):
      raise CheckpointError(f'{path} has {key} {value!r}, where three numbers (one per RGB '
                            'channel) belong: the folder is damaged; download it again.')
  return dict(pixel_mean=tuple(float(x) for x in pre['image_mean']),
              pixel_std=tuple(float(x) for x in pre['image_std']))


def _family(folder: str, hf_config: Mapping[str, Any]) -> Family:
  """The family that reads the folder's `model_type`, or a CheckpointError naming it."""
  kind = hf_config['model_type']
  readers = {t: f for f in models.FAMILIES.values() for t in f.transformers_types}
  if kind not in readers:
    raise CheckpointError(f'{folder} holds a transformers {kind!r} model; these are read: '
                          f'{", ".join(sorted(readers))}.')
  return readers[kind]


def check_fits(folder: str, config: Mapping[str, Any]) -> None:
  """Refuses a folder whose model computes another function than `config`'s would
  with its weights (another activation, LayerNorm epsilon, size or pixel
  statistics), naming each field and the folder's value, before any weight is read:
  fine-tuning from it would otherwise train a model that is not the folder's.

  Args:
    folder: a `transformers` folder (`is_folder`).
    config: the model config its weights are fitted to.

  Raises:
    CheckpointError: the fields that differ.
  """
  hf_config = _json(os.path.join(folder, CONFIG))
  theirs = {**_family(folder, hf_config).transformers_fields(hf_config),
            **_pixel_fields(folder)}
  # No pixel statistics: images in [-1, 1] as they come, i.e. mean 0.5 and std 0.5.
  ours = {**dict(pixel_mean=(0.5,) * 3, pixel_std=(0.5,) * 3),
          **{k: v for k, v in config.items() if v is not None}}
  differ = []
  for field, value in theirs.items():
    mine = ours.get(field)
    same = value == mine if value is None or isinstance(value, str) else (
        mine is not None and np.shape(mine) == np.shape(value)
        and np.allclose(value, mine, rtol=1e-6, atol=0))
    if not same:
      differ.append(f"{field} {value!r} (the recipe's model has {mine!r})")
  if differ:
    raise CheckpointError(f'{folder} holds a model with ' + ', '.join(differ) + ': set the '
                          'recipe\'s model fields to the folder\'s (--config.model.<field>) to '
                          'fine-tune from it.')


def read(folder: str, weights: str) -> Tuple[str, Dict[str, Any], Flat]:
  """A `transformers` folder as (model name, its fields, flat parameters in the
  published layout).

  Args:
    folder: the folder (`is_folder`).
    weights: its weights file (`checkpoint.weights_file`).

  Returns:
    (a model name of the zoo, the fields that make it the folder's model, the
    parameters).

  Raises:
    CheckpointError: a model type, or a field of it, that the project cannot express.
  """
  family, name, fields = _described(folder)  # checked before the weights are read
  timm_state, extra, weight_fields = _as_timm(family, name, fields, read_state_dict(weights))
  flat = published_from_timm(timm_state, name, **fields)
  return name, {**fields, **weight_fields}, {**flat, **extra}


# The fields of a model's head: fine-tuning makes it anew for the data's classes.
HEAD_FIELDS = ('num_classes', 'representation_size')


def model_of(folder: str, weights: str) -> Tuple[str, Dict[str, Any]]:
  """The zoo name and fields of a `transformers` folder's model, as `read` gives
  them, but the head's (`HEAD_FIELDS`): what a recipe fine-tuning from the folder
  takes as its model. Reads the folder's JSON files and the weights' names and
  shapes only (`timm_files.state_dict_shapes`: a `.safetensors` file's header).

  Args:
    folder: the folder (`is_folder`).
    weights: its weights file (`checkpoint.weights_file`).

  Returns:
    (a model name of the zoo, the fields that make its backbone the folder's).

  Raises:
    CheckpointError: a model type, or a field of it, that the project cannot express.
  """
  family, name, fields = _described(folder)
  _, _, weight_fields = _as_timm(family, name, fields, state_dict_shapes(weights))
  return name, {k: v for k, v in {**fields, **weight_fields}.items() if k not in HEAD_FIELDS}


def _described(folder: str) -> Tuple[Family, str, Dict[str, Any]]:
  """The folder's family, zoo name and fields from its `config.json` and
  `preprocessor_config.json`, each checked."""
  config = _json(os.path.join(folder, CONFIG))
  family = _family(folder, config)
  fields = family.transformers_fields(config)
  pixels = _pixel_fields(folder)
  name = _zoo_name(family, fields)
  if pixels and 'pixel_mean' not in models.get_config(name):
    _check_unit_range(folder, pixels)  # a family without pixel statistics reads [-1, 1]
    pixels = {}
  return family, name, {**fields, **pixels}


def _as_timm(family: Family, name: str, fields: Mapping[str, Any], state: Mapping[str, Any]
             ) -> Tuple[Dict[str, Any], Flat, Dict[str, Any]]:
  """The folder's weights under timm's names, the parameters timm has no place for,
  and the fields the weights fix (the head, the classes, ...: `Family.timm_fields`,
  as a timm file's do, but the image size)."""
  timm_state, extra, extra_fields = family.from_transformers(state)
  fixed = family.timm_fields(timm_state, models.get_config(name, **fields))
  fixed.pop('image_size')
  return timm_state, extra, {**fixed, **extra_fields}


def _check_unit_range(folder: str, pixels: Mapping[str, Any]) -> None:
  """Refuses pixel statistics other than mean 0.5 and std 0.5 (images in [-1, 1])
  for a family whose models have no others."""
  if not (np.allclose(pixels['pixel_mean'], 0.5, rtol=0, atol=1e-6)
          and np.allclose(pixels['pixel_std'], 0.5, rtol=0, atol=1e-6)):
    raise CheckpointError(
        f"{folder}'s {PREPROCESSOR} normalises images with mean {list(pixels['pixel_mean'])} "
        f"and std {list(pixels['pixel_std'])}; this model reads images in [-1, 1] (mean 0.5, "
        'std 0.5) and has no field for others.')


def _zoo_name(family: Family, fields: Mapping[str, Any]) -> str:
  """The zoo's name of the model these fields make (the family's first where none
  has them all: the fields make the model)."""
  for name in family.variants:
    config = models.get_config(name)
    if all(config.get(k) == v for k, v in fields.items()):
      return name
  return next(iter(family.variants))


def converted(params: Mapping[str, Any], config: ml_collections.ConfigDict, image_size: int,
              labels: Optional[Sequence[str]] = None, model_type: Optional[str] = None
              ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
  """A model as the `transformers` model its family writes it as: (config.json,
  the weights under the files' names), nothing written.

  Args:
    params: the model's parameters (zeros of their shapes check a model before
      it is trained: `check_writable`).
    config: its model config (`models.get_config`).
    image_size: the images' side in pixels.
    labels: the classes' names, for a classifier's `id2label` (LABEL_<i> if None).
    model_type: the `model_type` to write where the model can be more than one
      (a SigLIP tower as 'siglip2_vision_model'); None, the one its fields make.

  Returns:
    (config.json, the weights).

  Raises:
    CheckpointError: a model its family cannot write for transformers (a family
      without `to_transformers`, or a field it names).
  """
  family = models.family_of(config)
  if family.to_transformers is None:
    raise CheckpointError(f'{config.name} is not written for transformers: only '
                          f'{", ".join(f.title for f in models.FAMILIES.values() if f.to_transformers)} '
                          'models are.')
  hf_config, state = family.to_transformers(published_float32(params), config, image_size,
                                            model_type)
  if labels is not None and 'id2label' in hf_config:
    hf_config['id2label'] = {str(i): str(name) for i, name in enumerate(labels)}
    hf_config['label2id'] = {str(name): i for i, name in enumerate(labels)}
  return hf_config, state


def check_writable(config: ml_collections.ConfigDict, image_size: int) -> None:
  """Refuses a model `write` would refuse, from its shapes alone: before training
  a run that is to be exported.

  Args:
    config: the model config.
    image_size: the images' side in pixels.

  Raises:
    CheckpointError: as `write`.
  """
  shapes = jax.eval_shape(models.build_model(config).init, jax.random.PRNGKey(0),
                          jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32))
  zeros = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes['params'])
  converted(zeros, config, image_size)


def write(folder: str, params: Mapping[str, Any], config: ml_collections.ConfigDict,
          image_size: int, labels: Optional[Sequence[str]] = None,
          model_type: Optional[str] = None) -> None:
  """Writes a model as a `transformers` folder that `transformers` loads with the
  same outputs (`converted`): `config.json`, `model.safetensors` and
  `preprocessor_config.json`.

  Args:
    folder: the folder to write (made if missing).
    params: the model's parameters.
    config: its model config (`models.get_config`).
    image_size: the images' side in pixels.
    labels: the classes' names (LABEL_<i> if None).
    model_type: as `converted`.

  Raises:
    CheckpointError: as `converted`, before anything is written.
  """
  hf_config, state = converted(params, config, image_size, labels, model_type)
  os.makedirs(folder, exist_ok=True)
  save_file({k: np.ascontiguousarray(v, np.float32) for k, v in state.items()},
            os.path.join(folder, 'model.safetensors'), metadata={'format': 'pt'})
  with open(os.path.join(folder, CONFIG), 'w') as f:
    json.dump(hf_config, f, indent=2)
  mean = config.get('pixel_mean') or (0.5,) * 3  # none: [-1, 1] images, mean and std 0.5
  std = config.get('pixel_std') or (0.5,) * 3
  # SigLIP 2's processor cuts each image into at most the tower's grid of patches.
  sizes = ({'size': {'height': image_size, 'width': image_size}}
           if hf_config['model_type'] != 'siglip2_vision_model' else
           {'patch_size': hf_config['patch_size'], 'max_num_patches': hf_config['num_patches']})
  with open(os.path.join(folder, PREPROCESSOR), 'w') as f:
    json.dump({'image_processor_type': ('Siglip2ImageProcessor'
                                        if 'max_num_patches' in sizes else 'ViTImageProcessor'),
               'do_resize': True, **sizes, 'do_rescale': True, 'rescale_factor': 1 / 255,
               'do_normalize': True, 'image_mean': list(mean), 'image_std': list(std)},
              f, indent=2)
