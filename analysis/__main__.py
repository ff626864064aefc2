"""Command line of the analysis tools: figures (PNG) and their numbers (JSON).

    python -m analysis <tool> --config configs/quickstart_vit.py --workdir workdirs/quickstart_vit \
        [--config2 configs/quickstart_resnet.py --workdir2 workdirs/quickstart_resnet] --out DIR

A model is the recipe that trained it (`--config`: model name, architecture,
image size, dataset) and its parameters (`--workdir` with params.npz, or
`--checkpoint` with any .npz, published or ours). `--steps warmup,last` analyses
a model at several steps of its run (the parameters training kept with
`--config.keep_params_at`), as one model per step. Tools: the registry
(`analysis.tool.TOOLS`: the built-in ones of `analysis/tools/`, and those that
modules named by `--tool_modules` register); `all` runs every one on every
model it applies to, then writes report.html and report.md (every figure with
its caption) and the numbers and figures as TensorBoard events in each model's
workdir (`<workdir>/analysis`). `report` rebuilds the page and the joint
figures from the JSON already in --out.
"""
import contextlib
import glob
import importlib
import json
import logging
import os
import shlex
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from absl import flags
from ml_collections import config_flags

from vit_jax import cpu_devices

# Split over several CPU devices (XLA_FLAGS), the models' collectives wait for a device
# that other work on the machine holds up, as training's do, before JAX's backend starts.
cpu_devices.patient_collectives()

from analysis import tool
from analysis.reporting import events, plots, report, runs
from analysis.runtime import estimate, features, planning, stopping  # noqa: E402
from analysis import tools  # noqa: F401,E402  (registers the built-in tools and their flags)
from vit_jax import budget, entry, settings, sweep_rows  # noqa: E402
from vit_jax import workdir as workdirs  # noqa: E402
from vit_jax.atomic import atomic_write  # noqa: E402
from vit_jax.errors import ConfigError, DataError, UserError, WorkdirError  # noqa: E402

log = logging.getLogger('analysis')  # run as __main__

TOOL_MODULES_FLAG = '--tool_modules='

FLAGS = flags.FLAGS
entry.define_recipe_flag('config', 'Recipe of the (first) model.')
entry.define_recipe_flag('config2', 'Recipe of a second model, to compare.')
flags.DEFINE_string('workdir', None, 'Training workdir of the first model (its params.npz); '
                    'several, comma-separated, for the training runs (seeds) of one recipe.')
flags.DEFINE_string('workdir2', None, 'Training workdir(s) of the second model.')
flags.DEFINE_string('checkpoint', None, '.npz of the first model; overrides --workdir.')
flags.DEFINE_string('checkpoint2', None, '.npz of the second model; overrides --workdir2.')
flags.DEFINE_string('row', None, 'With a sweep recipe as --config (configs/ablations.py:...), '
                    'the row whose model --workdir holds.')
flags.DEFINE_string('row2', None, 'The same for --config2.')
flags.DEFINE_list('rows', None, 'With a sweep recipe as --config and the sweep\'s directory as '
                  '--workdir: analyse these rows together, each from <workdir>/<row> '
                  '(instead of --row and a second model).')
flags.DEFINE_list('seeds', None, 'With --rows: each row as one model given as its training '
                  'runs of these seeds, from <workdir>/<row>.seed<N> (as `vit_jax.sweep --seeds` '
                  'trains them).')
flags.DEFINE_list('steps', None, 'Analyse each model from a --workdir at these steps of its '
                  'run, as one model per step: \'warmup\' (the end of warm-up), step numbers '
                  '(kept by training with --config.keep_params_at) and \'last\' (params.npz); '
                  'a model given as its seeds\' runs, as one model per step whose runs are '
                  'its seeds at that step.')
flags.DEFINE_string('out', 'analysis_out', 'Directory for figures and JSON.')
flags.DEFINE_string('dataset', None, 'Dataset instead of the recipe\'s (TFDS name or folder:).')
flags.DEFINE_integer('num_images', 1000, 'Images per split the tools use.')
flags.DEFINE_integer('batch_size', 100, 'Images per forward pass.')
flags.DEFINE_list('tool_modules', [], 'Importable modules that register more analysis tools '
                  '(`analysis.tool.register`); imported before the flags are read, so their '
                  'tools may define flags too.')
flags.DEFINE_enum('sharding', 'data', ['data', 'fsdp'], 'data: each device holds the whole '
                  'parameters; fsdp: they are split over every device as fully sharded training '
                  'splits them, with the batches and Lanczos vectors, for models too big for one.')
flags.DEFINE_bool('overwrite', False, 'Replace the analysis of other models in --out.')
flags.DEFINE_string('time_budget', '', 'A duration (6m, 90s, 1h): before any tool runs, each '
                    "tool's time is estimated from one timed pass of each kind on each model "
                    'and a sample of its host work, and the costliest tools take smaller samples '
                    'until the whole fits (re-planned between tools against the clock); only a '
                    'budget the smallest samples exceed is refused.')
flags.DEFINE_bool('tensorboard', True, 'Also write the results as TensorBoard events in '
                  '<workdir>/analysis (or <out>/tensorboard/<model> for a --checkpoint).')


def _config_file(which: str) -> Tuple[str, str]:
  """(file name, argument) of --config<which>: 'configs/papers.py:vit' -> ('papers.py', 'vit')."""
  name, _, arg = os.path.basename(config_flags.get_config_filename(
      FLAGS['config' + which])).partition(':')
  return name, arg


def _subject(config, workdir, path, which: str, row: Optional[str]):
  """The model, the file or workdir it came from, and its workdir if from one."""
  path = path or workdir
  if path is None:
    raise ConfigError(f'Give --workdir{which} or --checkpoint{which} with --config{which}.')
  label = os.path.splitext(_config_file(which)[0])[0]
  if 'sweep' in config:
    rows = [name for name, _ in config.sweep.rows]
    if row not in rows:
      raise ConfigError(f'--config{which} is the sweep {config.sweep.name!r}: name its row '
                        f'with --row{which} (or rows with --rows), one of {rows}.')
    config, label = sweep_rows.row_config(config, row), f'{config.sweep.name}_{row}'
  elif row is not None:
    raise ConfigError(f'--row{which} needs a sweep recipe as --config{which}.')
  settings.check(config)  # a field of the wrong type is one sentence, before the model loads
  subject = features.load_subject(config.model_name, path, config.image_size,
                                  dict(config.model), label=label, recipe=config)
  if FLAGS.sharding == 'fsdp':
    subject = features.split_parameters(subject)
  return subject, path, workdir if path == workdir else None


def _runs(config, workdir, path, which: str, row: Optional[str],
          groups: Dict[str, Tuple[str, int]]) -> List[Tuple[features.Subject, str, Optional[str]]]:
  """The model of --config<which> and --workdir<which> (`_subject`), or, where the
  workdir flag names several comma-separated workdirs, each of them: the training
  runs (seeds) of one recipe or sweep row (`vit_jax.sweep --seeds`), labelled
  '<label>_seed<N>' and recorded in `groups`
  (label -> (the model's label, seed)). Runs that differ in anything but their
  seed are refused, naming the fields, before any model loads.

  Args:
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
    return [_subject(config, workdir, path, which, row)]
  if path is not None:
    raise ConfigError(f'--workdir{which} names {len(dirs)} runs of one model (its seeds): give '
                      f'them without --checkpoint{which}.')
  recorded = {}
  for d in dirs:
    recorded[d] = workdirs.recorded_settings(d)
    if recorded[d] is None:
      raise ConfigError(f'{d} recorded no training settings: --workdir{which} takes the '
                        'workdirs of training runs of one recipe (python -m vit_jax.sweep '
                        '--seeds 0,1,2 trains them).')
  seeds = {d: recorded[d].get('seed', 0) for d in dirs}
  for d in dirs[1:]:
    changed = [line for line in workdirs.differences(recorded[dirs[0]], recorded[d])
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
    subject, source, from_workdir = _subject(config, d, None, which, row)
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


def at_steps(loaded: Sequence[Tuple[features.Subject, str, Optional[str]]], words: Sequence[str],
             groups: Dict[str, Tuple[str, int]], origins: Optional[Dict[str, str]] = None
             ) -> List[Tuple[features.Subject, str, Optional[str]]]:
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
    warmup = (workdirs.recorded_settings(workdir) or {}).get('warmup_steps', recipe.warmup_steps)
    for word in words:
      if word == LAST:
        path = os.path.join(workdir, 'params.npz')
        results = os.path.join(workdir, workdirs.RESULTS)
        step = LAST
        if os.path.exists(results):
          with open(results) as f:
            step = json.load(f)['step']
      else:
        try:
          step, = workdirs.kept_steps(word, warmup)
        except ValueError as e:
          raise ConfigError(f'--steps: {e}; give \'warmup\', step numbers or '
                            f'{LAST!r}.') from None
        path = workdirs.kept_params_path(workdir, step)
        if not os.path.exists(path):
          kept = sorted(glob.glob(workdirs.kept_params_path(workdir, '*')))
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
      if FLAGS.sharding == 'fsdp':
        at = features.split_parameters(at)
      if origins is not None:
        origins[label] = workdir
      out.append((at, path, None))
  groups.clear()
  groups.update(stepped)
  return out


def run_tools(names: Sequence[str], subjects: Sequence[features.Subject],
              batches_for: Callable[[features.Subject], tool.Batches], out: str,
              options: Optional[Mapping[str, Any]] = None,
              planner: Optional[planning.Planner] = None,
              given: str = 'all') -> Tuple[Dict, Dict, Dict[str, str]]:
  """Runs the registered tools `names` on every subject they apply to, with their
  `options` (tool name -> its `Tool.options` instance), writing `<tool>.json` and the
  figures into `out`. A tool that fails leaves the others running: its reason
  goes into `failures.json` (which forgets the tools that now ran) for the report.
  Under a time budget (`planner`, sharing `options`) the tools still to run are
  fitted to the time left before each one (those it leaves out do not run), and
  `plan.json` kept up to date.

  Args:
    names: the tools, in the order they run.
    subjects: the models.
    batches_for: a model -> its batches by split.
    out: the analysis directory.
    options: each tool's options.
    planner: the time budget's plan, or None.
    given: the tool the command line names ('all'), for the commands of those
      the plan leaves out.

  Returns:
    (each tool's JSON, each tool's wall seconds, each failed tool's reason).
  """
  os.makedirs(out, exist_ok=True)
  results, seconds, failed = {}, {}, {}
  for i, name in enumerate(names):
    stopping.check()
    if planner is not None and i:
      planner.fit(names[i:])
      report.record_plan(out, planner.budget_text, planner.changed(), names,
                         left_out_commands(planner.left_out, given))
    if planner is not None and name in planner.left_out:
      continue
    start = time.perf_counter()
    print(f'{name}: running', flush=True)
    try:
      results[name] = tool.run_on(tool.TOOLS[name], subjects, batches_for, out,
                                  (options or {}).get(name))
    except stopping.Stopped:
      raise
    except Exception as e:  # noqa: BLE001  (one tool's fault, reported; the rest run)
      failed[name] = f'{type(e).__name__}: {e}'.splitlines()[0]
      log.debug('The %s tool failed.', name, exc_info=True)  # shown with --verbosity=1
      print(f'{name}: failed ({failed[name]})', flush=True)
      continue
    with atomic_write(os.path.join(out, f'{name}.json')) as f:
      json.dump(tool.to_json(results[name]), f, allow_nan=False)
    seconds[name] = round(time.perf_counter() - start, 1)
    if planner is not None:
      planner.record(name, seconds[name])
    print(f'{name}: wrote {os.path.join(out, name + ".json")} in {seconds[name]} s', flush=True)
  now = {n: why for n, why in report.load_failures(out).items() if n not in results} | failed
  with atomic_write(os.path.join(out, report.FAILURES_FILE)) as f:
    json.dump(now, f, indent=1)
  return results, seconds, failed


def tool_command(name: str, argv: Sequence[str], given: str) -> str:
  """The command that runs tool `name` alone on the models and --out of the
  command line `argv` (this program's, which named the tool `given`), without
  its time budget.

  Args:
    name: the tool.
    argv: the command line, program first.
    given: the tool (or 'all') `argv` names.

  Returns:
    The command, quoted for a shell.
  """
  args, skip = list(argv[1:]), False
  if given in args:
    args.remove(given)
  kept = []
  for arg in args:
    if skip:
      skip = False
    elif arg == '--time_budget':
      skip = True
    elif not arg.startswith('--time_budget='):
      kept.append(arg)
  return shlex.join(['python', '-m', 'analysis', name, *kept])


def left_out_commands(left_out: Mapping[str, str], given: str) -> Dict[str, Tuple[str, str]]:
  """{tool: (why it was left out, the command that runs it)} of `left_out`, for
  the command line that named the tool `given`."""
  return {n: (why, tool_command(n, sys.argv, given)) for n, why in left_out.items()}


def check_amounts(num_images: int, batch_size: int) -> None:
  """The amount of data, before any model is loaded.

  Args:
    num_images: --num_images.
    batch_size: --batch_size.

  Raises:
    ConfigError: either is out of its range.
  """
  if num_images < 1:
    raise ConfigError(f'--num_images is {num_images}; give at least one image per split.')
  if not 1 <= batch_size <= num_images:
    raise ConfigError(f'--batch_size is {batch_size}; it must be between 1 and --num_images '
                      f'({num_images}).')


def check_heads(subjects: Sequence[features.Subject], names: Sequence[str]) -> None:
  """Refuses tools that read logits on a model without a classifier head (one
  published without, as DINOv2 and SigLIP), naming the tools that run on it.

  Args:
    subjects: the models analysed.
    names: the tools to run.

  Raises:
    ConfigError: such a tool and such a model.
  """
  needing = [n for n in names if tool.TOOLS[n].reads_logits]
  headless = [s.label for s in subjects if not s.config.num_classes]
  if needing and headless:
    others = [n for n in tool.TOOLS if not tool.TOOLS[n].reads_logits]
    raise ConfigError(
        f'{", ".join(headless)} has no classifier head, and {", ".join(needing)} read its '
        f'logits: run the tools that read representations ({", ".join(others)}), or fine-tune '
        'a head first (python -m vit_jax.train --config.pretrained=FILE).')


def check_data(subjects: Sequence[features.Subject], dataset: Optional[str], num_images: int,
               splits: Sequence[str], run_dirs: Optional[Dict[str, str]] = None) -> None:
  """Each model's head against the classes of the data it is analysed on (and,
  for a model from a training workdir, against the classes its run recorded, in
  their order), and each split the tools read against `num_images`; records the
  classes' names in the subject (figures name classes by them).

  Args:
    subjects: the models analysed.
    dataset: the dataset given instead of each recipe's own, or None.
    num_images: the images per split the tools use (--num_images).
    splits: the splits the tools read ('train', 'eval': `Tool.splits`).
    run_dirs: each model's training workdir, by label, where it came from one.
  """
  from vit_jax import input_pipeline  # TFDS and Grain, only where data is read
  for s in subjects:
    name = dataset or s.recipe.dataset
    source = input_pipeline.get_source(name, s.recipe.eval_split, s.recipe.data_dir)
    for split in [{'train': s.recipe.train_split, 'eval': s.recipe.eval_split}[k]
                  for k in ('train', 'eval') if k in splits]:
      read = input_pipeline.get_source(name, split, s.recipe.data_dir)
      if read.num_examples < num_images:
        raise DataError(f'{name}:{split} has {read.num_examples} images, fewer than '
                        f'--num_images={num_images}: give --num_images={read.num_examples} '
                        'or fewer.')
    if s.config.num_classes and s.config.num_classes != source.num_classes:
      raise DataError(
          f'The head of {s.label} has {s.config.num_classes} classes but {source.name} has '
          f'{source.num_classes}: analyse it on the data it was trained on (its recipe\'s '
          'dataset, or --dataset).')
    run_dir = (run_dirs or {}).get(s.label)
    recorded = workdirs.recorded_data(run_dir) if run_dir else None
    trained = (recorded or {}).get('train', {}).get('classes')
    if trained and source.class_names and list(source.class_names) != trained:
      raise DataError(
          f'{s.label} was trained on the classes {trained} (its workdir\'s '
          f'{workdirs.DATA}), but {source.name} names {list(source.class_names)}: its labels '
          'would mean other classes. Analyse it on data with the classes it was trained on, '
          'in that order.')
    s.class_names = tuple(source.class_names)


MANIFEST = 'analysis_files.json'  # the files this command wrote into --out


class ToolsFailed(UserError):
  """Some tools failed; the others' results and report were written."""


def _is_run(out: str) -> bool:
  """Whether `out` holds a training run: its record, lock, results or parameters."""
  return workdirs.has_results(out) or any(
      os.path.exists(os.path.join(out, name))
      for name in (workdirs.RECORD, workdirs.LOCK, workdirs.RESULTS))


def _written_before(out: str) -> List[str]:
  """The files an earlier analysis wrote into `out`: its manifest's, or for an
  analysis older than the manifest the names the analysis gives its files."""
  path = os.path.join(out, MANIFEST)
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  named = [f'{n}.json' for n in tool.TOOLS] + [report.SUBJECTS_FILE, 'timings.json',
                                                'estimates.json', 'report.html', 'report.md']
  return [n for n in named if os.path.exists(os.path.join(out, n))] + [
      os.path.basename(p) for p in glob.glob(os.path.join(out, '*.png'))]


def files_in(out: str) -> set:
  """Every file under `out`, as paths relative to it.

  Args:
    out: a directory.

  Returns:
    The relative paths.
  """
  return {os.path.relpath(os.path.join(root, name), out)
          for root, _, names in os.walk(out) for name in names}


# The files of --out an analysis writes besides its tools' JSON, figures and events.
OWN_FILES = (MANIFEST, report.SUBJECTS_FILE, report.FAILURES_FILE, report.PLAN_FILE,
             'timings.json', 'estimates.json', 'report.html', 'report.md')
EVENTS_FOLDER = 'tensorboard'  # <out>/tensorboard/<model>: the events of a --checkpoint's model


def written_here(out: str, name: str) -> bool:
  """Whether the file `name` (relative to `out`) is one this analysis writes: its
  own files, a tool's JSON, a figure this process saved (`plots.SAVED`) or an
  event file of a model without a workdir.

  Args:
    out: the analysis directory.
    name: a path relative to it.

  Returns:
    Whether the analysis wrote it.
  """
  return (name in OWN_FILES or name.split(os.sep)[0] == EVENTS_FOLDER
          or (name.endswith('.json') and name[:-len('.json')] in tool.TOOLS)
          or os.path.abspath(os.path.join(out, name)) in plots.SAVED)


def record_manifest(out: str, before: set) -> None:
  """Adds the files this analysis wrote into `out` since `before` (`files_in`) to
  its manifest, so that --overwrite later removes those and nothing else: a file
  that someone else put there meanwhile stays out of it (`written_here`).

  Args:
    out: the analysis directory.
    before: the files there before this command (`files_in`).
  """
  written = set(_written_before(out) if os.path.exists(os.path.join(out, MANIFEST)) else [])
  written |= {name for name in files_in(out) - before if written_here(out, name)}
  with atomic_write(os.path.join(out, MANIFEST)) as f:
    json.dump(sorted(written | {MANIFEST}), f, indent=0)


def check_out(out: str) -> None:
  """Refuses an --out that is a file or holds a training run, before any model loads.

  Args:
    out: --out.

  Raises:
    WorkdirError: it is a file or holds a run.
  """
  if os.path.exists(out) and not os.path.isdir(out):
    raise WorkdirError(f'--out {out} is a file; give a directory for the analysis.')
  if os.path.isdir(out) and _is_run(out):
    raise WorkdirError(f'--out {out} holds a training run (its config.json, parameters or '
                       'checkpoints); give the analysis a directory of its own.')


def claim_out(out: str, about: Mapping[str, Mapping], overwrite: bool) -> None:
  """Refuses an --out that holds a training run (`check_out`), or the analysis of
  other models (another name, source or parameter checksum: a model retrained in
  place is another model) unless `overwrite`, which removes the files the earlier
  analysis wrote and nothing else: sections of different models never mix in one
  report.

  Args:
    out: --out.
    about: what the report will know of each model.
    overwrite: --overwrite.

  Raises:
    WorkdirError: it holds a run, or another analysis without `overwrite`.
  """
  check_out(out)
  earlier = report.load_subjects(out)
  key = lambda subjects: {k: (v['model_name'], v['source']) for k, v in subjects.items()}
  # A record older than the checksum is compared by name and source alone.
  sums = lambda subjects: {k: v.get('params_checksum') for k, v in subjects.items()}
  if not earlier or (key(earlier) == key(about) and all(
      sums(earlier)[k] in (None, sums(about)[k]) for k in earlier)):
    return
  if not overwrite:
    described = '; '.join(f'{k}: {v["model_name"]} from {v["source"]}' for k, v in earlier.items())
    raise WorkdirError(f'{out} holds the analysis of other models ({described}; or of these '
                       'files before they changed). Give another --out, or --overwrite to '
                       'replace it.')
  for name in _written_before(out):
    path = os.path.join(out, name)
    if os.path.isfile(path):
      os.remove(path)


def run(name: str) -> Dict:
  """The command for tool `name` (or 'all') on the flags' models.

  Args:
    name: a registered tool, or 'all'.

  Returns:
    Each tool's JSON.
  """
  started = time.perf_counter()
  if FLAGS.config is None:
    raise ConfigError('--config is required: the recipe of the model to analyse.')
  check_amounts(FLAGS.num_images, FLAGS.batch_size)
  check_out(FLAGS.out)
  try:
    seconds = budget.parse_duration(FLAGS.time_budget) if FLAGS.time_budget else None
  except ValueError as e:
    raise ConfigError(f'--{e}') from None
  if seconds is not None and seconds <= 0:
    raise ConfigError(f'--time_budget={FLAGS.time_budget} leaves no time; give a duration such '
                      'as 6m, 90s or 1h30m, or leave it out for no budget.')
  names = list(tool.TOOLS) if name == 'all' else [name]
  if seconds is not None:
    names = planning.by_importance(names)
  options = {n: tool.TOOLS[n].read_options() for n in names}  # each checks its own flags
  second = [f'--{f}' for f in ('workdir2', 'checkpoint2', 'row2') if FLAGS[f].value is not None]
  if second and FLAGS.config2 is None:
    raise ConfigError(f'{" and ".join(second)} name a second model, whose recipe is '
                      '--config2: give it too, or leave them out.')
  with holding(FLAGS.out), stopping.on_signals(FLAGS.out):
    return _run_held(name, names, options, seconds, started)


def _run_held(name: str, names: List[str], options: Dict[str, Any], seconds: Optional[float],
              started: float) -> Dict:
  """`run` once --out is held: loads the models, checks them and their data, claims
  --out for them, then plans and runs the tools and writes the report."""
  groups = {}  # a run of a model given as several workdirs -> (the model, its seed)
  if FLAGS.rows:
    if 'sweep' not in FLAGS.config or FLAGS.workdir is None or any(
        FLAGS[f].value is not None for f in ('row', 'checkpoint', 'config2')):
      raise ConfigError('--rows takes a sweep recipe as --config and the sweep\'s directory '
                        'as --workdir, without --row, --checkpoint or a second model.')
    loaded = [run for row in FLAGS.rows
              for run in _runs(FLAGS.config, _row_runs(FLAGS.workdir, row, FLAGS.seeds), None,
                               '', row, groups)]
  elif FLAGS.seeds:
    raise ConfigError('--seeds names the runs of each row of --rows: give --rows (the runs of '
                      'one recipe go to --workdir, comma-separated).')
  else:
    loaded = _runs(FLAGS.config, FLAGS.workdir, FLAGS.checkpoint, '', FLAGS.row, groups)
  if FLAGS.config2 is not None:
    second_runs = _runs(FLAGS.config2, FLAGS.workdir2, FLAGS.checkpoint2, '2', FLAGS.row2,
                        groups)
    # Two recipes of one file ('configs/papers.py:vit', ':resnet') named by their arguments.
    (first, *_), (second, *_) = loaded[0], second_runs[0]
    args = _config_file('')[1], _config_file('2')[1]
    if (len(loaded) == len(second_runs) == 1 and first.label == second.label
        and args[0] != args[1] and FLAGS.row2 is None):
      first.label, second.label = (f'{s.label}_{a}' if a else s.label
                                   for s, a in zip((first, second), args))
    if len(loaded) == len(second_runs) == 1 and first.label == second.label:
      second.label += '_2'  # one recipe file for both: the second model is '<label>_2'
    loaded += second_runs
  run_dirs = {s.label: workdir for s, _, workdir in loaded if workdir}  # the class check's
  if FLAGS.steps:
    run_dirs = {}
    loaded = at_steps(loaded, FLAGS.steps, groups, run_dirs)
  subjects = [s for s, _, _ in loaded]
  if len({s.label for s in subjects}) < len(subjects):
    twice = sorted({s.label for s in subjects if [t.label for t in subjects].count(s.label) > 1})
    raise ConfigError(f'Two of the models analysed would both be labelled {twice[0]}: give '
                      'the seeds of one recipe as one model (--workdir A,B), the second model\'s '
                      'recipe under another file name, or --steps naming each step once.')
  # What the report and the events need to know of each model; the events go beside
  # the training events when the model comes from a workdir.
  about = {s.label: {**features.describe(s, workdir), 'source': source,
                     'tensorboard': os.path.join(workdir, 'analysis') if workdir else
                     os.path.join(FLAGS.out, EVENTS_FOLDER, s.label),
                     **({'group': groups[s.label][0], 'seed': groups[s.label][1]}
                        if s.label in groups else {})}
           for s, source, workdir in loaded}

  names = check_tools(subjects, names, name)
  check_heads(subjects, names)
  check_data(subjects, FLAGS.dataset, FLAGS.num_images,
             sorted({split for n in names for split in tool.TOOLS[n].splits}), run_dirs)
  claim_out(FLAGS.out, about, FLAGS.overwrite)
  before = files_in(FLAGS.out)  # what the manifest leaves out: the files already there
  try:
    # The models first, so that an analysis stopped part-way is known to be theirs.
    with atomic_write(os.path.join(FLAGS.out, report.SUBJECTS_FILE)) as f:
      json.dump(about, f, indent=1)

    def batches_for(subject):
      return features.recipe_batches(subject.recipe, FLAGS.num_images, FLAGS.batch_size,
                                     FLAGS.dataset)

    planner = None
    if seconds is not None:
      amounts = estimate.Amounts(FLAGS.num_images, FLAGS.batch_size)
      prices, unpriced = planning.price(
          names, subjects, batches_for, options, amounts,
          deadline=time.perf_counter() + planning.PRICING_SHARE * seconds)
      planner = planning.Planner(names, subjects, prices, options, amounts, started + seconds,
                                 FLAGS.time_budget)
      planner.leave_out(unpriced, f'not priced within {planning.PRICING_SHARE:.0%} of '
                        f'--time_budget={FLAGS.time_budget}')
      planner.fit(names)
    report.record_plan(FLAGS.out, FLAGS.time_budget, planner.changed() if planner else {},
                       names, left_out_commands(planner.left_out, name) if planner else {})
    results, timings, failed = run_tools(names, subjects, batches_for, FLAGS.out, options,
                                         planner, name)
    if groups:
      with atomic_write(os.path.join(FLAGS.out, report.RUNS_FILE)) as f:
        json.dump(runs.across_runs(results, about), f, indent=1)
    with atomic_write(os.path.join(FLAGS.out, 'timings.json')) as f:
      json.dump(timings, f)  # wall seconds per tool, compilation and data included
    if planner is not None:
      with atomic_write(os.path.join(FLAGS.out, 'estimates.json')) as f:
        json.dump({n: round(t, 1) for n, t in planner.estimated.items()}, f)
    page = finish(FLAGS.out, tensorboard=FLAGS.tensorboard) if report.has_report(
        FLAGS.out) else None
  finally:
    record_manifest(FLAGS.out, before)
  if failed:
    raise ToolsFailed(
        f'{len(failed)} of {len(names)} tools failed (' + '; '.join(
            f'{n}: {why}' for n, why in failed.items()) + ')' + (
            f'; the report of the others: {page}' if page else '') +
        '. Run again with --verbosity=1 for their tracebacks.')
  return results


def check_tools(subjects: Sequence[features.Subject], names: Sequence[str],
                given: str) -> List[str]:
  """The tools of `names` that have something to compute on `subjects`
  (`Tool.cannot_run`): a tool named alone that has not is refused; `all` says
  which it leaves out and why.

  Args:
    subjects: the models analysed.
    names: the tools to run.
    given: the tool the command line names, or 'all'.

  Returns:
    The tools that run.

  Raises:
    ConfigError: the tool named alone has nothing to compute on these models.
  """
  kept = []
  for n in names:
    why = tool.TOOLS[n].cannot_run(subjects)
    if not why:
      kept.append(n)
    elif given != 'all':
      raise ConfigError(f'{why}.')
    else:
      print(f'{n}: not run ({why}).', flush=True)
  return kept


OUT_LOCK = 'analysis_lock.json'  # held in --out while an analysis writes there


@contextlib.contextmanager
def holding(out: str) -> Iterator[None]:
  """Holds --out for this analysis: a lock (`OUT_LOCK`) that a second analysis
  into it is refused by while this one runs, as a training workdir's is; a
  directory made here and left empty is removed on the way out.

  Args:
    out: --out.
  """
  made = not os.path.exists(out)
  try:
    os.makedirs(out, exist_ok=True)
  except OSError as e:
    raise WorkdirError(f'--out {out} cannot be created ({e.strerror}); give a directory you '
                       'can write to.') from None
  lock = os.path.join(out, OUT_LOCK)
  workdirs.take_lock(lock, 'the analysis', 'give this one another --out')
  try:
    yield
  finally:
    if os.path.exists(lock):
      os.remove(lock)
    if made and not os.listdir(out):
      os.rmdir(out)


def finish(out: str, tensorboard: bool) -> str:
  """The report (and, if asked, the TensorBoard events) of the results in `out`.

  Args:
    out: the analysis directory.
    tensorboard: also write the TensorBoard events.

  Returns:
    report.html's path.
  """
  page = report.write_report(out)['html']
  subjects = report.load_subjects(out)
  if tensorboard and subjects:
    events.write_events(report.load_results(out),
                        {label: s['tensorboard'] for label, s in subjects.items()}, out)
    print('TensorBoard: ' + ', '.join(s['tensorboard'] for s in subjects.values()))
  print(f'Report: {os.path.abspath(page)}', flush=True)
  return page


def import_tool_modules(argv: Sequence[str]) -> None:
  """Imports the modules `--tool_modules=a,b` names, before absl parses the flags.

  Args:
    argv: the command line.
  """
  for arg in argv:
    if arg.startswith(TOOL_MODULES_FLAG):
      for module in filter(None, arg[len(TOOL_MODULES_FLAG):].split(',')):
        importlib.import_module(module)


def main(argv: Sequence[str]) -> None:
  """Runs the tool (or `all`, or `report`) the command line names.

  Args:
    argv: the program and the tool's name.
  """
  if len(argv) != 2 or argv[1] not in list(tool.TOOLS) + ['all', 'report']:
    raise ConfigError(f'Usage: python -m analysis <tool> --config ... ; tools: '
                      f'{", ".join(tool.TOOLS)}, all; or `report --out DIR`.')
  if argv[1] == 'report':
    finish(FLAGS.out, tensorboard=False)
  else:
    run(argv[1])


if __name__ == '__main__':
  import_tool_modules(sys.argv)
  entry.run(main, ('config', 'config2'))
