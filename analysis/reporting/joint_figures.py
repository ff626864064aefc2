"""Figures that put every analysed model in one frame, as the papers draw them:
each registered tool's `joint` (CKA heatmaps side by side on one colour scale,
curves over relative depth overlaid, spectra in the same axes), built from the
tools' JSON results alone, with each model in its family's colour.
"""
import os
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

from analysis import tool
from analysis.reporting import plots

Results = Mapping[str, Mapping]  # tool -> its JSON result


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
  if len(by_model) < 2:
    return []
  series = {label: np.asarray(values(r), np.float64) for label, r in by_model.items()}
  if errors is not None:
    kwargs['errors'] = {label: np.asarray(errors(r), np.float64) for label, r in by_model.items()}
  x = {label: _depth(len(v)) for label, v in series.items()}
  shade = {}
  if shade_key is not None:
    for label, r in by_model.items():
      positions = x[label]
      shade[label] = [positions[i] for i in r.get(shade_key, [])]
  width = min((1. / max(len(v) - 1, 1) for v in series.values()), default=1.)
  return [plots.curves(series, figure, title, 'relative depth', ylabel, x=x, shade=shade,
                       colours_of=dict(colour_of), shade_width=width, **kwargs)]


def model_colours(results: Results, kinds: Mapping[str, str]) -> Dict[str, str]:
  """A colour per model label of the results: its kind's (`plots.KIND_COLOURS`), or a
  spare one where two models are of one kind.

  Args:
    results: each tool's JSON.
    kinds: each model label's kind (`Layers.architecture`).

  Returns:
    {model label: colour}.
  """
  labels = sorted({label for name, result in results.items()
                   if tool.TOOLS[name].runs_on != tool.ALL_MODELS
                   for label in tool.per_model(result)})
  return dict(zip(labels, plots.colours([plots.KIND_COLOURS.get(kinds.get(label, ''))
                                         for label in labels])))


def joint_figures(results: Results, kinds: Mapping[str, str], out: str
                  ) -> Dict[str, List[str]]:
  """The joint figures of every registered tool in `results`, by tool.

  Args:
    results: each tool's JSON.
    kinds: each model label's kind (`Layers.architecture`), for its colour.
    out: the directory the figures go to.

  Returns:
    {tool name: its joint figures' paths}.
  """
  colour_of = model_colours(results, kinds)
  figures = {}
  for name, result in results.items():
    joint = tool.TOOLS[name].joint
    drawn = joint(result, colour_of, out) if joint is not None else []
    if drawn:
      figures[name] = drawn
  return figures
