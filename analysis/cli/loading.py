"""The models an analysis request names, loaded as subjects (`load_models`): a
recipe's model from a workdir or checkpoint, the runs (seeds) of one recipe, the rows
of a sweep, a second model, each at the steps its run kept.
"""
import glob
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import ml_collections

from analysis.cli.request import Request
from analysis.runtime import features
from vit_jax import files, sweep_rows, training
from vit_jax.errors import ConfigError, WorkdirError

Loaded = Tuple[features.Subject, str, Optional[str]]  # the model, its source, its workdir


def load_models(request: Request) -> Tuple[List[Loaded], Dict[str, Tuple[str, int]],
                                            Dict[str, str]]:
  """The models the request names, each labelled once: a recipe's model, the
  seeds' runs of one (`--workdir A,B`), a sweep's rows (`--rows`, `--seeds`), a
  second model, each at `--steps`.

  Args:
    request: the analysis.

  Returns:
    ((subject, source, workdir) of each model, each run's (model, seed) by label
    for models given as several runs, each model's training workdir by label).
  """
  groups = {}  # a run of a model given as several workdirs -> (the model, its seed)
  if request.rows:
    if 'sweep' not in request.config or request.workdir is None or any(
        getattr(request, f) is not None for f in ('row', 'checkpoint', 'config2')):
      raise ConfigError('--rows takes a sweep recipe as --config and the sweep\'s directory '
                        'as --workdir, without --row, --checkpoint or a second model.')
    loaded = [run for row in request.rows
              for run in _runs(request, request.config,
                               _row_runs(request.workdir, row, request.seeds), None, '', row,
                               groups)]
  elif request.seeds:
    raise ConfigError('--seeds names the runs of each row of --rows: give --rows (the runs of '
                      'one recipe go to --workdir, comma-separated).')
  else:
    loaded = _runs(request, request.config, request.workdir, request.checkpoint, '',
                   request.row, groups)
  if request.config2 is not None:
    second_runs = _runs(request, request.config2, request.workdir2, request.checkpoint2, '2',
                        request.row2, groups)
    # Two recipes of one file ('configs/papers.py:vit', ':resnet') named by their arguments.
    (first, *_), (second, *_) = loaded[0], second_runs[0]
    args = request.config_files[''][1], request.config_files['2'][1]
    if (len(loaded) == len(second_runs) == 1 and first.label == second.label
        and args[0] != args[1] and request.row2 is None):
      first.label, second.label = (f'{s.label}_{a}' if a else s.label
                                   for s, a in zip((first, second), args))
    if len(loaded) == len(second_runs) == 1 and first.label == second.label:
      second.label += '_2'  # one recipe file for both: the second model is '<label>_2'
    loaded += second_runs
  run_dirs = {s.label: workdir for s, _, workdir in loaded if workdir}  # the class check's
  if request.steps:
    run_dirs = {}
    loaded = at_steps(loaded, request.steps, groups, run_dirs, request.sharding)
  subjects = [s for s, _, _ in loaded]
  if len({s.label for s in subjects}) < len(subjects):
    twice = sorted({s.label for s in subjects if [t.label for t in subjects].count(s.label) > 1})
    raise ConfigError(f'Two of the models analysed would both be labelled {twice[0]}: give '
                      'the seeds of one recipe as one model (--workdir A,B), the second model\'s '
                      'recipe under another file name, or --steps naming each step once.')
  return loaded, groups, run_dirs


def _subject(request: Request, config: ml_collections.ConfigDict, workdir: Optional[str],
             path: Optional[str], which: str, row: Optional[str]) -> Loaded:
  """The model, the file or workdir it came from, and its workdir if from one."""
  path = path or workdir
  if path is None:
    raise ConfigError(f'Give --workdir{which} or --checkpoint{which} with --config{which}.')
  label = os.path.splitext(request.config_files[which][0])[0]
  if 'sweep' in config:
    rows = [name for name, _ in config.sweep.rows]
    if row not in rows:
      raise ConfigError(f'--config{which} is the sweep {config.sweep.name!r}: name its row '
                        f'with --row{which} (or rows with --rows), one of {rows}.')
    config, label = sweep_rows.row_config(config, row), f'{config.sweep.name}_{row}'
  elif row is not None:
    raise ConfigError(f'--row{which} needs a sweep recipe as --config{which}.')
  # a field of the wrong type is one sentence, before the model loads
  training.check_settings(config)
  subject = features.load_subject(config.model_name, path, config.image_size,
                                  dict(config.model), label=label, recipe=config)
  if request.sharding == 'fsdp':
    subject = features.split_parameters(subject)
  return subject, path, workdir if path == workdir else None


def _runs(request: Request, config: ml_collections.ConfigDict, workdir: Optional[str],
          path: Optional[str], which: str, row: Optional[str],
          groups: Dict[str, Tuple[str, int]]) -> List[Loaded]:
  """The model of --config<which> and --workdir<which> (`_subject`), or, where the
  workdir flag names several comma-separated workdirs, each of them: the training
  runs (seeds) of one recipe or sweep row (`vit_jax.sweep --seeds`), labelled
  '<label>_seed<N>' and recorded in `groups`
  (label -> (the model's label, seed)). Runs that differ in anything but their
  seed are refused, naming the fields, before any model loads.

  Args:
    request: the analysis.
    config: the recipe.
    workdir: the workdir flag's value.
    path: the checkpoint flag's value.
    which: '' or '2'.
    row: the row flag's value.
    groups: where each run's model and seed go.

  Returns:
    (subject, source, workdir) of each run.
  """
  dirs = [d for d in (workdir or '').split(',') if d]
  if len(dirs) < 2:
    return [_subject(request, config, workdir, path, which, row)]
  if path is not None:
    raise ConfigError(f'--workdir{which} names {len(dirs)} runs of one model (its seeds): give '
                      f'them without --checkpoint{which}.')
  recorded = {}
  for d in dirs:
    recorded[d] = training.recorded_settings(d)
    if recorded[d] is None:
      raise ConfigError(f'{d} recorded no training settings: --workdir{which} takes the '
                        'workdirs of training runs of one recipe (python -m vit_jax.sweep '
                        '--seeds 0,1,2 trains them).')
  seeds = {d: recorded[d].get('seed', 0) for d in dirs}
  for d in dirs[1:]:
    changed = [line for line in training.recipe_differences(recorded[dirs[0]], recorded[d])
               if not line.startswith('seed:')]
    if changed:
      raise ConfigError(f'--workdir{which} holds runs of different recipes: {d} differs from '
                        f'{dirs[0]} in {"; ".join(changed)}. Give the seeds of one recipe, '
                        'or analyse the recipes as two models (--workdir and --workdir2).')
  repeated = sorted({s for s in seeds.values() if list(seeds.values()).count(s) > 1})
  if repeated:
    raise ConfigError(f'--workdir{which} holds more than one run of seed '
                      f'{", ".join(map(str, repeated))}: give each seed once.')
  loaded = []
  for d in dirs:
    subject, source, from_workdir = _subject(request, config, d, None, which, row)
    group = subject.label
    subject.label = f'{group}_seed{seeds[d]}'
    groups[subject.label] = (group, seeds[d])
    loaded.append((subject, source, from_workdir))
  return loaded


def _row_runs(sweep_dir: str, row: str, seeds: Optional[Sequence[str]]) -> str:
  """The workdir flag's value for `row` of the sweep in `sweep_dir`: its workdir, or
  with `seeds` (`--seeds`) its runs' workdirs, comma-separated."""
  if not seeds:
    return os.path.join(sweep_dir, row)
  return ','.join(os.path.join(sweep_dir, sweep_rows.seeded_label(row, seed)) for seed in seeds)


LAST = 'last'


def at_steps(loaded: Sequence[Loaded], words: Sequence[str], groups: Dict[str, Tuple[str, int]],
             origins: Optional[Dict[str, str]] = None, sharding: str = 'data') -> List[Loaded]:
  """Each model of `loaded` (subject, source, workdir) as one model per step of
  `words` (`--steps`), labelled '<label>_step<N>', from the parameters its run kept
  ('warmup' is the run's warm-up as its workdir recorded it). A model given as its
  seeds' runs becomes one such model per step, '<model>_step<N>', whose runs are
  its seeds' parameters at that step ('<model>_step<N>_seed<S>'); `groups` is
  rewritten to say so.

  Args:
    loaded: (subject, source, workdir) of each model.
    words: 'warmup', step numbers and 'last'.
    groups: each run's (model, seed), by label, for models given as several runs.
    origins: where each model at a step gets its run's workdir, by label.
    sharding: 'data' or 'fsdp' (`--sharding`).

  Returns:
    (subject, source, None) of each model at each step.
  """
  out = []
  stepped = {}
  for subject, _, workdir in loaded:
    if workdir is None:
      raise ConfigError('--steps reads the parameters a training run kept in its workdir: '
                        'give --workdir, not --checkpoint.')
    recipe = subject.recipe
    # The run's own warm-up, where it recorded its settings.
    warmup = (training.recorded_settings(workdir) or {}).get('warmup_steps', recipe.warmup_steps)
    for word in words:
      if word == LAST:
        path = os.path.join(workdir, 'params.npz')
        results = os.path.join(workdir, files.RESULTS)
        step = LAST
        if os.path.exists(results):
          with open(results) as f:
            step = json.load(f)['step']
      else:
        try:
          step, = training.kept_steps(word, warmup)
        except ValueError as e:
          raise ConfigError(f'--steps: {e}; give \'warmup\', step numbers or '
                            f'{LAST!r}.') from None
        path = training.kept_params_path(workdir, step)
        if not os.path.exists(path):
          kept = sorted(glob.glob(training.kept_params_path(workdir, '*')))
          raise WorkdirError(
              f'{path} does not exist: the run in {workdir} kept no parameters at step {step} '
              f'({word}). Kept there: {", ".join(map(os.path.basename, kept)) or "none"}. '
              f'Train with --config.keep_params_at={word} (a finished run keeps them when '
              'trained again into a new workdir).')
      label = f'{subject.label}_step{step}'
      if subject.label in groups:
        group, seed = groups[subject.label]
        label = f'{group}_step{step}_seed{seed}'
        stepped[label] = (f'{group}_step{step}', seed)
      at = features.load_subject(recipe.model_name, path, recipe.image_size, dict(recipe.model),
                                 label=label, recipe=recipe)
      if sharding == 'fsdp':
        at = features.split_parameters(at)
      if origins is not None:
        origins[label] = workdir
      out.append((at, path, None))
  groups.clear()
  groups.update(stepped)
  return out
