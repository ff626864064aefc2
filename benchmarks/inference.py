"""Inference throughput of zoo models as a fraction of this machine's matmul rate.

    python benchmarks/inference.py [--models ViT-B_16,BiT-M-R50x1] [--batches 8,32]

Everything is measured in one run: first a large matmul in float32 and
bfloat16 (the machine's attainable FLOP/s), then each model. Model FLOPs are
XLA's count for the float32 program, so the bfloat16 figures measure the same
work. Targets: ViT-B/16 float32 >= 0.75 of the float32 matmul rate; bfloat16
>= 1.5x float32.
"""
import argparse

import jax
import jax.numpy as jnp

from timing import matmul_rate, seconds_per_call, xla_flops
from vit_jax import models


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='ViT-B_16,BiT-M-R50x1')
  parser.add_argument('--batches', default='8,32')
  parser.add_argument('--image-size', type=int, default=224)
  parser.add_argument('--matmul-size', type=int, default=4096)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()

  print(f'devices: {jax.devices()}')
  rates = {dt: matmul_rate(dt, args.matmul_size, args.repeats) for dt in ('float32', 'bfloat16')}
  for dt, rate in rates.items():
    print(f'matmul {args.matmul_size}^2 {dt:>8}: {rate / 1e9:7.1f} GFLOP/s')
  print(f'bfloat16 / float32 matmul rate: {rates["bfloat16"] / rates["float32"]:.2f}')

  header = (f'{"model":<14}{"batch":>6}{"dtype":>10}{"img/s":>9}{"GFLOP/s":>9}'
            f'{"/ f32 mm":>10}{"/ own mm":>10}{"vs f32":>8}')
  print(header)
  for name in args.models.split(','):
    for batch in map(int, args.batches.split(',')):
      images = jnp.zeros((batch, args.image_size, args.image_size, 3))
      f32_time = None
      for dt in ('float32', 'bfloat16'):
        model = models.get_model(name, 1000, dtype=dt)
        variables = jax.jit(model.init)(jax.random.PRNGKey(0), images[:1])
        forward = jax.jit(model.apply)
        if dt == 'float32':
          flops = xla_flops(forward, variables, images)
        elapsed = seconds_per_call(forward, variables, images, repeats=args.repeats)
        f32_time = f32_time or elapsed
        rate = flops / elapsed
        print(f'{name:<14}{batch:>6}{dt:>10}{batch / elapsed:9.1f}{rate / 1e9:9.1f}'
              f'{rate / rates["float32"]:10.2f}{rate / rates[dt]:10.2f}'
              f'{f32_time / elapsed:8.2f}')
        del variables


if __name__ == '__main__':
  main()
