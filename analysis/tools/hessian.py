"""Hessian spectra: top eigenvalues per minibatch by Lanczos and the SLQ spectral
density (Park & Kim Fig. 1, 4), and Hutchinson traces, of the whole Hessian and of
each parameter block's diagonal block."""
import dataclasses
import functools
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from analysis.measures import curvature, lanczos, uncertainty
from analysis.reporting import joint_figures, plots, verdict
from analysis.runtime import features, objectives, progress
from analysis.tool import (Batches, Subject, Tool, each_model, figure_path, model_scalars,
                           per_model, register)
from analysis.runtime.estimate import Amounts, Work
from analysis.tool_options import Budget, option
from analysis.tools.common import check_lanczos, fixed_batches, lanczos_steps_option
from vit_jax.models.family import CONVNET, TRANSFORMER
from vit_jax.training import kernel_mask

# An SLQ density is drawn down to 1e-8 of its peak, so that its extreme Ritz values,
# whose quadrature weights are about 1e-6, show as bumps in the tails.
DENSITY_DECADES = 8



@dataclasses.dataclass(frozen=True)
class Options:
  """The Hessian tool's options: its command-line flags, and the settings a time
  budget shrinks (the smallest sample: 2 minibatches, 10 Lanczos steps, one density
  probe, 2 trace probes and 4 steps per block). A setting left None follows
  `lanczos_steps`, as its `*_in_use` property says."""
  hessian_batches: int = option(4, 'Minibatches (of --batch_size) for the Hessian, each its own '
                                'top-k estimate.', least=1, budget=Budget(minimum=2, order=0))
  lanczos_steps: int = lanczos_steps_option(Budget(minimum=10, order=1))
  hessian_l2_on: str = option(
      'all', 'Parameters the training objective\'s L2 term covers: all (Park & Kim\'s AdamW '
      'decays every parameter) or kernels (the parameters this project\'s optimizer decays).',
      choices=objectives.L2_ON)
  hessian_density_width: str = option(
      'pyhessian', 'Width of the Gaussians the SLQ density is drawn with: pyhessian (its '
      'variance 1e-5 * max(1, span)) or wide (span / 100, smoother).',
      choices=lanczos.DENSITY_WIDTHS)
  hessian_objective: str = option(
      'training', 'training: the recipe\'s loss plus L2 on augmented training batches (Park '
      '& Kim); clean: plain cross-entropy on evaluation-preprocessed images.',
      choices=('training', 'clean'))
  hessian_top_k: int = option(5, 'Eigenvalues per minibatch.', flag=False)
  density_steps: Optional[int] = option(
      None, 'Lanczos steps per SLQ probe (None: twice --lanczos_steps).', flag=False)
  density_probes: int = option(2, 'SLQ probes.', flag=False,
                               budget=Budget(minimum=1, order=2, smaller=lambda probes: 1))
  trace_probes: Optional[int] = option(
      None, 'Hutchinson probes (None: half --lanczos_steps, at least 2).', flag=False,
      budget=Budget(minimum=2, order=3, smaller=lambda probes: 2, follows='trace_probes_in_use'))
  block_steps: Optional[int] = option(
      None, 'Lanczos steps per parameter block\'s diagonal block (None: half --lanczos_steps, '
      'at least 1).', flag=False,
      budget=Budget(minimum=4, order=3, smaller=lambda steps: 4, follows='block_steps_in_use'))

  @property
  def density_steps_in_use(self) -> int:
    return self.density_steps or 2 * self.lanczos_steps

  @property
  def trace_probes_in_use(self) -> int:
    return self.trace_probes or max(2, self.lanczos_steps // 2)

  @property
  def block_steps_in_use(self) -> int:
    return self.block_steps or max(1, self.lanczos_steps // 2)

  @property
  def basis_steps(self) -> int:
    """The most steps any Lanczos run takes: the basis every run shares."""
    return max(self.lanczos_steps, self.density_steps_in_use, self.block_steps_in_use)


def hessian_objective(subject: Subject, objective: str, unroll: bool = False,
                      l2_on: str = 'all'):
  """(loss, split of its batches, description) for `objective`:
  'training', the recipe's own loss plus L2 (over the parameters `l2_on` names) on
  training batches with its augmentation (Park & Kim's protocol,
  `objectives.recipe_objective`), or 'clean', plain cross-entropy without L2 on
  evaluation-preprocessed training images. `unroll` as in
  `objectives.training_loss`.

  Args:
    subject: the model.
    objective: 'training' or 'clean'.
    unroll: as in `objectives.training_loss`.
    l2_on: 'all' or 'kernels'.

  Returns:
    (loss, split of its batches, description).
  """
  if objective == 'clean':
    return (objectives.training_loss(subject.model, unroll=unroll), 'train',
            {'loss': 'softmax', 'label_smoothing': 0., 'l2': 0.,
             'data': 'training split, evaluation preprocessing'})
  if objective != 'training':
    raise ValueError(f'Unknown Hessian objective {objective!r}; use training or clean.')
  if subject.recipe is None:
    raise ValueError(f'The training objective of {subject.label} needs the recipe that '
                     'trained it (load_subject(..., recipe=)); or measure objective="clean".')
  loss, description = objectives.recipe_objective(subject.model, subject.recipe, unroll, l2_on)
  return loss, features.TRAIN_AUGMENTED, {**description,
                                          'data': 'training split through the training '
                                                  'pipeline, augmentation drawn once'}


def _operator(subject: Subject, batches: Batches, options: Options):
  """The objective's minibatch Hessian-vector product (`curvature.minibatch_hvp`),
  whether its batches loop on the host, and the objective's description."""
  host_loop = curvature.loops_on_host(subject.layers.architecture)
  loss, split, description = hessian_objective(subject, options.hessian_objective, host_loop,
                                               options.hessian_l2_on)
  fixed = fixed_batches(batches, split, options.hessian_batches, subject.config.num_classes,
                        subject.mesh)
  basis = check_lanczos(options.basis_steps, curvature.dimension(subject.params), subject.label)
  return (*curvature.minibatch_hvp(loss, subject.params, fixed, host_loop, keep_free=basis,
                                   compiler_options=objectives.compiler_options()),
          host_loop, description)


def measure(subject: Subject, batches: Batches, options: Options = Options()) -> Dict:
  """Top-k Hessian eigenvalues on each of several minibatches (the paper's protocol),
  an SLQ density with its negative fraction on all of them together, Hutchinson
  traces of the whole Hessian and of each parameter block's diagonal block
  (`curvature.parameter_blocks`), and the largest-magnitude eigenvalue of each
  block's diagonal block on the first minibatch, of the objective
  `hessian_objective` names with L2 over `hessian_l2_on` (recorded in the JSON).
  The density is drawn with Gaussians of `hessian_density_width`
  (`lanczos.density_sigma`: PyHessian's by default).

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    options: the tool's options.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  matvec, dim, operands, method, host_loop, description = _operator(subject, batches, options)
  ids, blocks = curvature.parameter_blocks(subject.params)
  sizes = curvature.block_sizes(subject.params)
  # Progress in Hessian-vector products on one minibatch: the density's are on all.
  done = progress.Progress(
      f'hessian {subject.label}',
      options.hessian_batches * (options.lanczos_steps
                                 + options.density_probes * options.density_steps_in_use
                                 + options.trace_probes_in_use)
      + sum(min(options.block_steps_in_use, n) for n in sizes.values()),
      'minibatch Hessian-vector products')
  # Every run, of any step count, minibatch or block, through one program: the product
  # with a block's diagonal block (`curvature.block_matvec`), the whole Hessian's under
  # a mask of ones, in a basis of the most steps any run takes.
  masked, whole = curvature.block_matvec(matvec), jnp.ones(dim, jnp.float32)
  shared = dict(host_loop=host_loop, mesh=subject.mesh, capacity=options.basis_steps)
  lanczos_run = functools.partial(lanczos.extreme_eigenvalues,
                                  on_step=lambda carry: done.advance(1, carry), **shared)
  tops = []
  for i in range(options.hessian_batches):
    tops.append(lanczos_run(masked, dim, options.lanczos_steps, options.hessian_top_k,
                            jax.random.PRNGKey(i), operands=(whole, *operands(slice(i, i + 1)))
                            )['top'].tolist())
    if not host_loop:
      done.advance(options.lanczos_steps)
  nodes, weights = lanczos.slq(masked, dim, options.density_steps_in_use, options.density_probes,
                               operands=(whole, *operands(slice(None))),
                               on_step=lambda carry: done.advance(options.hessian_batches, carry),
                               **shared)
  block_top = _block_tops(lanczos_run, masked, dim, ids, blocks, sizes, operands(slice(0, 1)),
                          options.block_steps_in_use, None if host_loop else done.advance)
  signs = jax.random.rademacher(jax.random.PRNGKey(options.hessian_batches),
                                (options.trace_probes_in_use, dim), jnp.float32)
  sums = lanczos.hutchinson(masked, signs, (whole, *operands(slice(None))), ids, len(blocks),
                            **shared)
  done.advance(options.hessian_batches * options.trace_probes_in_use)
  return {'objective': {'name': options.hessian_objective, **description}, 'hvp': method,
          'top_per_minibatch': tops, 'num_parameters': dim,
          'num_minibatches': options.hessian_batches, 'lanczos_steps': options.lanczos_steps,
          'density_steps': options.density_steps_in_use, 'density_probes': options.density_probes,
          **_summaries(subject, nodes, weights, sums, blocks, description, options),
          'block_top_eigenvalue': block_top, 'block_steps': options.block_steps_in_use}


def _block_tops(lanczos_run: Callable, masked: Callable, dim: int, ids: jnp.ndarray,
                blocks: Sequence[str], sizes: Mapping[str, int], operands: tuple,
                block_steps: int, advance: Optional[Callable[[int], None]]
                ) -> Dict[str, float]:
  """The largest-magnitude eigenvalue of each parameter block's diagonal block on the
  minibatch of `operands`: a Lanczos run of `block_steps` steps, or the block's size
  where smaller, under the block's mask, with a key of its own; `advance`, where given,
  is told each run's steps."""
  tops = {}
  for b, name in enumerate(blocks):
    steps = min(block_steps, sizes[name])
    tops[name] = float(lanczos_run(
        masked, dim, steps, 1, jax.random.PRNGKey(100 + b),
        operands=((ids == b).astype(jnp.float32), *operands))['top'][0])
    if advance:
      advance(steps)
  return tops


def _summaries(subject: Subject, nodes: np.ndarray, weights: np.ndarray, sums: np.ndarray,
               blocks: Sequence[str], description: Dict, options: Options) -> Dict:
  """The density's negative fractions, the traces with their standard errors and the
  L2 term's share, and the SLQ nodes and weights the density is drawn from."""
  block_traces = sums.mean(0)
  block_stderr = uncertainty.weighted_mean_stderr(sums, np.ones(options.trace_probes_in_use))
  l2_share = curvature.l2_traces(subject.params, description['l2'], kernel_mask
                                 if description.get('l2_on') == 'kernels' else None)
  beyond = 0.01 * np.abs(nodes).max()
  per_probe = [lanczos.negative_fraction(n, w, beyond) for n, w in zip(nodes, weights)]
  return {
      'negative_fraction': lanczos.negative_fraction(nodes, weights),
      # Mass below -1% of the largest |eigenvalue|: negative beyond the bulk's scatter.
      'negative_fraction_beyond_1pct': lanczos.negative_fraction(nodes, weights, beyond),
      'negative_fraction_beyond_1pct_stderr': float(
          uncertainty.weighted_mean_stderr(per_probe, np.ones(len(per_probe)))),
      'trace': float(sums.sum(1).mean()),
      'trace_stderr': float(uncertainty.weighted_mean_stderr(
          sums.sum(1), np.ones(options.trace_probes_in_use))),
      'trace_probes': options.trace_probes_in_use,
      'block_traces': dict(zip(blocks, block_traces.tolist())),
      'block_traces_stderr': dict(zip(blocks, block_stderr.tolist())),
      'trace_l2': float(sum(l2_share.values())), 'block_traces_l2': l2_share,
      'slq_nodes': nodes.tolist(), 'slq_weights': weights.tolist(),
      'sigma': lanczos.density_sigma(nodes, options.hessian_density_width),
      'density_width': options.hessian_density_width}


def draw(result: Dict, subject: Subject, out: str, options: Options = Options()) -> List[str]:
  """The figures of the Hessian tool, from its numbers (`measure`): the minibatches' top
  eigenvalues, the spectral density with them as a rug, and the blocks' traces and
  largest eigenvalues.

  See `analysis.tool.Draw`.
  """
  tops = result['top_per_minibatch']
  nodes, weights = np.asarray(result['slq_nodes']), np.asarray(result['slq_weights'])
  sigma = result['sigma']
  # The density's axis reaches the largest minibatch eigenvalues, drawn as a rug.
  span = max(np.abs(nodes).max(), np.abs(tops).max(), 1e-12)
  grid = lanczos.density_grid(-span * 1.05, span * 1.05, sigma)
  blocks = list(result['block_traces'])
  return [
      plots.histogram(np.ravel(tops), figure_path(out, 'hessian_top', subject),
                      f'Top-{options.hessian_top_k} Hessian eigenvalues on '
                      f'{options.hessian_batches} minibatches: {subject.label}', 'eigenvalue'),
      plots.curves({'density': lanczos.density(nodes, weights, grid, sigma)},
                   figure_path(out, 'hessian_density', subject),
                   f'Hessian spectral density (SLQ, sigma {sigma:.3g}): {subject.label}',
                   'eigenvalue', 'density (log)', x=grid, logy=True, decades=DENSITY_DECADES,
                   rug={'density': np.ravel(tops)},
                   rug_label=f'top-{options.hessian_top_k} per minibatch'),
      plots.curves({'trace of the block': [result['block_traces'][b] for b in blocks],
                    'largest eigenvalue of the block': [result['block_top_eigenvalue'][b]
                                                        for b in blocks]},
                   figure_path(out, 'hessian_trace', subject),
                   f'Hessian per parameter block (trace: Hutchinson, '
                   f'{options.trace_probes_in_use} probes): {subject.label}', 'parameter block',
                   'value', xlabels=blocks,
                   errors={'trace of the block': np.asarray(
                       [result['block_traces_stderr'][b] for b in blocks])})]


def _findings(label, r, q):
  return [f'{label} ({r["objective"]["name"]} objective, ', q('num_parameters'),
          ' parameters): top eigenvalues from ', q('top_per_minibatch', reduce='min'), ' to ',
          q('top_per_minibatch', reduce='max'), '; negative spectral mass ',
          q('negative_fraction'), ' (about half of it the bulk at 0, split by the smoothing), '
          'beyond 1% of the largest |eigenvalue| ', q('negative_fraction_beyond_1pct'), ' ± ',
          q('negative_fraction_beyond_1pct_stderr'), '; trace ', q('trace'), ' ± ',
          q('trace_stderr'), ' (Hutchinson, ', q('trace_probes'), ' probes), of which the L2 '
          'term exactly ', q('trace_l2')]


def _largest(r: Mapping) -> verdict.Estimate:
  """The mean over minibatches of each one's largest eigenvalue, with its standard
  error over the minibatches."""
  largest = [max(top) for top in r['top_per_minibatch']]
  return float(np.mean(largest)), float(uncertainty.weighted_mean_stderr(
      largest, np.ones(len(largest))))


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  by_model, labels = per_model(result), list(per_model(result))
  return [
      verdict.contrast(
          'flatter ViT', 'ViT\'s top Hessian eigenvalues are smaller than ResNet\'s: a flatter '
          'loss (Park & Kim Fig. 1, 4).', 'largest eigenvalue, mean over minibatches', models,
          labels, lambda label: _largest(by_model[label]), higher=CONVNET, lower=TRANSFORMER),
      verdict.contrast(
          'negative curvature in ViT', 'ViT\'s spectrum holds negative eigenvalues that '
          'ResNet\'s has few of (Park & Kim Fig. 1, 4).',
          'spectral mass below -1% of the largest |eigenvalue|', models, labels,
          lambda label: (by_model[label]['negative_fraction_beyond_1pct'],
                         by_model[label]['negative_fraction_beyond_1pct_stderr']))]


def _scalars(r):
  return {'hessian/top_eigenvalue': [max(top) for top in r['top_per_minibatch']],
          'hessian/negative_fraction': [r['negative_fraction']],
          'hessian/negative_fraction_beyond_1pct': [r['negative_fraction_beyond_1pct']]}


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """Every model's SLQ density on one eigenvalue axis, each from its own nodes; and
  Park & Kim's "max eigenvalue spectra" (Fig. 1, 4): the histogram of every
  minibatch's top-k eigenvalues by magnitude, the negative members of the top-k
  included (the same model at several steps of its run with --steps).

  Args:
    result: the tool's JSON.
    colour_of: each model label's colour.
    out: the directory the figures go to.

  Returns:
    The figures' paths.
  """
  by_model = per_model(result)
  span = max(max(np.abs(np.asarray(r['slq_nodes'])).max(),
                 np.abs(np.asarray(r['top_per_minibatch'])).max()) for r in by_model.values())
  grid = lanczos.density_grid(-1.05 * span, 1.05 * span,
                              min(r['sigma'] for r in by_model.values()), least=600)
  series = {label: lanczos.density(np.asarray(r['slq_nodes']), np.asarray(r['slq_weights']),
                                   grid, r['sigma']) for label, r in by_model.items()}
  return [plots.curves(series, joint_figures.path(out, 'hessian'),
                       'Hessian spectral densities (SLQ)', 'eigenvalue', 'density (log)',
                       x=grid, logy=True, decades=DENSITY_DECADES, colours_of=colour_of,
                       rug={label: np.ravel(r['top_per_minibatch'])
                            for label, r in by_model.items()},
                       rug_label='top eigenvalues per minibatch'),
          plots.histogram({label: np.ravel(r['top_per_minibatch'])
                           for label, r in by_model.items()},
                          joint_figures.path(out, 'hessian_max'),
                          'Top Hessian eigenvalues of each minibatch', 'eigenvalue',
                          colours_of=colour_of)]


def work(subject: Subject, options: Options, amounts: Amounts) -> Work:
  """Minibatch Hessian-vector products: Lanczos for the top eigenvalues on each
  minibatch, then the SLQ probes and the trace probes over all of them, and
  Lanczos on each block's diagonal block on one minibatch, all through one
  compiled program, except where the host drives them (`curvature.minibatch_hvp`:
  one product's program, and the linearisation's or the product over all batches).

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  products = options.hessian_batches * (
      options.lanczos_steps + options.density_probes * options.density_steps_in_use
      + options.trace_probes_in_use)
  blocks = sum(min(options.block_steps_in_use, n)
               for n in curvature.block_sizes(subject.params).values())
  return Work({'hvp': products + blocks},
              {'hvp': 2 if curvature.loops_on_host(subject.layers.architecture) else 1})


TOOL = register(Tool(
    name='hessian', importance=2, title='Hessian spectra', splits=('train',),
    quantity='Top-5 Hessian eigenvalues on each minibatch by Lanczos (the ticks under the '
             'density), and the SLQ spectral density on all of them, of the objective the JSON '
             'names, on a log axis so that the tails show. The negative mass counts all SLQ mass '
             'below 0; the near-zero bulk splits about evenly between signs under the '
             'smoothing, so about half the mass of any model is negative there, and the mass '
             'below -1% of the largest |eigenvalue| (± over probes) is the negative curvature '
             'the paper speaks of. The trace, of the whole Hessian and of each parameter '
             'block\'s diagonal block, is Hutchinson\'s estimate from Rademacher probes '
             '(PyHessian\'s), ± over probes, with the L2 term\'s exact share (l2 per '
             'penalised parameter; the rest is the data term\'s); each block\'s '
             'largest-magnitude eigenvalue is '
             'Lanczos on its diagonal block (half the Lanczos steps, first minibatch).',
    paper='Park & Kim (Fig. 1, 4): ViT\'s top eigenvalues are smaller (a flatter landscape) '
          'than ResNet\'s, but its spectrum has negative eigenvalues that large data and '
          'training suppress.',
    reads_logits=True,
    run=measure, draw=draw, findings=each_model(_findings), scalars=model_scalars(_scalars),
    joint=joint, verdicts=verdicts,
    options=Options,
    work=work, shortened_by=('hessian_batches', 'lanczos_steps'),
    minimum='2 minibatches, 10 Lanczos steps, one density probe, 2 trace probes and 4 steps '
            'per block'))
