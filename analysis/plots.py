"""Figures of the analysis results, written as PNG files (matplotlib, no display)."""
from typing import Dict, Optional, Sequence, Union

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402


def _save(fig, path: str) -> str:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def heatmap(matrix: np.ndarray, path: str, title: str, xlabel: str, ylabel: str,
            vmin: Optional[float] = 0., vmax: Optional[float] = 1.) -> str:
  """A matrix with row 0 at the bottom, as CKA figures are drawn."""
  fig, ax = plt.subplots(figsize=(5, 4.4))
  image = ax.imshow(matrix, origin='lower', cmap='magma', vmin=vmin, vmax=vmax, aspect='auto')
  fig.colorbar(image, ax=ax)
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  return _save(fig, path)


def curves(series: Dict[str, np.ndarray], path: str, title: str, xlabel: str, ylabel: str,
           x: Union[None, np.ndarray, Dict[str, np.ndarray]] = None, shade: Sequence[int] = (),
           logy: bool = False, legend: bool = True) -> str:
  """One line per named series, at `x` (shared, or per series name; default
  0, 1, ...); `shade` marks x positions (e.g. attention blocks)."""
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  for name, values in series.items():
    values = np.asarray(values)
    at = x.get(name) if isinstance(x, dict) else x
    ax.plot(np.arange(len(values)) if at is None else at, values, marker='.', label=name)
  for position in shade:
    ax.axvspan(position - 0.5, position + 0.5, color='0.9', zorder=0)
  if logy:
    ax.set_yscale('log')
    # Gaussian tails reach 1e-300; six decades below the peak show the shape.
    peak = max(np.nanmax(np.asarray(v)) for v in series.values())
    ax.set_ylim(bottom=peak * 1e-6)
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  if legend and len(series) > 1:
    ax.legend(fontsize='small')
  elif len(series) > 1:  # many layers: colour runs from shallow (dark) to deep (light)
    for line, colour in zip(ax.get_lines(), plt.cm.viridis(np.linspace(0, 1, len(series)))):
      line.set_color(colour)
  return _save(fig, path)


def histogram(values: np.ndarray, path: str, title: str, xlabel: str) -> str:
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  ax.hist(values, bins=30)
  ax.set(title=title, xlabel=xlabel, ylabel='count')
  return _save(fig, path)


def scatter_by_layer(values: np.ndarray, path: str, title: str, ylabel: str) -> str:
  """(layers, heads) values, one dot per head, heads sorted within each layer."""
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  for layer, row in enumerate(values):
    ax.scatter(np.full(len(row), layer), np.sort(row), s=12,
               c=np.arange(len(row)), cmap='viridis')
  ax.set(title=title, xlabel='layer', ylabel=ylabel)
  return _save(fig, path)


def image_grid(images: np.ndarray, path: str, title: str, cols: int = 7,
               titles: Optional[Sequence[str]] = None, cmap: Optional[str] = None) -> str:
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
