"""Figures that put every analysed model in one frame, as the papers draw them:
CKA heatmaps side by side on one colour scale (Raghu et al. Fig. 1), curves over
relative depth overlaid (Park & Kim Fig. 2b, 9), Hessian spectra in the same axes
(Park & Kim Fig. 4). Built from the tools' JSON results alone.
"""
import os
from typing import Dict, List, Mapping

import numpy as np

from analysis import lanczos, plots

Results = Mapping[str, Mapping]  # tool -> its JSON result


def _depth(n: int) -> np.ndarray:
  """Relative depth 0..1 of n layers, so models of different depth share an axis."""
  return np.linspace(0., 1., n) if n > 1 else np.zeros(1)


def per_model(result: Mapping) -> Dict[str, Mapping]:
  """The per-model entries of a tool's JSON (label -> that model's numbers)."""
  return {label: value for label, value in result.items() if isinstance(value, Mapping)}


def _cka(result: Mapping, out: str) -> List[str]:
  layers = result['layers']
  panels = []
  for key, matrix in result['cka'].items():
    a, _, b = key.partition(' vs ')
    b = b or a
    panels.append((np.asarray(matrix).T, key, layers[a], layers[b]))
  return [plots.heatmaps(panels, os.path.join(out, 'joint_cka.png'),
                         f'Linear CKA on {result["num_examples"]} images (one colour scale)')]


def _depth_curves(by_model: Dict[str, Mapping], values, colour_of: Dict[str, str],
                  path: str, title: str, ylabel: str, shade_key=None, **kwargs) -> str:
  series = {label: np.asarray(values(r), np.float64) for label, r in by_model.items()}
  x = {label: _depth(len(v)) for label, v in series.items()}
  shade = {}
  if shade_key is not None:
    for label, r in by_model.items():
      positions = x[label]
      shade[label] = [positions[i] for i in r.get(shade_key, [])]
  width = min((1. / max(len(v) - 1, 1) for v in series.values()), default=1.)
  return plots.curves(series, path, title, 'relative depth', ylabel, x=x, shade=shade,
                      colours_of=colour_of, shade_width=width, **kwargs)


def joint_figures(results: Results, families: Mapping[str, str], out: str
                  ) -> Dict[str, List[str]]:
  """The joint figures of every tool that ran on two or more models, by tool;
  `families` gives each model label's family (for its colour)."""
  figures = {}
  if 'cka' in results and len(results['cka']['layers']) > 1:
    figures['cka'] = _cka(results['cka'], out)
  models = {tool: per_model(result) for tool, result in results.items() if tool != 'cka'}
  models = {tool: by_model for tool, by_model in models.items() if len(by_model) > 1}
  labels = sorted({label for by_model in models.values() for label in by_model})
  colour_of = dict(zip(labels, plots.colours([families.get(label, '') for label in labels])))
  path = lambda name: os.path.join(out, f'joint_{name}.png')
  if 'fourier' in models:
    fourier = models['fourier']
    figures['fourier'] = [
        _depth_curves(fourier, lambda r: r['high_frequency'], colour_of, path('fourier'),
                      'High-frequency amplitude vs depth (attention shaded)',
                      'delta log amplitude', shade_key='attention_layers'),
        _depth_curves(fourier, lambda r: r['variance'], colour_of, path('variance'),
                      'Feature-map variance vs depth (attention shaded)', 'variance',
                      shade_key='attention_layers', logy=True, decades=3)]
  if 'hessian' in models:
    figures['hessian'] = [_hessian(models['hessian'], colour_of, path)]
  if 'robustness' in models:
    robustness = models['robustness']
    eps = {label: r['epsilons'][-1] for label, r in robustness.items()}
    series = {f'{label} (eps {eps[label]:g})': r['accuracy'][-1]
              for label, r in robustness.items()}
    x = {name: np.asarray(r['frequencies']) / np.pi
         for name, r in zip(series, robustness.values())}
    figures['robustness'] = [plots.curves(
        series, path('robustness'), 'Accuracy under frequency-band noise',
        'noise frequency f (x pi)', 'accuracy', x=x,
        colours_of=dict(zip(series, (colour_of[label] for label in robustness))))]
  if 'norm_ratio' in models:
    figures['norm_ratio'] = [_depth_curves(
        models['norm_ratio'],
        lambda r: [row.get('spatial', np.nan) for row in r['ratios'].values()], colour_of,
        path('norm_ratio'), '||z|| / ||f(z)|| of spatial tokens per branch', 'ratio',
        logy=True, decades=3)]
  if 'erf' in models:
    figures['erf'] = [_depth_curves(
        models['erf'], lambda r: r['half_mass_pixels'], colour_of, path('erf'),
        'Receptive field: area holding half the gradient mass', 'pixels', logy=True,
        decades=4)]
  if 'probes' in models:
    figures['probes'] = [_depth_curves(
        models['probes'], lambda r: [row['accuracy'] for row in r['probes']['token mean']],
        colour_of, path('probes'), 'Linear probe on the token mean per layer',
        'test accuracy')]
  return figures


def _hessian(hessian: Dict[str, Mapping], colour_of: Dict[str, str], path) -> str:
  """Every model's SLQ density on one eigenvalue axis, each from its own nodes."""
  span = max(np.abs(np.asarray(r['slq_nodes'])).max() for r in hessian.values())
  grid = np.linspace(-1.05 * span, 1.05 * span, 600)
  series = {label: lanczos.density(np.asarray(r['slq_nodes']), np.asarray(r['slq_weights']),
                                   grid, r['sigma']) for label, r in hessian.items()}
  return plots.curves(series, path('hessian'), 'Hessian spectral densities (SLQ)',
                      'eigenvalue', 'density', x=grid, logy=True, decades=4,
                      colours_of=colour_of)
