"""Loss landscapes (Li et al. 2018, as Park & Kim's `ops/loss_landscapes.py` draws
them): a loss evaluated on a grid of points params + a d1 + b d2 along two
directions, random and filter-normalised or the Hessian's top eigenvectors.

Park & Kim normalise a random Gaussian direction per PyTorch tensor over its
first axis: each slice along the other axes is rescaled to the norm the weights
have there (`norm(w, dim=0) / (norm(d, dim=0) + 1e-7) * d`), and every tensor of
fewer than two axes (biases, normalisation scales) gets a zero direction. PyTorch's
first axis of a weight is its output axis, so here a kernel is normalised over its
output axes (the last; the last two of an attention query, key or value kernel,
whose outputs are heads x head size); other arrays of two or more axes (class
token, position embeddings) over their first axis, as in PyTorch.
"""
import re
from typing import Any, Callable, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from analysis import lanczos

EPS = 1e-7  # the authors' guard
# Kernels whose output is (heads, head size): normalised over both.
_TWO_OUTPUT_AXES = re.compile(r'(^|/)(query|key|value)/kernel$')


def output_axes(path: str, ndim: int) -> Tuple[int, ...]:
  """The axes of the array at parameter `path` that PyTorch's first axis holds."""
  if path.endswith('kernel'):
    return (ndim - 2, ndim - 1) if _TWO_OUTPUT_AXES.search(path) else (ndim - 1,)
  return (0,)


def filter_normalised(direction: Any, params: Any) -> Any:
  """`direction` (a tree like `params`) normalised as Park & Kim do (module docstring)."""
  def normalise(path, d, w):
    if np.ndim(w) < 2:
      return jnp.zeros_like(w)
    axes = output_axes('/'.join(path), np.ndim(w))
    w_norm = jnp.sqrt(jnp.sum(jnp.square(w), axis=axes, keepdims=True))
    d_norm = jnp.sqrt(jnp.sum(jnp.square(d), axis=axes, keepdims=True))
    return w_norm / (d_norm + EPS) * d
  flat_d = flax.traverse_util.flatten_dict(flax.core.unfreeze(direction))
  flat_w = flax.traverse_util.flatten_dict(flax.core.unfreeze(params))
  return flax.traverse_util.unflatten_dict(
      {k: normalise(k, flat_d[k], flat_w[k]) for k in flat_w})


def random_directions(params: Any, key: jax.Array, count: int = 2) -> list:
  """`count` Gaussian directions, filter-normalised (`filter_normalised`)."""
  leaves, tree = jax.tree_util.tree_flatten(params)
  directions = []
  for k in jax.random.split(key, count):
    keys = jax.random.split(k, len(leaves))
    noise = [jax.random.normal(kk, np.shape(x), jnp.float32) for kk, x in zip(keys, leaves)]
    directions.append(filter_normalised(jax.tree_util.tree_unflatten(tree, noise), params))
  return directions


def grid(loss: Callable[[Any], jax.Array], params: Any, directions: Sequence[Any],
         coordinates: np.ndarray, chunk: int = 8) -> np.ndarray:
  """loss(params + sum_i c_i d_i) at every row c of `coordinates` (P, len(directions)),
  the points evaluated `chunk` at a time under `vmap` in one compiled program
  (`jax.lax.map`), not one program call per point."""
  directions = list(directions)

  def at(c):
    moved = jax.tree_util.tree_map(
        lambda p, *ds: p + sum(ci * d for ci, d in zip(c, ds)).astype(p.dtype),
        params, *directions)
    return loss(moved)
  coordinates = jnp.asarray(coordinates, jnp.float32)
  return np.asarray(jax.jit(lambda cs: jax.lax.map(at, cs, batch_size=chunk))(coordinates))


def hessian_directions(matvec: Callable[..., jax.Array], params: Any, num_steps: int,
                       operands: Sequence = (), count: int = 2, key: jax.Array = None) -> list:
  """The Ritz vectors of the `count` largest eigenvalues of the operator
  `matvec(v, *operands)` on flat vectors of `params`' size (`hessian.flat_hvp`), from
  `num_steps` Lanczos steps, as unit-norm trees like `params`."""
  flat, unravel = ravel_pytree(params)
  key = jax.random.PRNGKey(0) if key is None else key
  alphas, betas, basis = lanczos.lanczos_tridiag(
      matvec, jax.random.normal(key, flat.shape, jnp.float32), num_steps, operands=operands)
  values, vectors = lanczos.tridiag_eigh(alphas, betas)
  top = np.argsort(values)[::-1][:count]
  ritz = np.asarray(basis, np.float64).T @ vectors[:, top]
  return [unravel(jnp.asarray(v / np.linalg.norm(v), jnp.float32)) for v in ritz.T]
