"""The tools of Park & Kim 2022 run on zoo models over a dataset: Hessian spectra,
feature-map Fourier curves, feature-map variance and robustness to band-limited
noise. Same conventions as `representation_tools`: numbers returned, figures written.
"""
from typing import Dict, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from analysis import features, fourier, hessian, lanczos, plots
from analysis.representation_tools import Batches, Subject, figure_path

DENSITY_DECADES = 4  # an SLQ density is drawn down to 1e-4 of its peak


def _fixed_batches(batches: Batches, split: str, count: int, num_classes: int):
  """`count` batches drawn once, so the loss is one function: stacked (K, B, ...)
  images and (K, B, C) label distributions (integer labels become one-hot), each
  batch split over the devices."""
  fixed = []
  for images, labels in batches(split):
    if labels.ndim == 1:
      labels = jax.nn.one_hot(labels, num_classes)
    fixed.append((images, labels))
    if len(fixed) == count:
      return tuple(features.shard_examples(x, axis=1) for x in hessian.stack_batches(fixed))
  raise ValueError(f'The {split} split gave {len(fixed)} batches, fewer than the {count} '
                   'needed; use more images.')


def hessian_objective(subject: Subject, objective: str, unroll: bool = False):
  """(loss, split of its batches, description) for `objective`:
  'training', the recipe's own loss plus L2 on training batches with its
  augmentation (Park & Kim's protocol, `hessian.recipe_objective`), or 'clean',
  plain cross-entropy without L2 on evaluation-preprocessed training images.
  `unroll` as in `hessian.training_loss`."""
  if objective == 'clean':
    return (hessian.training_loss(subject.model, unroll=unroll), 'train',
            {'loss': 'softmax', 'label_smoothing': 0., 'l2': 0.,
             'data': 'training split, evaluation preprocessing'})
  if objective != 'training':
    raise ValueError(f'Unknown Hessian objective {objective!r}; use training or clean.')
  if subject.recipe is None:
    raise ValueError(f'The training objective of {subject.label} needs the recipe that '
                     'trained it (load_subject(..., recipe=)); or measure objective="clean".')
  loss, description = hessian.recipe_objective(subject.model, subject.recipe, unroll)
  return loss, features.TRAIN_AUGMENTED, {**description,
                                 'data': 'training split through the training pipeline, '
                                         'augmentation drawn once'}


def run_hessian(subject: Subject, batches: Batches, out: str, num_minibatches: int = 4,
                top_k: int = 5, steps_top: int = 20, steps_density: int = 40,
                num_probes: int = 2, objective: str = 'training') -> Dict:
  """Top-k Hessian eigenvalues on each of several minibatches (the paper's protocol),
  and an SLQ density with its negative fraction on all of them together, of the
  objective `hessian_objective` names (recorded in the JSON)."""
  num_classes = subject.config.num_classes
  # Convolutions run slowly inside XLA:CPU loop bodies: drive those models from Python there.
  host_loop = subject.family.convolutional and jax.default_backend() == 'cpu'
  loss, split, description = hessian_objective(subject, objective, unroll=host_loop)
  fixed = _fixed_batches(batches, split, num_minibatches, num_classes)
  matvec, dim = hessian.flat_hvp(loss, subject.params, unroll=host_loop)
  tops = [lanczos.extreme_eigenvalues(matvec, dim, steps_top, top_k, jax.random.PRNGKey(i),
                                      operands=(subject.params, tuple(x[i:i + 1] for x in fixed)),
                                      host_loop=host_loop)['top'].tolist()
          for i in range(num_minibatches)]
  nodes, weights = lanczos.slq(matvec, dim, steps_density, num_probes,
                               operands=(subject.params, fixed), host_loop=host_loop)
  span = max(np.abs(nodes).max(), 1e-12)
  grid = np.linspace(-span * 1.05, span * 1.05, 400)
  sigma = span / 100
  spectrum = lanczos.density(nodes, weights, grid, sigma)
  figures = [
      plots.histogram(np.ravel(tops), figure_path(out, 'hessian_top', subject),
                      f'Top-{top_k} Hessian eigenvalues on {num_minibatches} minibatches: '
                      f'{subject.label}', 'eigenvalue'),
      plots.curves({'density': spectrum}, figure_path(out, 'hessian_density', subject),
                   f'Hessian spectral density (SLQ, sigma {sigma:.3g}): {subject.label}',
                   'eigenvalue', 'density', x=grid, logy=True, decades=DENSITY_DECADES)]
  return {'objective': {'name': objective, **description},
          'top_per_minibatch': tops, 'num_parameters': dim,
          'negative_fraction': lanczos.negative_fraction(nodes, weights),
          # Mass below -1% of the largest |eigenvalue|: negative beyond the bulk's scatter.
          'negative_fraction_beyond_1pct': lanczos.negative_fraction(nodes, weights, 0.01 * span),
          'slq_nodes': nodes.tolist(), 'slq_weights': weights.tolist(), 'sigma': sigma,
          'figures': figures}


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
                   'delta log amplitude', shade=shade, xlabels=labels),
      plots.curves({'variance': variance}, figure_path(out, 'variance', subject),
                   f'Feature-map variance: {subject.label}', 'layer', 'variance',
                   shade=shade, logy=True, decades=3, xlabels=labels)]
  return {'layers': labels, 'attention_layers': shade,
          'curves': [c.tolist() for c in curves],
          'frequency_positions': [positions[label].tolist() for label in labels],
          'high_frequency': high.tolist(), 'variance': variance.tolist(),
          'figures': figures}


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
    sign = jnp.sign(jax.random.normal(jax.random.PRNGKey(step), images.shape))
    clean += float(jnp.sum(jnp.argmax(subject.logits(images), -1) == labels))
    for j, f in enumerate(frequencies):
      band = fourier.band_limited(sign, f, width)
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
