"""What a tool's `joint` draws with: figures that put every analysed model in one
frame, as the papers draw them (CKA heatmaps side by side on one colour scale,
curves over relative depth overlaid, spectra in the same axes), built from the
tools' JSON results alone, with each model in its family's colour. The command's
report draws every registered tool's (`analysis.cli.report.draw_joint_figures`).
"""
import os
from typing import Any, Callable, List, Mapping, Optional

import numpy as np

from analysis.reporting import plots, verdict

Results = Mapping[str, Mapping]  # tool -> its JSON result


class Palette(dict):
  """Each model label's colour, as a dict, and `groups`: the models given as
  several training runs (seeds), {model: [its runs' labels]}, whose curves are drawn
  as their mean over the runs with the runs thin behind it."""

  def __init__(self, colours: Mapping[str, str],
               groups: Optional[Mapping[str, List[str]]] = None):
    super().__init__(colours)
    self.groups = dict(groups or {})


def path(out: str, name: str) -> str:
  """Where the joint figure `name` goes.

  Args:
    out: the analysis directory.
    name: the figure's name.

  Returns:
    The PNG's path.
  """
  return os.path.join(out, f'joint_{name}.png')


def _depth(n: int) -> np.ndarray:
  """Relative depth 0..1 of n layers, so models of different depth share an axis."""
  return np.linspace(0., 1., n) if n > 1 else np.zeros(1)


def depth_curves(by_model: Mapping[str, Mapping], values: Callable[[Mapping], list],
                 colour_of: Mapping[str, str], figure: str, title: str, ylabel: str,
                 shade_key: Optional[str] = None,
                 errors: Optional[Callable[[Mapping], list]] = None, **kwargs: Any
                 ) -> List[str]:
  """One curve per model over relative depth (none below two models), with the
  standard errors `errors(r)` as bars; `shade_key` names the JSON list of layer
  indices to shade in the model's colour.

  Args:
    by_model: each model's JSON entry.
    values: an entry -> its values per layer.
    colour_of: each model's colour.
    figure: the PNG's path.
    title: the title.
    ylabel: the y axis' label.
    shade_key: the entry's key of layer indices to shade, or None.
    errors: an entry -> its standard errors per layer, or None.
    **kwargs: passed to `plots.curves`.

  Returns:
    [the figure's path], or [] below two models.
  """
  series = {label: np.asarray(values(r), np.float64) for label, r in by_model.items()}
  stderr = ({label: np.asarray(errors(r), np.float64) for label, r in by_model.items()}
            if errors is not None else None)
  series, stderr, runs, colour_of, by_model = _runs_as_means(
      series, stderr, colour_of, by_model, getattr(colour_of, 'groups', {}))
  if len(series) < 2:
    return []
  if stderr is not None:
    kwargs['errors'] = stderr
  if runs:
    kwargs['runs'] = runs
  x = {label: _depth(len(v)) for label, v in series.items()}
  shade = {}
  if shade_key is not None:
    for label, r in by_model.items():
      positions = x[label]
      shade[label] = [positions[i] for i in r.get(shade_key, [])]
  width = min((1. / max(len(v) - 1, 1) for v in series.values()), default=1.)
  return [plots.curves(series, figure, title, 'relative depth', ylabel, x=x, shade=shade,
                       colours_of=dict(colour_of), shade_width=width, **kwargs)]


def _runs_as_means(series, stderr, colour_of, by_model, groups):
  """Each model given as several runs (`groups`) as one series, the runs' mean with
  the standard error of `verdict.combine` at each point, its runs kept to be drawn
  behind it, in its first run's colour; its first run's entry stands for it."""
  runs, colours, entries = {}, dict(colour_of), dict(by_model)
  series, stderr = dict(series), None if stderr is None else dict(stderr)
  for model, labels in groups.items():
    labels = [label for label in labels if label in series]
    if len(labels) < 2 or len({len(series[label]) for label in labels}) > 1:
      continue
    stack = np.stack([series.pop(label) for label in labels])
    errors = (np.stack([stderr.pop(label) for label in labels]) if stderr is not None
              else np.full(stack.shape, np.nan))
    points = [verdict.combine(list(zip(stack[:, i], errors[:, i])))[0]
              for i in range(stack.shape[1])]
    series[model] = np.array([mean for mean, _ in points])
    if stderr is not None:
      stderr[model] = np.array([error for _, error in points])
    runs[model] = list(stack)
    colours[model] = colour_of.get(labels[0])
    entries[model] = entries[labels[0]]
    for label in labels:
      entries.pop(label)
  return series, stderr, runs, colours, entries
