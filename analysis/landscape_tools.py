"""The tools of Park & Kim 2022 run on zoo models over a dataset: Hessian spectra,
feature-map Fourier curves, feature-map variance and robustness to band-limited
noise. Same conventions as `representation_tools`: numbers returned, figures written.
"""
from typing import Dict, List, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from analysis import features, fourier, hessian, lanczos, plots
from analysis.representation_tools import Batches, Subject, _figure, _short


def _fixed_batches(batches: Batches, split: str, count: int, num_classes: int):
  """`count` (images, one-hot labels) batches drawn once, so the loss is one function."""
  fixed = []
  for images, labels in batches(split):
    fixed.append((jnp.asarray(images), jax.nn.one_hot(labels, num_classes)))
    if len(fixed) == count:
      return fixed
  raise ValueError(f'The {split} split gave {len(fixed)} batches, fewer than the {count} '
                   'needed; use more images.')


def run_hessian(subject: Subject, batches: Batches, out: str, num_minibatches: int = 4,
                top_k: int = 5, steps_top: int = 20, steps_density: int = 40,
                num_probes: int = 2) -> Dict:
  """Top-k Hessian eigenvalues on each of several minibatches (the paper's protocol),
  and an SLQ density with its negative fraction on all of them together."""
  num_classes = subject.config.num_classes
  fixed = _fixed_batches(batches, 'train', num_minibatches, num_classes)
  loss = hessian.training_loss(subject.model)
  matvec, dim = hessian.flat_hvp(loss, subject.params)
  # Convolutions run slowly inside XLA:CPU loop bodies: drive ResNets from Python there.
  host_loop = subject.family == 'bit' and jax.default_backend() == 'cpu'
  tops = [lanczos.extreme_eigenvalues(matvec, dim, steps_top, top_k, jax.random.PRNGKey(i),
                                      operands=(subject.params, [batch]),
                                      host_loop=host_loop)['top'].tolist()
          for i, batch in enumerate(fixed)]
  nodes, weights = lanczos.slq(matvec, dim, steps_density, num_probes,
                               operands=(subject.params, fixed), host_loop=host_loop)
  span = max(np.abs(nodes).max(), 1e-12)
  grid = np.linspace(-span * 1.05, span * 1.05, 400)
  sigma = span / 100
  spectrum = lanczos.density(nodes, weights, grid, sigma)
  figures = [
      plots.histogram(np.ravel(tops), _figure(out, 'hessian_top', subject),
                      f'Top-{top_k} Hessian eigenvalues on {num_minibatches} minibatches: '
                      f'{subject.label}', 'eigenvalue'),
      plots.curves({'density': spectrum}, _figure(out, 'hessian_density', subject),
                   f'Hessian spectral density (SLQ, sigma {sigma:.3g}): {subject.label}',
                   'eigenvalue', 'density', x=grid, logy=True)]
  return {'top_per_minibatch': tops, 'num_parameters': dim,
          'negative_fraction': lanczos.negative_fraction(nodes, weights),
          # Mass below -1% of the largest |eigenvalue|: negative beyond the bulk's scatter.
          'negative_fraction_beyond_1pct': lanczos.negative_fraction(nodes, weights, 0.01 * span),
          'slq_nodes': nodes.tolist(), 'slq_weights': weights.tolist(), 'sigma': sigma,
          'figures': figures}


def _fourier_layers(subject: Subject) -> List[Tuple[str, str, bool]]:
  """(label, sown name, is attention-like) for each sub-block output in order."""
  if subject.family == 'vit':
    rows = [('embedding', 'Transformer/encoderblock_0/input', False)]
    for i in range(subject.config.num_layers):
      block = f'Transformer/encoderblock_{i}/'
      rows += [(f'block{i}/+sa', block + '+sa', True), (f'block{i}/+mlp', block + '+mlp', False)]
    return rows
  return [(_short(n), n, False) for n in features.block_names(subject)]


def run_fourier(subject: Subject, batches: Batches, out: str) -> Dict:
  """Relative log amplitude curves per layer, the highest-frequency value vs depth
  (attention outputs shaded) and the feature-map variance vs depth."""
  rows = _fourier_layers(subject)
  names = [name for _, name, _ in rows]

  # Maps differ in size (ResNet stages): curves go onto one grid of frequencies.
  x = np.linspace(0, 1, 9)

  def per_batch(images):
    inter = subject.intermediates(images, names)
    maps = [features.spatial_map(subject, inter[n]) for n in names]
    curves = [jnp.interp(x, fourier.normalised_frequencies(min(m.shape[1:3])),
                         fourier.relative_log_amplitude(m)) for m in maps]
    return jnp.stack(curves), jnp.stack([fourier.spatial_variance(m) for m in maps])

  results = [per_batch(images) for images, _ in batches('eval')]
  curves = np.mean([np.asarray(c) for c, _ in results], axis=0)
  variance = np.mean([np.asarray(v) for _, v in results], axis=0)
  labels = [label for label, _, _ in rows]
  shade = [i for i, (_, _, attention) in enumerate(rows) if attention]
  figures = [
      plots.curves({label: curve for label, curve in zip(labels, curves)},
                   _figure(out, 'fourier_curves', subject),
                   f'Relative log amplitude: {subject.label}', 'frequency (fraction of max)',
                   'delta log amplitude', x=x, legend=False),
      plots.curves({'highest frequency': curves[:, -1]}, _figure(out, 'fourier_depth', subject),
                   f'High-frequency amplitude vs depth: {subject.label}', 'layer',
                   'delta log amplitude', shade=shade),
      plots.curves({'variance': variance}, _figure(out, 'variance', subject),
                   f'Feature-map variance: {subject.label}', 'layer', 'variance',
                   shade=shade, logy=True)]
  return {'layers': labels, 'attention_layers': shade, 'curves': curves.tolist(),
          'high_frequency': curves[:, -1].tolist(), 'variance': variance.tolist(),
          'figures': figures}


def run_robustness(subject: Subject, batches: Batches, out: str,
                   bands: Sequence[Tuple[float, float]] = ((0, .2), (.2, .4), (.4, .6),
                                                           (.6, .8), (.8, 1.01)),
                   noise_norm: float = 0.1) -> Dict:
  """Accuracy drop when noise of a fixed L2 norm (relative to the image norm) is
  confined to each band of radial spatial frequencies."""
  correct = np.zeros(len(bands) + 1)
  count = 0
  for step, (images, labels) in enumerate(batches('eval')):
    images = jnp.asarray(images)
    image_norm = jnp.sqrt(jnp.sum(images**2, axis=(1, 2, 3), keepdims=True))
    variants = [images]
    for b, band in enumerate(bands):
      key = jax.random.fold_in(jax.random.PRNGKey(step), b)
      variants.append(images + image_norm * fourier.band_noise(key, images.shape, band,
                                                               noise_norm))
    for v, x in enumerate(variants):
      correct[v] += float(jnp.sum(jnp.argmax(subject.logits(x), -1) == labels))
    count += len(labels)
  accuracy = correct / count
  drops = accuracy[0] - accuracy[1:]
  centres = np.array([(lo + min(hi, 1.)) / 2 for lo, hi in bands])
  figure = plots.curves({'accuracy drop': drops}, _figure(out, 'robustness', subject),
                        f'Band-limited noise (norm {noise_norm} x image): {subject.label}',
                        'noise frequency (fraction of max)', 'accuracy drop', x=centres)
  return {'clean_accuracy': accuracy[0], 'bands': [list(b) for b in bands],
          'accuracy_drop': drops.tolist(), 'noise_norm': noise_norm, 'figures': [figure]}
