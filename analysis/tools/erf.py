"""Effective receptive fields of every layer's centre location (Raghu et al. Fig. 6)."""
from typing import Dict, List, Mapping

import jax
import numpy as np

from analysis.measures import receptive_field, uncertainty
from analysis.reporting import joint_figures, plots, verdict
from analysis.runtime import features
from analysis.runtime.estimate import Amounts, Work
from analysis.tool import (Batches, Subject, Tool, each_model, figure_path, model_scalars,
                           per_model, register, take)


ERF_GROUPS = 4  # the images are split into groups; the spread over groups is the uncertainty
ERF_IMAGES = 32


def half_mass_area(field: np.ndarray) -> int:
  """The area in pixels holding half of a field's total mass.

  Args:
    field: an (H, W) receptive field.

  Returns:
    The area in pixels.
  """
  return int(np.searchsorted(np.cumsum(np.sort(field.ravel())[::-1]), 0.5 * field.sum()) + 1)


def measure(subject: Subject, batches: Batches, num_images: int = ERF_IMAGES) -> Dict:
  """Effective receptive field of the centre location of every block output, and
  the area holding half its mass, with its standard error over ERF_GROUPS groups
  of the images.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    num_images: images the fields are averaged over.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  images = np.concatenate([b for b, _ in take(batches('eval'), num_images)])[:num_images]
  groups = np.array_split(images, min(ERF_GROUPS, len(images)))
  names = subject.layers.stream
  fields, half_mass, stderr = [], [], []
  for name in names:
    feature_fn = jax.jit(lambda x, name=name: features.spatial_map(
        subject, subject.intermediates(x, [name])[name]))
    per_group = [np.asarray(receptive_field.effective_receptive_field(feature_fn, g))
                 for g in groups]
    # Each group's field is scaled to a maximum of 1; the field of all images is their
    # size-weighted mean, scaled again.
    field = np.average(per_group, axis=0, weights=[len(g) for g in groups])
    fields.append(field / field.max())
    half_mass.append(half_mass_area(fields[-1]))
    stderr.append(float(uncertainty.weighted_mean_stderr(
        [half_mass_area(f) for f in per_group], [len(g) for g in groups])))
  return {'layers': list(subject.layers.labels), 'half_mass_pixels': half_mass,
          'half_mass_stderr': stderr, 'num_images': len(images),
          'fields': [f.tolist() for f in fields]}


def draw(result: Mapping, subject: Subject, out: str) -> List[str]:
  """The figure of the tool's numbers (`measure`): each block's field, scaled to its maximum.

  See `analysis.tool.Draw`.
  """
  return [plots.image_grid(np.asarray(result['fields']), figure_path(out, 'erf', subject),
                           f'Effective receptive fields (|gradient|): {subject.label}',
                           labels=result['layers'], cmap='viridis', vmin=0., vmax=1.,
                           colorbar_label='of the maximum')]


def _findings(label, r, q):
  return [f'{label}: half the mass within ', q('half_mass_pixels', 0), ' ± ',
          q('half_mass_stderr', 0), f' px at {r["layers"][0]}, ', q('half_mass_pixels', -1),
          ' ± ', q('half_mass_stderr', -1), f' px at {r["layers"][-1]}']


def _lower_quarter(r: Mapping) -> verdict.Estimate:
  """Mean half-mass area over the first quarter of the layers (at least one), with
  a standard error bounded by the mean of theirs."""
  n = max(len(r['half_mass_pixels']) // 4, 1)
  return (float(np.mean(r['half_mass_pixels'][:n])),
          float(np.mean(np.asarray(r['half_mass_stderr'][:n], np.float64))))


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  by_model = per_model(result)
  return [verdict.contrast(
      'larger fields low in ViT',
      'ViT\'s receptive fields are larger in its lower layers than ResNet\'s (Raghu et al. '
      'Fig. 6).', 'half-mass area over the first quarter of the layers (px)', models,
      list(by_model), lambda label: _lower_quarter(by_model[label]))]


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """The figures that put every model in one frame.

  Args:
    result: the tool's JSON.
    colour_of: each model label's colour.
    out: the directory the figures go to.

  Returns:
    The figures' paths (none below two models).
  """
  return joint_figures.depth_curves(
      per_model(result), lambda r: r['half_mass_pixels'], colour_of,
      joint_figures.path(out, 'erf'), 'Receptive field: area holding half the gradient mass',
      'pixels', logy=True, decades=4, errors=lambda r: r['half_mass_stderr'])


def work(subject: Subject, options: None, amounts: Amounts) -> Work:
  """An input gradient over ERF_IMAGES images per stream layer, each compiled apart.

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  layers = len(subject.layers.stream)
  images = min(ERF_IMAGES, amounts.num_images)
  return Work({'gradient': layers * images / amounts.batch_size}, {'gradient': layers})


TOOL = register(Tool(
    name='erf', importance=8, title='Effective receptive fields',
    quantity='Effective receptive field of the centre location: |d output / d input| summed '
             'over channels and images; the number is the area in pixels holding half its mass, '
             '± its standard error over four groups of the images.',
    paper='Raghu et al. (Fig. 6): ViT\'s receptive fields are larger in its lower layers than '
          'ResNet\'s, which grow gradually with depth.',
    run=measure, draw=draw, findings=each_model(_findings),
    scalars=model_scalars(lambda r: {'erf/half_mass_pixels': list(r['half_mass_pixels'])}),
    joint=joint, verdicts=verdicts, work=work, shortened_by=()))
