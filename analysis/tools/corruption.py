"""Corruption robustness (Park & Kim's `robustness.ipynb`, on CIFAR-10-C and
CIFAR-100-C): error under the 15 corruptions of Hendrycks & Dietterich at 5
severities, with CIFAR-C's parameters for small images (ImageNet-C's above 64 px
or on request), and the mean corruption error against a baseline model."""
import dataclasses
import os
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from analysis.measures import corruptions, uncertainty
from analysis.reporting import plots, verdict
from analysis.runtime import features
from analysis.runtime.estimate import Amounts, Work
from analysis.tool import ALL_MODELS, Batches, Figure, Subject, Tool, register, take
from analysis.tool_options import Budget, option
from vit_jax.errors import ConfigError
from vit_jax.models.family import CONVNET



@dataclasses.dataclass(frozen=True)
class Options:
  """The corruption tool's command-line options."""
  corruption_baseline: Optional[str] = option(
      None, 'Model label the corruption errors are relative to (default: the first '
      'convolutional model, else the first).')
  corruptions_from: str = option(
      'package', 'package: corrupt the evaluation images with imagecorruptions; tfds: read '
      'TFDS cifar10_corrupted (CIFAR-10 models, the data prepared in the recipe\'s data_dir).',
      choices=('package', 'tfds'))
  corruption_parameters: str = option(
      'auto', 'auto: CIFAR-C\'s parameters for images up to 64 px (Park & Kim\'s CIFAR-C), '
      'ImageNet-C\'s above; cifar or imagenet: that set at any size (ImageNet-C\'s on small '
      'images is a departure: its noise and blur are set for 224 px).',
      choices=('auto', *corruptions.PARAMETER_SETS))
  corruption_fraction: float = option(
      1., 'The share of the evaluation images used, the first ones, clean and corrupted '
      '(a time budget\'s smaller sample: two thirds at a time, down to a fifth).', flag=False,
      budget=Budget(minimum=0.2, order=0))


TFDS_NAME = 'cifar10_corrupted/{}_{}'  # a TFDS config per corruption and severity


SET_NAMES = {'cifar': 'CIFAR-C', 'imagenet': 'ImageNet-C'}


def _baseline(subjects: Sequence[Subject], baseline: Optional[str]) -> str:
  labels = [s.label for s in subjects]
  if baseline is not None and baseline not in labels:
    raise ConfigError(f'--corruption_baseline={baseline} is not one of the models analysed: '
                      f'{", ".join(labels)}.')
  convnets = [s.label for s in subjects if s.layers.architecture == CONVNET]
  return baseline or (convnets or labels)[0]


def _corrupted_batches(subjects: Sequence[Subject], batches: Batches, source: str,
                       num_images: int, batch_size: int, parameters: str):
  """(corruption, severity) -> a function giving that data's (images, labels) batches."""
  if source == 'package':
    corruptions.package()  # the missing package named before any work
    return lambda name, severity: (
        (corruptions.corrupt(images, name, severity, seed=1000 * step, parameters=parameters),
         labels)
        for step, (images, labels) in enumerate(batches('eval')))
  recipe = subjects[0].recipe
  if any(s.recipe.dataset != 'cifar10' for s in subjects):
    raise ConfigError('--corruptions_from=tfds reads cifar10_corrupted, CIFAR-10\'s test images '
                      'corrupted: every model must be a CIFAR-10 model (recipe dataset '
                      'cifar10); corrupt any other data with --corruptions_from=package.')
  return lambda name, severity: features.dataset_batches(
      TFDS_NAME.format(name, severity), 'test', subjects[0].image_size, batch_size, num_images,
      recipe.data_dir)


def measure(subjects: Sequence[Subject], batches: Batches, options: Options = Options()) -> Dict:
  """Each model's error on the clean evaluation images and under each corruption
  and severity (every model on the same corrupted images), its mean over them,
  and Hendrycks & Dietterich's corruption errors against `corruption_baseline`.
  The corruptions' `corruption_parameters` set ('auto': `corruptions.parameters_for`
  the image size; TFDS's cifar10_corrupted is CIFAR-C's) is recorded in the JSON.
  With a `corruption_fraction` below 1 (a time budget's smaller sample) only that
  share of the evaluation images, the first ones, is used, clean and corrupted.

  Args:
    subjects: the models.
    batches: split -> its (images, labels) batches.
    options: the tool's options: `corruption_baseline`, the model label the errors
      are relative to (`_baseline` if None); `corruptions_from` 'package' (corrupt
      here) or 'tfds' (read cifar10_corrupted); `corruption_parameters` 'auto',
      'cifar' or 'imagenet'; `corruption_fraction`.

  Returns:
    The tool's JSON but its figures (`draw`'s).
  """
  baseline = _baseline(subjects, options.corruption_baseline)
  if options.corruption_fraction < 1:
    keep = max(1, int(np.ceil(options.corruption_fraction
                              * sum(len(x) for x, _ in batches('eval')))))
    batches = lambda split, every=batches: take(every(split), keep)
  parameters = ('cifar' if options.corruptions_from == 'tfds' else corruptions.parameters_for(
      subjects[0].image_size, options.corruption_parameters))
  clean, errors, num_images = _errors(subjects, batches, options, parameters)
  clean_error = {label: float(v.mean()) for label, v in clean.items()}
  relative = {label: corruptions.corruption_errors(errors[label], clean_error[label],
                                                   errors[baseline], clean_error[baseline])
              for label in errors}
  result = {
      'baseline': baseline, 'source': options.corruptions_from, 'parameters': parameters,
      'fraction': options.corruption_fraction,
      'num_images': num_images,
      'corruptions': list(corruptions.CORRUPTIONS), 'severities': list(corruptions.SEVERITIES),
      'image_size': subjects[0].image_size, 'errors': errors, 'clean_error': clean_error,
      'clean_error_stderr': {label: float(uncertainty.binomial_stderr(e, num_images))
                             for label, e in clean_error.items()},
      'mean_error': {label: float(np.mean(list(e.values()))) for label, e in errors.items()},
      **{key: {label: r[key] for label, r in relative.items()}
         for key in ('ce', 'mce', 'relative_ce', 'relative_mce')}}
  return result


def _errors(subjects: Sequence[Subject], batches: Batches, options: Options, parameters: str
            ) -> Tuple[Dict[str, np.ndarray], Dict[str, Dict[str, List[float]]], int]:
  """Each model's mistakes on the clean evaluation images (a boolean per image), its
  error under each corruption at each severity, and the number of images."""
  clean = {s.label: [] for s in subjects}
  num_images = batch_size = 0
  for images, labels in batches('eval'):
    batch_size = batch_size or len(images)
    num_images += len(images)
    for s in subjects:
      clean[s.label].append(np.asarray(s.logits(images)).argmax(-1) != np.asarray(labels))
  data = _corrupted_batches(subjects, batches, options.corruptions_from, num_images, batch_size,
                            parameters)
  errors = {s.label: {} for s in subjects}
  for name in corruptions.CORRUPTIONS:
    wrong = {s.label: np.zeros(len(corruptions.SEVERITIES)) for s in subjects}
    seen = np.zeros(len(corruptions.SEVERITIES))
    for j, severity in enumerate(corruptions.SEVERITIES):
      for images, labels in data(name, severity):
        seen[j] += len(images)
        for s in subjects:
          wrong[s.label][j] += np.sum(np.asarray(s.logits(images)).argmax(-1) != labels)
    for s in subjects:
      errors[s.label][name] = (wrong[s.label] / seen).tolist()
  return {label: np.concatenate(v) for label, v in clean.items()}, errors, num_images


def draw(result: Mapping, subjects: Sequence[Subject], out: str,
         options: Options = Options()) -> List[str]:
  """The figures of the tool's numbers (`measure`): each model's error under each
  corruption (rows) and severity (columns).

  See `analysis.tool.Draw`.
  """
  return [plots.heatmap(
      100 * np.array([errors[c] for c in result['corruptions']]),
      os.path.join(out, f'corruption_{label}.png'),
      f'Error under {SET_NAMES[result["parameters"]]} corruptions: {label} '
      f'(clean {100 * result["clean_error"][label]:.1f}%)',
      'severity', 'corruption', vmin=0., vmax=100.,
      xlabels=[str(v) for v in result['severities']],
      ylabels=list(result['corruptions']), colorbar_label='error (%)')
      for label, errors in result['errors'].items()]


def findings(result: Mapping, quote) -> Dict[str, List]:
  """What the models show, per caption key.

  Args:
    result: the tool's JSON.
    quote: makes a quote of a number of the JSON (`tool.QuoteFn`).

  Returns:
    Text fragments per caption key.
  """
  out = {}
  for label in result['errors']:
    text = [f'{label}: clean error ', quote('clean_error', label), ' ± ',
            quote('clean_error_stderr', label), ', mean error under the 15 corruptions x 5 '
            'severities ', quote('mean_error', label)]
    if label != result['baseline']:
      text += [f'; mCE against {result["baseline"]} ', quote('mce', label),
               ', relative mCE ', quote('relative_mce', label)]
    out[label] = text
  return out


def figures(result: Mapping) -> List[Figure]:
  """The figures of the tool's JSON, with their captions' keys.

  Args:
    result: the tool's JSON.

  Returns:
    The figures.
  """
  return [Figure(path, label, (label,)) for label, path in zip(result['errors'],
                                                               result['figures'])]


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """Every model's error averaged over the corruptions against severity (0: clean).

  Args:
    result: the tool's JSON.
    colour_of: each model label's colour.
    out: the directory the figures go to.

  Returns:
    The figures' paths.
  """
  series = {label: [result['clean_error'][label]] + list(np.mean(list(e.values()), axis=0))
            for label, e in result['errors'].items()}
  return [plots.curves(series, os.path.join(out, 'joint_corruption.png'),
                       f'Error under the {SET_NAMES[result.get("parameters", "imagenet")]} '
                       'corruptions', 'severity (0: clean)',
                       'error, mean over corruptions', x=np.arange(6.), colours_of=colour_of)]


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The mean error under corruption, with the binomial standard error of an error
  rate on the evaluation images (larger than one over all the corrupted copies of
  them, which share their images).

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  def estimate(label):
    error = result['mean_error'][label]
    return -error, float(uncertainty.binomial_stderr(error, result['num_images']))
  return [verdict.contrast(
      'robust to corruptions', 'ViTs err less than ResNets on corrupted images (Park & Kim, '
      'Sec. 4, CIFAR-C).', f'minus the mean error under the 15 '
      f'{SET_NAMES[result.get("parameters", "imagenet")]} corruptions x 5 severities',
      models, list(result['errors']), estimate, fmt='.3f')]


def work(subject: Subject, options: Options, amounts: Amounts) -> Work:
  """A forward pass over the clean and each corrupted evaluation set, or the
  `fraction` of it the options keep, and (corrupting with the package) each
  corrupted image.

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  corrupted = len(corruptions.CORRUPTIONS) * len(corruptions.SEVERITIES)
  fraction = options.corruption_fraction
  return Work({'forward': (1 + corrupted) * amounts.batches * fraction}, {'forward': 1},
              host={CORRUPTED_IMAGE: corrupted * amounts.num_images * fraction
                    if options.corruptions_from == 'package' else 0.})


CORRUPTED_IMAGE = 'corrupted image'
TIMED_IMAGES = 2


def host_prices(subject: Subject, images: np.ndarray, labels: np.ndarray, options: Options,
                amounts: Amounts) -> Dict[str, float]:
  """Seconds of corrupting one image, the mean over the corruptions at the middle
  severity, timed on `TIMED_IMAGES` of `images` after a first call of each (the
  package's imports and tables); none when the corrupted images are read.

  Args:
    subject: the model.
    images: one evaluation batch of images.
    labels: their labels.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    Seconds per unit, by the unit's name.
  """
  if options.corruptions_from != 'package':
    return {CORRUPTED_IMAGE: 0.}
  parameters = corruptions.parameters_for(subject.image_size, options.corruption_parameters)
  middle = corruptions.SEVERITIES[len(corruptions.SEVERITIES) // 2]
  sample = np.asarray(images[:TIMED_IMAGES])
  seconds = []
  for name in corruptions.CORRUPTIONS:
    corruptions.corrupt(sample[:1], name, middle, seed=0, parameters=parameters)
    start = time.perf_counter()
    corruptions.corrupt(sample, name, middle, seed=0, parameters=parameters)
    seconds.append((time.perf_counter() - start) / len(sample))
  return {CORRUPTED_IMAGE: float(np.mean(seconds))}


TOOL = register(Tool(
    name='corruption', importance=15, title='Corruption robustness',
    quantity='Top-1 error under the 15 corruptions of Hendrycks & Dietterich (noise, blur, '
             'weather, digital) at severities 1-5, applied at the model\'s input resolution with '
             'CIFAR-C\'s parameters (Hendrycks\' make_cifar_c.py, `analysis.measures.cifar_c`) '
             'for images '
             'up to 64 px and ImageNet-C\'s (imagecorruptions) above, the set named in the JSON, '
             'or read from TFDS cifar10_corrupted; every model sees the same corrupted images. '
             'CE per corruption is the summed error over severities relative to the baseline '
             'model\'s, mCE its mean over corruptions; the relative mCE subtracts each model\'s '
             'clean error first (Hendrycks & Dietterich).',
    paper='Park & Kim (Sec. 4, robustness on CIFAR-100-C): attention makes a model more '
          'robust to corrupted data; AlterNet is more robust than the ResNet it builds on.',
    reads_logits=True,
    run=measure, draw=draw, runs_on=ALL_MODELS, findings=findings, figures=figures, joint=joint,
    models=lambda result: list(result['errors']),
    verdicts=verdicts,
    scalars=lambda result, label: ({'corruption/mean_error': [result['mean_error'][label]]}
                                   if label in result['errors'] else {}),
    options=Options,
    work=work, host_prices=host_prices, shortened_by=('num_images',),
    minimum='a fifth of the evaluation images'))
