"""Timing helpers shared by the benchmarks: wall time, XLA FLOP counts, matmul rate."""
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def seconds_per_call(fn, *args, repeats: int) -> float:
  """Median wall time of `fn(*args)` after one warm-up (compile) call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def xla_flops(fn, *args) -> float:
  cost = fn.lower(*args).compile().cost_analysis()
  return float((cost[0] if isinstance(cost, list) else cost)['flops'])


def matmul_rate(dtype, n: int, repeats: int) -> float:
  a = jnp.asarray(np.random.RandomState(0).randn(n, n), dtype)
  matmul = jax.jit(jnp.matmul)
  return 2 * n**3 / seconds_per_call(matmul, a, a, repeats=repeats)
