"""Timing helpers shared by the benchmarks: wall time, XLA FLOP counts, matmul rate,
the project's train step ready to time."""
import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import steps


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


def train_step_and_batches(config: ml_collections.ConfigDict, num_classes: int,
                           num_batches: int = 1):
  """The train command's compiled step over all devices, its state and random batches.

  The state is replicated as in the train loop, so every call after the first
  reuses one compilation; images are random, as all-zero ones run faster.
  """
  setup = steps.build(config, num_classes, total_steps=1000)
  rng = np.random.RandomState(0)
  shape = (config.batch_size, config.image_size, config.image_size, 3)
  batches = [{'image': rng.uniform(-1, 1, shape).astype(np.float32),
              'label': np.eye(num_classes, dtype=np.float32)[
                  rng.randint(0, num_classes, config.batch_size)]}
             for _ in range(num_batches)]
  return setup.train_step, setup.state, batches
