"""Effective receptive fields of every layer's centre location (Raghu et al. Fig. 6)."""
from typing import Dict, List, Mapping

import jax
import numpy as np

from analysis import erf, features, joint_figures, plots
from analysis.tool import (Batches, Subject, Tool, each_model, figure_path, model_scalars,
                           per_model, register, take)


def run_erf(subject: Subject, batches: Batches, out: str, num_images: int = 32) -> Dict:
  """Effective receptive field of the centre location of every block output."""
  images = np.concatenate([b for b, _ in take(batches('eval'), num_images)])[:num_images]
  names = subject.layers.stream
  fields = []
  for name in names:
    feature_fn = lambda x, name=name: features.spatial_map(
        subject, subject.intermediates(x, [name])[name])
    fields.append(np.asarray(erf.effective_receptive_field(jax.jit(feature_fn), images)))
  # Area (in pixels) holding half of the total gradient mass: one number per layer.
  half_mass = [int(np.searchsorted(np.cumsum(np.sort(f.ravel())[::-1]), 0.5 * f.sum()) + 1)
               for f in fields]
  figure = plots.image_grid(np.stack(fields), figure_path(out, 'erf', subject),
                            f'Effective receptive fields: {subject.label}',
                            titles=list(subject.layers.labels), cmap='viridis')
  return {'layers': list(subject.layers.labels), 'half_mass_pixels': half_mass,
          'fields': [f.tolist() for f in fields], 'figures': [figure]}


def _findings(label, r, q):
  return [f'{label}: half the mass within ', q('half_mass_pixels', 0),
          f' px at {r["layers"][0]}, ', q('half_mass_pixels', -1), f' px at {r["layers"][-1]}']


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  return joint_figures.depth_curves(
      per_model(result), lambda r: r['half_mass_pixels'], colour_of,
      joint_figures.path(out, 'erf'), 'Receptive field: area holding half the gradient mass',
      'pixels', logy=True, decades=4)


TOOL = register(Tool(
    name='erf', title='Effective receptive fields',
    quantity='Effective receptive field of the centre location: |d output / d input| summed '
             'over channels and images; the number is the area in pixels holding half its mass.',
    paper='Raghu et al. (Fig. 6): ViT\'s receptive fields are larger in its lower layers than '
          'ResNet\'s, which grow gradually with depth.',
    run=run_erf, findings=each_model(_findings),
    scalars=model_scalars(lambda r: {'erf/half_mass_pixels': list(r['half_mass_pixels'])}),
    joint=joint))
