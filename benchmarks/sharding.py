"""Replicated (`sharding='data'`) against fully sharded (`'fsdp'`) training state:
bytes of parameters and optimizer state per device, the memory XLA plans for the
step, and the step time, measured in one run on the same devices.

    python benchmarks/sharding.py                       # 8 simulated CPU devices
    python benchmarks/sharding.py --models ViT-L_16 --image-size 224 --batch 64   # a GPU host

On a CPU host the devices are simulated (`--devices`), so step times show the
cost of the collectives on one machine, not a speed-up.
"""
import argparse
import os
import sys


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='ViT-S_16,ViT-B_16')
  parser.add_argument('--batch', type=int, default=16, help='global batch')
  parser.add_argument('--image-size', type=int, default=64)
  parser.add_argument('--devices', type=int, default=8, help='simulated CPU devices')
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  if 'jax' not in sys.modules:  # before JAX starts: the simulated devices of a CPU host
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                               f' --xla_force_host_platform_device_count={args.devices}')
  import jax
  import ml_collections

  from configs import common
  from timing import MID_SCHEDULE, program_bytes, seconds_per_call, train_step_and_batches
  from vit_jax import sharding

  device = jax.devices()[0]
  print(f'{jax.device_count()} x {device.device_kind}, batch {args.batch}, '
        f'{args.image_size} px, Adam, float32')
  print(f'{"model":<12}{"sharding":>10}{"state MiB/dev":>15}{"plan MiB":>10}{"s/step":>8}'
        f'{"state ratio":>13}{"time ratio":>12}')
  for name in args.models.split(','):
    measured = {}
    for rule in ('data', 'fsdp'):
      config = common.base_config()
      config.update(model_name=name, image_size=args.image_size, batch_size=args.batch,
                    optimizer='adam', lr=1e-3, weight_decay=1e-4, sharding=rule)
      config.model = ml_collections.ConfigDict()
      step, state, (batch,) = train_step_and_batches(config, 1000)
      state_bytes = sharding.bytes_per_device(state, device)
      compiled = step.lower(state, batch, MID_SCHEDULE).compile()
      holder = {'state': state}

      def run(b):
        holder['state'], metrics = compiled(holder['state'], b, MID_SCHEDULE)
        return metrics
      measured[rule] = (state_bytes, program_bytes(compiled),
                        seconds_per_call(run, batch, repeats=args.repeats))
      base_bytes, _, base_time = measured['data']
      print(f'{name:<12}{rule:>10}{state_bytes / 2**20:15.1f}'
            f'{measured[rule][1] / 2**20:10.0f}{measured[rule][2]:8.2f}'
            f'{state_bytes / base_bytes:13.3f}{measured[rule][2] / base_time:12.2f}', flush=True)


if __name__ == '__main__':
  main()
