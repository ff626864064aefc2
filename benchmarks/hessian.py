"""Cost of Hessian-vector products and Lanczos on a zoo model.

    python benchmarks/hessian.py [--model quickstart_vit] [--image_size 28]
        [--examples 1024] [--batch 256] [--steps 100]

The model is a quick-start recipe's (`quickstart_vit`, `quickstart_resnet`,
`quickstart_alternet`: `configs/<name>.py` at its image size) or any zoo name
(`--model ViT-B_16 --image_size 224`), randomly initialised, 10 classes. Its
training loss over `--examples` random images in batches of `--batch` (one
`lax.scan` over the stacked batches, each batch split over every device)
feeds the HVP; convolutional models on CPU take the analysis's path there (the
batches a Python loop, the Lanczos steps driven from Python: `curvature.sum_over_batches`).
Prints one HVP (jvp of grad) against one gradient on one batch (target <= 3; <= 4
for convolutional models on CPU), HVP images/s over all batches (one batch at a
time, so memory is that of one batch), the product the Hessian tool takes where
the host drives the loop (each batch's gradient linearised once), the compile
time of the Lanczos loop at 20 and 200 steps and with half and all of the
batches (target <= 10 s, independent of both; not for the Python-driven loop),
and the run time of `--steps` steps.
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from analysis.measures import curvature, lanczos
from analysis.runtime import features, objectives
from configs import quickstart_alternet, quickstart_resnet, quickstart_vit
from timing import seconds_per_call
from vit_jax import models

QUICKSTART = {'quickstart_vit': quickstart_vit, 'quickstart_resnet': quickstart_resnet,
              'quickstart_alternet': quickstart_alternet}


def config_and_size(name: str, image_size: int):
  """The model config (architecture fields, 10 classes) and image size of `name`."""
  if name in QUICKSTART:
    recipe = QUICKSTART[name].get_config()
    return models.get_config(recipe.model_name, num_classes=10, **recipe.model), recipe.image_size
  return models.get_config(name, num_classes=10), image_size


def random_batches(count: int, batch: int, size: int):
  rng = np.random.RandomState(0)
  stacked = (rng.uniform(-1, 1, (count, batch, size, size, 3)).astype(np.float32),
             np.eye(10, dtype=np.float32)[rng.randint(0, 10, (count, batch))])
  return tuple(features.shard_examples(x, axis=1) for x in stacked)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='quickstart_vit')
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--examples', type=int, default=1024)
  parser.add_argument('--batch', type=int, default=256)
  parser.add_argument('--steps', type=int, default=100)
  parser.add_argument('--no-compile-study', action='store_true',
                      help='skip the compile times at 20/200 steps and half the batches')
  args = parser.parse_args()
  config, size = config_and_size(args.model, args.image_size)
  model = models.build_model(config)
  # As the Hessian tool runs it: convolutions outside XLA:CPU loop bodies.
  host_loop = curvature.loops_on_host(models.family_of(config).layers(config).architecture)
  count = args.examples // args.batch
  batches = random_batches(count, args.batch, size)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), np.zeros((1, size, size, 3)))['params']
  loss = objectives.training_loss(model, unroll=host_loop)
  matvec, dim = curvature.flat_hvp(loss, params, unroll=host_loop)
  grad = jax.jit(lambda p, b: ravel_pytree(jax.grad(loss)(p, b))[0])
  v = jnp.asarray(np.random.RandomState(1).randn(dim), jnp.float32)
  one = tuple(x[:1] for x in batches)
  grad_s = seconds_per_call(grad, params, one, repeats=3)
  hvp_one_s = seconds_per_call(matvec, v, params, one, repeats=3)
  hvp_s = seconds_per_call(matvec, v, params, batches, repeats=3)
  print(f'{args.model}: {dim:,} parameters, {count * args.batch} examples of {size} px in '
        f'{count} batches of {args.batch}, {jax.device_count()} x {jax.devices()[0].device_kind}')
  print(f'one batch: gradient {grad_s:.3f} s, HVP {hvp_one_s:.3f} s: ratio '
        f'{hvp_one_s / grad_s:.2f} (target <= {4 if host_loop else 3}); all batches: HVP {hvp_s:.3f} s, '
        f'{count * args.batch / hvp_s:.0f} images/s')
  # The Hessian tool's operator: linearised products where the host drives the loop.
  operator, _, operands, method = curvature.minibatch_hvp(
      loss, params, batches, host_loop, compiler_options=objectives.compiler_options())
  if method == 'linearised':
    linear_s = seconds_per_call(operator, v, *operands(slice(0, 1)), repeats=3)
    print(f'one batch, linearised once (the tool\'s product here): {linear_s:.3f} s, '
          f'{linear_s / grad_s:.2f} gradients, {hvp_one_s / linear_s:.2f}x faster than jvp '
          'of grad')

  def compile_seconds(steps: int, ops) -> float:
    run = jax.jit(lambda s, ops: lanczos.lanczos_tridiag(matvec, s, steps, operands=ops))
    start = time.perf_counter()
    run.lower(v, ops).compile()
    return time.perf_counter() - start

  half = tuple(x[:max(count // 2, 1)] for x in batches)
  for steps, ops, what in ((20, (params, batches), 'all batches'),
                           (200, (params, batches), 'all batches'),
                           (20, (params, half), 'half the batches')):
    if not (args.no_compile_study or host_loop):
      print(f'compile of {steps} Lanczos steps, {what}: {compile_seconds(steps, ops):.1f} s '
            '(target <= 10)')

  if host_loop:
    run = lambda s, _: lanczos.lanczos_tridiag(operator, s, args.steps,
                                               operands=operands(slice(None)), host_loop=True)
  else:
    run = jax.jit(lambda s, ops: lanczos.lanczos_tridiag(matvec, s, args.steps, operands=ops))
    start = time.perf_counter()
    run = run.lower(v, (params, batches)).compile()
    print(f'compile of {args.steps} Lanczos steps: {time.perf_counter() - start:.1f} s')
  start = time.perf_counter()
  alphas, betas, _ = jax.block_until_ready(run(v, (params, batches)))
  minutes = (time.perf_counter() - start) / 60
  ritz, _ = lanczos.tridiag_eigh(alphas, betas)
  print(f'{args.steps} Lanczos steps: {minutes:.2f} min'
        f'{" (Python-driven, compiling included)" if host_loop else ", compiled beforehand"}; '
        f'largest Ritz value {ritz[-1]:.4g}, smallest {ritz[0]:.4g}')


if __name__ == '__main__':
  main()
