"""Cost of all-pairs minibatch CKA next to the forward passes that feed it.

    python benchmarks/cka.py [--num_images 10000] [--batch 250] [--image_size 112]
        [--models ViT-Ti_16,ViT-Ti_16]

Two zoo models (by default two 12-block ViT-Ti/16, token and GAP heads,
different seeds; 25 residual-stream layers each, 50 in all; `--models
ViT-B_16,BiT-M-R50x1` for the papers' pair, randomly initialised) stream
`num_images` random images, each batch split over every device. Per batch it
times the two forward passes and the CKA update (Gram matrices of all layers,
one product, float64 sums) separately, and prints images/s of the whole
pipeline. Targets: CKA time at most half the forward time; resident memory flat
from the first tenth of the images to the end.
"""
import argparse
import time

import jax
import numpy as np

from analysis.measures import similarity
from analysis.runtime import features
from vit_jax import models


def resident_mib() -> float:
  with open('/proc/self/status') as f:
    line = next(l for l in f if l.startswith('VmRSS'))
  return int(line.split()[1]) / 1024


def subject(name: str, label: str, seed: int, image_size: int, **overrides) -> features.Subject:
  config = models.get_config(name, num_classes=10, **overrides)
  params = jax.jit(models.build_model(config).init)(
      jax.random.PRNGKey(seed), np.zeros((1, image_size, image_size, 3), np.float32))['params']
  return features.Subject(label, config, params, image_size)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--num_images', type=int, default=10_000)
  parser.add_argument('--batch', type=int, default=250)
  parser.add_argument('--image_size', type=int, default=112)
  parser.add_argument('--models', default='ViT-Ti_16,ViT-Ti_16')
  args = parser.parse_args()
  first, second = args.models.split(',')
  # The default pair differs in its head: a token and a GAP ViT.
  second_overrides = {'classifier': 'gap'} if first == second == 'ViT-Ti_16' else {}
  subjects = [subject(first, f'{first} (1)', 0, args.image_size),
              subject(second, f'{second} (2)', 1, args.image_size, **second_overrides)]
  names = [s.layers.stream for s in subjects]
  print(f'{args.models}: {sum(map(len, names))} layers, {args.num_images} images of '
        f'{args.image_size} px, batch {args.batch}, {jax.device_count()} x '
        f'{jax.devices()[0].device_kind}')
  stream = similarity.MinibatchCKA()
  rng = np.random.RandomState(0)
  forward_s = cka_s = 0.
  num_batches = args.num_images // args.batch
  memory = []
  for step in range(num_batches + 1):  # batch 0 compiles and is not timed
    images = rng.uniform(-1, 1, (args.batch, args.image_size, args.image_size, 3)).astype(
        np.float32)
    start = time.perf_counter()
    reps = jax.block_until_ready(features.layer_representations(subjects, names, images))
    middle = time.perf_counter()
    stream.update(reps)
    end = time.perf_counter()
    if step:
      forward_s += middle - start
      cka_s += end - middle
    if step in (max(num_batches // 10, 1), num_batches):
      memory.append(resident_mib())
  stream.result()
  print(f'forward passes: {forward_s:.1f} s; CKA updates: {cka_s:.1f} s; '
        f'ratio CKA/forward {cka_s / forward_s:.3f} (target <= 0.5); '
        f'{num_batches * args.batch / (forward_s + cka_s):.0f} images/s in all')
  print(f'resident memory after {max(num_batches // 10, 1) * args.batch} images: '
        f'{memory[0]:.0f} MiB; after {num_batches * args.batch}: {memory[1]:.0f} MiB '
        f'(growth {memory[1] - memory[0]:+.0f} MiB)')


if __name__ == '__main__':
  main()
