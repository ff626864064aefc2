"""Training-step throughput of zoo models against this machine's matmul rate.

    python benchmarks/train_step.py [--models ViT-B_16,BiT-M-R50x1] [--batch 256]
        [--dtypes bfloat16,float32] [--remat none|dots|full] [--attention auto]

Times the project's own train step (`vit_jax.training.steps.build`: forward, backward,
Adam update, replicated state, batch sharded over every device) on random
images, after a matmul of each dtype in the same run. Model FLOPs are analytic
(3x the forward pass's matmul and convolution FLOPs, read off its program), so
the figures hold on GPUs too, where XLA's own count leaves library calls out.
Prints the device, images/s, achieved FLOP/s over the same dtype's matmul rate,
the memory XLA plans for the step, and the device's peak memory where it
reports one. A CPU host is split into devices as the train command splits it.
"""
import argparse

import jax
import ml_collections

from configs import common
from timing import (architecture, backend_defaults, forward_flops, matmul_rates,
                    peak_memory, program_bytes, seconds_per_call, train_step_and_batches)
from vit_jax import cpu_devices


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='ViT-B_16,BiT-M-R50x1')
  parser.add_argument('--batch', type=int, default=None,
                      help='global batch; default 256 on accelerators, 32 on CPU')
  parser.add_argument('--image-size', type=int, default=224)
  parser.add_argument('--dtypes', default='float32,bfloat16')
  parser.add_argument('--remat', default='none', help='ViT block remat policy')
  parser.add_argument('--attention', default='auto', help='ViT attention implementation')
  parser.add_argument('--matmul-size', type=int, default=None,
                      help='default 8192 on accelerators, 4096 on CPU')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--cpu-devices', type=int, default=0,
                      help='devices to split a CPU host into; 0: one per core')
  args = parser.parse_args()
  # Before the backend starts; it splits CPU hosts only, for the CPU default batch.
  split_for = args.batch or 32
  cpu_devices.split_cpu_into_devices(ml_collections.ConfigDict(
      dict(batch_size=split_for, accum_steps=1, eval_batch_size=split_for)), args.cpu_devices)
  batch, matmul = backend_defaults(args.batch, args.matmul_size)
  dtypes = args.dtypes.split(',')
  print(f'{jax.device_count()} x {jax.devices()[0].device_kind}, batch {batch}, '
        f'{args.image_size} px, remat {args.remat}, attention {args.attention}')
  rates = matmul_rates(dtypes, matmul, args.repeats)
  print(f'{"model":<14}{"dtype":>10}{"img/s":>10}{"TFLOP/s":>9}{"/ mm":>7}{"vs first":>9}'
        f'{"plan GiB":>9}{"peak GiB":>9}')
  for name in args.models.split(','):
    flops = 3 * forward_flops(name, args.image_size) * batch
    first = None
    for dt in dtypes:
      config = common.base_config()
      config.update(model_name=name, image_size=args.image_size, batch_size=batch,
                    optimizer='adam', lr=1e-3, weight_decay=1e-4)
      config.model = ml_collections.ConfigDict(
          architecture(name, dt, args.remat, args.attention))
      step, state, (images,) = train_step_and_batches(config, 1000)
      step = step.lower(state, images).compile()
      plan = program_bytes(step) / 2**30
      # The step donates its state, so each call gets the previous call's output.
      holder = {'state': state}
      def run(batch):
        holder['state'], metrics = step(holder['state'], batch)
        return metrics
      elapsed = seconds_per_call(run, images, repeats=args.repeats)
      first = first or elapsed
      rate = flops / elapsed
      print(f'{name:<14}{dt:>10}{batch / elapsed:10.1f}{rate / 1e12:9.2f}'
            f'{rate / rates[dt]:7.2f}{first / elapsed:9.2f}{plan:9.1f}{peak_memory():>9}',
            flush=True)


if __name__ == '__main__':
  main()
