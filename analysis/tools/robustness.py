"""Robustness to frequency-band noise (Park & Kim Fig. 2c)."""
from typing import Dict, List, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from analysis import fourier, joint_figures, plots
from analysis.tool import (Batches, Subject, Tool, each_model, figure_path, model_scalars,
                           per_model, register)


def run_robustness(subject: Subject, batches: Batches, out: str,
                   epsilons: Sequence[float] = (0.1, 0.3, 1.0),
                   frequencies: Sequence[float] = tuple(np.linspace(0, np.pi, 9)),
                   width: float = 0.2) -> Dict:
  """Accuracy under the authors' frequency-band noise (`fourier.frequency_noise`:
  eps * sign(N(0, 1)) masked to the square band of half-width `width` around each
  frequency f in [0, pi]) for each eps; one base noise per batch for every (eps, f),
  so curves differ by the band alone. Images are in [-1, 1]."""
  correct = np.zeros((len(epsilons), len(frequencies)))
  clean = count = 0
  for step, (images, labels) in enumerate(batches('eval')):
    images = jnp.asarray(images)
    clean += float(jnp.sum(jnp.argmax(subject.logits(images), -1) == labels))
    for j, f in enumerate(frequencies):
      # The same key for every f: one base noise per batch, masked to each band.
      band = fourier.frequency_noise(jax.random.PRNGKey(step), images.shape, f, 1., width)
      for i, eps in enumerate(epsilons):
        predicted = jnp.argmax(subject.logits(images + eps * band), -1)
        correct[i, j] += float(jnp.sum(predicted == labels))
    count += len(labels)
  accuracy = correct / count
  x = np.asarray(frequencies) / np.pi
  figure = plots.curves({f'eps {eps:g}': acc for eps, acc in zip(epsilons, accuracy)},
                        figure_path(out, 'robustness', subject),
                        f'Frequency-band noise (band half-width {width}): {subject.label}',
                        'noise frequency f (x pi)', 'accuracy', x=x)
  return {'clean_accuracy': clean / count, 'epsilons': list(epsilons),
          'frequencies': list(map(float, frequencies)), 'band_half_width': width,
          'accuracy': accuracy.tolist(), 'accuracy_drop': (clean / count - accuracy).tolist(),
          'figures': [figure]}


def _scalars(r):
  series = {f'robustness/eps_{eps:g}': list(acc)
            for eps, acc in zip(r['epsilons'], r['accuracy'])}
  series['robustness/clean'] = [r['clean_accuracy']]
  return series


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """Each model's accuracy curve at its largest eps."""
  by_model = per_model(result)
  if len(by_model) < 2:
    return []
  names = {label: f'{label} (eps {r["epsilons"][-1]:g})' for label, r in by_model.items()}
  series = {names[label]: r['accuracy'][-1] for label, r in by_model.items()}
  x = {names[label]: np.asarray(r['frequencies']) / np.pi for label, r in by_model.items()}
  return [plots.curves(series, joint_figures.path(out, 'robustness'),
                       'Accuracy under frequency-band noise', 'noise frequency f (x pi)',
                       'accuracy', x=x,
                       colours_of={names[label]: colour_of[label] for label in by_model})]


TOOL = register(Tool(
    name='robustness', title='Robustness to frequency-band noise',
    quantity='Accuracy under noise eps * sign(N(0,1)) masked to a frequency band around f in '
             '[0, pi] (Park & Kim\'s protocol), images in [-1, 1].',
    paper='Park & Kim (Fig. 2c): ViT is robust to high-frequency noise where ResNet is '
          'vulnerable; both suffer from low-frequency noise.',
    run=run_robustness,
    findings=each_model(lambda label, r, q: [
        f'{label}: clean ', q('clean_accuracy'), '; at eps ', q('epsilons', -1), ' accuracy ',
        q('accuracy', -1, 0), ' for f = 0 and ', q('accuracy', -1, -1), ' for f = pi']),
    scalars=model_scalars(_scalars), joint=joint))
