"""Robustness to frequency-band noise (Park & Kim Fig. 2c)."""
import dataclasses
from typing import Dict, List, Mapping, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from analysis.measures import frequency, uncertainty
from analysis.reporting import joint_figures, plots, verdict
from analysis.runtime.estimate import Amounts, Work
from analysis.tool import (Batches, Subject, Tool, each_model, figure_path, model_scalars,
                           per_model, register)
from analysis.tool_options import Budget, option
from vit_jax.models.family import TRANSFORMER


EPSILONS = (0.1, 0.3, 1.0)
FREQUENCIES = tuple(float(f) for f in np.linspace(0, np.pi, 9))
MIN_FREQUENCIES = tuple(float(f) for f in np.linspace(0, np.pi, 5))  # 0, pi/4, ..., pi


@dataclasses.dataclass(frozen=True)
class Options:
  """The robustness tool's settings (set in code; a time budget thins the bands)."""
  noise_epsilons: Tuple[float, ...] = option(EPSILONS, 'The noise amplitudes.', flag=False)
  noise_frequencies: Tuple[float, ...] = option(
      FREQUENCIES, 'The bands\' centres, in [0, pi]; a time budget keeps 5 (the ends kept).',
      flag=False, budget=Budget(minimum=MIN_FREQUENCIES, order=0,
                                smaller=lambda frequencies: MIN_FREQUENCIES))
  noise_band_width: float = option(0.2, 'The bands\' half-width.', flag=False)


def measure(subject: Subject, batches: Batches, options: Options = Options()) -> Dict:
  """Accuracy under the authors' frequency-band noise (`frequency.frequency_noise`:
  eps * sign(N(0, 1)) masked to the square band of half-width `noise_band_width`
  around each frequency f in `noise_frequencies`) for each eps of `noise_epsilons`;
  one base noise per batch for every (eps, f), so curves differ by the band alone.
  Images are in [-1, 1].

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    options: the tool's settings.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  epsilons, frequencies = options.noise_epsilons, options.noise_frequencies
  width = options.noise_band_width
  correct = np.zeros((len(epsilons), len(frequencies)))
  clean = count = 0
  for step, (images, labels) in enumerate(batches('eval')):
    images = jnp.asarray(images)
    clean += float(jnp.sum(jnp.argmax(subject.logits(images), -1) == labels))
    for j, f in enumerate(frequencies):
      # The same key for every f: one base noise per batch, masked to each band.
      band = frequency.frequency_noise(jax.random.PRNGKey(step), images.shape, f, 1., width)
      for i, eps in enumerate(epsilons):
        predicted = jnp.argmax(subject.logits(images + eps * band), -1)
        correct[i, j] += float(jnp.sum(predicted == labels))
    count += len(labels)
  # A band the mask leaves empty at this image size adds no noise: its accuracy is
  # the clean one, not a measurement, so it is reported as None and never drawn.
  size = images.shape[1]
  band_pixels = [int(frequency.band_mask(size, f, width).sum()) for f in frequencies]
  supported = np.array(band_pixels) > 0
  accuracy = np.where(supported, correct / count, np.nan)
  stderr = uncertainty.binomial_stderr(accuracy, count)
  clean_accuracy = clean / count
  return {'clean_accuracy': clean_accuracy,
          'clean_stderr': float(uncertainty.binomial_stderr(clean_accuracy, count)), 'num_images': count,
          'epsilons': list(epsilons), 'frequencies': list(map(float, frequencies)),
          'band_half_width': width, 'image_size': size, 'band_pixels': band_pixels,
          'accuracy': _json(accuracy), 'accuracy_stderr': _json(stderr),
          'accuracy_drop': _json(clean_accuracy - accuracy)}


def draw(result: Mapping, subject: Subject, out: str, options: Options = Options()) -> List[str]:
  """The figure of the tool's numbers (`measure`): accuracy against the noise frequency, one curve per eps, none at a band without support.

  See `analysis.tool.Draw`.
  """
  nan = lambda key: np.array(result[key], dtype=np.float64)  # None (no support) is NaN
  names = [f'eps {eps:g}' for eps in result['epsilons']]
  return [plots.curves(dict(zip(names, nan('accuracy'))),
                       figure_path(out, 'robustness', subject),
                       f'Frequency-band noise (band half-width {result["band_half_width"]}): '
                       f'{subject.label}', 'noise frequency f (x pi)', 'accuracy',
                       x=np.asarray(result['frequencies']) / np.pi,
                       errors=dict(zip(names, nan('accuracy_stderr'))))]


def _json(values: np.ndarray) -> list:
  """An array as nested lists, with None where it is NaN (no support)."""
  return [[None if np.isnan(v) else float(v) for v in row] for row in np.atleast_2d(values)]


def first_supported(r: Mapping) -> int:
  """The index of the lowest frequency whose band has support at the image size.

  Args:
    r: a model's JSON entry.

  Returns:
    The index.
  """
  return next(i for i, n in enumerate(r.get('band_pixels', [1] * len(r['frequencies']))) if n)


def _scalars(r):
  # Steps are the frequency indices; bands without support have no value.
  series = {f'robustness/eps_{eps:g}': [a for a in acc if a is not None]
            for eps, acc in zip(r['epsilons'], r['accuracy'])}
  series['robustness/clean'] = [r['clean_accuracy']]
  return series


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """Each model's accuracy curve at its largest eps.

  Args:
    result: the tool's JSON.
    colour_of: each model label's colour.
    out: the directory the figures go to.

  Returns:
    The figures' paths.
  """
  by_model = per_model(result)
  names = {label: f'{label} (eps {r["epsilons"][-1]:g})' for label, r in by_model.items()}
  as_array = lambda values: np.array([np.nan if v is None else v for v in values])
  series = {names[label]: as_array(r['accuracy'][-1]) for label, r in by_model.items()}
  errors = {names[label]: as_array(r['accuracy_stderr'][-1]) for label, r in by_model.items()
            if 'accuracy_stderr' in r}
  x = {names[label]: np.asarray(r['frequencies']) / np.pi for label, r in by_model.items()}
  return [plots.curves(series, joint_figures.path(out, 'robustness'),
                       'Accuracy under frequency-band noise', 'noise frequency f (x pi)',
                       'accuracy', x=x, errors=errors,
                       colours_of={names[label]: colour_of[label] for label in by_model})]


def _findings(label, r, q):
  low = first_supported(r)
  where = ('f = 0' if low == 0 else
           f'f = {r["frequencies"][low] / np.pi:.3g} pi (the lowest band with support at '
           f'{r.get("image_size", "this")} px; lower ones add no noise)')
  return [f'{label}: clean ', q('clean_accuracy'), '; at eps ', q('epsilons', -1), ' accuracy ',
          q('accuracy', -1, low), f' for {where} and ', q('accuracy', -1, -1), ' for f = pi']


def _accuracy(r: Mapping, band: int) -> verdict.Estimate:
  """Accuracy at the largest eps in one band, with its binomial standard error."""
  value = r['accuracy'][-1][band]
  return (np.nan, np.nan) if value is None else (value, r['accuracy_stderr'][-1][band])


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  by_model = per_model(result)
  found = [verdict.contrast(
      'ViT robust to high frequencies',
      'ViT is robust to high-frequency noise, where ResNet is vulnerable (Park & Kim Fig. 2c).',
      'accuracy at f = pi under the largest eps', models, list(by_model),
      lambda label: _accuracy(by_model[label], -1))]
  for label in verdict.by_kind(models, list(by_model), [TRANSFORMER]):
    r = by_model[label]
    low = first_supported(r)
    found.append(verdict.single(
        'ViT hurt by low frequencies', 'ViT suffers from low-frequency noise more than from '
        'high-frequency noise (Park & Kim Fig. 2c).',
        f'accuracy at f = pi minus at f = {r["frequencies"][low] / np.pi:.3g} pi (largest eps)',
        label, verdict.difference(_accuracy(r, -1), _accuracy(r, low))))
  return found


def work(subject: Subject, options: Options, amounts: Amounts) -> Work:
  """A clean pass and one per (eps, band) over the evaluation split.

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  noisy = len(options.noise_epsilons) * len(options.noise_frequencies)
  return Work({'forward': amounts.batches * (1 + noisy)}, {'forward': 1})


TOOL = register(Tool(
    name='robustness', importance=6, title='Robustness to frequency-band noise',
    quantity='Accuracy under noise eps * sign(N(0,1)) masked to a frequency band around f in '
             '[0, pi] (Park & Kim\'s protocol), images in [-1, 1]; error bars are binomial '
             'standard errors; a band the mask leaves empty at the image size is not drawn.',
    paper='Park & Kim (Fig. 2c): ViT is robust to high-frequency noise where ResNet is '
          'vulnerable; both suffer from low-frequency noise.',
    reads_logits=True,
    run=measure, draw=draw,
    findings=each_model(_findings),
    scalars=model_scalars(_scalars), joint=joint, verdicts=verdicts, work=work, options=Options,
    minimum='5 frequency bands'))
