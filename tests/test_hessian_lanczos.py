"""Hessian-vector products and Lanczos spectra against dense references."""
import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, PartitionSpec as P

from analysis.measures import curvature, lanczos
from analysis.runtime import features, objectives
from helpers import assert_close_at_scale, tiny_bit
from vit_jax.training import steps

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


class TinyNet(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    x = x.reshape(x.shape[0], -1)
    return nn.Dense(3)(jnp.tanh(nn.Dense(5)(x)))


def tiny_problem(dtype, num_batches=2, batch=6, **loss_options):
  rng = np.random.RandomState(0)
  model = TinyNet()
  batches = curvature.stack_batches(
      [(jnp.asarray(rng.randn(batch, 2, 2, 1), dtype),
        jnp.asarray(np.eye(3)[rng.randint(0, 3, batch)], dtype)) for _ in range(num_batches)])
  params = model.init(jax.random.PRNGKey(0), batches[0][0])['params']
  params = jax.tree_util.tree_map(lambda p: p.astype(dtype) + 0.3, params)
  return objectives.training_loss(model, **{'l2': 0.01, **loss_options}), params, batches


def test_scanned_loss_equals_the_loss_written_out():
  with jax.enable_x64(True):
    model = TinyNet()
    loss, params, (images, labels) = tiny_problem(jnp.float64, num_batches=3, l2=0.5,
                                                  label_smoothing=0.1)
    smoothed = labels * 0.9 + 0.1 / 3
    per_batch = []
    for x, y in zip(images, smoothed):
      logits = model.apply({'params': params}, x)
      log_p = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
      per_batch.append(-jnp.mean(jnp.sum(y * log_p, axis=-1)))
    penalty = sum(jnp.sum(p ** 2) for p in jax.tree_util.tree_leaves(params))
    expected = np.mean(per_batch) + 0.25 * penalty
    np.testing.assert_allclose(loss(params, (images, labels)), expected, rtol=1e-12)
    unrolled = objectives.training_loss(model, l2=0.5, label_smoothing=0.1, unroll=True)
    np.testing.assert_allclose(unrolled(params, (images, labels)), expected, rtol=1e-12)


def test_l2_mask_penalises_only_the_marked_parameters():
  with jax.enable_x64(True):
    model = TinyNet()
    loss, params, batches = tiny_problem(jnp.float64, l2=0.)
    masked = objectives.training_loss(model, l2=2., l2_mask=steps.kernel_mask)
    kernels = sum(jnp.sum(p['kernel'] ** 2) for p in params.values())
    np.testing.assert_allclose(masked(params, batches) - loss(params, batches), kernels,
                               rtol=1e-12)


def test_hvp_sharded_over_eight_devices_equals_one_device():
  assert jax.device_count() == 8
  loss, params, batches = tiny_problem(jnp.float32, num_batches=3, batch=16)
  matvec, dim = curvature.flat_hvp(loss, params)
  sharded = tuple(features.shard_examples(x, axis=1) for x in batches)
  assert len(sharded[0].sharding.device_set) == 8
  one = jax.device_put(batches, jax.devices()[0])
  v = jnp.asarray(np.random.RandomState(3).randn(dim), jnp.float32)
  run = jax.jit(matvec)
  # float32; only the order of the cross-device sums differs.
  np.testing.assert_allclose(run(v, params, sharded), run(v, params, one), rtol=1e-5, atol=1e-6)
  top = [lanczos.extreme_eigenvalues(matvec, dim, 12, k=3, operands=(params, b))['top']
         for b in (sharded, one)]
  np.testing.assert_allclose(top[0], top[1], rtol=1e-4)


@pytest.mark.parametrize('dtype,rtol', [(jnp.float32, 2e-4), (jnp.float64, 1e-10)])
def test_hvp_equals_dense_hessian_and_finite_differences(dtype, rtol):
  with jax.enable_x64(dtype == jnp.float64):
    loss, params, batches = tiny_problem(dtype)
    flat, unravel = ravel_pytree(params)
    flat_loss = lambda f: loss(unravel(f), batches)
    dense = jax.hessian(flat_loss)(flat)
    hvp, dim = curvature.flat_hvp(loss, params)
    matvec = lambda v: hvp(v, params, batches)
    v = jnp.asarray(np.random.RandomState(1).randn(dim), dtype)
    chex.assert_trees_all_close(matvec(v), dense @ v, rtol=rtol, atol=rtol)
    if dtype == jnp.float64:
      # Central differences of the gradient: O(h^2) truncation error.
      h = 1e-5
      grad = jax.grad(flat_loss)
      finite = (grad(flat + h * v) - grad(flat - h * v)) / (2 * h)
      chex.assert_trees_all_close(matvec(v), finite, rtol=1e-6, atol=1e-8)
    u = jnp.asarray(np.random.RandomState(2).randn(dim), dtype)
    np.testing.assert_allclose(jnp.vdot(u, matvec(v)), jnp.vdot(matvec(u), v), rtol=rtol)


def random_symmetric(n, seed=0):
  a = np.random.RandomState(seed).randn(n, n)
  return (a + a.T) / 2


def test_full_lanczos_recovers_eigh():
  with jax.enable_x64(True):
    a = random_symmetric(30)
    alphas, betas, vectors = lanczos.lanczos_tridiag(lambda v: a @ v, jnp.ones(30), 30)
    ritz, _ = lanczos.tridiag_eigh(alphas, betas)
    np.testing.assert_allclose(ritz, np.linalg.eigvalsh(a), atol=1e-8)
    np.testing.assert_allclose(vectors @ vectors.T, np.eye(30), atol=1e-10)


def test_lanczos_vectors_stay_orthonormal_in_float32():
  diagonal = jnp.asarray(np.concatenate([np.linspace(0, 1, 500), [5., 10., 20.]]), jnp.float32)
  _, _, vectors = lanczos.lanczos_tridiag(lambda v: diagonal * v, jnp.ones(503), 80)
  np.testing.assert_allclose(vectors @ vectors.T, np.eye(80), atol=1e-5)


def test_extreme_eigenvalues_converge_in_few_steps():
  # Bulk in [-1, 1] and separated outliers: 3 large, 2 negative.
  bulk = np.linspace(-1, 1, 1000)
  values = np.concatenate([bulk, [50., 30., 20., -10., -5.]])
  diagonal = jnp.asarray(values, jnp.float32)
  result = lanczos.extreme_eigenvalues(lambda v: diagonal * v, len(values), num_steps=40, k=3)
  np.testing.assert_allclose(result['top'], [50., 30., 20.], rtol=1e-4)
  np.testing.assert_allclose(result['most_negative'][:2], [-10., -5.], rtol=1e-4)


def test_one_large_outlier_gives_one_ritz_value_not_ghosts():
  values = np.concatenate([np.random.RandomState(0).uniform(0, 1, 300), [100.]])
  diagonal = jnp.asarray(values, jnp.float32)
  ritz = lanczos.extreme_eigenvalues(lambda v: diagonal * v, 301, num_steps=120)['ritz']
  assert np.sum(np.abs(ritz - 100.) < 1.) == 1


def test_breakdown_restarts_with_an_orthogonal_vector():
  # Start in the span of 3 eigenvectors: the Krylov space is exhausted after 3 steps.
  with jax.enable_x64(True):
    diagonal = jnp.arange(1., 9.)
    start = jnp.zeros(8).at[:3].set(1.)
    alphas, betas, vectors = lanczos.lanczos_tridiag(lambda v: diagonal * v, start, 8)
    assert abs(float(betas[2])) == 0.
    np.testing.assert_allclose(vectors @ vectors.T, np.eye(8), atol=1e-10)
    ritz, _ = lanczos.tridiag_eigh(alphas, betas)
    np.testing.assert_allclose(ritz, np.arange(1., 9.), atol=1e-8)


def test_quadrature_weights_and_moments():
  """With a Rademacher start on a diagonal matrix, m Lanczos steps integrate
  x^k exactly for k <= 2m - 1, and v^T H^k v / n = tr(H^k) / n."""
  with jax.enable_x64(True):
    values = np.random.RandomState(0).uniform(-1, 3, 200)
    nodes, weights = lanczos.slq(lambda v: jnp.asarray(values) * v, 200, num_steps=6,
                                 num_probes=3, dtype=jnp.float64)
    np.testing.assert_allclose(weights.sum(1), 1., rtol=1e-12)
    for k in range(1, 12):
      np.testing.assert_allclose(np.sum(weights * nodes**k, axis=1),
                                 np.full(3, np.mean(values**k)), rtol=1e-8)


def test_density_matches_the_smoothed_true_density():
  values = np.concatenate([np.random.RandomState(0).normal(0, 1, 400),
                           np.random.RandomState(1).normal(6, 0.5, 100)])
  matrix = jnp.asarray(values, jnp.float32)
  nodes, weights = lanczos.slq(lambda v: matrix * v, 500, num_steps=60, num_probes=8)
  grid = np.linspace(-5, 9, 300)
  sigma = 0.5
  estimate = lanczos.density(nodes, weights, grid, sigma)
  truth = lanczos.density(values[None], np.full((1, 500), 1 / 500), grid, sigma)
  np.testing.assert_allclose(np.trapezoid(estimate, grid), 1., atol=1e-3)
  # Rademacher probes: the weight on each eigenvalue is 1/n exactly for a
  # diagonal matrix, so only the quadrature error remains.
  assert np.max(np.abs(estimate - truth)) < 0.05 * truth.max()
  np.testing.assert_allclose(lanczos.negative_fraction(nodes, weights), np.mean(values < 0),
                             atol=0.05)


def pyhessian_density(eigenvalues, weights, num_bins=10000, sigma_squared=1e-5,
                      overhead=0.01):
  """PyHessian's `density_generate` (`density_plot.py`, lines 40-66): Gaussians of
  variance sigma_squared * max(1, lambda_max - lambda_min) on num_bins points from
  lambda_min to lambda_max (each the mean over runs of the runs' extremes, widened by
  `overhead`), averaged over runs and normalised by the sum over the grid."""
  eigenvalues, weights = np.array(eigenvalues), np.array(weights)
  lambda_max = np.mean(np.max(eigenvalues, axis=1), axis=0) + overhead
  lambda_min = np.mean(np.min(eigenvalues, axis=1), axis=0) - overhead
  grids = np.linspace(lambda_min, lambda_max, num=num_bins)
  sigma = sigma_squared * max(1, (lambda_max - lambda_min))
  out = np.zeros((eigenvalues.shape[0], num_bins))
  for i in range(eigenvalues.shape[0]):
    for j in range(num_bins):
      out[i, j] = np.sum(np.exp(-(grids[j] - eigenvalues[i]) ** 2 / (2. * sigma))
                         / np.sqrt(2 * np.pi * sigma) * weights[i])
  density = out.mean(0)
  return density / (np.sum(density) * (grids[1] - grids[0])), grids, sigma


@pytest.mark.parametrize('scale', [0.3, 50.])
def test_the_density_is_drawn_with_pyhessians_width(scale):
  """A span under 1 and one of 100: the variance, and the density on PyHessian's grid."""
  rng = np.random.RandomState(3)
  nodes = np.sort(rng.uniform(-scale, scale, (2, 30)), axis=1)
  weights = rng.dirichlet(np.ones(30), 2)
  theirs, grid, variance = pyhessian_density(nodes, weights, num_bins=2000)
  sigma = lanczos.density_sigma(nodes)
  assert sigma ** 2 == pytest.approx(variance, rel=1e-12)
  ours = lanczos.density(nodes, weights, grid, sigma)
  # Ours integrates to 1 over the real line; theirs is normalised over their grid,
  # which ends at the mean of the runs' extremes and so cuts off some mass.
  ours = ours / (np.sum(ours) * (grid[1] - grid[0]))
  np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12 * theirs.max())
  assert lanczos.density_sigma(nodes, 'wide') == pytest.approx(np.abs(nodes).max() / 100)
  dense = lanczos.density_grid(-scale, scale, sigma)
  assert np.diff(dense)[0] <= sigma / 2


def test_the_joint_spectra_keep_every_minibatchs_top_k(monkeypatch, tmp_path):
  """Park & Kim's max eigenvalue spectra histogram the top-k of each minibatch,
  its negative members too."""
  from analysis.reporting import plots
  from analysis.tools import TOOLS
  drawn = {}
  monkeypatch.setattr(plots, 'histogram',
                      lambda values, path, *a, **k: drawn.update(values) or path)
  monkeypatch.setattr(plots, 'curves', lambda series, path, *a, **k: path)
  tops = {'vit': [[5., -3., 1.], [4., 2., -1.]], 'resnet': [[9., 8., 7.], [-9.5, 6., 2.]]}
  result = {label: {'top_per_minibatch': top, 'slq_nodes': [[-1., 2.]],
                    'slq_weights': [[0.5, 0.5]], 'sigma': 0.1} for label, top in tops.items()}
  TOOLS['hessian'].joint(result, {}, str(tmp_path))
  for label, top in tops.items():
    np.testing.assert_array_equal(drawn[label], np.ravel(top))


def test_hessian_top_and_bottom_eigenvalues_match_eigh():
  loss, params, batches = tiny_problem(jnp.float32)
  flat, unravel = ravel_pytree(params)
  exact = np.linalg.eigvalsh(np.asarray(
      jax.hessian(lambda f: loss(unravel(f), batches))(flat), np.float64))
  matvec, dim = curvature.flat_hvp(loss, params)
  result = lanczos.extreme_eigenvalues(matvec, dim, num_steps=dim, k=3,
                                       operands=(params, batches))
  by_magnitude = exact[np.argsort(-np.abs(exact))]
  np.testing.assert_allclose(result['top'], by_magnitude[:3], rtol=1e-4)
  np.testing.assert_allclose(result['most_negative'], exact[:3], rtol=1e-4, atol=1e-6)


def test_hutchinson_over_hadamard_probes_is_the_exact_trace_block_by_block():
  """The rows of a 64x64 Hadamard matrix cut to the 43 parameters are sign vectors
  whose mean outer product is exactly I: Hutchinson's mean over them is the trace of
  the dense Hessian (`jax.hessian`), and of each block's diagonal block."""
  loss, params, batches = tiny_problem(jnp.float32)
  flat, unravel = ravel_pytree(params)
  dense = np.asarray(jax.hessian(lambda f: loss(unravel(f), batches))(flat), np.float64)
  matvec, dim = curvature.flat_hvp(loss, params)
  ids, names = curvature.parameter_blocks(params, depth=1)
  # Dense_0 is the 5 -> 3 layer (constructed first): 18 parameters, then 25.
  assert names == ['Dense_0', 'Dense_1'] and list(np.asarray(ids)) == [0] * 18 + [1] * 25
  probes = jnp.asarray(scipy.linalg.hadamard(64)[:, :dim], jnp.float32)
  sums = lanczos.hutchinson(matvec, probes, (params, batches), ids, len(names))
  chex.assert_shape(sums, (64, 2))
  diagonal = np.diag(dense)
  scale = np.abs(diagonal).sum()  # float32 products summed over 43 coordinates
  np.testing.assert_allclose(sums.mean(0), [diagonal[:18].sum(), diagonal[18:].sum()],
                             atol=1e-5 * scale)
  np.testing.assert_allclose(sums.sum(1).mean(), np.trace(dense), atol=1e-5 * scale)
  # The L2 term's share (l2 = 0.01 on all 43 parameters) is exact; the rest is the
  # trace of the loss without it.
  without_l2, _, _ = tiny_problem(jnp.float32, l2=0.)
  data = np.trace(np.asarray(jax.hessian(lambda f: without_l2(unravel(f), batches))(flat)))
  l2 = curvature.l2_traces(params, 0.01, depth=1)
  assert l2 == pytest.approx({'Dense_0': 0.18, 'Dense_1': 0.25})
  np.testing.assert_allclose(np.trace(dense) - sum(l2.values()), data, rtol=1e-5)
  kernels = curvature.l2_traces(params, 0.01, steps.kernel_mask, depth=1)
  assert kernels == pytest.approx({'Dense_0': 0.15, 'Dense_1': 0.20})


def test_a_blocks_top_eigenvalue_is_that_of_its_diagonal_block():
  """Lanczos on `block_matvec` with as many steps as the block has parameters
  recovers the largest-magnitude eigenvalue of the dense Hessian's diagonal block."""
  loss, params, batches = tiny_problem(jnp.float32)
  flat, unravel = ravel_pytree(params)
  dense = np.asarray(jax.hessian(lambda f: loss(unravel(f), batches))(flat), np.float64)
  matvec, dim = curvature.flat_hvp(loss, params)
  ids, names = curvature.parameter_blocks(params, depth=1)
  assert curvature.block_sizes(params, depth=1) == {'Dense_0': 18, 'Dense_1': 25}
  for b, size in enumerate((18, 25)):
    inside = np.asarray(ids) == b
    exact = np.linalg.eigvalsh(dense[np.ix_(inside, inside)])
    top = lanczos.extreme_eigenvalues(
        curvature.block_matvec(matvec), dim, size, 1,
        operands=(jnp.asarray(inside, jnp.float32), params, batches))['top'][0]
    np.testing.assert_allclose(top, exact[np.argmax(np.abs(exact))], rtol=1e-4)


def test_host_loop_gives_the_same_tridiagonal_matrix():
  a = jnp.asarray(random_symmetric(40), jnp.float32)
  start = jnp.ones(40)
  compiled = lanczos.lanczos_tridiag(lambda v, m: m @ v, start, 12, operands=(a,))
  hosted = lanczos.lanczos_tridiag(lambda v, m: m @ v, start, 12, operands=(a,), host_loop=True)
  chex.assert_trees_all_close(compiled, hosted, rtol=1e-5, atol=1e-5)
  nodes, weights = lanczos.slq(lambda v, m: m @ v, 40, 8, 2, operands=(a,), host_loop=True)
  chex.assert_trees_all_close(weights.sum(1), np.ones(2), rtol=1e-5)


def test_resnet_hvp_unrolled_equals_the_scan_and_jax_hessian():
  """The ResNet path on CPU (batches as a Python loop, `sum_over_batches`) gives the
  scanned program's product and the dense Hessian's, on a tiny BiT in float64. The
  dense Hessian is taken over the head's kernel and parts of the 7x7 root and a
  3x3 convolution (H_SS v_S for a vector supported on them), as the whole one
  would not fit in memory. In float32 the two programs' rounding, divided by the
  standard deviations of weight standardisation and GroupNorm, reaches 2e-4 of the
  product's largest entry on some CPUs: float64 leaves only the method to compare."""
  with jax.enable_x64(True):
    model = tiny_bit(num_classes=3, num_layers=(1,), width_factor=0.5, dtype='float64')
    rng = np.random.RandomState(0)
    batches = curvature.stack_batches(
        [(jnp.asarray(rng.uniform(-1, 1, (4, 8, 8, 3))),
          jnp.asarray(np.eye(3)[rng.randint(0, 3, 4)])) for _ in range(2)])
    params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64),
                                    model.init(jax.random.PRNGKey(0), batches[0][0])['params'])
    flat, unravel = ravel_pytree(params)
    # Each leaf's positions in the flat vector, and the entries of the chosen kernels.
    positions = flax.traverse_util.flatten_dict(unravel(jnp.arange(flat.shape[0])), sep='/')
    chosen = {'resnet/head/conv2d/kernel': 96,
              'resnet/root_block/standardized_conv2d/kernel': 75,
              'resnet/block1/unit01/b/standardized_conv2d/kernel': 150}
    where = jnp.concatenate([positions[k].ravel()[:n] for k, n in chosen.items()])
    v_sub = jnp.asarray(rng.randn(where.shape[0]))
    v = jnp.zeros_like(flat).at[where].set(v_sub)
    products = {}
    for unroll in (True, False):
      loss = objectives.training_loss(model, l2=0.01, label_smoothing=0.1, unroll=unroll)
      matvec, _ = curvature.flat_hvp(loss, params, unroll=unroll)
      products[unroll] = jax.jit(matvec)(v, params, batches)
    dense = jax.jit(jax.hessian(lambda sub: loss(unravel(flat.at[where].set(sub)), batches)))(
        flat[where])
    assert products[True].dtype == jnp.float64
    scale = float(jnp.max(jnp.abs(products[False])))
    chex.assert_trees_all_close(products[True], products[False], rtol=1e-9, atol=1e-12 * scale)
    chex.assert_trees_all_close(products[True][where], dense @ v_sub, rtol=1e-7,
                                atol=1e-9 * scale)


def test_lanczos_vectors_split_over_a_mesh_give_the_same_coefficients():
  """1,003 coordinates over 8 devices: vectors padded to 1,008 and split, 126 per
  device, while the operator sees the 1,003; the same tridiagonal matrix."""
  mesh = Mesh(np.array(jax.devices()), ('data',))
  diagonal = jnp.asarray(np.linspace(-1, 3, 1003), jnp.float32)
  start = jax.random.normal(jax.random.PRNGKey(1), (1003,))
  seen = []
  whole = lanczos.lanczos_tridiag(lambda v: diagonal * v, start, 12)
  split = lanczos.lanczos_tridiag(lambda v: diagonal * v, start, 12, host_loop=True, mesh=mesh,
                                  on_step=lambda carry: seen.append(carry[0]))
  basis = seen[-1]
  assert basis.sharding.spec == P(None, ('data',)) and basis.shape == (13, 1008)
  assert {shard.data.shape for shard in basis.addressable_shards} == {(13, 126)}
  np.testing.assert_array_equal(np.asarray(basis)[:, 1003:], 0.)
  np.testing.assert_allclose(split[0], whole[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(split[1], whole[1], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(split[2], whole[2], atol=1e-5)
  result = lanczos.extreme_eigenvalues(lambda v: diagonal * v, 1003, 12, k=2, mesh=mesh)
  np.testing.assert_allclose(
      result['top'], lanczos.extreme_eigenvalues(lambda v: diagonal * v, 1003, 12, k=2)['top'],
      rtol=1e-5)


def tiny_resnet_problem(num_batches=3, dtype=jnp.float32):
  """A tiny BiT's training loss, parameters and batches, in `dtype` (float64 under
  `jax.enable_x64`)."""
  model = tiny_bit(num_classes=3, num_layers=(1,), width_factor=0.5,
                   dtype=jnp.dtype(dtype).name)
  rng = np.random.RandomState(0)
  batches = curvature.stack_batches(
      [(jnp.asarray(rng.uniform(-1, 1, (4, 8, 8, 3)), dtype),
        jnp.asarray(np.eye(3)[rng.randint(0, 3, 4)], dtype)) for _ in range(num_batches)])
  params = jax.tree_util.tree_map(lambda a: a.astype(dtype),
                                  model.init(jax.random.PRNGKey(0), batches[0][0])['params'])
  return objectives.training_loss(model, l2=0.01, label_smoothing=0.1, unroll=True), params, batches


def test_linearised_products_equal_jvp_of_grad_on_any_run_of_the_batches():
  """The host loop's operator linearises each batch once; its products over all the
  batches and over any run of them are jvp of grad's on the same batches. In
  float64: in float32 the two programs' rounding, divided by the standard
  deviations of weight standardisation and GroupNorm, reaches 10% of some entries
  under other XLA:CPU code generation."""
  with jax.enable_x64(True):
    loss, params, batches = tiny_resnet_problem(dtype=jnp.float64)
    matvec, dim, operands, method = curvature.minibatch_hvp(loss, params, batches, unroll=True)
    assert method == 'linearised' and dim == curvature.dimension(params)
    reference, _ = curvature.flat_hvp(loss, params, unroll=True)
    v = jnp.asarray(np.random.RandomState(1).randn(dim))
    for which in (slice(None), slice(0, 1), slice(1, 3)):
      expected = reference(v, params, tuple(x[which] for x in batches))
      product = matvec(v, *operands(which))
      assert product.dtype == jnp.float64
      scale = float(jnp.max(jnp.abs(expected)))
      chex.assert_trees_all_close(product, expected, rtol=1e-9, atol=1e-12 * scale)
    one = curvature.linearisation_bytes(loss, params, batches)
    assert one == sum(x.nbytes for x in jax.tree_util.tree_leaves(operands(slice(0, 1))[0][0]))


def test_linearised_products_compile_with_the_options_they_are_given():
  """The host loop's linearisation and products are compiled with the options the
  caller passes (the tools pass the train step's, `objectives.compiler_options`): an
  option XLA refuses fails them."""
  from vit_jax import cpu_devices
  loss, params, batches = tiny_resnet_problem(num_batches=1)
  with pytest.raises(Exception, match='xla_cpu_experimental_ynn_fusion_type'):
    curvature.minibatch_hvp(loss, params, batches, unroll=True, compiler_options={
        'xla_cpu_experimental_ynn_fusion_type': 'NOT_A_FUSION_TYPE'})
  assert objectives.compiler_options() == cpu_devices.gradient_compiler_options('cpu')


def test_products_are_jvp_of_grad_where_residuals_would_not_fit_or_batches_scan(monkeypatch):
  loss, params, batches = tiny_resnet_problem(num_batches=2)
  assert curvature.minibatch_hvp(loss, params, batches, unroll=False)[3] == 'jvp of grad'
  # The memory left is fixed: other processes' use moves it between two readings.
  free = 1 << 30
  monkeypatch.setattr(curvature, 'available_memory', lambda: free)
  assert curvature.minibatch_hvp(loss, params, batches, True, keep_free=free)[3] == 'jvp of grad'
  matvec, dim, operands, _ = curvature.minibatch_hvp(loss, params, batches, True, keep_free=free)
  v = jnp.ones(dim)
  np.testing.assert_array_equal(matvec(v, *operands(slice(0, 1))),
                                curvature.flat_hvp(loss, params, True)[0](
                                    v, params, tuple(x[:1] for x in batches)))


@pytest.mark.slow
def test_the_hessian_tools_results_do_not_depend_on_how_products_are_taken(
    subjects, tmp_path, monkeypatch):
  """The tool on the smallest tiny model it drives from the host (a ResNet or a
  hybrid): linearised products, then jvp of grad (residuals too large to keep),
  give the same spectra and traces."""
  from analysis.tools import hessian as hessian_tool
  from helpers import batches
  subject = min((s for s in subjects.values() if curvature.loops_on_host(s.layers.architecture)),
                key=lambda s: curvature.dimension(s.params))
  small = hessian_tool.Options(hessian_batches=1, lanczos_steps=4, density_steps=4,
                               density_probes=1, trace_probes=2, block_steps=2)
  with monkeypatch.context() as patch:
    linearised = hessian_tool.measure(subject, batches, small)
    patch.setattr(curvature, 'linearisation_bytes', lambda *_: curvature.available_memory())
    jvp = hessian_tool.measure(subject, batches, small)
  assert (linearised['hvp'], jvp['hvp']) == ('linearised', 'jvp of grad')
  for key in ('top_per_minibatch', 'slq_nodes', 'slq_weights', 'trace'):
    np.testing.assert_allclose(linearised[key], jvp[key], rtol=1e-3, atol=1e-5, err_msg=key)
  for key in ('block_traces', 'block_top_eigenvalue'):
    np.testing.assert_allclose(list(linearised[key].values()), list(jvp[key].values()),
                               rtol=1e-3, atol=1e-5, err_msg=key)
