"""Loss landscapes (Park & Kim Fig. 1 left): the training objective of the Hessian
tool on a grid around the trained parameters, along two filter-normalised random
directions or the Hessian's top eigenvectors; the NLL and the L2 term apart."""
import time
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np
import optax.tree_utils as otu
from absl import flags

from analysis import features, hessian, landscape, plots
from analysis.estimate import Work
from analysis.tool import Batches, Subject, Tool, each_model, figure_path, register
from analysis.tools.hessian import fixed_batches, check_lanczos
from vit_jax.errors import ConfigError
from vit_jax.steps import kernel_mask

flags.DEFINE_integer('landscape_points', 11, 'Grid points along each direction of a loss '
                     'landscape (Park & Kim: 11 from -1 to 1).')
flags.DEFINE_integer('landscape_batches', 2, 'Training minibatches (of --batch_size) each '
                     'landscape point is evaluated on.')
flags.DEFINE_enum('landscape_directions', 'random', ['random', 'hessian'],
                  'random: filter-normalised Gaussian directions (the paper); hessian: the top '
                  'two Hessian eigenvectors (unit norm).')
FLAGS = flags.FLAGS
SPAN = 1.  # the authors' grid runs from -1 to 1 along each direction


def run_landscape(subject: Subject, batches: Batches, out: str, points: int = 11,
                  num_batches: int = 2, directions: str = 'random', lanczos_steps: int = 20,
                  chunk: int = 8) -> Dict:
  """The recipe's objective (`hessian.recipe_objective`: its loss and label
  smoothing, plus L2 = weight_decay / lr on the kernels) on `num_batches` training
  batches drawn once through its pipeline, at params + a d1 + b d2 on a points x
  points grid of a, b in [-1, 1]; the NLL part and the L2 part are kept apart.
  `directions` 'random' draws two filter-normalised Gaussian directions (Park &
  Kim's `create_bases`), 'hessian' takes the Ritz vectors of the two largest
  eigenvalues (`lanczos_steps` steps on the first batch). Points are evaluated
  `chunk` at a time in one program."""
  if subject.recipe is None:
    raise ValueError(f'The landscape of {subject.label} is of its training objective, which '
                     'needs the recipe that trained it (load_subject(..., recipe=)).')
  unroll = hessian.loops_on_host(subject.family.convolutional)
  fixed = fixed_batches(batches, features.TRAIN_AUGMENTED, num_batches,
                         subject.config.num_classes, subject.mesh)
  total_loss, description = hessian.recipe_objective(subject.model, subject.recipe, unroll)
  l2 = description['l2']
  nll_loss = hessian.training_loss(subject.model, 0., subject.recipe.loss,
                                   subject.recipe.label_smoothing, unroll=unroll)
  if directions == 'random':
    bases = landscape.random_directions(subject.params, jax.random.PRNGKey(0))
  elif directions == 'hessian':
    matvec, dim = hessian.flat_hvp(total_loss, subject.params, unroll=unroll)
    check_lanczos(lanczos_steps, dim, subject.label)
    bases = landscape.hessian_directions(matvec, subject.params, lanczos_steps,
                                         (subject.params, tuple(x[:1] for x in fixed)))
  else:
    raise ValueError(f'Unknown landscape directions {directions!r}; use random or hessian.')
  axis = np.linspace(-SPAN, SPAN, points)
  a, b = np.meshgrid(axis, axis)  # [row b, column a]
  coordinates = np.stack([a.ravel(), b.ravel()], axis=1)
  started = time.perf_counter()
  nll = landscape.grid(lambda p: nll_loss(p, fixed), subject.params, bases, coordinates,
                       chunk).reshape(points, points)
  seconds = time.perf_counter() - started
  penalty = landscape.grid(
      lambda p: 0.5 * l2 * otu.tree_norm(jax.tree_util.tree_map(
          lambda w, on: w if on else jnp.zeros_like(w), p, kernel_mask(p)), squared=True),
      subject.params, bases, coordinates, chunk).reshape(points, points)
  total = nll + penalty
  title = f'{subject.label}\n' + ('filter-normalised random directions'
                                    if directions == 'random' else 'top Hessian eigenvectors')
  names = ('direction 1', 'direction 2') if directions == 'random' else ('eigenvector 1',
                                                                           'eigenvector 2')
  figures = [plots.landscape(axis, axis, total, figure_path(out, 'landscape', subject),
                             f'Loss (NLL + L2): {title}', *names),
             plots.landscape(axis, axis, total, figure_path(out, 'landscape_surface', subject),
                             f'Loss (NLL + L2): {title}', *names, surface=True),
             plots.curves({'NLL + L2, along 1': total[points // 2],
                           'NLL + L2, along 2': total[:, points // 2],
                           'NLL along 1': nll[points // 2], 'NLL along 2': nll[:, points // 2]},
                          figure_path(out, 'landscape_1d', subject),
                          f'Loss along each direction: {title}', 'step along the direction',
                          'loss', x=axis)]
  return {'objective': description, 'directions': directions, 'coordinates': axis.tolist(),
          'loss': total.tolist(), 'nll': nll.tolist(), 'l2': penalty.tolist(),
          'centre_loss': float(total[points // 2, points // 2]),
          'num_images': int(fixed[0].shape[0] * fixed[0].shape[1]),
          'grid_seconds': round(seconds, 1), 'figures': figures}


def options(points: int, num_batches: int, directions: str, lanczos_steps: int) -> Dict:
  """`run_landscape`'s options from the command line, checked before any model loads."""
  for flag, value, least in (('landscape_points', points, 3),
                             ('landscape_batches', num_batches, 1)):
    if value < least:
      raise ConfigError(f'--{flag} is {value}; it must be at least {least}.')
  return dict(points=points, num_batches=num_batches, directions=directions,
              lanczos_steps=lanczos_steps)


TOOL = register(Tool(
    name='landscape', title='Loss landscape',
    quantity='The recipe\'s training objective (NLL with its label smoothing, plus L2 = '
             'weight_decay / lr on the kernels) on augmented training batches drawn once, on a '
             'grid around the trained parameters along two filter-normalised random directions '
             '(Park & Kim\'s normalisation) or the top Hessian eigenvectors; NLL and L2 kept '
             'apart in the JSON.',
    paper='Park & Kim (Fig. 1): ViT\'s loss landscape is flatter than ResNet\'s near the '
          'optimum, and its training loss higher.',
    run=run_landscape,
    findings=each_model(lambda label, r, q: [
        f'{label}: loss at the trained parameters ', q('centre_loss'), ', grid from ',
        q('loss', reduce='min'), ' to ', q('loss', reduce='max'),
        f' ({r["directions"]} directions)']),
    options=lambda: options(FLAGS.landscape_points, FLAGS.landscape_batches,
                            FLAGS.landscape_directions, FLAGS.lanczos_steps),
    # Every grid point is a forward pass over each of the landscape's batches.
    work=lambda subject, options, amounts: Work(
        {'forward': options['points'] ** 2 * options['num_batches']}, {'forward': 1}),
    shortened_by=('landscape_points', 'landscape_batches')))
