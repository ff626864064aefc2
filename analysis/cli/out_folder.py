"""The analysis's output folder (--out): held by one analysis at a time (`holding`),
refused where it holds a training run or another model's analysis (`claim_out`), and
the manifest of the files each analysis wrote there (`record_manifest`), so that
--overwrite removes those and nothing else.
"""
import contextlib
import glob
import json
import os
from typing import Iterator, List, Mapping

from analysis import tool
from analysis.cli import report
from analysis.reporting import plots
from vit_jax import files, training
from vit_jax.errors import WorkdirError
from vit_jax.files import atomic_write

MANIFEST = 'analysis_files.json'  # the files this command wrote into --out


def written_before(out: str) -> List[str]:
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
  written = set(written_before(out) if os.path.exists(os.path.join(out, MANIFEST)) else [])
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
  if os.path.isdir(out) and files.is_run(out):
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
  for name in written_before(out):
    path = os.path.join(out, name)
    if os.path.isfile(path):
      os.remove(path)


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
  training.take_lock(lock, 'the analysis', 'give this one another --out')
  try:
    yield
  finally:
    if os.path.exists(lock):
      os.remove(lock)
    if made and not os.listdir(out):
      os.rmdir(out)
