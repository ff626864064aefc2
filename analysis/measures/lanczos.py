"""Lanczos tridiagonalisation of a symmetric operator given only as a matrix-vector
product, and the spectral estimates built on it: extreme eigenvalues and the
stochastic Lanczos quadrature (SLQ) density (Ghorbani et al. 2019), and Hutchinson's
trace estimator.

Nothing here knows about models: a Hessian is one closure that feeds `matvec`.
"""
import functools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MatVec = Callable[..., jax.Array]


def _split(x: jax.Array, mesh: Optional[Mesh]) -> jax.Array:
  """`x` (..., n) with its last axis split over `mesh` (left to XLA without one)."""
  if mesh is None:
    return x
  spec = P(*([None] * (x.ndim - 1)), mesh.axis_names)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def padded_size(n: int, mesh: Optional[Mesh]) -> int:
  """n rounded up to a multiple of `mesh`'s device count: the length of a Lanczos
  vector split over it (the operator's n coordinates, then zeros).

  Args:
    n: the operator's dimension.
    mesh: the mesh the vectors are split over, or None.

  Returns:
    The padded length.
  """
  return n if mesh is None else -(-n // mesh.devices.size) * mesh.devices.size


def _orthogonalise(w: jax.Array, basis: jax.Array) -> jax.Array:
  """Two passes of Gram-Schmidt against every row of `basis` (zero rows are inert)."""
  for _ in range(2):
    w = w - basis.T @ (basis @ w)
  return w


def _lanczos_update(i, carry, w: jax.Array, key: jax.Array, size: int, mesh: Optional[Mesh]):
  """The step after the product: w = H basis[i] orthogonalised into basis[i + 1]; the
  first step's product is kept as it came (`first_product`)."""
  basis, alphas, betas, first = carry
  v = basis[i]
  w = _split(jnp.pad(w, (0, v.shape[0] - size)), mesh)
  first = jnp.where(i == 0, w, first)
  alpha = jnp.vdot(w, v)
  w = _orthogonalise(w, basis)  # rows after i are still zero
  beta = jnp.linalg.norm(w)
  tolerance = jnp.finfo(w.dtype).eps ** 0.5
  broke_down = beta < tolerance * jnp.maximum(jnp.abs(alpha), 1.)

  def restart(_):
    fresh = jax.random.normal(jax.random.fold_in(key, i), w.shape, w.dtype)
    fresh = _orthogonalise(jnp.where(jnp.arange(w.shape[0]) < size, fresh, 0.), basis)
    return fresh / jnp.linalg.norm(fresh)

  following = jax.lax.cond(broke_down, restart, lambda w: w / beta, w)
  basis = _split(basis.at[i + 1].set(following), mesh)
  return (basis, alphas.at[i].set(alpha), betas.at[i].set(jnp.where(broke_down, 0., beta)),
          first)


# The host loop's update, compiled once per basis shape; the loop state is donated,
# so the basis is updated in place rather than copied every step.
_jitted_update = jax.jit(_lanczos_update, static_argnames=('size', 'mesh'),
                         donate_argnames=('carry',))


def _lanczos_step(i, carry, matvec: MatVec, key: jax.Array, operands: Sequence, size: int,
                  mesh: Optional[Mesh]):
  w = matvec(carry[0][i, :size], *operands)
  return _lanczos_update(i, carry, w, key, size, mesh)


def lanczos_tridiag(matvec: MatVec, start: jax.Array, num_steps: int,
                    key: jax.Array = None, operands: Sequence = (), host_loop: bool = False,
                    on_step: Optional[Callable[[Any], None]] = None,
                    mesh: Optional[Mesh] = None) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """`num_steps` Lanczos steps from `start`: (alphas (m,), betas (m-1,), vectors (m, n)).

  The operator is v -> matvec(v, *operands); arrays it needs are best passed as
  `operands`, so that under `jit` they are inputs rather than folded constants.

  Every new vector is orthogonalised against all previous ones twice (full
  reorthogonalisation), so the basis stays orthonormal and converged eigenvalues
  are not repeated as ghosts. If the Krylov space is exhausted (beta ~ 0), the
  next vector is a fresh random one orthogonal to the basis and beta is 0, so
  the tridiagonal matrix splits into exact blocks. The steps run in one
  `fori_loop`, so compile time does not depend on `num_steps`. With
  `host_loop`, Python drives the steps instead (same arithmetic): it calls
  `matvec` as it is, so pass a compiled one (`curvature.minibatch_hvp`), then one
  compiled update of the basis. XLA:CPU runs convolutions inside loop bodies
  several times slower, so ResNet Hessians are faster this way on CPU; and one
  operator's program serves every caller, whatever its operands' batches. There
  `on_step` is called with the loop's state after every step (for
  `progress.Progress`).

  With a `mesh` (the one fully sharded parameters live on), every vector of the
  basis is split over its devices, as the parameters are: each device holds
  1/n of the (num_steps + 1) x dim basis. The vectors are padded with zeros to
  `padded_size`; the operator never sees the padding, so the arithmetic is
  that of the unpadded vectors.

  Args:
    matvec: the operator, v -> matvec(v, *operands).
    start: the first vector, (n,) (normalised here).
    num_steps: m, the Lanczos steps.
    key: where a breakdown's fresh vectors come from (PRNGKey(0) if None).
    operands: the arrays `matvec` takes after the vector.
    host_loop: run the steps from Python, one compiled step each.
    on_step: with `host_loop`, called with the loop state after every step.
    mesh: the mesh the basis is split over, or None.

  Returns:
    (alphas (m,), betas (m-1,), the orthonormal basis (m, n)).
  """
  alphas, betas, basis, _ = _run(matvec, start, num_steps, num_steps, key, operands, host_loop,
                                 on_step, mesh)
  return alphas, betas[:-1], basis[:-1, :start.shape[0]]


def _run(matvec: MatVec, start: jax.Array, num_steps, capacity: int, key: Optional[jax.Array],
         operands: Sequence, host_loop: bool, on_step: Optional[Callable[[Any], None]],
         mesh: Optional[Mesh]) -> Tuple[jax.Array, ...]:
  """`lanczos_tridiag`'s loop in a basis of `capacity` + 1 rows, of which the first
  `num_steps` + 1 are filled (a traced count without `host_loop`): (alphas
  (capacity,), betas (capacity,), the basis, the first product H start / |start|),
  zero past `num_steps`."""
  key = jax.random.PRNGKey(0) if key is None else key
  size = start.shape[0]
  basis = jnp.zeros((capacity + 1, padded_size(size, mesh)), start.dtype)
  basis = _split(basis.at[0, :size].set(start / jnp.linalg.norm(start)), mesh)
  carry = (basis, jnp.zeros(capacity, start.dtype), jnp.zeros(capacity, start.dtype),
           jnp.zeros_like(basis[0]))
  if host_loop:
    for i in range(num_steps):
      w = matvec(carry[0][i, :size], *operands)
      carry = _jitted_update(jnp.int32(i), carry, w, key=key, size=size, mesh=mesh)
      if on_step is not None:
        on_step(carry)
    jax.block_until_ready(carry)  # before a caller's next run, which does not depend on it
  else:
    carry = jax.lax.fori_loop(
        0, num_steps, lambda i, c: _lanczos_step(i, c, matvec, key, operands, size, mesh),
        carry)
  basis, alphas, betas, first = carry
  return alphas, betas, basis, first[:size]


def _coefficients(matvec: MatVec, start: jax.Array, num_steps, capacity: int, key: jax.Array,
                  operands: Sequence, host_loop: bool, on_step: Optional[Callable[[Any], None]],
                  mesh: Optional[Mesh]) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """`_run`'s alphas, betas and first product: its basis never leaves the program."""
  alphas, betas, _, first = _run(matvec, start, num_steps, capacity, key, operands, host_loop,
                                 on_step, mesh)
  return alphas, betas, first


# Compiled once per operator and capacity, then reused for any step count up to it and
# any operands of the same shapes (the minibatches of a Hessian, a block's mask).
_compiled_coefficients = jax.jit(_coefficients, static_argnames=(
    'matvec', 'capacity', 'host_loop', 'on_step', 'mesh'))


def run(matvec: MatVec, start: jax.Array, num_steps: int, key: jax.Array = None,
        operands: Sequence = (), host_loop: bool = False,
        on_step: Optional[Callable[[Any], None]] = None, mesh: Optional[Mesh] = None,
        capacity: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray, jax.Array]:
  """`num_steps` Lanczos steps as `lanczos_tridiag` takes them, keeping only the
  tridiagonal matrix and the first product. Compiled (without `host_loop`) for a
  basis of `capacity` steps (at least `num_steps`; `num_steps` if None), so that
  runs of any step count up to it share one program: give the largest step count
  of the runs to come.

  Args:
    matvec: the operator, v -> matvec(v, *operands).
    start: the first vector, (n,).
    num_steps: m, the Lanczos steps.
    key: as in `lanczos_tridiag`.
    operands: as in `lanczos_tridiag`.
    host_loop: as in `lanczos_tridiag`.
    on_step: as in `lanczos_tridiag`.
    mesh: as in `lanczos_tridiag`.
    capacity: the steps the compiled program holds.

  Returns:
    (alphas (m,), betas (m-1,), matvec(start / |start|)).
  """
  capacity = num_steps if capacity is None else capacity
  if num_steps > capacity:
    raise ValueError(f'{num_steps} Lanczos steps do not fit a basis of {capacity}.')
  if host_loop:
    alphas, betas, first = _coefficients(matvec, start, num_steps, capacity, key,
                                         tuple(operands), True, on_step, mesh)
  else:
    alphas, betas, first = _compiled_coefficients(
        matvec=matvec, start=start, num_steps=jnp.int32(num_steps), capacity=capacity, key=key,
        operands=tuple(operands), host_loop=False, on_step=None, mesh=mesh)
  alphas, betas = np.asarray(alphas), np.asarray(betas)
  return alphas[:num_steps], betas[:max(num_steps - 1, 0)], first


def tridiag_eigh(alphas: np.ndarray, betas: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """Eigenvalues (ascending) and eigenvectors of the tridiagonal matrix, in float64.

  Args:
    alphas: its diagonal, (m,).
    betas: its off-diagonal, (m-1,).

  Returns:
    (eigenvalues (m,), eigenvectors as columns (m, m)).
  """
  return scipy.linalg.eigh_tridiagonal(np.asarray(alphas, np.float64),
                                       np.asarray(betas, np.float64))


def quadrature(alphas: np.ndarray, betas: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """Gauss quadrature nodes (Ritz values) and weights (squared first components of
  the eigenvectors) of the start vector's spectral measure; weights sum to 1.

  Args:
    alphas: the Lanczos diagonal, (m,).
    betas: the Lanczos off-diagonal, (m-1,).

  Returns:
    (nodes (m,), weights (m,)).
  """
  nodes, vectors = tridiag_eigh(alphas, betas)
  return nodes, vectors[0] ** 2


def ritz_summary(alphas: np.ndarray, betas: np.ndarray, k: int = 5) -> Dict[str, np.ndarray]:
  """The k largest-magnitude and the k most negative Ritz values, and all of them.

  Args:
    alphas: the Lanczos diagonal, (m,).
    betas: the Lanczos off-diagonal, (m-1,).
    k: how many of each.

  Returns:
    {'top': by decreasing magnitude, 'most_negative': ascending, 'ritz': all, ascending}.
  """
  ritz, _ = tridiag_eigh(alphas, betas)
  by_magnitude = ritz[np.argsort(-np.abs(ritz))]
  return {'top': by_magnitude[:k], 'most_negative': ritz[:k], 'ritz': ritz}


def extreme_eigenvalues(matvec: MatVec, dim: int, num_steps: int, k: int = 5,
                        key: jax.Array = None, dtype: Any = jnp.float32,
                        operands: Sequence = (), host_loop: bool = False,
                        on_step: Optional[Callable[[Any], None]] = None,
                        mesh: Optional[Mesh] = None,
                        capacity: Optional[int] = None) -> Dict[str, np.ndarray]:
  """Ritz estimates of the k largest-magnitude and the k most negative eigenvalues,
  from a random start.

  Args:
    matvec: the operator, v -> matvec(v, *operands).
    dim: its dimension.
    num_steps: the Lanczos steps.
    k: how many eigenvalues of each kind.
    key: the start vector's and the loop's randomness (PRNGKey(0) if None).
    dtype: the vectors' dtype.
    operands: the arrays `matvec` takes after the vector.
    host_loop: as in `lanczos_tridiag`.
    on_step: as in `lanczos_tridiag`.
    mesh: as in `lanczos_tridiag`.
    capacity: as in `run`.

  Returns:
    `ritz_summary` of the run.
  """
  key = jax.random.PRNGKey(0) if key is None else key
  start_key, loop_key = jax.random.split(key)
  alphas, betas, _ = run(matvec, jax.random.normal(start_key, (dim,), dtype), num_steps,
                         loop_key, operands, host_loop, on_step, mesh, capacity)
  return ritz_summary(alphas, betas, k)


def slq(matvec: MatVec, dim: int, num_steps: int, num_probes: int, key: jax.Array = None,
        dtype: Any = jnp.float32, operands: Sequence = (), host_loop: bool = False,
        on_step: Optional[Callable[[Any], None]] = None,
        mesh: Optional[Mesh] = None,
        capacity: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
  """Nodes and weights (num_probes, num_steps) of stochastic Lanczos quadrature,
  one Rademacher probe per row, the probes one after the other through one
  compiled program (with `host_loop`, as in `lanczos_tridiag`, calling
  `on_step`), at the memory of one probe: under `vmap` two probes took 13% longer
  on the quick-start ViT on a 2-core CPU. Each probe's basis is split over `mesh`
  as there.

  Args:
    matvec: the operator, v -> matvec(v, *operands).
    dim: its dimension.
    num_steps: the Lanczos steps per probe.
    num_probes: the Rademacher start vectors.
    key: their randomness (PRNGKey(0) if None).
    dtype: the vectors' dtype.
    operands: the arrays `matvec` takes after the vector.
    host_loop: as in `lanczos_tridiag`.
    on_step: as in `lanczos_tridiag`.
    mesh: as in `lanczos_tridiag`.
    capacity: as in `run`.

  Returns:
    (nodes, weights), each (num_probes, num_steps).
  """
  key = jax.random.PRNGKey(0) if key is None else key
  pairs = []
  for probe_key in jax.random.split(key, num_probes):
    start_key, loop_key = jax.random.split(probe_key)
    alphas, betas, _ = run(matvec, jax.random.rademacher(start_key, (dim,), dtype), num_steps,
                           loop_key, operands, host_loop, on_step, mesh, capacity)
    pairs.append(quadrature(alphas, betas))
  return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def hutchinson(matvec: MatVec, probes: jax.Array, operands: Sequence = (),
               segment_ids: Optional[jax.Array] = None, num_segments: int = 1,
               capacity: Optional[int] = None, host_loop: bool = False,
               mesh: Optional[Mesh] = None) -> np.ndarray:
  """v^T H v for each probe v (rows of `probes`), split into its sums over segments
  of the flat vector (coordinates with `segment_ids` b: a parameter block), shape
  (probes, num_segments). With Rademacher probes (E[v v^T] = I) the mean of column b
  estimates the trace of block b's diagonal block and the mean of the row sums
  tr(H) (Hutchinson's estimator, PyHessian's trace), one product per probe.
  Without `capacity`, `matvec` is called as it is, so pass a compiled one; with
  it, each product is the first of a one-step Lanczos run through the program of
  that capacity (`run`), which the caller's other runs share.

  Args:
    matvec: the operator, v -> matvec(v, *operands).
    probes: the probe vectors as rows, (probes, n).
    operands: the arrays `matvec` takes after the vector.
    segment_ids: each coordinate's segment, (n,) integers (all 0 if None).
    num_segments: the number of segments.
    capacity: as in `run`; None: no Lanczos program.
    host_loop: as in `lanczos_tridiag`, with `capacity`.
    mesh: as in `lanczos_tridiag`, with `capacity`.

  Returns:
    (probes, num_segments) sums of v * Hv per segment.
  """
  ids = jnp.zeros(probes.shape[1], jnp.int32) if segment_ids is None else segment_ids

  def product(v):
    if capacity is None:
      return matvec(v, *operands)
    # The run's first product is H v / |v|.
    return run(matvec, v, 1, None, operands, host_loop, None, mesh, capacity)[2] * \
        jnp.linalg.norm(v)
  return np.stack([np.asarray(_segment_products(v, product(v), ids, num_segments))
                   for v in probes])


@functools.partial(jax.jit, static_argnames='num_segments')
def _segment_products(v: jax.Array, hv: jax.Array, ids: jax.Array, num_segments: int
                      ) -> jax.Array:
  return jax.ops.segment_sum(v * hv, ids, num_segments)


def density(nodes: np.ndarray, weights: np.ndarray, grid: np.ndarray, sigma: float
            ) -> np.ndarray:
  """Spectral density on `grid`: each node a Gaussian of width `sigma` carrying its
  weight, averaged over probes; integrates to 1 when the grid covers the nodes.

  Args:
    nodes: (probes, steps) quadrature nodes (or one probe's, (steps,)).
    weights: their weights, the same shape.
    grid: the points to evaluate at.
    sigma: the Gaussians' standard deviation (`density_sigma`).

  Returns:
    The density at each grid point.
  """
  nodes, weights = np.atleast_2d(nodes), np.atleast_2d(weights)
  gauss = np.exp(-(grid[None, None] - nodes[..., None]) ** 2 / (2 * sigma**2))
  return np.mean(np.sum(weights[..., None] * gauss, axis=1), axis=0) / (sigma * np.sqrt(2 * np.pi))


DENSITY_WIDTHS = ('pyhessian', 'wide')


def density_sigma(nodes: np.ndarray, width: str = 'pyhessian') -> float:
  """The standard deviation of the Gaussians `density` draws each node with.

  'pyhessian' is PyHessian's (`density_plot.py`, `density_generate`, lines 49-53):
  a variance of 1e-5 * max(1, lambda_max - lambda_min), where lambda_max and
  lambda_min are the mean over probes of each probe's largest and smallest node,
  widened by 0.01 each. 'wide' is span / 100 with span the largest |node|, a
  smoother curve that shows a few Ritz values as a continuum (a departure).

  Args:
    nodes: (probes, steps) SLQ nodes.
    width: 'pyhessian' or 'wide'.

  Returns:
    The standard deviation.
  """
  nodes = np.atleast_2d(np.asarray(nodes, np.float64))
  if width == 'pyhessian':
    top, bottom = nodes.max(axis=1).mean() + 0.01, nodes.min(axis=1).mean() - 0.01
    return float(np.sqrt(1e-5 * max(1., top - bottom)))
  if width == 'wide':
    return float(max(np.abs(nodes).max(), 1e-12) / 100)
  raise ValueError(f'Unknown density width {width!r}; use one of {", ".join(DENSITY_WIDTHS)}.')


def density_grid(low: float, high: float, sigma: float, least: int = 400) -> np.ndarray:
  """Points from `low` to `high` close enough (sigma / 2 apart, at least `least` of
  them) that every Gaussian of `density` shows its peak.

  Args:
    low: the first point.
    high: the last point.
    sigma: the Gaussians' standard deviation.
    least: the fewest points.

  Returns:
    The evenly spaced points.
  """
  return np.linspace(low, high, max(least, int(np.ceil((high - low) / (sigma / 2))) + 1))


def negative_fraction(nodes: np.ndarray, weights: np.ndarray, below: float = 0.) -> float:
  """Share of the spectral mass below `-below` (0: all negative mass), averaged over
  probes. Ritz values of a bulk at zero scatter to both signs, so a small positive
  `below` separates clearly negative curvature from that scatter.

  Args:
    nodes: (probes, steps) quadrature nodes.
    weights: their weights.
    below: the margin below 0 that counts as negative.

  Returns:
    The mean over probes of the weight below -below.
  """
  nodes, weights = np.atleast_2d(nodes), np.atleast_2d(weights)
  return float(np.mean(np.sum(np.where(nodes < -below, weights, 0.), axis=1)))
