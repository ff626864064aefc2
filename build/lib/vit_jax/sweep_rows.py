"""The rows of a sweep recipe: a training recipe plus `sweep.name` and
`sweep.rows`, (label, fields) pairs whose fields override the recipe's.
Imports no TensorFlow, so the analysis can read a row's recipe."""
import re

import ml_collections


def row_config(config: ml_collections.ConfigDict, label: str) -> ml_collections.ConfigDict:
  """The training recipe of one row: the sweep's recipe with the row's fields.

  A row's dict field (`model`) updates the recipe's field by field, unless the
  row also names another `model_name`, whose architecture fields then replace
  the recipe's whole. Unknown fields are an error naming them.

  Args:
    config: the sweep recipe.
    label: the row.

  Returns:
    The row's recipe.
  """
  fields = dict(config.sweep.rows)[label]
  row = ml_collections.ConfigDict(
      {k: v for k, v in config.copy_and_resolve_references().to_dict().items() if k != 'sweep'})
  unknown = sorted(set(fields) - set(row))
  if unknown:
    raise ValueError(f'Sweep row {label!r} sets {unknown}, which the recipe does not have.')
  for key, value in fields.items():
    if key == 'model' and fields.get('model_name', row.model_name) == row.model_name:
      row.model.update(value)
    else:
      row[key] = value
  return row


def seeded_label(label: str, seed: int) -> str:
  """The label of a row's run of one seed (`vit_jax.sweep --seeds`): 'vit-6%.seed1',
  or 'seed1' for a training recipe (label '').

  Args:
    label: the recipe's row.
    seed: the seed.

  Returns:
    The run's row label.
  """
  return f'{label}.seed{seed}' if label else f'seed{seed}'


def recipe_row(label: str) -> str:
  """The recipe's row of a row trained once per seed (`seeded_label`): 'vit-6%' for
  'vit-6%.seed1', '' for a training recipe's 'seed1'; any other label itself.

  Args:
    label: a sweep row's label.

  Returns:
    The recipe's row.
  """
  return re.sub(r'(^|\.)seed\d+$', '', label)
