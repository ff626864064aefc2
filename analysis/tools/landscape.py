"""Loss landscapes (Park & Kim Fig. 1 left): the training objective of the Hessian
tool on a grid around the trained parameters, along two filter-normalised random
directions or the Hessian's top eigenvectors; the NLL and the L2 term apart."""
import dataclasses
import time
from typing import Any, Callable, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax.tree_utils as otu

from analysis.measures import curvature, loss_surface
from analysis.reporting import plots
from analysis.runtime import features, objectives, progress
from analysis.runtime.estimate import Work
from analysis.tool import Batches, Subject, Tool, each_model, figure_path, register
from analysis.tool_options import Budget, option
from analysis.tools.common import check_lanczos, fixed_batches, lanczos_steps_option
from vit_jax.training import kernel_mask

L2_TERMS = ('authors', 'objective')
MIN_POINTS = 11  # the authors' `get_loss_landscape` default


def fewer_points(points: int) -> int:
  """A time budget's smaller grid: about 0.8 of the points a side, odd (so that the
  trained parameters stay a point), at least 2 fewer."""
  return min(int(points * 0.8) // 2 * 2 + 1, points - 2)



@dataclasses.dataclass(frozen=True)
class Options:
  """The landscape tool's command-line options."""
  landscape_points: int = option(21, 'Grid points along each direction of a loss landscape '
                                 '(Park & Kim\'s notebook: 21 from -1 to 1).', least=3,
                                 budget=Budget(minimum=MIN_POINTS, order=0, smaller=fewer_points))
  landscape_batches: int = option(2, 'Training minibatches (of --batch_size) each landscape '
                                  'point is evaluated on.', least=1,
                                  budget=Budget(minimum=1, order=1, smaller=lambda batches: 1))
  landscape_directions: str = option(
      'random', 'random: filter-normalised Gaussian directions (the paper); hessian: the top '
      'two Hessian eigenvectors (unit norm).', choices=('random', 'hessian'))
  lanczos_steps: int = lanczos_steps_option()
  landscape_l2: str = option(
      'authors', 'authors: weight_decay (PyTorch\'s, here weight_decay / lr) times the sum '
      'of every parameter tensor\'s unsquared norm (Park & Kim\'s notebook); objective: the '
      'L2 term whose gradient is this project\'s decay, (weight_decay / lr) / 2 times the '
      'squared norm of the kernels.', choices=L2_TERMS)
  landscape_normalisation: str = option(
      'authors', 'authors: Park & Kim\'s filter normalisation in their layout (position '
      'embeddings and q/k/v biases held still, fused q/k/v normalised together); per_array: '
      'every array of two or more axes normalised alone.', choices=loss_surface.NORMALISATIONS)


SPAN = 1.  # the authors' grid runs from -1 to 1 along each direction


def l2_penalty(term: str, coefficient: float) -> Callable[[Any], jax.Array]:
  """The landscape's L2 term as a function of the parameters: 'authors',
  coefficient * the sum of every tensor's unsquared norm (`loss_surface.authors_l2`),
  or 'objective', coefficient / 2 * the squared norm of the kernels (the term whose
  gradient is this project's decay, `steps.kernel_mask`). `coefficient` is
  weight_decay / lr: PyTorch's AdamW decay, which the authors multiply in.

  Args:
    term: 'authors' or 'objective'.
    coefficient: weight_decay / lr.

  Returns:
    params -> the L2 term.
  """
  if term == 'authors':
    return lambda p: coefficient * loss_surface.authors_l2(p)
  if term == 'objective':
    return lambda p: 0.5 * coefficient * otu.tree_norm(jax.tree_util.tree_map(
        lambda w, on: w if on else jnp.zeros_like(w), p, kernel_mask(p)), squared=True)
  raise ValueError(f'Unknown landscape L2 term {term!r}; use one of {", ".join(L2_TERMS)}.')


def _directions(subject: Subject, options: Options, fixed: Tuple[jax.Array, jax.Array],
                unroll: bool) -> Any:
  """The two directions of `landscape_directions`: filter-normalised random ones, or
  the Hessian's top Ritz vectors on the first of the `fixed` batches."""
  if options.landscape_directions == 'random':
    return loss_surface.random_directions(subject.params, jax.random.PRNGKey(0),
                                          normalisation=options.landscape_normalisation)
  if options.landscape_directions == 'hessian':
    total_loss, _ = objectives.recipe_objective(subject.model, subject.recipe, unroll)
    basis = check_lanczos(options.lanczos_steps, curvature.dimension(subject.params),
                          subject.label)
    first = tuple(x[:1] for x in fixed)
    matvec, _, operands, _ = curvature.minibatch_hvp(
        total_loss, subject.params, first, unroll, keep_free=basis,
        compiler_options=objectives.compiler_options())
    return loss_surface.hessian_directions(matvec, subject.params, options.lanczos_steps,
                                           operands(slice(None)), host_loop=unroll)
  raise ValueError(f'Unknown landscape directions {options.landscape_directions!r}; use random '
                   'or hessian.')


def measure(subject: Subject, batches: Batches, options: Options = Options(),
            chunk: int = 8) -> Dict:
  """The recipe's NLL (its loss and label smoothing) on `landscape_batches` training
  batches drawn once through its pipeline, plus an L2 term (`l2_penalty` of
  `landscape_l2`: Park & Kim's by default), at params + a d1 + b d2 on a grid of
  `landscape_points` x `landscape_points` values of a, b in [-1, 1]; the NLL part
  and the L2 part are kept apart. `landscape_directions` 'random' draws two
  filter-normalised Gaussian directions (Park & Kim's `create_bases`,
  `loss_surface.filter_normalised` with `landscape_normalisation`), 'hessian' takes
  the Ritz vectors of the two largest eigenvalues of the Hessian tool's objective
  (`lanczos_steps` steps on the first batch). Points are evaluated `chunk` at a
  time, one program call per chunk, with the progress reported between calls.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    options: the tool's options.
    chunk: points evaluated together.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  points, directions = options.landscape_points, options.landscape_directions
  if subject.recipe is None:
    raise ValueError(f'The landscape of {subject.label} is of its training objective, which '
                     'needs the recipe that trained it (load_subject(..., recipe=)).')
  unroll = curvature.loops_on_host(subject.layers.architecture)
  fixed = fixed_batches(batches, features.TRAIN_AUGMENTED, options.landscape_batches,
                        subject.config.num_classes, subject.mesh)
  description = {'loss': subject.recipe.loss,
                 'label_smoothing': subject.recipe.label_smoothing,
                 'l2': objectives.l2_coefficient(subject.recipe),
                 'l2_term': options.landscape_l2}
  nll_loss = objectives.training_loss(subject.model, 0., subject.recipe.loss,
                                      subject.recipe.label_smoothing, unroll=unroll)
  bases = _directions(subject, options, fixed, unroll)
  axis = np.linspace(-SPAN, SPAN, points)
  a, b = np.meshgrid(axis, axis)  # [row b, column a]
  coordinates = np.stack([a.ravel(), b.ravel()], axis=1)
  started = time.perf_counter()
  done = progress.Progress(f'landscape {subject.label}', len(coordinates), 'grid points')
  nll = loss_surface.grid(lambda p: nll_loss(p, fixed), subject.params, bases, coordinates,
                          chunk, host_loop=unroll, on_points=done.advance).reshape(points, points)
  seconds = time.perf_counter() - started
  l2 = loss_surface.grid(l2_penalty(options.landscape_l2, description['l2']), subject.params,
                         bases, coordinates, chunk).reshape(points, points)
  total = nll + l2
  return {'objective': description, 'directions': directions,
          'normalisation': options.landscape_normalisation if directions == 'random' else None,
          'coordinates': axis.tolist(),
          'loss': total.tolist(), 'nll': nll.tolist(), 'l2': l2.tolist(),
          'centre_loss': float(total[points // 2, points // 2]),
          'num_images': int(fixed[0].shape[0] * fixed[0].shape[1]),
          'grid_seconds': round(seconds, 1)}


def draw(result: Dict, subject: Subject, out: str, options: Options = Options()) -> List[str]:
  """The figures of the landscape tool, from its numbers (`measure`): the loss as a
  contour map and a surface, and along each direction through the centre.

  See `analysis.tool.Draw`.
  """
  directions, normalisation = options.landscape_directions, options.landscape_normalisation
  axis, total, nll = (np.asarray(result[k]) for k in ('coordinates', 'loss', 'nll'))
  middle = len(axis) // 2
  departures = ([f'{options.landscape_l2} L2'] if options.landscape_l2 != 'authors' else []) + (
      ['per-array directions'] if directions == 'random' and normalisation != 'authors' else [])
  title = f'{subject.label}' + (f' ({", ".join(departures)})' if departures else '') + '\n' + (
      'filter-normalised random directions' if directions == 'random'
      else 'top Hessian eigenvectors')
  names = ('direction 1', 'direction 2') if directions == 'random' else ('eigenvector 1',
                                                                           'eigenvector 2')
  return [plots.landscape(axis, axis, total, figure_path(out, 'landscape', subject),
                          f'Loss (NLL + L2): {title}', *names),
          plots.landscape(axis, axis, total, figure_path(out, 'landscape_surface', subject),
                          f'Loss (NLL + L2): {title}', *names, surface=True),
          plots.curves({'NLL + L2, along 1': total[middle], 'NLL + L2, along 2': total[:, middle],
                        'NLL along 1': nll[middle], 'NLL along 2': nll[:, middle]},
                       figure_path(out, 'landscape_1d', subject),
                       f'Loss along each direction: {title}', 'step along the direction',
                       'loss', x=axis)]


TOOL = register(Tool(
    name='landscape', importance=5, title='Loss landscape', splits=(),  # augmented training batches
    quantity='The recipe\'s NLL (with its label smoothing) on augmented training batches '
             'drawn once plus Park & Kim\'s L2 term (weight_decay, PyTorch\'s, here '
             'weight_decay / lr, times the sum of every parameter tensor\'s unsquared norm), '
             'on a grid around the trained parameters along two random directions '
             'filter-normalised as the authors do (position embeddings and q/k/v biases held '
             'still, fused q/k/v normalised together) or the top Hessian eigenvectors; NLL and '
             'L2 kept apart in the JSON, which names the L2 term and normalisation used.',
    paper='Park & Kim (Fig. 1): ViT\'s loss landscape is flatter than ResNet\'s near the '
          'optimum, and its training loss higher.',
    reads_logits=True,
    run=measure, draw=draw,
    findings=each_model(lambda label, r, q: [
        f'{label}: loss at the trained parameters ', q('centre_loss'), ', grid from ',
        q('loss', reduce='min'), ' to ', q('loss', reduce='max'),
        f' ({r["directions"]} directions)']),
    options=Options,
    # Every grid point is a forward pass over each of the landscape's batches.
    work=lambda subject, options, amounts: Work(
        {'forward': options.landscape_points ** 2 * options.landscape_batches}, {'forward': 1}),
    shortened_by=('landscape_points', 'landscape_batches'),
    minimum=f'{MIN_POINTS} x {MIN_POINTS} points on one batch'))
