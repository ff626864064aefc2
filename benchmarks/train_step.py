"""Training-step throughput of zoo models as a fraction of this machine's matmul rate.

    python benchmarks/train_step.py [--models ViT-S_16,BiT-M-R50x1] [--batch 32]

Times the project's own train step (`vit_jax.steps.build`: forward,
backward, Adam update) at 224 px in float32 and bfloat16 compute, after a
float32 and bfloat16 matmul in the same run. The CPU is split into devices
as the train command splits it (one per core, `--cpu-devices` to choose) and
the images are random (all-zero images run faster). Model FLOPs are XLA's
count for the float32 step over all devices. Targets: float32 >= 0.6 of the
float32 matmul rate; bfloat16 faster than float32.
"""
import argparse

import jax
import ml_collections

from configs import common
from timing import matmul_rate, seconds_per_call, train_step_and_batches, xla_flops
from vit_jax import train


def step_and_inputs(name: str, dtype: str, batch: int, size: int):
  config = common.base_config()
  config.update(model_name=name, image_size=size, batch_size=batch, optimizer='adam', lr=1e-3,
                weight_decay=1e-4)
  config.model = ml_collections.ConfigDict({'dtype': dtype})
  step, state, (images,) = train_step_and_batches(config, 1000)
  return step, state, images


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='ViT-S_16,BiT-M-R50x1')
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--image-size', type=int, default=224)
  parser.add_argument('--matmul-size', type=int, default=4096)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--cpu-devices', type=int, default=0,
                      help='devices to split a CPU host into; 0: one per core')
  args = parser.parse_args()
  train.split_cpu_into_devices(
      ml_collections.ConfigDict(dict(batch_size=args.batch, accum_steps=1,
                                     eval_batch_size=args.batch)), args.cpu_devices)

  rates = {dt: matmul_rate(dt, args.matmul_size, args.repeats) for dt in ('float32', 'bfloat16')}
  for dt, rate in rates.items():
    print(f'matmul {args.matmul_size}^2 {dt:>8}: {rate / 1e9:7.1f} GFLOP/s')
  print(f'{jax.device_count()} devices')
  print(f'{"model":<14}{"dtype":>10}{"img/s":>9}{"GFLOP/s":>9}{"/ f32 mm":>10}{"vs f32":>8}')
  for name in args.models.split(','):
    f32_time = flops = None
    for dt in ('float32', 'bfloat16'):
      step, state, batch = step_and_inputs(name, dt, args.batch, args.image_size)
      if flops is None:
        flops = xla_flops(step, state, batch) * jax.device_count()  # XLA counts per device
      # The step donates its state, so each call gets the previous call's output.
      holder = {'state': state}
      def run(batch):
        holder['state'], metrics = step(holder['state'], batch)
        return metrics
      elapsed = seconds_per_call(run, batch, repeats=args.repeats)
      f32_time = f32_time or elapsed
      rate = flops / elapsed
      print(f'{name:<14}{dt:>10}{args.batch / elapsed:9.1f}{rate / 1e9:9.1f}'
            f'{rate / rates["float32"]:10.2f}{f32_time / elapsed:8.2f}')


if __name__ == '__main__':
  main()
