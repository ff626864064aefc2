"""Figures of the analysis results, written as PNG files (matplotlib, no display).

Every helper takes the file to write; with `path=None` it returns the open figure
instead (for notebooks and tests).
"""
from typing import Dict, NamedTuple, Optional, Sequence, Tuple, Union

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

# Okabe-Ito colours (safe for colour-blind readers) that no family claims
# (`Family.colour`), for a second model of one family.
OTHER_COLOURS = ('#E69F00', '#56B4E9', '#000000', '#F0E442')
HEATMAP_CMAP = 'magma'  # perceptually uniform, readable in grey and by colour-blind readers
MAX_TICKS = 24


def _save(fig, path: Optional[str]):
  fig.tight_layout()
  if path is None:
    return fig
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def colours(preferred: Sequence[Optional[str]]) -> list:
  """A colour per model: the one it prefers (its family's), or a spare Okabe-Ito
  colour where none is given or an earlier model took it."""
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
    ax.set_xticks(positions, names, rotation=90, fontsize=6)
  else:
    ax.set_yticks(positions, names, fontsize=6)


class Panel(NamedTuple):
  """One heatmap of `heatmaps`: columns and rows named by layer labels, with the
  indices where a new stage begins (`Layers.stages`) dashed."""
  matrix: np.ndarray
  title: str
  xlabels: Sequence[str]
  ylabels: Sequence[str]
  xstages: Sequence[int] = ()
  ystages: Sequence[int] = ()


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
            xstages: Sequence[int] = (), ystages: Sequence[int] = ()):
  """A matrix with row 0 at the bottom, as CKA figures are drawn; `xlabels` and
  `ylabels` name the columns and rows (layer names), and the column and row
  indices in `xstages` and `ystages` begin a new stage (dashed)."""
  fig, ax = plt.subplots(figsize=(5.2, 4.6))
  fig.colorbar(_draw_heatmap(ax, matrix, xlabels, ylabels, vmin, vmax, xstages, ystages),
               ax=ax)
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  return _save(fig, path)


def heatmaps(panels: Sequence[Panel], path: Optional[str], title: str, vmin: float = 0.,
             vmax: float = 1.):
  """Heatmaps side by side on one colour scale, as Raghu et al. juxtapose ViT and
  ResNet CKA."""
  fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels) + 0.8, 5.),
                           squeeze=False, layout='constrained')
  for ax, panel in zip(axes[0], panels):
    image = _draw_heatmap(ax, panel.matrix, panel.xlabels, panel.ylabels, vmin, vmax,
                          panel.xstages, panel.ystages)
    ax.set_title(panel.title, fontsize=9)
  fig.colorbar(image, ax=list(axes[0]), fraction=0.03)
  fig.suptitle(title)
  if path is None:
    return fig
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def log_limits(values: Sequence[np.ndarray], decades: float) -> Tuple[float, float]:
  """y-limits of a log axis from the data: from the smallest positive value (but at
  most `decades` below the peak) to a little above the peak."""
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
           stages: Sequence[int] = (), errors: Optional[Dict[str, np.ndarray]] = None):
  """One line per named series, at `x` (shared, or per series name; default
  0, 1, ...). `shade` marks x positions (attention blocks; per series name to
  shade in that series' colour); `xlabels` names the positions 0, 1, ... (layer
  names), and a new stage begins at each position in `stages` (dashed); a log
  axis spans at most `decades` below the peak. `errors` gives a series' standard
  errors, drawn as error bars; NaN values (no support) are left out, not drawn."""
  fig, ax = plt.subplots(figsize=(5.8, 4.))
  for name, values in series.items():
    values = np.asarray(values)
    at = x.get(name) if isinstance(x, dict) else x
    at = np.arange(len(values)) if at is None else at
    line, = ax.plot(at, values, label=name, marker='.' if len(values) <= 64 else None,
                    color=(colours_of or {}).get(name))
    if errors is not None and name in errors:
      ax.errorbar(at, values, yerr=np.asarray(errors[name], np.float64), fmt='none',
                  ecolor=line.get_color(), capsize=2, lw=0.8)
  shades = shade if isinstance(shade, dict) else {None: shade}
  for name, positions in shades.items():
    colour = (colours_of or {}).get(name, '0.5') if name is not None else '0.5'
    for position in positions:
      ax.axvspan(position - shade_width / 2, position + shade_width / 2, color=colour,
                 alpha=0.15, lw=0, zorder=0)
  if xlabels is not None:
    _layer_ticks(ax, 'x', xlabels)
  for start in stages:
    ax.axvline(start - 0.5, color='0.6', lw=0.6, ls='--', zorder=0)
  if logy:
    ax.set_yscale('log')
    ax.set_ylim(*log_limits(list(series.values()), decades))
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  if legend and len(series) > 1:
    ax.legend(fontsize='small')
  elif len(series) > 1:  # many layers: colour runs from shallow (dark) to deep (light)
    for line, colour in zip(ax.get_lines(), plt.cm.viridis(np.linspace(0, 1, len(series)))):
      line.set_color(colour)
  return _save(fig, path)


def histogram(values: Union[np.ndarray, Dict[str, np.ndarray]], path: Optional[str],
              title: str, xlabel: str, colours_of: Optional[Dict[str, str]] = None):
  """A histogram, or overlaid ones on shared bins for named value sets."""
  sets = values if isinstance(values, dict) else {'': values}
  bins = np.histogram_bin_edges(np.concatenate([np.ravel(v) for v in sets.values()]), 30)
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  for name, v in sets.items():
    ax.hist(np.ravel(v), bins=bins, alpha=0.6 if len(sets) > 1 else 1., label=name or None,
            color=(colours_of or {}).get(name))
  ax.set(title=title, xlabel=xlabel, ylabel='count')
  if len(sets) > 1:
    ax.legend(fontsize='small')
  return _save(fig, path)


def scatter_by_layer(values: np.ndarray, path: Optional[str], title: str, ylabel: str):
  """(layers, heads) values, one dot per head, heads sorted within each layer."""
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  for layer, row in enumerate(values):
    ax.scatter(np.full(len(row), layer), np.sort(row), s=12,
               c=np.arange(len(row)), cmap='viridis')
  ax.set(title=title, xlabel='block', ylabel=ylabel)
  ax.set_xticks(range(len(values)))
  return _save(fig, path)


def image_grid(images: np.ndarray, path: Optional[str], title: str, cols: int = 7,
               titles: Optional[Sequence[str]] = None, cmap: Optional[str] = None):
  """Images (n, h, w) or (n, h, w, 3) in a grid; each is scaled to its own range."""
  n = len(images)
  rows = int(np.ceil(n / cols))
  fig, axes = plt.subplots(rows, cols, figsize=(1.3 * cols, 1.3 * rows + 0.4), squeeze=False)
  for i, ax in enumerate(axes.ravel()):
    ax.axis('off')
    if i < n:
      image = np.asarray(images[i], np.float64)
      image = (image - image.min()) / max(image.max() - image.min(), 1e-12)
      ax.imshow(image, cmap=cmap if image.ndim == 2 else None)
      if titles is not None:
        ax.set_title(titles[i], fontsize=7)
  fig.suptitle(title)
  return _save(fig, path)
