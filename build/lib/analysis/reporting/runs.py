"""A model given as several training runs (its seeds): each tool's numbers over the
runs, beside the per-run numbers the tools' JSON keeps.

`python -m analysis TOOL --workdir DIR/seed0,DIR/seed1,DIR/seed2` analyses each
run as a model of its own ('<label>_seed<N>', with its `group` and `seed` in
subjects.json); `across_runs` writes, for every tool whose JSON holds an entry
per model, the mean over the runs and their standard deviation, number by
number, to runs.json. The verdicts join the runs by `verdict.combine`.
"""
from typing import Any, Dict, List, Mapping, Tuple

import numpy as np


def groups(about: Mapping[str, Mapping]) -> Dict[str, List[str]]:
  """The models given as several runs, and their runs' labels.

  Args:
    about: what the report knows of each model label (a run's 'group').

  Returns:
    {model: [run labels, in order]}.
  """
  out = {}
  for label, known in about.items():
    if 'group' in known:
      out.setdefault(known['group'], []).append(label)
  return out


def across_runs(results: Mapping[str, Mapping], about: Mapping[str, Mapping]) -> Dict:
  """Each tool's per-run entries of each model given as several runs, number by
  number: the runs' mean and their standard deviation (n - 1).

  Args:
    results: each tool's JSON ({run label: entry} for the tools that hold an entry
      per model; others are left out).
    about: what the report knows of each model label.

  Returns:
    {tool: {model: {'runs': labels, 'mean': entry, 'sd': entry}}}, each entry with
    the runs' structure; a number where every run has one, a value that is the
    same in every run (a name, a setting) as it is, None where they differ.
  """
  out = {}
  for name, result in results.items():
    for model, labels in groups(about).items():
      if not all(label in result for label in labels):
        continue
      mean, sd = _stats([result[label] for label in labels])
      out.setdefault(name, {})[model] = {'runs': labels, 'mean': mean, 'sd': sd}
  return out


def _stats(values: List[Any]) -> Tuple[Any, Any]:
  """(mean, standard deviation) of the same place in each run's entry."""
  first = values[0]
  if all(isinstance(v, dict) for v in values) and all(v.keys() == first.keys() for v in values):
    pairs = {k: _stats([v[k] for v in values]) for k in first}
    return {k: m for k, (m, _) in pairs.items()}, {k: s for k, (_, s) in pairs.items()}
  if all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
    pairs = [_stats(list(column)) for column in zip(*values)]
    return [m for m, _ in pairs], [s for _, s in pairs]
  if all(isinstance(v, (int, float)) and not isinstance(v, bool)
         for v in values):
    numbers = np.array(values, np.float64)
    if not np.all(np.isfinite(numbers)):
      return None, None
    return float(numbers.mean()), float(numbers.std(ddof=1))
  return (first, None) if all(v == first for v in values) else (None, None)
