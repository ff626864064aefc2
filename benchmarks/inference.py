"""Inference throughput of zoo models against this machine's matmul rate.

    python benchmarks/inference.py [--models ViT-B_16,BiT-M-R50x1] [--batch 256]
        [--dtypes float32,bfloat16] [--attention auto]

Everything is measured in one run: first a large matmul of each dtype (the
machine's attainable FLOP/s), then each model's jitted forward pass on random
images. Model FLOPs are analytic (the forward pass's matmuls and convolutions,
read off its program), the same work for every dtype and on every backend.
"""
import argparse

import jax
import numpy as np

from timing import (architecture, backend_defaults, forward_flops, matmul_rates, peak_memory,
                    seconds_per_call)
from vit_jax import models


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='ViT-B_16,BiT-M-R50x1')
  parser.add_argument('--batch', type=int, default=None,
                      help='default 256 on accelerators, 32 on CPU')
  parser.add_argument('--image-size', type=int, default=224)
  parser.add_argument('--dtypes', default='float32,bfloat16')
  parser.add_argument('--attention', default='auto', help='ViT attention implementation')
  parser.add_argument('--matmul-size', type=int, default=None,
                      help='default 8192 on accelerators, 4096 on CPU')
  parser.add_argument('--repeats', type=int, default=5)
  args = parser.parse_args()
  batch, matmul = backend_defaults(args.batch, args.matmul_size)
  dtypes = args.dtypes.split(',')
  print(f'{jax.devices()[0].device_kind}, batch {batch}, {args.image_size} px, '
        f'attention {args.attention}')
  rates = matmul_rates(dtypes, matmul, args.repeats)
  print(f'{"model":<14}{"dtype":>10}{"img/s":>10}{"TFLOP/s":>9}{"/ mm":>7}{"vs first":>9}'
        f'{"peak GiB":>9}')
  images = jax.device_put(np.random.RandomState(0).uniform(
      -1, 1, (batch, args.image_size, args.image_size, 3)).astype(np.float32))
  for name in args.models.split(','):
    flops = forward_flops(name, args.image_size) * batch
    first = None
    for dt in dtypes:
      model = models.get_model(name, 1000, **architecture(name, dt, 'none', args.attention))
      variables = jax.jit(model.init)(jax.random.PRNGKey(0), images[:1])
      forward = jax.jit(model.apply)
      elapsed = seconds_per_call(forward, variables, images, repeats=args.repeats)
      first = first or elapsed
      rate = flops / elapsed
      print(f'{name:<14}{dt:>10}{batch / elapsed:10.1f}{rate / 1e12:9.2f}'
            f'{rate / rates[dt]:7.2f}{first / elapsed:9.2f}{peak_memory():>9}', flush=True)
      del variables


if __name__ == '__main__':
  main()
