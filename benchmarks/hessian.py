"""Cost of Hessian-vector products and Lanczos on the quick-start ViT.

    python benchmarks/hessian.py [--examples 1024] [--batch 256] [--steps 100]

Prints one HVP (jvp of grad) over one gradient on the same batches (target <= 3),
the wall time of `--steps` Lanczos steps over `--examples` examples (target <=
10 minutes on 2 cores), and the compile time of the Lanczos loop at 20 and 200
steps (target: the same).
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from analysis import hessian, lanczos
from configs import quickstart_vit
from timing import seconds_per_call
from vit_jax import models


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--examples', type=int, default=1024)
  parser.add_argument('--batch', type=int, default=256)
  parser.add_argument('--steps', type=int, default=100)
  args = parser.parse_args()
  config = quickstart_vit.get_config()
  model = models.get_model(config.model_name, 10, **config.model)
  size = config.image_size
  rng = np.random.RandomState(0)
  batches = [(jnp.asarray(rng.uniform(-1, 1, (args.batch, size, size, 3)), jnp.float32),
              jax.nn.one_hot(rng.randint(0, 10, args.batch), 10))
             for _ in range(args.examples // args.batch)]
  params = jax.jit(model.init)(jax.random.PRNGKey(0), batches[0][0][:1])['params']
  loss = hessian.training_loss(model)
  matvec, dim = hessian.flat_hvp(loss, params)
  grad = jax.jit(lambda p, b: ravel_pytree(jax.grad(loss)(p, b))[0])
  v = jnp.asarray(rng.randn(dim), jnp.float32)
  grad_s = seconds_per_call(grad, params, batches, repeats=5)
  hvp_s = seconds_per_call(jax.jit(matvec), v, params, batches, repeats=5)
  print(f'{dim:,} parameters, {args.examples} examples in batches of {args.batch}')
  print(f'gradient {grad_s:.3f} s, HVP {hvp_s:.3f} s: ratio {hvp_s / grad_s:.2f} (target <= 3)')

  for steps in (20, 200):
    run = jax.jit(lambda s, ops, steps=steps: lanczos.lanczos_tridiag(matvec, s, steps,
                                                                      operands=ops))
    start = time.perf_counter()
    run.lower(v, (params, batches)).compile()
    print(f'compile of {steps} Lanczos steps: {time.perf_counter() - start:.1f} s')

  run = jax.jit(lambda s, ops: lanczos.lanczos_tridiag(matvec, s, args.steps, operands=ops))
  compiled = run.lower(v, (params, batches)).compile()
  start = time.perf_counter()
  alphas, betas, _ = jax.block_until_ready(compiled(v, (params, batches)))
  minutes = (time.perf_counter() - start) / 60
  ritz, _ = lanczos.tridiag_eigh(alphas, betas)
  print(f'{args.steps} Lanczos steps: {minutes:.2f} min (target <= 10); '
        f'largest Ritz value {ritz[-1]:.4g}, smallest {ritz[0]:.4g}')


if __name__ == '__main__':
  main()
