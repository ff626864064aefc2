"""Loss landscapes (Li et al. 2018, as Park & Kim's `ops/loss_landscapes.py` draws
them): a loss evaluated on a grid of points params + a d1 + b d2 along two
directions, random and filter-normalised or the Hessian's top eigenvectors.

Park & Kim (how-do-vits-work `ops/loss_landscapes.py`, `create_bases`, lines
57-65) draw a Gaussian direction per PyTorch tensor of the model's state dict and
normalise it over the tensor's first axis: each slice along the other axes is
rescaled to the norm the weights have there (`normalize_filter`, lines 11-21:
`norm(w, dim=0) / (norm(d, dim=0) + 1e-7) * d`). They then zero the direction of
every tensor of fewer than two axes (`ignore_bn`, lines 24-31: biases,
normalisation scales) and of every tensor whose name matches the keywords of
their landscape notebook (`losslandscape.ipynb`: `kws=["pos_embed",
"relative_position"]`: position embeddings and relative position biases), so
these stay where training left them.

PyTorch's first axis of a weight is its output axis, so here a kernel is
normalised over its output axes (the last; the last two of an attention query,
key or value kernel, whose outputs are heads x head size); other arrays of two or
more axes (the class token) over their first axis, as in PyTorch. Their models
fuse attention projections into one tensor: timm's ViT one `qkv` Linear (3D, D),
AlterNet's `to_q` and a fused `to_kv` (`models/attentions.py`, `Attention2d`).
A fused kernel's norm per input column runs over the fused outputs together, and
its bias (1-D) is zeroed; so the query, key and value kernels of a module that is
one fused tensor in their layout share one norm per input column here, and their
biases (2-D here, heads x head size) get zero directions.

`normalisation='per_array'` keeps this project's layout instead (a departure):
each array normalised alone, q, k and v apart, their biases and the position
embeddings perturbed like any array of two or more axes.
"""
import re
from typing import Any, Callable, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from analysis.measures import lanczos

EPS = 1e-7  # the authors' guard
NORMALISATIONS = ('authors', 'per_array')
# Kernels whose output is (heads, head size): normalised over both.
_TWO_OUTPUT_AXES = re.compile(r'(^|/)(query|key|value)/kernel$')
# The notebook's keywords, and this project's names for what they match: ViT
# position embeddings (`pos_embedding`, `pos_embedding_row`, ...), AlterNet's
# `relative_position_bias`, the relative ViT's `relative_embedding`.
HELD_STILL = re.compile(r'pos_embed|relative_position|relative_embedding')
_QKV_BIAS = re.compile(r'(^|/)(query|key|value)/bias$')
# Attention modules and the projections the authors' layout fuses into one tensor.
_FUSED = ((re.compile(r'(^|/)MultiHeadDotProductAttention_\d+$'), (('query', 'key', 'value'),)),
          (re.compile(r'(^|/)attention$'), (('query',), ('key', 'value'))))


def output_axes(path: str, ndim: int) -> Tuple[int, ...]:
  """The axes of the array at parameter `path` that PyTorch's first axis holds.

  Args:
    path: a '/'-joined parameter path.
    ndim: the array's number of axes.

  Returns:
    The output axes.
  """
  if path.endswith('kernel'):
    return (ndim - 2, ndim - 1) if _TWO_OUTPUT_AXES.search(path) else (ndim - 1,)
  return (0,)


def fused_group(path: str) -> Tuple[str, ...]:
  """The parameter paths fused with the q/k/v kernel at `path` into one tensor in
  the authors' layout (itself included), or () when `path` is no such kernel.

  Args:
    path: a '/'-joined parameter path.

  Returns:
    The fused paths.
  """
  match = re.match(r'^(.*)/(query|key|value)/kernel$', path)
  if not match:
    return ()
  module, projection = match.groups()
  for pattern, groups in _FUSED:
    if pattern.search(module):
      group = next(g for g in groups if projection in g)
      return tuple(f'{module}/{p}/kernel' for p in group)
  return (path,)


def _sum_squares(x, axes):
  return jnp.sum(jnp.square(x), axis=axes, keepdims=True)


def filter_normalised(direction: Any, params: Any, normalisation: str = 'authors') -> Any:
  """`direction` (a tree like `params`) normalised as Park & Kim do (module
  docstring), or each array alone with `normalisation='per_array'`.

  Args:
    direction: a tree like `params`.
    params: the parameters the landscape is drawn around.
    normalisation: 'authors' or 'per_array'.

  Returns:
    The normalised direction, a tree like `params`.
  """
  if normalisation not in NORMALISATIONS:
    raise ValueError(f'Unknown normalisation {normalisation!r}; use one of '
                     f'{", ".join(NORMALISATIONS)}.')
  authors = normalisation == 'authors'
  flat_d = {'/'.join(k): v for k, v in
            flax.traverse_util.flatten_dict(flax.core.unfreeze(direction)).items()}
  flat_w = {'/'.join(k): v for k, v in
            flax.traverse_util.flatten_dict(flax.core.unfreeze(params)).items()}

  def norms(path, tree):
    axes = output_axes(path, np.ndim(flat_w[path]))
    group = fused_group(path) if authors else ()
    return jnp.sqrt(sum(_sum_squares(tree[p], axes) for p in (group or (path,)) if p in tree))

  def normalise(path):
    w, d = flat_w[path], flat_d[path]
    if np.ndim(w) < 2 or (authors and (HELD_STILL.search(path) or _QKV_BIAS.search(path))):
      return jnp.zeros_like(w)
    return norms(path, flat_w) / (norms(path, flat_d) + EPS) * d
  return flax.traverse_util.unflatten_dict(
      {tuple(path.split('/')): normalise(path) for path in flat_w})


def authors_l2(params: Any) -> jax.Array:
  """Park & Kim's L2 term before its coefficient: the sum over every parameter
  tensor of its unsquared Euclidean norm (how-do-vits-work `ops/norm.py`, `l2`,
  lines 15-22: `l2_norm += torch.norm(param)` over `model.parameters()`); their
  landscape notebook adds `weight_decay * l2` to the NLL.

  Args:
    params: the parameter tree.

  Returns:
    The sum of norms, a scalar.
  """
  return sum(jnp.sqrt(jnp.sum(jnp.square(p.astype(jnp.float32))))
             for p in jax.tree_util.tree_leaves(params))


def random_directions(params: Any, key: jax.Array, count: int = 2,
                      normalisation: str = 'authors') -> list:
  """`count` Gaussian directions, filter-normalised (`filter_normalised` with
  `normalisation`).

  Args:
    params: the parameters the landscape is drawn around.
    key: the directions' randomness.
    count: how many directions.
    normalisation: as in `filter_normalised`.

  Returns:
    The directions, trees like `params`.
  """
  leaves, tree = jax.tree_util.tree_flatten(params)
  directions = []
  for k in jax.random.split(key, count):
    keys = jax.random.split(k, len(leaves))
    noise = [jax.random.normal(kk, np.shape(x), jnp.float32) for kk, x in zip(keys, leaves)]
    directions.append(filter_normalised(jax.tree_util.tree_unflatten(tree, noise), params,
                                        normalisation))
  return directions


def grid(loss: Callable[[Any], jax.Array], params: Any, directions: Sequence[Any],
         coordinates: np.ndarray, chunk: int = 8, host_loop: bool = False,
         on_points: Optional[Callable[[int], Any]] = None) -> np.ndarray:
  """loss(params + sum_i c_i d_i) at every row c of `coordinates` (P, len(directions)),
  the points evaluated `chunk` at a time under `vmap`, one call of one compiled
  program per chunk (the last one padded with the grid's last point); or with
  `host_loop` one call per point, for models whose convolutions XLA:CPU runs
  slower under `vmap` over their kernels (the quick-start ResNet's 121 points:
  7.9 s against 14.9 s). Each call is waited for: programs in flight at once can
  deadlock XLA:CPU's collectives when the batches are split over several devices,
  and between calls a caller can report progress (`on_points`).

  Args:
    loss: params -> a scalar.
    params: the centre of the grid.
    directions: trees like `params`.
    coordinates: (P, len(directions)) steps along the directions.
    chunk: points evaluated together.
    host_loop: one program call per point, from Python.
    on_points: called with the number of points each call evaluated.

  Returns:
    The (P,) losses.
  """
  def at(c, params, directions):
    moved = jax.tree_util.tree_map(
        lambda p, *ds: p + sum(ci * d for ci, d in zip(c, ds)).astype(p.dtype),
        params, *directions)
    return loss(moved)
  directions = list(directions)
  coordinates = np.asarray(coordinates, np.float32)
  size = 1 if host_loop else min(chunk, len(coordinates))
  evaluate = jax.jit(at) if host_loop else jax.jit(jax.vmap(at, in_axes=(0, None, None)))
  padded = np.concatenate([coordinates, np.repeat(coordinates[-1:], -len(coordinates) % size,
                                                  axis=0)])
  losses = []
  for start in range(0, len(coordinates), size):
    points = padded[start:start + size]
    losses.append(np.asarray(evaluate(points[0] if host_loop else points, params,
                                      directions)).reshape(-1))
    if on_points is not None:
      on_points(min(size, len(coordinates) - start))
  return np.concatenate(losses)[:len(coordinates)]


def hessian_directions(matvec: Callable[..., jax.Array], params: Any, num_steps: int,
                       operands: Sequence = (), count: int = 2, key: jax.Array = None,
                       host_loop: bool = False) -> list:
  """The Ritz vectors of the `count` largest eigenvalues of the operator
  `matvec(v, *operands)` on flat vectors of `params`' size (`curvature.flat_hvp`), from
  `num_steps` Lanczos steps, as unit-norm trees like `params`.

  Args:
    matvec: the operator, (v, *operands) -> H v.
    params: the parameter tree the flat vectors unravel into.
    num_steps: the Lanczos steps.
    operands: the arrays `matvec` takes after the vector.
    count: how many eigenvectors.
    key: the start vector's randomness (PRNGKey(0) if None).
    host_loop: as in `lanczos.lanczos_tridiag`.

  Returns:
    The eigenvectors, largest eigenvalue first.
  """
  flat, unravel = ravel_pytree(params)
  key = jax.random.PRNGKey(0) if key is None else key
  alphas, betas, basis = lanczos.lanczos_tridiag(
      matvec, jax.random.normal(key, flat.shape, jnp.float32), num_steps, operands=operands,
      host_loop=host_loop)
  values, vectors = lanczos.tridiag_eigh(alphas, betas)
  top = np.argsort(values)[::-1][:count]
  ritz = np.asarray(basis, np.float64).T @ vectors[:, top]
  return [unravel(jnp.asarray(v / np.linalg.norm(v), jnp.float32)) for v in ritz.T]
