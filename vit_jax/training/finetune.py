"""Fine-tuning's start: the parameters a run starts from (a checkpoint fitted to the
run's model, `files.load_pretrained`, or fresh ones), the model a recipe takes from a
`transformers` folder or a recorded run, and what is wrong with a recipe's
`pretrained` before any work."""
import os
from typing import Any, Mapping, Optional

import ml_collections

from vit_jax import files, models
from vit_jax.files import Params
from vit_jax.models.family import CheckpointError
from vit_jax.training import settings, steps
from vit_jax.training import workdir as workdirs


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
          and files.is_transformers_folder(path)):
    return None
  name, fields = files.transformers_model(path, files.weights_file(path))
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
  if path.startswith(files.AUGREG_PREFIX):
    try:
      path, row = files.augreg_lookup(path[len(files.AUGREG_PREFIX):], config.augreg_dir)
    except CheckpointError as e:
      return str(e)
    expected = files.augreg_model_name(row['name'])
    if expected != config.model_name:
      return (f'{config.pretrained} is a {expected} checkpoint but the recipe builds '
              f'{config.model_name}; set --config.model_name={expected}.')
  if '://' in path or os.path.exists(path):
    return None
  return (f'the pretrained checkpoint {path} does not exist. {files.WHERE_PUBLIC}; download '
          'one and set --config.pretrained=<path>, or --config.pretrained=None to train from '
          'scratch.')


def initial_params(config: ml_collections.ConfigDict, num_classes: int) -> Params:
  """The parameters a run of `config` starts from (`steps.build`'s `params`): fresh
  ones from its seed, with `config.pretrained`, when it names a checkpoint, read and
  fitted to the model once (`files.load_pretrained`: the new head, the resized grid).
  `pretrained` is checked once, before any work, by the run's `loop.check_inputs`
  (`missing_pretrained`); here a file that is not there is refused as `files.read`
  refuses it.

  Args:
    config: the recipe (seed, image_size, pretrained, augreg_dir, keep_head).
    num_classes: the data's classes.

  Returns:
    The parameters.

  Raises:
    CheckpointError: `config.pretrained` cannot be read or fitted to the model.
  """
  model_cfg = steps.model_config(config, num_classes)
  params = steps.init_params(config, models.build_model(model_cfg), config.image_size)
  if not config.pretrained:
    return params
  return files.load_pretrained(files.augreg_resolve(config.pretrained, config.augreg_dir), params,
                               model_cfg, keep_head=config.keep_head)
