"""A finished run as a Hugging Face `transformers` folder with a model card:

    python -m vit_jax.export --workdir DIR --out FOLDER

or `python -m vit_jax.train ... --export_transformers FOLDER` at the end of
training. The folder holds `hf_files.write`'s `config.json`, `model.safetensors`
and `preprocessor_config.json` (the classes' names from the run's data), and a
`README.md`: the recipe, the data, the steps and the evaluation of the run's
`results.json`.
"""
import json
import os
from typing import Any, Mapping, Sequence

import ml_collections
from absl import flags

from vit_jax import entry, files, training
from vit_jax.errors import UserError
from vit_jax.files import atomic_write

FLAGS = flags.FLAGS


def transformers_folder(run: str, folder: str) -> str:
  """Writes the finished run in `run` as a `transformers` folder with its model card.

  Args:
    run: the run's workdir (its config.json, data.json, params.npz and results.json).
    folder: the folder to write (made if missing; one that holds what an export
      did not write is refused: `hf_files.claim_folder`).

  Returns:
    The model card's path.

  Raises:
    UserError: a run that has not finished, or whose files are missing, named
      before anything is written; a model `transformers` cannot express, or a
      folder it may not write (`hf_files.write`'s CheckpointError).
  """
  results_path = os.path.join(run, files.RESULTS)
  params_path = os.path.join(run, 'params.npz')
  for path in (results_path, params_path):
    if not os.path.isfile(path):
      raise UserError(f'{path} is missing: the run in {run} has not finished. Finish it (the '
                      'same training command) before exporting it.')
  settings = training.recorded_settings(run)
  if settings is None:
    raise UserError(f'{run} holds no {files.RECORD}, the recipe of its run: it is not a '
                    'workdir of the training command.')
  recipe = ml_collections.ConfigDict(settings)
  reads = (run, recipe.get('pretrained'))
  files.claim_transformers_folder(folder, reads)
  data = training.recorded_data(run) or {}
  labels = (data.get('train') or {}).get('classes')
  if not labels:
    raise UserError(f'{run} records no classes of its training data ({files.DATA}): its '
                    'head\'s classes are not known. Rerun the training command in it to record '
                    'them.')
  try:
    with open(results_path) as f:
      results = json.load(f)
  except ValueError as e:
    raise UserError(f'{results_path} is not readable JSON ({e}): restore it, or rerun the '
                    'training command in the workdir to write it again.') from e
  if not isinstance(results, dict):
    raise UserError(f'{results_path} holds no JSON object: rerun the training command in the '
                    'workdir to write it again.')
  # The run's model: one output per class of its training data, as the loop builds it.
  config = training.model_config(recipe, len(labels))
  files.write_transformers(folder, files.load(params_path), config, recipe.image_size, labels,
                           reads=reads)
  with open(os.path.join(folder, files.TRANSFORMERS_CONFIG)) as f:
    architecture = json.load(f)['architectures'][0]
  path = os.path.join(folder, files.TRANSFORMERS_CARD)
  with atomic_write(path) as f:
    f.write(model_card(recipe, data, results, architecture))
  return path


def check_recipe(recipe: ml_collections.ConfigDict, run: str, folder: str) -> None:
  """Refuses, before training, a recipe whose model `transformers_folder` could not
  write (`hf_files.check_writable`; the classes do not matter here), or a folder it
  may not write into (`hf_files.claim_folder`: the run's workdir, the model it
  fine-tunes from, files an export does not write). It traces the model, which
  starts JAX's backend: call it once the devices are set.

  Args:
    recipe: the training recipe.
    run: its workdir.
    folder: the folder the run is to be exported to.

  Raises:
    CheckpointError: naming what transformers cannot express, or what the folder
      holds.
  """
  files.claim_transformers_folder(folder, reads=(run, recipe.get('pretrained')))
  files.check_transformers_writable(training.model_config(recipe, 2), recipe.image_size)


def model_card(recipe: Mapping[str, Any], data: Mapping[str, Any],
               results: Mapping[str, Any], architecture: str) -> str:
  """The model card of a run: what trained it, on what, for how long, how it
  scored on its evaluation split, and how `transformers` loads it.

  Args:
    recipe: the run's recorded recipe.
    data: its recorded data (split -> identity), or empty.
    results: its results.json.
    architecture: the `transformers` class it is written as.

  Returns:
    The card's Markdown.
  """
  train, evaluation = data.get('train') or {}, data.get('eval') or {}
  model_fields = ', '.join(f'{k}={v}' for k, v in sorted(dict(recipe.get('model') or {}).items()))
  accuracy = results.get('eval_accuracy')
  lines = [
      '---', 'library_name: transformers', 'tags:', '- image-classification', '- vit_jax',
      '---', '', f'# {recipe["model_name"]} trained with vit_jax', '',
      '| | |', '| --- | --- |',
      f'| model | {recipe["model_name"]}' + (f' ({model_fields})' if model_fields else '') + ' |',
      f'| data | {_split_line(recipe, train, "train_split")} |',
      f'| image size | {recipe["image_size"]} px |',
      f'| training | {results.get("step")} of {results.get("total_steps")} steps of '
      f'{recipe["batch_size"]} images, learning rate {recipe["lr"]} ({recipe["decay"]} '
      'schedule) |',
      f'| evaluation | {_split_line(recipe, evaluation, "eval_split")} |',
      '| accuracy | ' + (f'{100 * accuracy:.2f}% on {results.get("eval_examples")} images, loss '
                         f'{results.get("eval_loss"):.4f}' if accuracy is not None
                         else 'not evaluated') + ' |',
      '', 'Load it with `transformers`:', '', '```python',
      f'from transformers import {architecture}',
      f'model = {architecture}.from_pretrained(FOLDER)',
      '```', '',
      'or here: `vit_jax.checkpoint.from_pretrained(FOLDER)`.', '']
  return '\n'.join(lines)


def _split_line(recipe: Mapping[str, Any], split: Mapping[str, Any], field: str) -> str:
  """'<dataset> <split>, <n> images, <k> classes' from the recorded data."""
  name = split.get('name') or recipe.get('dataset')
  parts = [f'{name} {split.get("split") or recipe.get(field)}']
  if split.get('examples') is not None:
    parts.append(f'{split["examples"]} images')
  if split.get('classes'):
    parts.append(f'{len(split["classes"])} classes')
  return ', '.join(parts)


def define_flags() -> None:
  """The command-line flags; defined only when run as a program."""
  flags.DEFINE_string('workdir', None, 'The finished run to export.')
  flags.DEFINE_string('out', None, 'The transformers folder to write.')
  flags.mark_flags_as_required(['workdir', 'out'])


def main(argv: Sequence[str]) -> None:
  """Exports --workdir's run to --out.

  Args:
    argv: the command line's arguments that are no flags (none).
  """
  del argv
  print(f'wrote {transformers_folder(FLAGS.workdir, FLAGS.out)} and the model beside it')


if __name__ == '__main__':
  define_flags()
  entry.run(main, config_flags=(), fields=False)
