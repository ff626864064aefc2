"""Feature-map Fourier analysis and variance over depth (Park & Kim Fig. 2b, 9)."""
from typing import Dict, List, Mapping

import numpy as np

from analysis import features, fourier, joint_figures, plots
from analysis.tool import (Batches, Subject, Tool, each_model, figure_path, model_scalars,
                           per_model, register)


def run_fourier(subject: Subject, batches: Batches, out: str) -> Dict:
  """Relative log amplitude curves per layer (each drawn at the authors' positions,
  `fourier.curve_positions`), the last entry of each, their "high frequency", vs
  depth (attention outputs shaded), and the unbiased feature-map variance vs depth."""
  layers = subject.layers
  names = list(layers.stream)

  def per_batch(images):
    inter = subject.intermediates(images, names)
    maps = [features.spatial_map(subject, inter[n]) for n in names]
    return ([np.asarray(fourier.relative_log_amplitude(m)) for m in maps],
            np.array([fourier.spatial_variance(m) for m in maps]))

  results = [per_batch(images) for images, _ in batches('eval')]
  # Maps differ in size between ResNet stages, so curves differ in length.
  curves = [np.mean([c[i] for c, _ in results], axis=0) for i in range(len(names))]
  variance = np.mean([v for _, v in results], axis=0)
  high = np.array([curve[-1] for curve in curves])
  labels, shade = list(layers.labels), list(layers.attention)
  positions = {label: fourier.curve_positions(len(c)) for label, c in zip(labels, curves)}
  figures = [
      plots.curves(dict(zip(labels, curves)), figure_path(out, 'fourier_curves', subject),
                   f'Relative log amplitude: {subject.label}', 'frequency (x pi)',
                   'delta log amplitude', x=positions, legend=False),
      plots.curves({'high frequency': high}, figure_path(out, 'fourier_depth', subject),
                   f'High-frequency amplitude vs depth: {subject.label}', 'layer',
                   'delta log amplitude', shade=shade, xlabels=labels, stages=layers.stages),
      plots.curves({'variance': variance}, figure_path(out, 'variance', subject),
                   f'Feature-map variance: {subject.label}', 'layer', 'variance',
                   shade=shade, logy=True, decades=3, xlabels=labels, stages=layers.stages)]
  return {'layers': labels, 'attention_layers': shade,
          'curves': [c.tolist() for c in curves],
          'frequency_positions': [positions[label].tolist() for label in labels],
          'high_frequency': high.tolist(), 'variance': variance.tolist(),
          'figures': figures}


def _findings(label, r, q):
  return [f'{label}: high-frequency delta log amplitude ', q('high_frequency', 0),
          f' at {r["layers"][0]}, ', q('high_frequency', -1), f' at {r["layers"][-1]}; variance ',
          q('variance', 0), ' to ', q('variance', -1)]


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  by_model = per_model(result)
  return (joint_figures.depth_curves(
      by_model, lambda r: r['high_frequency'], colour_of, joint_figures.path(out, 'fourier'),
      'High-frequency amplitude vs depth (attention shaded)', 'delta log amplitude',
      shade_key='attention_layers') +
          joint_figures.depth_curves(
      by_model, lambda r: r['variance'], colour_of, joint_figures.path(out, 'variance'),
      'Feature-map variance vs depth (attention shaded)', 'variance',
      shade_key='attention_layers', logy=True, decades=3))


TOOL = register(Tool(
    name='fourier', title='Fourier analysis and feature-map variance',
    quantity='Relative log amplitude of the feature maps\' 2-D Fourier transform: the '
             'high-frequency value is delta log amplitude at pi against 0, per layer; variance '
             'is the unbiased feature-map variance per layer.',
    paper='Park & Kim (Fig. 2b, 9): multi-head attention lowers high-frequency amplitude '
          '(low-pass) and convolutions raise it; MSAs lower feature-map variance, convolutions '
          'raise it.',
    run=run_fourier, findings=each_model(_findings),
    scalars=model_scalars(lambda r: {'fourier/high_frequency': list(r['high_frequency']),
                                     'fourier/variance': list(r['variance'])}),
    joint=joint))
