"""Feature-map Fourier analysis and variance over depth (Park & Kim Fig. 2b, 9)."""
from typing import Dict, List, Mapping

import numpy as np

from analysis.measures import frequency, uncertainty
from analysis.reporting import joint_figures, plots, verdict
from analysis.runtime import features
from analysis.tool import (Batches, Subject, Tool, each_model, figure_path, model_scalars,
                           per_model, register)


def measure(subject: Subject, batches: Batches) -> Dict:
  """Relative log amplitude curves per layer (each drawn at the authors' positions,
  `frequency.curve_positions`), the last entry of each, their "high frequency", vs
  depth (attention outputs shaded), and the unbiased feature-map variance vs depth.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  layers = subject.layers
  names = list(layers.stream)

  def per_batch(images):
    inter = subject.intermediates(images, names)
    maps = [features.spatial_map(subject, inter[n]) for n in names]
    return ([np.asarray(frequency.relative_log_amplitude(m)) for m in maps],
            np.array([frequency.spatial_variance(m) for m in maps]))

  results, sizes = [], []
  for images, _ in batches('eval'):
    results.append(per_batch(images))
    sizes.append(len(images))
  # Maps differ in size between ResNet stages, so curves differ in length.
  curves = [np.average([c[i] for c, _ in results], axis=0, weights=sizes)
            for i in range(len(names))]
  variance = np.average([v for _, v in results], axis=0, weights=sizes)
  high = np.array([curve[-1] for curve in curves])
  high_per_batch = [[c[i][-1] for i in range(len(names))] for c, _ in results]
  high_stderr = uncertainty.weighted_mean_stderr(high_per_batch, sizes)
  variance_stderr = uncertainty.weighted_mean_stderr([v for _, v in results], sizes)
  labels, shade = list(layers.labels), list(layers.attention)
  positions = {label: frequency.curve_positions(len(c)) for label, c in zip(labels, curves)}
  result = {'layers': labels, 'attention_layers': shade,
            'curves': [c.tolist() for c in curves],
            'frequency_positions': [positions[label].tolist() for label in labels],
            'high_frequency': high.tolist(), 'high_frequency_stderr': high_stderr.tolist(),
            'variance': variance.tolist(), 'variance_stderr': variance_stderr.tolist()}
  if shade:  # what the attention branches do, per batch: the change they make, averaged
    steps = lambda values: float(np.mean([values[i] - values[i - 1] for i in shade]))
    for key, per_batch_values in (
        ('high_frequency', high_per_batch),
        ('log_variance', [np.log(v) for _, v in results])):
      changes = [steps(values) for values in per_batch_values]
      result[f'attention_{key}_change'] = {
          'mean': float(np.average(changes, weights=sizes)),
          'stderr': float(uncertainty.weighted_mean_stderr(changes, sizes))}
  return result


def draw(result: Dict, subject: Subject, out: str) -> List[str]:
  """The figures of the Fourier tool, from its numbers (`measure`): each layer's curve, the high
  frequency and the variance against depth, attention outputs shaded.

  See `analysis.tool.Draw`.
  """
  labels, shade, stages = result['layers'], result['attention_layers'], subject.layers.stages
  positions = dict(zip(labels, map(np.asarray, result['frequency_positions'])))
  return [
      plots.curves(dict(zip(labels, map(np.asarray, result['curves']))),
                   figure_path(out, 'fourier_curves', subject),
                   f'Relative log amplitude: {subject.label}', 'frequency (x pi)',
                   'delta log amplitude', x=positions, legend=False),
      plots.curves({'high frequency': np.asarray(result['high_frequency'])},
                   figure_path(out, 'fourier_depth', subject),
                   f'High-frequency amplitude vs depth: {subject.label}', 'layer',
                   'delta log amplitude', shade=shade, xlabels=labels, stages=stages,
                   errors={'high frequency': np.asarray(result['high_frequency_stderr'])},
                   shade_label='after attention'),
      plots.curves({'variance': np.asarray(result['variance'])},
                   figure_path(out, 'variance', subject),
                   f'Feature-map variance: {subject.label}', 'layer', 'variance',
                   shade=shade, logy=True, decades=3, xlabels=labels, stages=stages,
                   errors={'variance': np.asarray(result['variance_stderr'])},
                   shade_label='after attention')]


def _findings(label, r, q):
  return [f'{label}: high-frequency delta log amplitude ', q('high_frequency', 0),
          f' at {r["layers"][0]}, ', q('high_frequency', -1), f' at {r["layers"][-1]}; variance ',
          q('variance', 0), ' to ', q('variance', -1)]


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  found = []
  for label, r in per_model(result).items():
    if 'attention_high_frequency_change' not in r:
      continue
    change = lambda key: (-r[key]['mean'], r[key]['stderr'])
    found += [
        verdict.single('attention is a low-pass filter', 'Multi-head attention lowers the '
                       'high-frequency amplitude of feature maps (Park & Kim Fig. 2b).',
                       'minus the mean change in high-frequency delta log amplitude across '
                       'attention branches', label, change('attention_high_frequency_change')),
        verdict.single('attention lowers variance', 'Multi-head attention lowers feature-map '
                       'variance; convolutions raise it (Park & Kim Fig. 9).',
                       'minus the mean change in log variance across attention branches', label,
                       change('attention_log_variance_change'))]
  return found


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """The figures that put every model in one frame.

  Args:
    result: the tool's JSON.
    colour_of: each model label's colour.
    out: the directory the figures go to.

  Returns:
    The figures' paths (none below two models).
  """
  by_model = per_model(result)
  return (joint_figures.depth_curves(
      by_model, lambda r: r['high_frequency'], colour_of, joint_figures.path(out, 'fourier'),
      'High-frequency amplitude vs depth (attention shaded)', 'delta log amplitude',
      shade_key='attention_layers', errors=lambda r: r['high_frequency_stderr']) +
          joint_figures.depth_curves(
      by_model, lambda r: r['variance'], colour_of, joint_figures.path(out, 'variance'),
      'Feature-map variance vs depth (attention shaded)', 'variance',
      shade_key='attention_layers', logy=True, decades=3,
      errors=lambda r: r['variance_stderr']))


TOOL = register(Tool(
    name='fourier', importance=4, title='Fourier analysis and feature-map variance',
    quantity='Relative log amplitude of the feature maps\' 2-D Fourier transform: the '
             'high-frequency value is delta log amplitude at pi against 0, per layer; variance '
             'is the unbiased feature-map variance per layer; error bars are standard errors '
             'over batches. As the authors draw them, a curve\'s ceil(n/2) entries (from an n px '
             'map, entry i at true frequency 2 pi i / n) are spread evenly over 0..pi whatever n: '
             'the last is drawn at pi though it lies at pi (n - 1) / n (odd n) or pi (n - 2) / n '
             '(even n), so a 4 px map\'s two points (0 and pi/2) are drawn at 0 and pi and a 2 px '
             'map gives one point; compare curves of different map sizes by shape only.',
    paper='Park & Kim (Fig. 2b, 9): multi-head attention lowers high-frequency amplitude '
          '(low-pass) and convolutions raise it; MSAs lower feature-map variance, convolutions '
          'raise it.',
    run=measure, draw=draw, findings=each_model(_findings),
    scalars=model_scalars(lambda r: {'fourier/high_frequency': list(r['high_frequency']),
                                     'fourier/variance': list(r['variance'])}),
    joint=joint, verdicts=verdicts))
