"""The rows of a sweep recipe: a training recipe plus `sweep.name` and
`sweep.rows`, (label, fields) pairs whose fields override the recipe's.
Imports no TensorFlow, so the analysis can read a row's recipe."""
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
