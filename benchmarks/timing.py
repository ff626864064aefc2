"""Timing helpers shared by the benchmarks: wall time, FLOP counts, matmul rate,
program memory, the project's train step ready to time."""
import math
import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import models, training


def seconds_per_call(fn, *args, repeats: int) -> float:
  """Median wall time of `fn(*args)` after one warm-up (compile) call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def matmul_flops(fn, *args) -> float:
  """2 x the multiply-adds of every matmul and convolution in `fn`'s program.

  Read off the jaxpr, so it counts what the model asks for whichever library
  runs it (XLA's `cost_analysis()` on GPU leaves cuBLAS and cuDNN calls out).
  Arguments may be `jax.ShapeDtypeStruct`s: nothing is computed.
  """
  return 2. * _multiply_adds(jax.make_jaxpr(fn)(*args).jaxpr)


def _multiply_adds(jaxpr) -> float:
  total = 0.
  for eqn in jaxpr.eqns:
    out = eqn.outvars[0].aval.shape
    if eqn.primitive.name == 'dot_general':
      (contract, _), _ = eqn.params['dimension_numbers']
      lhs = eqn.invars[0].aval.shape
      total += math.prod(out) * math.prod(lhs[i] for i in contract)
    elif eqn.primitive.name == 'conv_general_dilated':
      kernel = eqn.invars[1].aval.shape  # its input-feature axis is already per group
      out_features = kernel[eqn.params['dimension_numbers'].rhs_spec[0]]
      total += math.prod(out) * math.prod(kernel) / out_features
    repeats = eqn.params.get('length', 1)  # a scan runs its body `length` times
    for sub in _subjaxprs(eqn.params.values()):
      total += repeats * _multiply_adds(sub)
  return total


def _subjaxprs(values):
  for value in values:
    if isinstance(value, (tuple, list)):
      yield from _subjaxprs(value)
    elif isinstance(value, jax.extend.core.ClosedJaxpr):
      yield value.jaxpr
    elif isinstance(value, jax.extend.core.Jaxpr):
      yield value


def program_bytes(compiled) -> int:
  """Device memory XLA plans for a compiled program: arguments, outputs and
  temporaries, less what outputs reuse of donated arguments."""
  m = compiled.memory_analysis()
  return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
          - m.alias_size_in_bytes)


def matmul_rate(dtype, n: int, repeats: int) -> float:
  a = jnp.asarray(np.random.RandomState(0).randn(n, n), dtype)
  matmul = jax.jit(jnp.matmul)
  return 2 * n**3 / seconds_per_call(matmul, a, a, repeats=repeats)


def backend_defaults(batch: int, matmul_size: int):
  """(batch, matmul size) where not given: 32 and 4096 on CPU, 256 and 8192 on accelerators."""
  on_cpu = jax.default_backend() == 'cpu'
  return batch or (32 if on_cpu else 256), matmul_size or (4096 if on_cpu else 8192)


def matmul_rates(dtypes, size: int, repeats: int) -> dict:
  """FLOP/s of a size x size matmul in each dtype, printed as measured."""
  rates = {dt: matmul_rate(dt, size, repeats) for dt in dtypes}
  for dt, rate in rates.items():
    print(f'matmul {size}^2 {dt:>8}: {rate / 1e12:8.2f} TFLOP/s')
  return rates


def train_step_and_batches(config: ml_collections.ConfigDict, num_classes: int,
                           num_batches: int = 1):
  """The train command's compiled step (state, batch) over all devices, its
  state and random batches.

  The state is replicated and the batches sharded as in the train loop, so
  every call after the first reuses one compilation; images are random, as
  all-zero ones run faster.
  """
  setup = training.build_steps(config, num_classes, total_steps=1000)
  rng = np.random.RandomState(0)
  shape = (config.batch_size, config.image_size, config.image_size, 3)
  batches = [setup.shard_batch({'image': rng.uniform(-1, 1, shape).astype(np.float32),
                                'label': np.eye(num_classes, dtype=np.float32)[
                                    rng.randint(0, num_classes, config.batch_size)]})
             for _ in range(num_batches)]
  return setup.train_step, setup.state, batches


def architecture(name: str, dtype: str, remat: str, attention: str) -> dict:
  """Model overrides: the dtype, and remat and attention where the family has them."""
  fields = models.get_config(name)
  overrides = {'dtype': dtype}
  if 'remat' in fields:
    overrides.update(remat=remat, attention_impl=attention)
  return overrides


def forward_flops(name: str, size: int) -> float:
  """Matmul FLOPs of one image's forward pass (attention counted as explicit products)."""
  fields = models.get_config(name)
  model = models.get_model(name, 1000, **(
      {'attention_impl': 'explicit'} if 'attention_impl' in fields else {}))
  images = jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)
  return matmul_flops(model.apply, variables, images)


def peak_memory() -> str:
  stats = jax.devices()[0].memory_stats() or {}
  return f'{stats["peak_bytes_in_use"] / 2**30:.1f}' if 'peak_bytes_in_use' in stats else '-'
