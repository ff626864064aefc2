"""The analysis as TensorBoard events beside a model's training events: per tool,
scalar series over layers (the step is the layer, branch, minibatch or frequency
index) and the tool's figures as images.
"""
import os
from typing import Dict, List, Mapping

import numpy as np
from clu import metric_writers
from PIL import Image

Series = Dict[str, List[float]]  # tag -> values at steps 0, 1, ...


def scalar_series(tool: str, result: Mapping, label: str) -> Series:
  """The per-layer numbers of one model in one tool's JSON, as tagged series."""
  if tool == 'cka':
    return {'cka/first_layer_vs_layer': list(result['cka'][label][0])}
  r = result[label]
  if tool == 'attention_distance':
    return {'attention_distance/mean_over_heads_px':
            np.mean(r['distance_per_layer_head'], axis=1).tolist()}
  if tool == 'norm_ratio':
    kinds = next(iter(r['ratios'].values()))
    return {f'norm_ratio/{kind}': [row[kind] for row in r['ratios'].values()] for kind in kinds}
  if tool == 'erf':
    return {'erf/half_mass_pixels': list(r['half_mass_pixels'])}
  if tool == 'probes':
    series = {f'probes/{kind}': [row['accuracy'] for row in rows]
              for kind, rows in r['probes'].items()}
    series.update({f'probes/few_shot_{k}': [v] for k, v in r['few_shot_pre_logits'].items()})
    return series
  if tool == 'localisation':
    return {'localisation/peak_at_query': list(r['peak_at_query'])}
  if tool == 'hessian':
    return {'hessian/top_eigenvalue': [max(top) for top in r['top_per_minibatch']],
            'hessian/negative_fraction': [r['negative_fraction']],
            'hessian/negative_fraction_beyond_1pct': [r['negative_fraction_beyond_1pct']]}
  if tool == 'fourier':
    return {'fourier/high_frequency': list(r['high_frequency']),
            'fourier/variance': list(r['variance'])}
  if tool == 'robustness':
    series = {f'robustness/eps_{eps:g}': list(acc)
              for eps, acc in zip(r['epsilons'], r['accuracy'])}
    series['robustness/clean'] = [r['clean_accuracy']]
    return series
  return {}


def _figures_of(tool: str, result: Mapping, label: str) -> List[str]:
  if tool == 'cka':
    return [path for key, path in zip(result['cka'], result['figures'])
            if label in key.split(' vs ')]
  return list(result[label].get('figures', []))


def write_events(results: Mapping[str, Mapping], logdirs: Mapping[str, str],
                 out: str) -> None:
  """Writes every model's scalars and figures to its logdir (label -> directory);
  figures are read from `out`, where the tools wrote them."""
  for label, logdir in logdirs.items():
    writer = metric_writers.SummaryWriter(logdir)  # TensorBoard only, not the log
    for tool, result in results.items():
      if tool != 'cka' and label not in result:
        continue
      for tag, values in scalar_series(tool, result, label).items():
        for step, value in enumerate(values):
          writer.write_scalars(step, {f'analysis/{tag}': float(value)})
      for path in _figures_of(tool, result, label):
        name = os.path.splitext(os.path.basename(path))[0]
        with Image.open(os.path.join(out, os.path.basename(path))) as image:
          pixels = np.asarray(image.convert('RGB'))
        writer.write_images(0, {f'analysis/{tool}/{name}': pixels[None]})
    writer.close()
