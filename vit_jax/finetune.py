"""Fine-tuning's start: a checkpoint fitted to a new model (a new head, position
embeddings resized to a new grid: `Family.fit`), and what is wrong
with a recipe's `pretrained` before any work."""
import os
from typing import Any, Mapping, Optional, Sequence

import ml_collections
import numpy as np

from vit_jax import augreg, checkpoint, hf_files, models, settings, steps
from vit_jax import workdir as workdirs
from vit_jax.layout import Params, check_matches, flatten, non_finite, unflatten
from vit_jax.models.family import CheckpointError


def load_pretrained(path: str, init_params: Mapping[str, Any], model_config: Any,
                    grid_shape: Optional[Sequence[int]] = None, keep_head: bool = False
                    ) -> Params:
  """Parameters for fine-tuning: the checkpoint at `path` fitted to a new model.

  `init_params` are the new model's freshly initialised parameters and
  `model_config` its config (`vit_jax.models.get_config`); `path` is an `.npz`
  or a timm state dict of that model (`checkpoint.load`). The head is taken
  from `init_params`; the family fits the rest (`Family.fit`, its named rules: for a
  ViT, `pre_logits` dropped without a representation size and position
  embeddings resized to the new grid, `grid_shape` inferred when square).
  Anything else that differs raises a CheckpointError listing missing,
  unexpected and wrongly shaped keys, and so does an array the new model takes
  from the checkpoint with NaN or infinity. `keep_head` keeps the checkpoint's head
  instead (a second stage of fine-tuning on the same classes).

  Args:
    path: the checkpoint (`.npz`, or a timm file of the same model).
    init_params: the new model's initialised parameters.
    model_config: the new model's config.
    grid_shape: the new patch grid, when not square.
    keep_head: keep the checkpoint's head instead of the new one.

  Returns:
    The new model's parameters, in its dtypes.
  """
  if hf_files.is_folder(str(path)):
    hf_files.check_fits(str(path), model_config)
  fields = {k: v for k, v in model_config.items() if k not in ('family', 'name', 'num_classes')}
  restored = checkpoint.read(path, model_config.name, **fields)  # fields: for a timm file
  init = flatten(init_params)
  restored = models.family_of(model_config).fit(restored, init, model_config, grid_shape,
                                                str(path), keep_head)
  broken = non_finite(restored)
  if broken:
    raise CheckpointError(
        f'{path} holds NaN or infinity in {len(broken)} array(s), first {broken[0]}: it is '
        'damaged or from a diverged run; fine-tune from another checkpoint.')
  check_matches(restored, init, str(path))
  return unflatten({k: np.asarray(v, dtype=init[k].dtype) for k, v in restored.items()})


def take_folder_model(config: ml_collections.ConfigDict, path: Optional[str]) -> Optional[str]:
  """Makes the recipe's model the model of the `transformers` folder that `path`
  (its `pretrained`, as the command line sets it) names, so that one command
  fine-tunes from any such folder: the folder's zoo name becomes `model_name`, and
  its fields (sizes, patch, activation, LayerNorm epsilon, registers, LayerScale,
  pooling, pixel statistics: `hf_files.model_of`) replace the recipe's in `model`.
  The recipe's other model fields of that family (dropout, dtype, ...) stay; the
  head is the data's. A field set on the command line (`--config.model.FIELD`) is
  set after this, and one that differs from the folder's is refused when the
  weights are fitted (`hf_files.check_fits`). Nothing changes for any other `pretrained`.

  Args:
    config: the recipe, changed in place.
    path: its `pretrained`.

  Returns:
    The folder's zoo name, or None where `pretrained` names no such folder.

  Raises:
    CheckpointError: the folder holds a model the project cannot express.
  """
  if not (isinstance(path, str) and 'pretrained' in config and 'model_name' in config
          and isinstance(config.get('model'), ml_collections.ConfigDict)
          and hf_files.is_folder(path)):
    return None
  name, fields = hf_files.model_of(path, checkpoint.weights_file(path))
  family_fields = models.get_config(name)
  kept = {k: v for k, v in config.model.items() if k in family_fields and k not in fields}
  set_model(config, name, {**kept, **fields})
  return name


def set_model(config: ml_collections.ConfigDict, name: str, fields: Mapping[str, Any]) -> None:
  """Makes the recipe's model `name` with these fields, each typed as a recipe's.

  Args:
    config: the recipe, changed in place.
    name: a zoo name.
    fields: its model fields.
  """
  model = ml_collections.ConfigDict()
  for field, value in fields.items():
    model[field] = settings.model_field_value(value)
  with config.unlocked():
    config.model_name = name
    config.model = model


def take_recorded_model(config: ml_collections.ConfigDict, path: Optional[str],
                        workdir: Optional[str]) -> bool:
  """Makes the recipe's model the one `workdir`'s run recorded, where `pretrained`
  names a folder that is gone and the run was fine-tuned from it: the run goes on
  from its own checkpoint (`loop.resumes_without_pretrained`) with the model the
  folder gave it.

  Args:
    config: the recipe, changed in place.
    path: its `pretrained`.
    workdir: the run's directory, or None.

  Returns:
    Whether the recorded model was taken.
  """
  if not (isinstance(path, str) and path and '://' not in path and not os.path.exists(path)
          and workdir and os.path.isdir(workdir) and 'model_name' in config):
    return False
  recorded = workdirs.recorded_settings(workdir)
  if not (recorded and recorded.get('pretrained') == path and 'model_name' in recorded
          and isinstance(recorded.get('model'), dict)):
    return False
  set_model(config, recorded['model_name'], recorded['model'])
  return True


def missing_pretrained(config: ml_collections.ConfigDict) -> Optional[str]:
  """What is wrong with a recipe's `pretrained`, found in seconds.

  Args:
    config: the recipe.

  Returns:
    None when it is fine (or empty); else a sentence: an AugReg name that the
    index does not resolve or that is another model than the recipe's, or a
    local file that is not there.
  """
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
  return (f'the pretrained checkpoint {path} does not exist. {checkpoint.WHERE_PUBLIC}; download '
          'one and set --config.pretrained=<path>, or --config.pretrained=None to train from '
          'scratch.')


def initial_params(config: ml_collections.ConfigDict, num_classes: int) -> Params:
  """The parameters a run of `config` starts from (`steps.build`'s `params`): fresh
  ones from its seed, with `config.pretrained`, when it names a checkpoint, read and
  fitted to the model once (`load_pretrained`: the new head, the resized grid).

  Args:
    config: the recipe (seed, image_size, pretrained, augreg_dir, keep_head).
    num_classes: the data's classes.

  Returns:
    The parameters.

  Raises:
    steps.TrainingError: `config.pretrained` cannot be read (`missing_pretrained`).
  """
  model_cfg = steps.model_config(config, num_classes)
  params = steps.init_params(config, models.build_model(model_cfg), config.image_size)
  if not config.pretrained:
    return params
  problem = missing_pretrained(config)
  if problem:
    raise steps.TrainingError(problem)
  return load_pretrained(augreg.resolve(config.pretrained, config.augreg_dir), params, model_cfg,
                         keep_head=config.keep_head)
