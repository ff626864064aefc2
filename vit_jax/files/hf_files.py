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
import math
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from safetensors.numpy import save as safetensors_bytes

from vit_jax import models
from vit_jax.files import run_folder
from vit_jax.files.atomic import atomic_write
from vit_jax.files.layout import flatten, published, published_float32
from vit_jax.files.timm_files import (published_from_timm, read_state_dict, safetensors_header,
                                      state_dict_shapes)
from vit_jax.models.family import CheckpointError, Family, Flat

CONFIG = 'config.json'
PREPROCESSOR = 'preprocessor_config.json'
WEIGHTS = 'model.safetensors'
CARD = 'README.md'  # the model card `vit_jax.export` writes beside the model
WRITTEN = (WEIGHTS, CONFIG, PREPROCESSOR, CARD)  # every file a folder written here holds
# model.safetensors' metadata: `format` as transformers reads it, `writer` the mark of a
# folder this project wrote (and may write again).
METADATA = {'format': 'pt', 'writer': 'vit_jax'}


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
  # The processor's other steps, honoured (normalising) or refused by name: these
  # models take pixels rescaled by 1/255 to [0, 1], then normalised.
  if pre.get('do_rescale', True) is not True or not math.isclose(
      pre.get('rescale_factor', 1 / 255), 1 / 255, rel_tol=1e-6):
    raise CheckpointError(f'{path} sets do_rescale {pre.get("do_rescale", True)!r} and '
                          f'rescale_factor {pre.get("rescale_factor", 1 / 255)!r}: these models '
                          'take pixels rescaled by 1/255, and have no field for another scale.')
  if pre.get('do_normalize', True) is False:  # pixels in [0, 1] as they are
    return dict(pixel_mean=(0.,) * 3, pixel_std=(1.,) * 3)
  given = [k for k in ('image_mean', 'image_std') if k in pre]
  if len(given) == 1:
    raise CheckpointError(f'{path} gives {given[0]} without '
                          f'{({"image_mean", "image_std"} - set(given)).pop()}, whose default '
                          "is its processor class's: add it to the file.")
  if not given:
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


def read(folder: str, weights: str) -> Tuple[ml_collections.ConfigDict, Flat]:
  """A `transformers` folder as (its model's config, flat parameters in the
  published layout).

  Args:
    folder: the folder (`is_folder`).
    weights: its weights file (`checkpoint.weights_file`).

  Returns:
    (the zoo config of the folder's model, its parameters).

  Raises:
    CheckpointError: a model type, or a field of it, that the project cannot express.
  """
  family, name, fields, hf_config = _described(folder)  # checked before the weights are read
  config = models.get_config(name, **fields)
  timm_state, extra, weight_fields = _as_timm(family, config, hf_config,
                                              read_state_dict(weights))
  flat = published_from_timm(timm_state, config)
  return models.with_fields(config, **weight_fields), {**flat, **extra}


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
  family, name, fields, hf_config = _described(folder)
  _, _, weight_fields = _as_timm(family, models.get_config(name, **fields), hf_config,
                                 state_dict_shapes(weights))
  return name, {k: v for k, v in {**fields, **weight_fields}.items() if k not in HEAD_FIELDS}


def _described(folder: str) -> Tuple[Family, str, Dict[str, Any], Dict[str, Any]]:
  """The folder's family, zoo name and fields from its `config.json` and
  `preprocessor_config.json`, each checked, and the `config.json`."""
  config = _json(os.path.join(folder, CONFIG))
  family = _family(folder, config)
  fields = family.transformers_fields(config)
  pixels = _pixel_fields(folder)
  name = _zoo_name(family, fields)
  if pixels and 'pixel_mean' not in models.get_config(name):
    _check_unit_range(folder, pixels)  # a family without pixel statistics reads [-1, 1]
    pixels = {}
  return family, name, {**fields, **pixels}, config


def _as_timm(family: Family, config: ml_collections.ConfigDict, hf_config: Mapping[str, Any],
             state: Mapping[str, Any]) -> Tuple[Dict[str, Any], Flat, Dict[str, Any]]:
  """The folder's weights under timm's names, the parameters timm has no place for,
  and the fields the weights fix (the head, the classes, ...: `Family.timm_fields`,
  as a timm file's do, but the image size). A classifier (`architectures` naming
  one) whose weights hold no head is refused: `from_pretrained` would start one at
  random; so are an `image_size` other than the position embeddings', and labels
  of another number than the head's outputs, which it refuses (a size mismatch)."""
  timm_state, extra, extra_fields = family.from_transformers(state, hf_config)
  fixed = family.timm_fields(timm_state, config)
  held = fixed.pop('image_size')
  written = hf_config.get('image_size')
  if ('pos_embed' in timm_state and isinstance(written, int) and not isinstance(written, bool)
      and written != held and 'num_patches' not in hf_config):  # SigLIP 2's: num_patches'
    raise CheckpointError(f'The config.json gives image_size {written}, and the position '
                          f'embeddings are those of {held} px images: transformers refuses '
                          'the folder (a size mismatch); set image_size to the one it was '
                          'saved with.')
  classifiers = [a for a in hf_config.get('architectures') or ()
                 if isinstance(a, str) and a.endswith('ForImageClassification')]
  # transformers' number of labels: id2label's, else num_labels, else its default of 2.
  labels = hf_config.get('id2label')
  outputs = len(labels) if isinstance(labels, dict) else hf_config.get('num_labels', 2)
  if classifiers and outputs and not fixed.get('num_classes'):
    raise CheckpointError(f'The config.json names {classifiers[0]}, and the weights hold no '
                          'classifier, which transformers would start at random: the folder '
                          'is damaged or incomplete; download it again.')
  if classifiers and fixed.get('num_classes') and outputs != fixed['num_classes']:
    raise CheckpointError(f"The config.json gives {outputs} labels (id2label's, else "
                          f"num_labels), and the classifier has {fixed['num_classes']} "
                          'outputs: transformers refuses the folder (a size mismatch); give '
                          'one label per output.')
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
    labels: the classes' names, one per output of a classifier's head, for its
      `id2label` (LABEL_<i> if None).
    model_type: the `model_type` to write where the model can be more than one
      (a SigLIP tower as 'siglip2_vision_model'); None, the one its fields make.

  Returns:
    (config.json, the weights).

  Raises:
    CheckpointError: a model its family cannot write for transformers (a family
      without `to_transformers`, or a field it names); names of another number
      than the head's outputs.
  """
  family = models.family_of(config)
  if family.to_transformers is None:
    raise CheckpointError(f'{config.name} is not written for transformers: only '
                          f'{", ".join(f.title for f in models.FAMILIES.values() if f.to_transformers)} '
                          'models are.')
  hf_config, state = family.to_transformers(published_float32(params), config, image_size,
                                            model_type)
  if labels is not None and 'id2label' in hf_config:
    if len(labels) != len(hf_config['id2label']):
      raise CheckpointError(f'{len(labels)} classes\' names were given for a head of '
                            f'{len(hf_config["id2label"])} outputs: give one name per output.')
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
  zeros = {k: np.zeros(s.shape, s.dtype) for k, s in _shapes(config, image_size).items()}
  converted(zeros, config, image_size)


def _shapes(config: ml_collections.ConfigDict, image_size: int) -> Dict[str, Any]:
  """The published parameters' shapes of `config`'s model on images of `image_size`
  pixels, nothing computed."""
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)
  images = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
  return published(flatten(jax.eval_shape(models.build_model(config).init, key, images)))


def _check_image_size(params: Flat, config: ml_collections.ConfigDict, image_size: int) -> None:
  """Refuses an image size the parameters (a ViT's position embeddings) were not
  made for, which `transformers` would refuse to load."""
  expected = _shapes(config, image_size)
  misshaped = [f'{k} {tuple(np.shape(v))} (at {image_size} px: {tuple(expected[k].shape)})'
               for k, v in params.items() if k in expected and np.shape(v) != expected[k].shape]
  if misshaped:
    raise CheckpointError(f'The parameters are not those of a {config.name} on {image_size} px '
                          f'images: {", ".join(misshaped[:3])}; give the image size the model '
                          'was made for.')


def claim_folder(folder: str, reads: Sequence[str] = ()) -> None:
  """Refuses, before any work, a folder `write` would write over something it did
  not make: a file, a training run, a model it reads from (`reads`), files a
  `transformers` folder written here does not hold (`WRITTEN`), or a
  `transformers` model written elsewhere (its `model.safetensors` without this
  project's mark, `METADATA`). A missing or empty folder, or one written here
  before, is taken.

  Args:
    folder: the folder to write.
    reads: the files and folders the writing reads (a run's workdir, the model it
      was fine-tuned from): none may be the folder or lie in it.

  Raises:
    CheckpointError: saying what the folder holds and what to do.
  """
  real = os.path.realpath(folder)
  for path in filter(None, reads):  # a workdir to be made is refused as one that is there
    if real == os.path.realpath(path) or (
        os.path.isfile(path) and real == os.path.dirname(os.path.realpath(path))):
      raise CheckpointError(f'{folder} is or holds {path}, which this writing reads: give a new '
                            'or empty folder.')
  if not os.path.exists(folder):
    return
  if not os.path.isdir(folder):
    raise CheckpointError(f'{folder} is a file, not a folder: give a new or empty folder to '
                          'write the transformers model into.')
  names = sorted(os.listdir(folder))
  ours = WEIGHTS in names and _written_here(os.path.join(folder, WEIGHTS))
  theirs = f'{folder} holds a transformers model this project did not write: give a new or ' \
           'empty folder.'
  if WEIGHTS in names and not ours:
    raise CheckpointError(theirs)
  if not ours and run_folder.is_run(folder):  # a run records its settings in a config.json too
    raise CheckpointError(f'{folder} holds a training run: give a new or empty folder, not a '
                          'workdir.')
  foreign = [n for n in names if n not in WRITTEN]
  if foreign:
    raise CheckpointError(f'{folder} holds files a transformers folder written here does not '
                          f'({", ".join(foreign[:5])}{", ..." if len(foreign) > 5 else ""}): '
                          'give a new or empty folder.')
  if names and not ours:
    raise CheckpointError(theirs)


def _written_here(weights: str) -> bool:
  """Whether a `model.safetensors` bears this project's mark (`METADATA`)."""
  try:
    metadata = safetensors_header(weights)[0].get('__metadata__')
  except CheckpointError:
    return False
  return isinstance(metadata, dict) and metadata.get('writer') == METADATA['writer']


def write(folder: str, params: Mapping[str, Any], config: ml_collections.ConfigDict,
          image_size: int, labels: Optional[Sequence[str]] = None,
          model_type: Optional[str] = None, reads: Sequence[str] = ()) -> None:
  """Writes a model as a `transformers` folder that `transformers` loads with the
  same outputs (`converted`): `config.json`, `model.safetensors` and
  `preprocessor_config.json`, each written whole or not at all.

  Args:
    folder: the folder to write (made if missing; refused where it holds what
      this did not write: `claim_folder`).
    params: the model's parameters.
    config: its model config (`models.get_config`).
    image_size: the images' side in pixels (that of the parameters' position
      embeddings, where the model has them).
    labels: the classes' names, one per output of the head (LABEL_<i> if None).
    model_type: as `converted`.
    reads: as `claim_folder`.

  Raises:
    CheckpointError: as `converted` and `claim_folder`; parameters of another
      image size, or names of another number than the head's outputs; before
      anything is written.
  """
  claim_folder(folder, reads)
  hf_config, state = converted(params, config, image_size, labels, model_type)
  _check_image_size(published(flatten(params)), config, image_size)
  os.makedirs(folder, exist_ok=True)
  with atomic_write(os.path.join(folder, WEIGHTS), 'wb') as f:
    f.write(safetensors_bytes({k: np.ascontiguousarray(v, np.float32) for k, v in state.items()},
                              metadata=METADATA))
  with atomic_write(os.path.join(folder, CONFIG)) as f:
    json.dump(hf_config, f, indent=2)
  mean = config.get('pixel_mean') or (0.5,) * 3  # none: [-1, 1] images, mean and std 0.5
  std = config.get('pixel_std') or (0.5,) * 3
  # SigLIP 2's processor cuts each image into at most the tower's grid of patches.
  sizes = ({'size': {'height': image_size, 'width': image_size}}
           if hf_config['model_type'] != 'siglip2_vision_model' else
           {'patch_size': hf_config['patch_size'], 'max_num_patches': hf_config['num_patches']})
  with atomic_write(os.path.join(folder, PREPROCESSOR)) as f:
    json.dump({'image_processor_type': ('Siglip2ImageProcessor'
                                        if 'max_num_patches' in sizes else 'ViTImageProcessor'),
               'do_resize': True, **sizes, 'do_rescale': True, 'rescale_factor': 1 / 255,
               'do_normalize': True, 'image_mean': list(mean), 'image_std': list(std)},
              f, indent=2)
