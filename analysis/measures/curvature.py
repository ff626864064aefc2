"""Hessian-vector products of a loss (a zoo model's training objective,
`analysis.runtime.objectives`), as one fixed symmetric operator on flat parameter
vectors for `analysis.measures.lanczos`.

The loss is evaluated in inference mode (no dropout, no stochastic depth) on a
fixed set of batches (drawn once, with whatever augmentation they were drawn
with), averaged over the batches, plus an optional explicit L2 term, so every
product uses the same matrix. Batches are stacked, (K, B, ...) images and
(K, B, C) labels (`stack_batches`), and the loss scans over them, so the program
holds one forward, backward and jvp however many batches there are; for ResNets
on CPU the batches are a Python loop instead (`sum_over_batches`).
"""
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax.tree_utils as otu
from jax.flatten_util import ravel_pytree
from jax.tree_util import Partial

from vit_jax.models.family import CONVNET, HYBRID

Batches = Tuple[jax.Array, jax.Array]  # stacked images (K, B, H, W, 3), labels (K, B, C)
Loss = Callable[[Any, Batches], jax.Array]


def stack_batches(batches: Sequence[Tuple[Any, Any]]) -> Batches:
  """[(images, labels), ...] of one batch size -> (images (K, B, ...), labels (K, B, C)).

  Args:
    batches: K (images, labels) pairs of one batch size.

  Returns:
    The stacked images and labels.
  """
  return jnp.stack([b[0] for b in batches]), jnp.stack([b[1] for b in batches])


def loops_on_host(architecture: str) -> bool:
  """Whether a model's batches and Lanczos steps are best driven from Python
  (`unroll`, `host_loop`): for models with convolutions (ResNets, hybrids) on
  XLA:CPU, which runs convolutions inside any loop body several times slower
  (`sum_over_batches`).

  Args:
    architecture: the model's kind (`Layers.architecture`).

  Returns:
    Whether to loop on the host.
  """
  return architecture in (CONVNET, HYBRID) and jax.default_backend() == 'cpu'


def sum_over_batches(fn: Callable[[Any], Any], batches: Batches, init: Any,
                     unroll: bool = False, which: Optional[jax.Array] = None) -> Any:
  """init + the sum of fn(batch) over the K stacked batches: a `lax.scan`, whose
  compile time does not grow with K, or with `unroll` a Python loop, straight-line
  code: XLA:CPU runs convolutions inside any loop body, even one of a single
  trip, several times slower (a ResNet's gradient on one batch of 100: 0.92 s in
  a scan against 0.12 s outside one). With `which`, (first, end), only batches
  first to end - 1 are summed, in a loop of that many trips, so that one program
  serves any run of the batches (not with `unroll`).

  Args:
    fn: one batch -> a tree.
    batches: K stacked batches.
    init: the tree the sum starts from.
    unroll: a Python loop instead of a scan.
    which: the run of batches, (2,) integers, or None for all.

  Returns:
    The summed tree.
  """
  if unroll:
    if which is not None:
      raise ValueError('A run of batches picked in the program needs a loop in it, not unroll.')
    total = init
    for i in range(batches[0].shape[0]):
      total = otu.tree_add(total, fn(jax.tree_util.tree_map(lambda x: x[i], batches)))
    return total
  if which is not None:
    return jax.lax.fori_loop(which[0], which[1], lambda i, t: otu.tree_add(t, fn(
        jax.tree_util.tree_map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False),
                               batches))), init)
  total, _ = jax.lax.scan(lambda t, batch: (otu.tree_add(t, fn(batch)), None), init, batches)
  return total


def hvp(loss: Loss, params: Any, batches: Batches, vector: Any, unroll: bool = False,
        which: Optional[jax.Array] = None) -> Any:
  """H v at `params` by forward-over-reverse differentiation (jvp of the gradient),
  one batch at a time (`sum_over_batches`), averaged: the loss is a mean over
  batches plus a penalty, so this is the whole Hessian's product, at the memory of
  one batch.

  Args:
    loss: (params, stacked batches) -> a scalar (`objectives.training_loss`).
    params: where the Hessian is taken.
    batches: K stacked batches.
    vector: a tree like `params`.
    unroll: as in `sum_over_batches`.
    which: as in `sum_over_batches`: the product over those batches alone.

  Returns:
    H v, a tree like `params`.
  """
  def product(batch):
    single = jax.tree_util.tree_map(lambda x: x[None], batch)
    return jax.jvp(lambda p: jax.grad(loss)(p, single), (params,), (vector,))[1]
  count = batches[0].shape[0] if which is None else which[1] - which[0]
  total = sum_over_batches(product, batches, otu.tree_zeros_like(vector), unroll, which)
  return jax.tree_util.tree_map(lambda x: x / count, total)


def flat_hvp(loss: Loss, params: Any, unroll: bool = False) -> Tuple[Callable[..., jax.Array], int]:
  """(matvec, dimension): matvec(v, params, batches) = H v on flat vectors, and
  matvec(v, params, batches, which) over the run of batches `which` picks
  (`sum_over_batches`), one program for any run.

  Parameters and batches are arguments, not closed over, so that under `jit`
  they are inputs rather than constants XLA would try to fold; pass them to the
  `analysis.measures.lanczos` functions as `operands=(params, batches)`. Batches split
  over devices (`analysis.runtime.features.shard_examples` on axis 1) make it
  data-parallel.

  Args:
    loss: (params, stacked batches) -> a scalar.
    params: a tree of the parameters' shapes (the point itself is an operand).
    unroll: as in `sum_over_batches`.

  Returns:
    (matvec, the number of parameters).
  """
  _, unravel = ravel_pytree(params)

  @jax.jit
  def matvec(v, params, batches, which=None):
    return ravel_pytree(hvp(loss, params, batches, unravel(v), unroll, which))[0]
  return matvec, dimension(params)


def dimension(params: Any) -> int:
  """The number of parameters: the Hessian's side.

  Args:
    params: the parameter tree.

  Returns:
    The number.
  """
  return sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(params))


def linearise(loss: Loss, params: Any, batches: Batches,
              compiler_options: Optional[Dict[str, str]] = None) -> Tuple[Partial, ...]:
  """Each batch's gradient of `loss` linearised at `params` (`jax.linearize`): its
  forward and backward pass run once and their residuals are kept, so that a
  product with that batch's Hessian is the tangent pass alone. All of them share one
  program, and so one `linearised_hvp` program serves any of them.

  Args:
    loss: (params, stacked batches) -> a scalar (`objectives.training_loss`).
    params: where the Hessian is taken.
    batches: K stacked batches.
    compiler_options: `jax.jit`'s, for the linearisations' program.

  Returns:
    K linear maps, tree like `params` -> (the batch's Hessian) times it.
  """
  one = jax.jit(_linearised_gradient(loss), compiler_options=compiler_options)
  return tuple(one(params, jax.tree_util.tree_map(lambda x: x[i], batches))
               for i in range(batches[0].shape[0]))


def _linearised_gradient(loss: Loss) -> Callable[[Any, Any], Partial]:
  """(params, one batch) -> the batch's gradient of `loss` linearised at params."""
  return lambda p, batch: jax.linearize(
      lambda q: jax.grad(loss)(q, jax.tree_util.tree_map(lambda x: x[None], batch)), p)[1]


def linearisation_bytes(loss: Loss, params: Any, batches: Batches) -> int:
  """The memory `linearise` keeps for one of the K batches, found without running it.

  Args:
    loss: as in `linearise`.
    params: as in `linearise`.
    batches: as in `linearise`.

  Returns:
    Bytes of one batch's residuals.
  """
  shapes = jax.eval_shape(_linearised_gradient(loss), params,
                          jax.tree_util.tree_map(lambda x: x[0], batches))
  return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))


def linearised_hvp(params: Any, compiler_options: Optional[Dict[str, str]] = None
                   ) -> Callable[..., jax.Array]:
  """matvec(v, linearisations) = the mean over the given `linearise` maps of their
  products with v, on flat vectors: H v over those batches, one compiled tangent
  pass per batch, summed from Python (straight-line, as `sum_over_batches` with
  `unroll`).

  Args:
    params: a tree of the parameters' shapes.
    compiler_options: `jax.jit`'s, for the products' program.

  Returns:
    The matvec.
  """
  _, unravel = ravel_pytree(params)
  # Each product adds to the running sum, so the batches' programs run one after the
  # other: independent programs in flight at once can deadlock XLA:CPU's collectives
  # when the batches are split over several devices.
  accumulate = jax.jit(lambda total, v, linear: total + ravel_pytree(linear(unravel(v)))[0],
                       compiler_options=compiler_options)

  def matvec(v, linearisations):
    total = jnp.zeros_like(v)
    for linear in linearisations:
      total = accumulate(total, v, linear)
    return total / len(linearisations)
  return matvec


def minibatch_hvp(loss: Loss, params: Any, batches: Batches, unroll: bool = False,
                  keep_free: int = 0, compiler_options: Optional[Dict[str, str]] = None
                  ) -> Tuple[Callable[..., jax.Array], int, Callable[[slice], tuple], str]:
  """H v of `loss` over any run of the K fixed batches, as a compiled operator.

  Where the batches are a Python loop (`unroll`: `loops_on_host`) and every
  batch's residuals fit in half the memory available now (less `keep_free`),
  each batch's gradient is linearised once (`linearise`) and every product after
  is a tangent pass (the quick-start ResNet's: 0.148 s against 0.230 s for jvp
  of grad, batch 100, 2-core AMD EPYC: `benchmarks/hessian.py`); otherwise each
  product is jvp of grad (`flat_hvp`). The products are the same to float32
  rounding.

  Args:
    loss: (params, stacked batches) -> a scalar.
    params: where the Hessian is taken.
    batches: K stacked batches.
    unroll: as in `sum_over_batches`.
    keep_free: bytes the caller will allocate besides (a Lanczos basis).
    compiler_options: `jax.jit`'s, for the linearised products' programs (those are
      top-level programs; jvp of grad may run inside the caller's).

  Returns:
    (matvec, dimension, operands, method): matvec(v, *operands(slice)) is H v over
    the batches the slice picks (`slice(None)`: all of them; without `unroll`,
    every slice has operands of one shape, so one compiled program serves them
    all); method is 'linearised' or 'jvp of grad'.
  """
  dim = dimension(params)
  count = batches[0].shape[0]
  if unroll and (count * linearisation_bytes(loss, params, batches)
                 < (available_memory() - keep_free) / 2):
    linearisations = linearise(loss, params, batches, compiler_options)
    return (linearised_hvp(params, compiler_options), dim,
            lambda which: (linearisations[which],), 'linearised')
  matvec, _ = flat_hvp(loss, params, unroll)
  if unroll:
    return (matvec, dim, lambda which: (params, tuple(x[which] for x in batches)),
            'jvp of grad')

  def operands(which: slice) -> tuple:  # every run of batches one program
    picked = range(count)[which]
    if picked.step != 1:
      raise ValueError(f'A run of batches is consecutive; {which} is not.')
    return params, batches, jnp.array([picked.start, picked.stop], jnp.int32)
  return matvec, dim, operands, 'jvp of grad'


def available_memory() -> int:
  """Bytes of host memory available now.

  Returns:
    The bytes.
  """
  return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


def block_names(params: Any, depth: int = 2) -> List[str]:
  """The block of each parameter leaf, in leaf order: the first `depth` modules of
  its path (a ViT's encoder block, a ResNet's stage, the embedding, the head); a
  top-level parameter is its own block.

  Args:
    params: the parameter tree.
    depth: the path segments that name a block.

  Returns:
    One block name per leaf.
  """
  keys = [[str(getattr(k, 'key', k)) for k in path]
          for path, _ in jax.tree_util.tree_leaves_with_path(params)]
  return ['/'.join(key[:-1][:depth] or key) for key in keys]


def block_sizes(params: Any, depth: int = 2) -> Dict[str, int]:
  """The number of parameters in each block (`block_names`), in first-leaf order.

  Args:
    params: the parameter tree.
    depth: as in `block_names`.

  Returns:
    {block name: its number of parameters}.
  """
  sizes: Dict[str, int] = {}
  for name, leaf in zip(block_names(params, depth), jax.tree_util.tree_leaves(params)):
    sizes[name] = sizes.get(name, 0) + int(np.size(leaf))
  return sizes


def l2_traces(params: Any, l2: float, l2_mask: Optional[Callable[[Any], Any]] = None,
              depth: int = 2) -> Dict[str, float]:
  """The exact trace of the L2 term's Hessian in each block: `objectives.training_loss` adds
  l2/2 ||w||^2 over the parameters `l2_mask` marks, whose Hessian is l2 on each of
  them, so l2 times their number. The rest of a block's trace is the data term's.

  Args:
    params: the parameter tree.
    l2: the L2 coefficient.
    l2_mask: as in `objectives.training_loss`.
    depth: as in `block_names`.

  Returns:
    {block name: the L2 term's trace there}.
  """
  mask = l2_mask(params) if l2_mask else jax.tree_util.tree_map(lambda _: True, params)
  traces = dict.fromkeys(block_names(params, depth), 0.)
  for name, leaf, on in zip(block_names(params, depth), jax.tree_util.tree_leaves(params),
                            jax.tree_util.tree_leaves(mask)):
    traces[name] += l2 * np.size(leaf) * bool(on)
  return traces


def parameter_blocks(params: Any, depth: int = 2) -> Tuple[jax.Array, List[str]]:
  """Each flat-vector coordinate's block (`block_names`) as an index into the
  distinct block names, in `ravel_pytree` order, for `lanczos.hutchinson`.

  Args:
    params: the parameter tree.
    depth: as in `block_names`.

  Returns:
    (the flat vector of block indices, the distinct block names).
  """
  paths = block_names(params, depth)
  names = list(dict.fromkeys(paths))
  leaves = [jnp.full(np.shape(x), names.index(p), jnp.int32)
            for p, x in zip(paths, jax.tree_util.tree_leaves(params))]
  ids = ravel_pytree(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), leaves))[0]
  return ids, names


def block_matvec(matvec: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  """The product with one block's diagonal block of H: `mask` (1 on the block's
  coordinates, 0 elsewhere) is the first operand, so every block shares one program.

  Args:
    matvec: the whole Hessian's product, (v, *operands) -> H v.

  Returns:
    (v, mask, *operands) -> the block's product.
  """
  return lambda v, mask, *operands: mask * matvec(mask * v, *operands)
