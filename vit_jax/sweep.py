"""One-command ablation sweeps: train every row of a sweep recipe, then tabulate.

    python -m vit_jax.sweep --config configs/ablations.py:posemb --workdir DIR \
        [--config.dataset=cifar10 --config.image_size=32 ...]

    python -m vit_jax.sweep --config configs/quickstart_vit.py --workdir DIR --seeds 0,1,2

The recipe is a training recipe plus `sweep.name` and `sweep.rows`, (label,
fields) pairs in table order whose fields override the recipe's
(`sweep_rows.row_config`). Each row trains into
DIR/<label> with `training.train_and_evaluate` and leaves DIR/<label>/result.json
(test accuracy and loss, Park & Kim's ECE and Brier score); a row with a result is not trained again, and an interrupted one resumes from
its checkpoint; `--rows a,b` trains only those. DIR/<name>.md, DIR/<name>.csv
and DIR/<name>.png hold the table of every row with a result. `--seeds` trains
every row once per seed (`with_seeds`), a training recipe as the rows
DIR/seed<N>: the runs the analysis takes as one model
(`--workdir DIR/seed0,DIR/seed1,DIR/seed2`), its verdicts then holding training
randomness.
"""
import csv
import json
import os
import re
import time
from typing import Dict, List, Optional, Sequence, Tuple

import ml_collections
import numpy as np
from absl import flags

from vit_jax import entry, training
from vit_jax.cpu_devices import split_cpu_into_devices
from vit_jax.errors import ConfigError, WorkdirError
from vit_jax.files import atomic_write
from vit_jax.sweep_rows import recipe_row, row_config, seeded_label

RESULT = 'result.json'
ROW_PREFIX = 'row:'  # `pretrained='row:<label>'`: start from another row's trained parameters
ROW_LABEL = re.compile(r'[\w.%+=-]+')
CALIBRATION = ('eval_ece', 'eval_brier')  # Park & Kim's calibration metrics of each row


def checked_row(config: ml_collections.ConfigDict, label: str
                ) -> Tuple[ml_collections.ConfigDict, Optional[str]]:
  """The row's recipe (`row_config`) and the label of the row it starts from (its
  `pretrained` is 'row:<label>'), or None; a field the recipe lacks or a reference
  to no other row is a ConfigError.

  Args:
    config: the sweep recipe.
    label: the row.

  Returns:
    (the row's recipe, the row it starts from or None).
  """
  try:
    row = row_config(config, label)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if not (isinstance(row.pretrained, str) and row.pretrained.startswith(ROW_PREFIX)):
    return row, None
  source = row.pretrained[len(ROW_PREFIX):]
  if source not in dict(config.sweep.rows) or source == label:
    raise ConfigError(f'Sweep row {label!r} starts from {row.pretrained!r}, which is not '
                      'another row of the sweep.')
  return row, source


def run_row(config: ml_collections.ConfigDict, label: str, workdir: str) -> Dict:
  """Trains one row (unless it has a result of the same settings) and returns its
  result. A row whose `pretrained` is 'row:<label>' starts from that row's
  parameters, trained first. A result of other settings is refused, naming them.

  Args:
    config: the sweep recipe.
    label: the row.
    workdir: the sweep's directory.

  Returns:
    The row's result.
  """
  row, source = checked_row(config, label)
  if source is not None:
    row.pretrained = os.path.join(workdir, source, 'params.npz')
  path = os.path.join(workdir, label, RESULT)
  if os.path.exists(path):
    return _earlier_result(path, row, label, workdir)
  if source is not None:
    run_row(config, source, workdir)
  start = time.perf_counter()
  summary = training.train_and_evaluate(row, os.path.join(workdir, label))
  # A row's fields may hold ConfigDicts (a recipe's `model`): stored as plain JSON.
  fields = json.loads(json.dumps(dict(config.sweep.rows)[label], default=lambda o: o.to_dict()))
  result = {'label': label, 'fields': fields,
            **{k: summary[k] for k in ('eval_accuracy', 'eval_loss') + CALIBRATION},
            'wall_seconds': round(time.perf_counter() - start, 1)}
  with atomic_write(path) as f:
    json.dump(result, f, indent=1)
  return result


def _earlier_result(path: str, row: ml_collections.ConfigDict, label: str, workdir: str) -> Dict:
  """The result a row left, if it was trained with the settings it has now."""
  try:
    with open(path) as f:
      result = json.load(f)
    result['eval_accuracy']
  except (ValueError, KeyError, TypeError) as e:
    raise WorkdirError(f'{path} is not a sweep result ({type(e).__name__}: {e}); delete '
                       f'{os.path.dirname(path)} to train row {label!r} again.') from e
  recorded = training.recorded_settings(os.path.join(workdir, label))
  if recorded is not None:
    changed = training.recipe_differences(
        recorded, training.settings_of(training.check_settings(row)))
    if changed:
      raise WorkdirError(
          f'Sweep row {label!r} in {workdir} was trained with other settings '
          f'({"; ".join(changed)}). Use a new workdir for the changed recipe, or delete '
          f'{os.path.dirname(path)} to train that row again.')
  return result


def seeds_table(results: List[Dict]) -> List[str]:
  """Markdown lines summarising the runs of each recipe row trained with more than
  one seed: the mean test accuracy, the standard deviation between the seeds and
  the standard error of the mean (SD / sqrt(seeds)); none without such rows.

  Args:
    results: each row's result, in table order.

  Returns:
    The lines: a blank one, then the table.
  """
  groups: Dict[str, List[float]] = {}
  for r in results:
    if recipe_row(r['label']) != r['label']:
      groups.setdefault(recipe_row(r['label']) or '(recipe)', []).append(r['eval_accuracy'])
  groups = {row: accuracy for row, accuracy in groups.items() if len(accuracy) > 1}
  if not groups:
    return []
  lines = ['', '| row | seeds | test accuracy, mean | SD between seeds | SE of the mean |',
           '| --- | --- | --- | --- | --- |']
  for row, accuracy in groups.items():
    sd = float(np.std(accuracy, ddof=1))
    lines.append(f'| {row} | {len(accuracy)} | {100 * np.mean(accuracy):.2f}% | '
                 f'{100 * sd:.2f} points | {100 * sd / np.sqrt(len(accuracy)):.2f} points |')
  return lines


def write_table(name: str, results: List[Dict], workdir: str) -> List[str]:
  """The sweep's Markdown and CSV tables and its bar chart.

  Args:
    name: the sweep's name.
    results: each row's result.
    workdir: the sweep's directory.

  Returns:
    The files' paths.
  """
  paths = [os.path.join(workdir, f'{name}.{ext}') for ext in ('md', 'csv', 'png')]
  lines = [f'| {name} | fields | test accuracy | ECE | Brier | wall time |',
           '| --- | --- | --- | --- | --- | --- |']
  for r in results:
    fields = ', '.join(f'{k}={v}' for k, v in r['fields'].items()) or '(recipe)'
    # Rows trained before the evaluation measured calibration have no ECE and Brier.
    ece, brier = (f'{r[k]:.3f}' if k in r else '–' for k in CALIBRATION)
    lines.append(f"| {r['label']} | {fields} | {100 * r['eval_accuracy']:.1f}% | {ece} | "
                 f"{brier} | {r['wall_seconds'] / 60:.1f} min |")
  lines += seeds_table(results)
  with open(paths[0], 'w') as f:
    f.write('\n'.join(lines) + '\n')
  with open(paths[1], 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['label', 'fields', 'eval_accuracy', 'eval_loss', *CALIBRATION,
                     'wall_seconds'])
    for r in results:
      writer.writerow([r['label'], json.dumps(r['fields']), r['eval_accuracy'], r['eval_loss'],
                       *(r.get(k, '') for k in CALIBRATION), r['wall_seconds']])
  import matplotlib  # only where a figure is drawn
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt
  fig, ax = plt.subplots(figsize=(max(4, 0.7 * len(results)), 3.5))
  accuracy = [100 * r['eval_accuracy'] for r in results]
  ax.bar(range(len(results)), accuracy)
  ax.set_xticks(range(len(results)), [r['label'] for r in results], rotation=60, ha='right')
  ax.set_ylim(min(accuracy) - 2, max(accuracy) + 1)
  ax.set_ylabel('test accuracy (%)')
  ax.set_title(f'Sweep: {name}')
  fig.tight_layout()
  fig.savefig(paths[2], dpi=100)
  plt.close(fig)
  return paths


def with_seeds(config: ml_collections.ConfigDict, seeds: Sequence[int]
               ) -> ml_collections.ConfigDict:
  """The sweep that trains each row of `config` once per seed: rows '<row>.seed<N>'
  (a training recipe is one row: 'seed<N>') whose `seed` (initialisation, data
  order, dropout) is N, a row that starts from another row ('row:<label>')
  starting from that row's run of the same seed.

  Args:
    config: a sweep recipe, or a training recipe.
    seeds: the seeds.

  Returns:
    The sweep recipe.
  """
  if len(set(seeds)) < len(seeds) or not seeds:
    raise ConfigError(f'--seeds {",".join(map(str, seeds))}: give each seed once.')
  config = config.copy_and_resolve_references()
  name, rows = ((config.sweep.name, list(config.sweep.rows)) if 'sweep' in config
                else ('seeds', [('', {})]))
  seeded = []
  for label, fields in rows:
    for seed in seeds:
      fields_seed = dict(fields, seed=seed)
      source = fields_seed.get('pretrained')
      if isinstance(source, str) and source.startswith(ROW_PREFIX):
        fields_seed['pretrained'] = seeded_label(source, seed)
      seeded.append((seeded_label(label, seed), fields_seed))
  with config.unlocked():
    config.sweep = ml_collections.ConfigDict({'name': name, 'rows': seeded})
  return config


def chosen_rows(name: str, labels: Sequence[str], rows: Optional[Sequence[str]]) -> List[str]:
  """The rows of a sweep that `rows` (`--rows`) names: each row by its label, and
  a row of a sweep trained once per seed (`with_seeds`) also by its recipe's label,
  'vit-6%' for 'vit-6%.seed0', 'vit-6%.seed1', ...

  Args:
    name: the sweep's name.
    labels: the sweep's row labels, in table order.
    rows: the names given, or None for every row.

  Returns:
    The labels chosen, in table order.

  Raises:
    ConfigError: a name that is no row of the sweep.
  """
  if not rows:
    return list(labels)
  unknown = [row for row in rows if row not in labels
             and not any(row == recipe_row(label) for label in labels)]
  if unknown:
    recipe_rows = list(dict.fromkeys(recipe_row(label) or label for label in labels))
    raise ConfigError(f'--rows names {", ".join(unknown)}, not a row of sweep {name!r}; its '
                      f'rows: {", ".join(recipe_rows)}.')
  return [label for label in labels if label in rows or recipe_row(label) in rows]


def run_sweep(config: ml_collections.ConfigDict, workdir: str,
              rows: Optional[Sequence[str]] = None) -> List[Dict]:
  """Every row of `config.sweep` in order (or only those named in `rows`), then the
  tables of every row that has a result.

  Args:
    config: the sweep recipe.
    workdir: the sweep's directory.
    rows: the rows to train, or None for all.

  Returns:
    The results of the rows trained.
  """
  if 'sweep' not in config:
    raise ConfigError('The recipe has no `sweep` field: give a sweep recipe such as '
                      'configs/ablations.py:posemb.')
  labels = [label for label, _ in config.sweep.rows]
  for label in labels:
    if not ROW_LABEL.fullmatch(label) or set(label) == {'.'}:
      raise ConfigError(f'Sweep row label {label!r} is not a plain directory name (letters, '
                        'digits and . _ % + = -): each row trains in <workdir>/<label>.')
  repeated = sorted({label for label in labels if labels.count(label) > 1})
  if repeated:
    raise ConfigError(f'Sweep {config.sweep.name!r} has more than one row labelled '
                      f'{", ".join(repeated)}: each row trains in <workdir>/<label>, so give '
                      'each a label of its own.')
  for label in labels:  # every row's fields and references, before any row trains
    checked_row(config, label)
  chosen = chosen_rows(config.sweep.name, labels, rows)
  os.makedirs(workdir, exist_ok=True)
  results = [run_row(config, label, workdir) for label in labels
             if label in chosen or os.path.exists(os.path.join(workdir, label, RESULT))]
  for path in write_table(config.sweep.name, results, workdir):
    print(f'wrote {path}', flush=True)
  return results


FLAGS = flags.FLAGS


def main(argv: Sequence[str]) -> None:
  """Trains the rows of the sweep recipe into --workdir and writes its tables.

  Args:
    argv: the command line's arguments that are no flags (none).
  """
  del argv
  config = FLAGS.config
  if FLAGS.seeds:
    try:
      seeds = [int(seed) for seed in FLAGS.seeds]
    except ValueError:
      raise ConfigError(f'--seeds={",".join(FLAGS.seeds)}: give whole numbers, e.g. '
                        '--seeds=0,1,2.') from None
    if min(seeds) < 0 or len(set(seeds)) < len(seeds):
      raise ConfigError(f'--seeds={",".join(FLAGS.seeds)}: give each seed once, each 0 or more '
                        '(the data order and initialisation draw from it), e.g. --seeds=0,1,2.')
    config = with_seeds(config, seeds)
  split_cpu_into_devices(config, FLAGS.cpu_devices, 1)
  run_sweep(config, FLAGS.workdir, FLAGS.rows)


if __name__ == '__main__':
  entry.define_recipe_flag('config', 'Sweep recipe, e.g. configs/ablations.py:posemb.')
  flags.DEFINE_string('workdir', None, 'Where each row trains (DIR/<row>) and the tables go.')
  flags.DEFINE_integer('cpu_devices', 0, 'As in vit_jax.train.')
  flags.DEFINE_list('rows', None, 'Train only these rows (labels, comma-separated; with '
                    '--seeds, a row\'s label names its run of every seed); the tables hold every '
                    'row with a result.')
  flags.DEFINE_list('seeds', None, 'Train every row once per seed (initialisation, data '
                    'order, dropout), as rows <row>.seed<N>; a training recipe as --config '
                    'trains into <workdir>/seed<N>.')
  flags.mark_flags_as_required(['config', 'workdir'])
  entry.run(main)
