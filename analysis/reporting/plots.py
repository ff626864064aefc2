"""Figures of the analysis results, written as PNG files (matplotlib, no display).

Every helper takes the file to write; with `path=None` it returns the open figure
instead (for notebooks and tests). Every figure goes out through `_save`, which
writes into the PNG what it shows in words (`ALT_KEY`, the report's alt text) and
the layout problems it finds (`LAYOUT_KEY`: text smaller than MIN_FONT points, or
a title that another element overlaps), so that tests can read both from the file.
"""
import json
import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import matplotlib

matplotlib.use('Agg')
import matplotlib.image  # noqa: E402  (after choosing the backend)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from vit_jax.models.family import CONVNET, HYBRID, MLP, TRANSFORMER  # noqa: E402

# Okabe-Ito colours (safe for colour-blind readers) by the kind of model
# (`Layers.architecture`): ViTs red and ResNets blue, as Park & Kim draw them.
KIND_COLOURS = {TRANSFORMER: '#D55E00', CONVNET: '#0072B2', HYBRID: '#009E73', MLP: '#CC79A7'}
# Those no kind claims, for a second model of one kind.
OTHER_COLOURS = ('#E69F00', '#56B4E9', '#000000', '#F0E442')
HEATMAP_CMAP = 'magma'  # perceptually uniform, readable in grey and by colour-blind readers
MAX_TICKS = 24
DPI = 110  # the figures' resolution
MIN_FONT = 7.  # points: the smallest text a figure may hold (110 dpi: about 11 px)
TICK_FONT = 7.5
ALT_KEY, LAYOUT_KEY = 'Description', 'Layout problems'  # PNG text chunks


def _texts(fig) -> List[matplotlib.text.Text]:
  """Every text a figure draws: visible, not empty, and for tick labels, at a
  tick inside its axis' view limits (matplotlib keeps, but does not draw, others)."""
  hidden = set()
  for ax in fig.axes:
    for axis in (ax.xaxis, ax.yaxis):
      low, high = sorted(axis.get_view_interval())
      slack = 1e-9 * max(abs(low), abs(high), 1.)
      for tick in axis.get_major_ticks() + axis.get_minor_ticks():
        if not low - slack <= tick.get_loc() <= high + slack:
          hidden.update((id(tick.label1), id(tick.label2)))
  return [t for t in fig.findobj(matplotlib.text.Text)
          if t.get_visible() and t.get_text().strip() and t.figure is fig
          and id(t) not in hidden]


def layout_problems(fig: Any) -> List[str]:
  """Text below MIN_FONT or cut off by the figure's edge, and titles that overlap
  another element of the figure (tight bounding boxes, as drawn).

  Args:
    fig: a drawn matplotlib figure.

  Returns:
    The problems in words.
  """
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  problems = [f'{t.get_text()!r} is {t.get_fontsize():g} pt' for t in _texts(fig)
              if t.get_fontsize() < MIN_FONT]
  canvas = fig.bbox.padded(1)
  problems += [f'{t.get_text()!r} is cut off by the edge' for t in _texts(fig)
               if not canvas.containsx(t.get_window_extent(renderer).x1)
               or not canvas.containsy(t.get_window_extent(renderer).y1)
               or not canvas.containsx(t.get_window_extent(renderer).x0)
               or not canvas.containsy(t.get_window_extent(renderer).y0)]
  titles = [(ax.title, ax) for ax in fig.axes if ax.get_title()]
  if fig._suptitle is not None and fig._suptitle.get_text():
    titles.append((fig._suptitle, None))
  for title, owner in titles:
    box = title.get_window_extent(renderer).shrunk(0.98, 0.9)
    others = []
    for ax in fig.axes:
      if ax is owner:  # its own axes area and tick labels, not its title
        others += [ax.patch] + list(ax.get_xticklabels()) + list(ax.get_yticklabels())
      else:
        others += [ax.patch, ax.title] + list(ax.get_xticklabels()) + \
            [ax.xaxis.label, ax.yaxis.label]
    for other in others:
      if other is title or not other.get_visible():
        continue
      if isinstance(other, matplotlib.text.Text) and not other.get_text().strip():
        continue
      if box.overlaps(other.get_window_extent(renderer)):
        name = other.get_text() if isinstance(other, matplotlib.text.Text) else 'an axes'
        problems.append(f'title {title.get_text()!r} overlaps {name!r}')
  return problems


def describe(fig: Any) -> str:
  """What a figure shows, in words, from its own titles, labels and legends.

  Args:
    fig: a matplotlib figure.

  Returns:
    The description (the PNG's alt text).
  """
  parts = []
  if fig._suptitle is not None and fig._suptitle.get_text():
    parts.append(fig._suptitle.get_text() + '.')
  for ax in fig.axes:
    if ax.get_label() == '<colorbar>':
      if ax.get_ylabel():
        parts.append(f'Colour scale: {ax.get_ylabel()}.')
      continue
    what = []
    if ax.get_title():
      what.append(ax.get_title())
    if ax.get_xlabel() or ax.get_ylabel():
      what.append(f'{ax.get_ylabel() or "value"} against {ax.get_xlabel() or "position"}')
    legend = ax.get_legend()
    if legend is not None:
      what.append('series: ' + ', '.join(t.get_text() for t in legend.get_texts()))
    if what:
      parts.append('; '.join(what) + '.')
  # One line: a title of two lines would break the alt text where it is quoted.
  return ' '.join(' '.join(part.split()) for part in dict.fromkeys(parts))


# Every figure file this process wrote (absolute paths): the analysis's manifest of
# --out lists these, never a file that someone else put there meanwhile.
SAVED: Set[str] = set()


def _save(fig, path: Optional[str]):
  if path is None:
    return fig
  SAVED.add(os.path.abspath(path))
  # Drawn once, at the file's resolution: the layout check's drawing is the PNG's
  # pixels (what `savefig` writes after drawing it again).
  fig.set_dpi(DPI)
  metadata = {ALT_KEY: describe(fig), LAYOUT_KEY: json.dumps(layout_problems(fig))}
  matplotlib.image.imsave(path, fig.canvas.buffer_rgba(), format='png', dpi=DPI,
                          metadata=metadata)
  plt.close(fig)
  return path


def _figure(*args, **kwargs):
  """plt.subplots with the constrained layout, which keeps titles, labels and
  colour bars apart."""
  return plt.subplots(*args, layout='constrained', **kwargs)


def colours(preferred: Sequence[Optional[str]]) -> list:
  """A colour per model: the one it prefers (its kind's, `KIND_COLOURS`), or a
  spare Okabe-Ito colour where none is given or an earlier model took it.

  Args:
    preferred: each model's preferred colour, or None.

  Returns:
    A colour per model.
  """
  spare, used, out = list(OTHER_COLOURS), set(), []
  for colour in preferred:
    if colour is None or colour in used:
      colour = spare.pop(0) if spare else None
    used.add(colour)
    out.append(colour)
  return out


def _layer_ticks(ax, which: str, labels: Sequence[str]) -> None:
  """Layer names as tick labels on the 'x' or 'y' axis of `ax`, thinned to at
  most MAX_TICKS."""
  step = int(np.ceil(len(labels) / MAX_TICKS))
  positions = list(range(0, len(labels), step))
  names = [labels[i] for i in positions]
  if which == 'x':
    ax.set_xticks(positions, names, rotation=90, fontsize=TICK_FONT)
  else:
    ax.set_yticks(positions, names, fontsize=TICK_FONT)


class Panel(NamedTuple):
  """One heatmap of `heatmaps`: columns and rows named by layer labels, with the
  indices where a new stage begins (`Layers.stages`) dashed."""
  matrix: np.ndarray
  title: str
  xlabels: Sequence[str]
  ylabels: Sequence[str]
  xstages: Sequence[int] = ()
  ystages: Sequence[int] = ()
  xname: str = 'layer'  # the axis labels
  yname: str = 'layer'


def _draw_heatmap(ax, matrix, xlabels, ylabels, vmin, vmax, xstages=(), ystages=()):
  image = ax.imshow(matrix, origin='lower', cmap=HEATMAP_CMAP, vmin=vmin, vmax=vmax,
                    aspect='auto')
  if xlabels is not None:
    _layer_ticks(ax, 'x', xlabels)
  if ylabels is not None:
    _layer_ticks(ax, 'y', ylabels)
  for start in xstages:
    ax.axvline(start - 0.5, color='white', lw=0.6, ls='--')
  for start in ystages:
    ax.axhline(start - 0.5, color='white', lw=0.6, ls='--')
  return image


def heatmap(matrix: np.ndarray, path: Optional[str], title: str, xlabel: str, ylabel: str,
            vmin: Optional[float] = 0., vmax: Optional[float] = 1.,
            xlabels: Optional[Sequence[str]] = None, ylabels: Optional[Sequence[str]] = None,
            xstages: Sequence[int] = (), ystages: Sequence[int] = (),
            colorbar_label: str = '') -> Any:
  """A matrix with row 0 at the bottom, as CKA figures are drawn; `xlabels` and
  `ylabels` name the columns and rows (layer names), and the column and row
  indices in `xstages` and `ystages` begin a new stage (dashed).

  Args:
    matrix: the (rows, columns) values.
    path: the PNG to write, or None.
    title: the title.
    xlabel: the x axis' label.
    ylabel: the y axis' label.
    vmin: the colour scale's low end (None: the data's).
    vmax: its high end (None: the data's).
    xlabels: the columns' names.
    ylabels: the rows' names.
    xstages: columns that begin a stage.
    ystages: rows that begin a stage.
    colorbar_label: the colour bar's label.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  fig, ax = _figure(figsize=(5.6, 5.))
  image = _draw_heatmap(ax, matrix, xlabels, ylabels, vmin, vmax, xstages, ystages)
  fig.colorbar(image, ax=ax, label=colorbar_label)
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  return _save(fig, path)


def heatmaps(panels: Sequence[Panel], path: Optional[str], title: str, vmin: float = 0.,
             vmax: float = 1., colorbar_label: str = '') -> Any:
  """Heatmaps side by side on one colour scale, as Raghu et al. juxtapose ViT and
  ResNet CKA.

  Args:
    panels: the heatmaps.
    path: the PNG to write, or None.
    title: the title.
    vmin: the colour scale's low end.
    vmax: its high end.
    colorbar_label: the colour bar's label.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  fig, axes = _figure(1, len(panels), figsize=(5.2 * len(panels) + 1., 5.6), squeeze=False)
  for ax, panel in zip(axes[0], panels):
    image = _draw_heatmap(ax, panel.matrix, panel.xlabels, panel.ylabels, vmin, vmax,
                          panel.xstages, panel.ystages)
    ax.set_title(panel.title, fontsize=10)
    ax.set(xlabel=panel.xname, ylabel=panel.yname)
  fig.colorbar(image, ax=list(axes[0]), fraction=0.03, label=colorbar_label)
  fig.suptitle(title)
  return _save(fig, path)


def log_limits(values: Sequence[np.ndarray], decades: float) -> Tuple[float, float]:
  """y-limits of a log axis from the data: from the smallest positive value (but at
  most `decades` below the peak) to a little above the peak.

  Args:
    values: the curves' values.
    decades: the most decades below the peak.

  Returns:
    (low, high).
  """
  flat = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in values])
  flat = flat[np.isfinite(flat) & (flat > 0)]
  peak = flat.max()
  return max(flat.min() / 1.5, peak * 10. ** -decades), peak * 1.5


def curves(series: Dict[str, np.ndarray], path: Optional[str], title: str, xlabel: str,
           ylabel: str, x: Union[None, np.ndarray, Dict[str, np.ndarray]] = None,
           shade: Union[Sequence[float], Dict[str, Sequence[float]]] = (),
           logy: bool = False, legend: bool = True, decades: float = 6.,
           xlabels: Optional[Sequence[str]] = None,
           colours_of: Optional[Dict[str, str]] = None, shade_width: float = 1.,
           stages: Sequence[int] = (), errors: Optional[Dict[str, np.ndarray]] = None,
           shade_label: str = '', rug: Optional[Dict[str, np.ndarray]] = None,
           rug_label: str = 'marks', reference: Optional[Tuple[float, str]] = None,
           runs: Optional[Dict[str, Sequence[np.ndarray]]] = None) -> Any:
  """One line per named series, at `x` (shared, or per series name; default
  0, 1, ...). `shade` marks x positions (attention blocks; per series name to
  shade in that series' colour), named `shade_label` in the legend; `xlabels`
  names the positions 0, 1, ... (layer names), and a new stage begins at each
  position in `stages` (dashed); a log axis spans at most `decades` below the
  peak. `errors` gives a series' standard errors, drawn as error bars; NaN values
  (no support) are left out, not drawn. `rug` marks values on the x axis in a
  series' colour (extreme eigenvalues), named '<series>: `rug_label`' in the
  legend; `reference` is a horizontal (value, name). `runs` gives a series' training
  runs (seeds), drawn thin behind it in its colour, the series their mean.

  Args:
    series: name -> values.
    path: the PNG to write, or None.
    title: the title.
    xlabel: the x axis' label.
    ylabel: the y axis' label.
    x: the positions, shared or per series name.
    shade: positions to shade, shared or per series name.
    logy: a log y axis.
    legend: draw a legend.
    decades: the log axis' span below the peak.
    xlabels: the positions' names.
    colours_of: each series' colour.
    shade_width: the shaded bands' width.
    stages: positions that begin a stage.
    errors: name -> standard errors.
    shade_label: the shading's legend entry.
    rug: name -> values marked on the x axis.
    rug_label: the rug's legend entry.
    reference: a horizontal (value, name).
    runs: name -> the values of each of its runs.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  fig, ax = _figure(figsize=(6.2, 4.3))
  colour_of = {}
  for name, values in series.items():
    values = np.asarray(values)
    at = x.get(name) if isinstance(x, dict) else x
    at = np.arange(len(values)) if at is None else at
    line, = ax.plot(at, values, label=name, marker='.' if len(values) <= 64 else None,
                    color=(colours_of or {}).get(name))
    colour_of[name] = line.get_color()
    for run in (runs or {}).get(name, ()):
      ax.plot(at, np.asarray(run), color=line.get_color(), lw=0.7, alpha=0.4, zorder=1)
    if errors is not None and name in errors:
      ax.errorbar(at, values, yerr=np.asarray(errors[name], np.float64), fmt='none',
                  ecolor=line.get_color(), capsize=2, lw=0.8)
  shades = shade if isinstance(shade, dict) else {None: shade}
  for name, positions in shades.items():
    colour = (colours_of or {}).get(name, '0.5') if name is not None else '0.5'
    for i, position in enumerate(positions):
      ax.axvspan(position - shade_width / 2, position + shade_width / 2, color=colour,
                 alpha=0.15, lw=0, zorder=0,
                 label=shade_label if shade_label and i == 0 and name is None else None)
  for name, values in (rug or {}).items():
    ax.plot(values, np.zeros(len(values)), '|', color=colour_of.get(name), ms=14, mew=1.5,
            transform=ax.get_xaxis_transform(), label=f'{name}: {rug_label}', clip_on=False)
  if reference is not None:
    ax.axhline(reference[0], color='0.3', lw=1, ls=':', label=reference[1])
  if xlabels is not None:
    _layer_ticks(ax, 'x', xlabels)
  for start in stages:
    ax.axvline(start - 0.5, color='0.6', lw=0.6, ls='--', zorder=0)
  if logy:
    ax.set_yscale('log')
    ax.set_ylim(*log_limits(list(series.values()), decades))
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  if len(series) > 1 and not legend:  # many layers: colour runs from shallow (dark) to deep
    for line, colour in zip(ax.get_lines(), plt.cm.viridis(np.linspace(0, 1, len(series)))):
      line.set_color(colour)
    mappable = plt.cm.ScalarMappable(cmap='viridis', norm=plt.Normalize(0, len(series) - 1))
    bar = fig.colorbar(mappable, ax=ax, label='layer (shallow to deep)')
    bar.ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
  elif legend and (len(series) > 1 or shade_label or rug or reference):
    ax.legend(fontsize='small')
  return _save(fig, path)


def bin_counts(values: Union[np.ndarray, Dict[str, np.ndarray]]) -> Dict[str, Any]:
  """Values counted in 30 bins over their range, as `histogram` draws them: the
  numbers a tool's JSON keeps of a histogram, drawn by `binned`.

  Args:
    values: the values, or name -> values (counted on shared bins).

  Returns:
    {'edges': the 31 bin edges, 'counts': each bin's count, or name -> counts}, as
    lists.
  """
  sets = values if isinstance(values, dict) else {'': values}
  edges = np.histogram_bin_edges(np.concatenate([np.ravel(v) for v in sets.values()]), 30)
  counts = {name: np.histogram(np.ravel(v), edges)[0].tolist() for name, v in sets.items()}
  return {'edges': edges.tolist(), 'counts': counts if isinstance(values, dict) else counts['']}


def histogram(values: Union[np.ndarray, Dict[str, np.ndarray]], path: Optional[str],
              title: str, xlabel: str, colours_of: Optional[Dict[str, str]] = None,
              logy: bool = False, marks: Sequence[Tuple[float, str]] = ()) -> Any:
  """A histogram, or overlaid ones on shared bins for named value sets: the values
  counted by `bin_counts`, drawn by `binned` (the other arguments are its own).

  Args:
    values: the values, or name -> values.
    path: the PNG to write, or None.
    title: the title.
    xlabel: the x axis' label.
    colours_of: each set's colour.
    logy: a log count axis.
    marks: vertical (value, name) lines.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  bins = bin_counts(values)
  return binned(bins['counts'], bins['edges'], path, title, xlabel, colours_of, logy, marks)


def binned(counts: Union[np.ndarray, Dict[str, np.ndarray]], edges: np.ndarray,
           path: Optional[str], title: str, xlabel: str,
           colours_of: Optional[Dict[str, str]] = None, logy: bool = False,
           marks: Sequence[Tuple[float, str]] = ()) -> Any:
  """A histogram of counts already binned (`histogram`'s, or a tool's JSON's), or
  overlaid ones on the same bins for named sets.

  Args:
    counts: each bin's count, or name -> counts.
    edges: the bins' edges (one more than the counts).
    path: the PNG to write, or None.
    title: the title.
    xlabel: the x axis' label.
    colours_of: each set's colour.
    logy: a log count axis (to show a few outliers beside the bulk).
    marks: vertical (value, name) lines, such as a threshold.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  sets = counts if isinstance(counts, dict) else {'': counts}
  edges = np.asarray(edges, np.float64)
  fig, ax = _figure(figsize=(5.8, 4.))
  for name, c in sets.items():
    ax.hist(edges[:-1], bins=edges, weights=np.asarray(c, np.float64),
            alpha=0.6 if len(sets) > 1 else 1., label=name or None,
            color=(colours_of or {}).get(name))
  for value, name in marks:
    ax.axvline(value, color='k', linestyle='--', linewidth=1, label=name)
  ax.set(title=title, xlabel=xlabel, ylabel='count')
  if logy:
    ax.set_yscale('log')
  if len(sets) > 1 or marks:
    ax.legend(fontsize='small')
  return _save(fig, path)


def scatter_by_layer(values: np.ndarray, path: Optional[str], title: str, ylabel: str,
                     errors: Optional[np.ndarray] = None, reference: Optional[float] = None,
                     reference_label: str = '') -> Any:
  """(layers, heads) values, one dot per head in the head's colour (legend), with
  standard errors as bars and a horizontal reference line.

  Args:
    values: (layers, heads) values.
    path: the PNG to write, or None.
    title: the title.
    ylabel: the y axis' label.
    errors: their standard errors, or None.
    reference: a horizontal line's value, or None.
    reference_label: its legend entry.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  values = np.asarray(values)
  fig, ax = _figure(figsize=(6.2, 4.3))
  heads = values.shape[1]
  colours = plt.cm.viridis(np.linspace(0, 1, heads))
  offsets = np.linspace(-0.25, 0.25, heads) if heads > 1 else np.zeros(1)
  for h in range(heads):
    at = np.arange(len(values)) + offsets[h]
    ax.scatter(at, values[:, h], s=14, color=colours[h], label=f'head {h}', zorder=3)
    if errors is not None:
      ax.errorbar(at, values[:, h], yerr=np.asarray(errors)[:, h], fmt='none',
                  ecolor=colours[h], lw=0.8, capsize=1.5)
  if reference is not None:
    ax.axhline(reference, color='0.3', lw=1, ls=':', label=reference_label)
  ax.set(title=title, xlabel='block', ylabel=ylabel)
  ax.set_xticks(range(len(values)))
  ax.legend(fontsize='small', ncol=2 if heads > 6 else 1, loc='best')
  return _save(fig, path)


def bars(values: np.ndarray, errors: np.ndarray, labels: Sequence[str], kinds: Sequence[str],
         path: Optional[str], title: str, ylabel: str, separators: Sequence[int] = ()) -> Any:
  """One bar per entry with its error bar, coloured by kind (a legend entry each),
  dashed lines before the entries in `separators` (stages).

  Args:
    values: one value per bar.
    errors: their standard errors.
    labels: the bars' names.
    kinds: each bar's kind (its colour).
    path: the PNG to write, or None.
    title: the title.
    ylabel: the y axis' label.
    separators: entries a dashed line goes before.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  fig, ax = _figure(figsize=(max(5., 0.35 * len(values) + 2.), 4.))
  palette = dict(zip(dict.fromkeys(kinds), colours([None] * len(set(kinds)))))
  for i, (value, error, kind) in enumerate(zip(values, errors, kinds)):
    ax.bar(i, value, yerr=error, color=palette[kind], capsize=2,
           label=kind if kinds.index(kind) == i else None)
  for start in separators:
    ax.axvline(start - 0.5, color='grey', linestyle='--', linewidth=0.8)
  ax.axhline(0, color='black', linewidth=0.6)
  _layer_ticks(ax, 'x', list(labels))
  ax.set(title=title, ylabel=ylabel)
  ax.legend(fontsize='small', loc='best')
  return _save(fig, path)


def scatter(points: Dict[str, Tuple[np.ndarray, np.ndarray]], path: Optional[str], title: str,
            xlabel: str, ylabel: str) -> Any:
  """Point clouds, one colour and legend entry per series: name -> (x, y).

  Args:
    points: name -> (x, y).
    path: the PNG to write, or None.
    title: the title.
    xlabel: the x axis' label.
    ylabel: the y axis' label.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  fig, ax = _figure(figsize=(6.2, 4.3))
  _draw_scatter(ax, points)
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  return _save(fig, path)


def _draw_scatter(ax, points: Dict[str, Tuple[np.ndarray, np.ndarray]]) -> None:
  for (name, (x, y)), colour in zip(points.items(), colours([None] * len(points))):
    ax.scatter(x, y, s=22, color=colour, label=name, zorder=3)
  ax.legend(fontsize='small', loc='best')


def scatter_panels(panels: Dict[str, Tuple[Dict[str, Tuple[np.ndarray, np.ndarray]], str]],
                   path: Optional[str], title: str, xlabel: str, cols: int = 4) -> Any:
  """`scatter`'s point clouds in several panels with a shared x axis: one per
  quantity on the y axis (one similarity measure each, say).

  Args:
    panels: panel title -> (name -> (x, y), the y axis' label).
    path: the PNG to write, or None.
    title: the figure's title.
    xlabel: the x axis' label.
    cols: panels per row.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  cols = min(cols, len(panels))
  rows = int(np.ceil(len(panels) / cols))
  fig, axes = _figure(rows, cols, figsize=(4.2 * cols, 3.4 * rows + 0.6), squeeze=False)
  for ax, (name, (points, ylabel)) in zip(axes.ravel(), panels.items()):
    _draw_scatter(ax, points)
    ax.set_title(name, fontsize=10)
    ax.set(xlabel=xlabel, ylabel=ylabel)
  for ax in axes.ravel()[len(panels):]:
    ax.axis('off')
  fig.suptitle(title)
  return _save(fig, path)


def landscape(a: np.ndarray, b: np.ndarray, values: np.ndarray, path: Optional[str], title: str,
              xlabel: str, ylabel: str, surface: bool = False) -> Any:
  """A loss landscape on the grid (a, b) (values indexed [b, a]): filled contours
  with their lines, or with `surface` a 3-D surface, as Park & Kim draw them.

  Args:
    a: the first direction's steps.
    b: the second's.
    values: the losses, indexed [b, a].
    path: the PNG to write, or None.
    title: the title.
    xlabel: the x axis' label.
    ylabel: the y axis' label.
    surface: a 3-D surface instead of contours.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  a, b, values = map(np.asarray, (a, b, values))
  x, y = np.meshgrid(a, b)
  if surface:
    fig = plt.figure(figsize=(6.4, 4.8), layout='constrained')
    ax = fig.add_subplot(projection='3d')
    ax.plot_surface(x, y, values, cmap='viridis', linewidth=0, antialiased=True)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel, zlabel='loss')
    ax.set_box_aspect(None, zoom=0.8)  # room for the tick labels of the tilted axes
    # Ticks within the data only: 3-D axes draw those beyond it outside the frame.
    ax.set_xticks(np.linspace(a.min(), a.max(), 5))
    ax.set_yticks(np.linspace(b.min(), b.max(), 5))
    ax.set_zticks(np.linspace(values.min(), values.max(), 4))
    ax.zaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter('%.3g'))
    return _save(fig, path)
  fig, ax = _figure(figsize=(5.6, 4.6))
  filled = ax.contourf(x, y, values, levels=20, cmap='viridis')
  ax.contour(x, y, values, levels=20, colors='k', linewidths=0.4)
  ax.plot(0, 0, 'r+', ms=10, mew=1.5, label='the trained parameters')
  fig.colorbar(filled, ax=ax, label='loss')
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel, aspect='equal')
  ax.legend(fontsize='small', loc='upper right')
  return _save(fig, path)


def reliability(count: np.ndarray, accuracy: np.ndarray, edges: np.ndarray, path: Optional[str],
                title: str, colour: Optional[str] = None) -> Any:
  """Park & Kim's calibration figure: the share of predictions in each confidence
  bin, and each bin's accuracy against the diagonal of perfect calibration.

  Args:
    count: predictions per bin.
    accuracy: each bin's accuracy.
    edges: the bins' edges.
    path: the PNG to write, or None.
    title: the title.
    colour: the bars' colour.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  count, accuracy, edges = map(np.asarray, (count, accuracy, edges))
  centres, width = (edges[:-1] + edges[1:]) / 2 * 100, np.diff(edges) * 100
  fig, (left, right) = _figure(1, 2, figsize=(9., 3.9))
  left.bar(centres, count / max(count.sum(), 1) * 100, width=width, color=colour or 'tab:green',
           edgecolor='black', alpha=0.8)
  left.set(title='Predictions per bin', xlabel='confidence (%)', ylabel='share (%)',
           xlim=(0, 100))
  right.plot([0, 100], [0, 100], ls=':', color='black', label='calibrated')
  right.bar(centres, accuracy * 100, width=width, color=colour or 'tab:red', edgecolor='black',
            alpha=0.8, label='accuracy')
  right.set(title='Reliability', xlabel='confidence (%)', ylabel='accuracy (%)', xlim=(0, 100),
            ylim=(0, 100))
  right.legend(fontsize='small', loc='upper left')
  fig.suptitle(title)
  return _save(fig, path)


def image_grid(images: np.ndarray, path: Optional[str], title: str, cols: int = 7,
               labels: Optional[Sequence[str]] = None, cmap: Optional[str] = None,
               colorbar_label: str = '', vmin: Optional[float] = None,
               vmax: Optional[float] = None,
               marks: Optional[Sequence[Tuple[float, float]]] = None) -> Any:
  """Images (n, h, w) or (n, h, w, 3) in a grid, each named by its label below it.
  Without `vmin`/`vmax` each is scaled to its own range; with them, one-channel
  images share that scale and its colour bar (`colorbar_label`). `marks` puts a
  cross at a (row, column) of each image (the query of a similarity map).

  Args:
    images: (n, h, w) or (n, h, w, 3) images.
    path: the PNG to write, or None.
    title: the title.
    cols: the grid's columns.
    labels: each image's name.
    cmap: the colour map of one-channel images.
    colorbar_label: the shared colour bar's label.
    vmin: the shared scale's low end.
    vmax: its high end.
    marks: a (row, column) per image to cross.

  Returns:
    `path`, or the open figure where `path` is None.
  """
  n = len(images)
  cols = min(cols, n)
  rows = int(np.ceil(n / cols))
  fig, axes = _figure(rows, cols, figsize=(1.45 * cols + (1. if colorbar_label else 0.),
                                           1.6 * rows + 0.8), squeeze=False)
  shown = None
  for i, ax in enumerate(axes.ravel()):
    ax.set_xticks([])
    ax.set_yticks([])
    if i >= n:
      ax.axis('off')
      continue
    image = np.asarray(images[i], np.float64)
    if vmin is None or vmax is None:
      image = (image - image.min()) / max(image.max() - image.min(), 1e-12)
    shown = ax.imshow(image, cmap=cmap if image.ndim == 2 else None,
                      vmin=vmin if image.ndim == 2 else None,
                      vmax=vmax if image.ndim == 2 else None)
    if marks is not None:
      ax.plot(marks[i][1], marks[i][0], 'x', color='red', ms=7, mew=2)
    if labels is not None:
      ax.set_xlabel(labels[i], fontsize=MIN_FONT)
  if colorbar_label and shown is not None:
    fig.colorbar(shown, ax=list(axes.ravel()), fraction=0.03, label=colorbar_label)
  fig.suptitle(title)
  return _save(fig, path)
