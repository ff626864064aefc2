"""The analysis command (`python -m analysis`, `analysis/__main__.py`): a `Request`
checked, its models loaded, checked against the tools and their data, then the tools
run (`run_tools`) and the report written (`finish`).
"""
import json
import logging
import os
import shlex
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from analysis import tool
from analysis.cli import events, loading, out_folder, planning, report
from analysis.cli.request import Request
from analysis.reporting import runs
from analysis.runtime import estimate, features, stopping
from vit_jax import data, files, training
from vit_jax.errors import ConfigError, DataError, UserError
from vit_jax.files import atomic_write

log = logging.getLogger('analysis')


class ToolsFailed(UserError):
  """Some tools failed; the others' results and report were written."""


def run(request: Request) -> Dict:
  """The analysis `request` asks for: its checks before any model loads, then, with
  --out held, the models, their checks and data, the tools and the report.

  Args:
    request: the analysis.

  Returns:
    Each tool's JSON.
  """
  started = time.perf_counter()
  if request.config is None:
    raise ConfigError('--config is required: the recipe of the model to analyse.')
  check_amounts(request.num_images, request.batch_size)
  out_folder.check_out(request.out)
  try:
    seconds = training.parse_duration(request.time_budget) if request.time_budget else None
  except ValueError as e:
    raise ConfigError(f'--{e}') from None
  if seconds is not None and seconds <= 0:
    raise ConfigError(f'--time_budget={request.time_budget} leaves no time; give a duration such '
                      'as 6m, 90s or 1h30m, or leave it out for no budget.')
  names = list(request.options)  # the tools named: every registered one for 'all'
  if seconds is not None:
    names = planning.by_importance(names)
  second = [f'--{f}' for f in ('workdir2', 'checkpoint2', 'row2')
            if getattr(request, f) is not None]
  if second and request.config2 is None:
    raise ConfigError(f'{" and ".join(second)} name a second model, whose recipe is '
                      '--config2: give it too, or leave them out.')
  with out_folder.holding(request.out), stopping.on_signals(request.out):
    return _run_held(request, names, seconds, started)


def _events_folder(workdir: Optional[str], out: str, label: str) -> str:
  """Where a model's TensorBoard events go: beside its training events (the
  workdir's `analysis/`) where the workdir can be written, else in --out (a run on
  a read-only mount, a model without a workdir), said in a warning for a run."""
  own = os.path.join(out, out_folder.EVENTS_FOLDER, label)
  if not workdir:
    return own
  beside = os.path.join(workdir, 'analysis')
  try:  # written to, as a read-only mount refuses even root
    os.makedirs(beside, exist_ok=True)
    with tempfile.TemporaryFile(dir=beside):
      return beside
  except OSError as e:
    log.warning('%s cannot be written (%s): the TensorBoard events of %s go to %s.', beside,
                e.strerror or e, label, own)
    return own


def _run_held(request: Request, names: List[str], seconds: Optional[float],
              started: float) -> Dict:
  """`run` once --out is held: loads the models, checks them and their data, claims
  --out for them, then plans and runs the tools and writes the report."""
  loaded, groups, run_dirs = loading.load_models(request)
  subjects = [s for s, _, _ in loaded]
  # What the report and the events need to know of each model; the events go beside
  # the training events when the model comes from a workdir.
  about = {s.label: {**features.describe(s, workdir), 'source': source,
                     'tensorboard': _events_folder(workdir, request.out, s.label),
                     **({'group': groups[s.label][0], 'seed': groups[s.label][1]}
                        if s.label in groups else {})}
           for s, source, workdir in loaded}

  names = check_tools(subjects, names, request.tool)
  check_heads(subjects, names)
  check_data(subjects, request.dataset, request.num_images,
             sorted({split for n in names for split in tool.TOOLS[n].splits}), run_dirs)
  out_folder.claim_out(request.out, about, request.overwrite)
  before = out_folder.files_in(request.out)  # what the manifest leaves out: the files already there
  try:
    # The models first, so that an analysis stopped part-way is known to be theirs.
    with atomic_write(os.path.join(request.out, report.SUBJECTS_FILE)) as f:
      json.dump(about, f, indent=1)

    def batches_for(subject):
      return features.recipe_batches(subject.recipe, request.num_images, request.batch_size,
                                     request.dataset)

    planner = None
    if seconds is not None:
      amounts = estimate.Amounts(request.num_images, request.batch_size)
      prices, unpriced = planning.price(
          names, subjects, batches_for, request.options, amounts,
          deadline=time.perf_counter() + planning.PRICING_SHARE * seconds)
      planner = planning.Planner(names, subjects, prices, request.options, amounts,
                                 started + seconds, request.time_budget, unpriced=unpriced)
      planner.leave_out(unpriced, f'not priced within {planning.PRICING_SHARE:.0%} of '
                        f'--time_budget={request.time_budget}')
      planner.fit(names)
    report.record_plan(request.out, request.time_budget, planner.changed() if planner else {},
                       names, left_out_commands(planner.left_out, request) if planner else {})
    results, timings, failed = run_tools(names, subjects, batches_for, request.out, request.options,
                                         planner, request)
    if groups:
      with atomic_write(os.path.join(request.out, report.RUNS_FILE)) as f:
        json.dump(runs.across_runs(results, about), f, indent=1)
    with atomic_write(os.path.join(request.out, 'timings.json')) as f:
      json.dump(timings, f)  # wall seconds per tool, compilation and data included
    if planner is not None:
      with atomic_write(os.path.join(request.out, 'estimates.json')) as f:
        json.dump({n: round(t, 1) for n, t in planner.estimated.items()}, f)
    page = finish(request.out, tensorboard=request.tensorboard) if report.has_report(
        request.out) else None
  finally:
    out_folder.record_manifest(request.out, before)
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


def run_tools(names: Sequence[str], subjects: Sequence[features.Subject],
              batches_for: Callable[[features.Subject], tool.Batches], out: str,
              options: Optional[Mapping[str, Any]] = None,
              planner: Optional[planning.Planner] = None,
              request: Optional[Request] = None) -> Tuple[Dict, Dict, Dict[str, str]]:
  """Runs the registered tools `names` on every subject they apply to, with their
  `options` (tool name -> its `Tool.options` instance), writing `<tool>.json` and the
  figures into `out`. A tool that fails leaves the others running: its reason
  goes into `failures.json` (which forgets the tools that now ran) for the report.
  Under a time budget (`planner`, sharing `options`) the tools still to run are
  fitted to the time left before each one (those it leaves out do not run), a
  tool left out runs at the end where the time it was left out for is still
  there (`Planner.take_back`), and `plan.json` is kept up to date.

  Args:
    names: the tools, in the order they run.
    subjects: the models.
    batches_for: a model -> its batches by split.
    out: the analysis directory.
    options: each tool's options.
    planner: the time budget's plan, or None.
    request: the analysis, for the commands of the tools the plan leaves out.

  Returns:
    (each tool's JSON, each tool's wall seconds, each failed tool's reason).
  """
  os.makedirs(out, exist_ok=True)
  results, seconds, failed = {}, {}, {}

  def planned(names_left):
    planner.fit(names_left)
    report.record_plan(out, planner.budget_text, planner.changed(), names,
                       left_out_commands(planner.left_out, request))

  for i, name in enumerate(names):
    stopping.check()
    if planner is not None and i:
      planned(names[i:])
    if planner is None or name not in planner.left_out:
      _run_tool(name, subjects, batches_for, out, options, planner, results, seconds, failed)
  while planner is not None and (name := planner.take_back()) is not None:
    stopping.check()
    planned([name])
    _run_tool(name, subjects, batches_for, out, options, planner, results, seconds, failed)
  now = {n: why for n, why in report.load_failures(out).items() if n not in results} | failed
  with atomic_write(os.path.join(out, report.FAILURES_FILE)) as f:
    json.dump(now, f, indent=1)
  return results, seconds, failed


def _run_tool(name: str, subjects: Sequence, batches_for: Callable, out: str,
              options: Optional[Mapping[str, Any]], planner: Optional[planning.Planner],
              results: Dict, seconds: Dict, failed: Dict[str, str]) -> None:
  """Runs one tool (`run_tools`), writing its JSON; its result, seconds or failure
  go into `results`, `seconds` or `failed`."""
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
    return
  with atomic_write(os.path.join(out, f'{name}.json')) as f:
    json.dump(tool.to_json(results[name]), f, allow_nan=False)
  seconds[name] = round(time.perf_counter() - start, 1)
  if planner is not None:
    planner.record(name, seconds[name])
  print(f'{name}: wrote {os.path.join(out, name + ".json")} in {seconds[name]} s', flush=True)


def interpreter() -> str:
  """The interpreter running this analysis, as a shell in the working directory
  names it: relative where it lies inside that directory (`.venv/bin/python`),
  else its full path; `python` where Python cannot tell."""
  if not sys.executable:
    return 'python'
  relative = os.path.relpath(sys.executable)
  return sys.executable if relative.startswith('..') else relative


def tool_command(name: str, argv: Sequence[str], given: str) -> str:
  """The command that runs tool `name` alone on the models and --out of the
  command line `argv` (this program's, which named the tool `given`), without
  its time budget, with the interpreter that runs this one (`interpreter`), so
  that it runs as pasted.

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
  return shlex.join([interpreter(), '-m', 'analysis', name, *kept])


def left_out_commands(left_out: Mapping[str, str], request: Optional[Request]
                      ) -> Dict[str, Tuple[str, str]]:
  """{tool: (why it was left out, the command that runs it)} of `left_out`, for
  the command line of `request` (this process's, naming 'all', without one)."""
  argv, given = (request.argv, request.tool) if request else (sys.argv, 'all')
  return {n: (why, tool_command(n, argv, given)) for n, why in left_out.items()}


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
  for s in subjects:
    name = dataset or s.recipe.dataset
    source = data.get_source(name, s.recipe.eval_split, s.recipe.data_dir)
    for split in [{'train': s.recipe.train_split, 'eval': s.recipe.eval_split}[k]
                  for k in ('train', 'eval') if k in splits]:
      read = data.get_source(name, split, s.recipe.data_dir)
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
    recorded = training.recorded_data(run_dir) if run_dir else None
    trained = (recorded or {}).get('train', {}).get('classes')
    if trained and source.class_names and list(source.class_names) != trained:
      raise DataError(
          f'{s.label} was trained on the classes {trained} (its workdir\'s '
          f'{files.DATA}), but {source.name} names {list(source.class_names)}: its labels '
          'would mean other classes. Analyse it on data with the classes it was trained on, '
          'in that order.')
    s.class_names = tuple(source.class_names)


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
