"""Replicated (`sharding='data'`) against fully sharded (`'fsdp'`) training state,
with the ViT's blocks unrolled or scanned (`scan_layers`): bytes of parameters and
optimizer state per device, the memory XLA plans for the step, the compile time
and the step time, measured in one run on the same devices.

    python benchmarks/training.py                       # 8 simulated CPU devices
    python benchmarks/training.py --models ViT-L_16 --image-size 224 --batch 64   # a GPU host

On a CPU host the devices are simulated (`--devices`), so step times show the
cost of the collectives on one machine, not a speed-up. A replicated variant
whose copies of the state would not fit in the host's memory is skipped with the
figure that says so.
"""
import argparse
import os
import sys
import time

# variant -> (sharding, scan_layers, remat)
VARIANTS = {'data': ('data', False, 'none'), 'fsdp': ('fsdp', False, 'none'),
            'fsdp+scan': ('fsdp', True, 'none'), 'fsdp+scan+remat': ('fsdp', True, 'full')}


def state_bytes_per_copy(config, num_classes: int) -> int:
  """Bytes of one whole training state (parameters and optimizer state), unallocated."""
  import jax
  import jax.numpy as jnp

  from vit_jax import models
  from vit_jax import training
  model_cfg = training.model_config(config, num_classes)
  model = models.build_model(model_cfg)
  optimizer = training.make_optimizer(config, 1000)

  def state():
    params = model.init(jax.random.PRNGKey(0),
                        jnp.zeros((1, config.image_size, config.image_size, 3)))['params']
    return params, optimizer.init(params)
  return sum(leaf.size * leaf.dtype.itemsize
             for leaf in jax.tree_util.tree_leaves(jax.eval_shape(state)))


def host_memory_bytes() -> int:
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def measure(config, repeats: int):
  """(state bytes on the first device, planned bytes, compile seconds, s/step) of
  the train step of `config`; its state is freed on return."""
  import jax

  from timing import program_bytes, seconds_per_call, train_step_and_batches
  from vit_jax import training
  step, state, (batch,) = train_step_and_batches(config, 1000)
  state_bytes = training.bytes_per_device(state, jax.devices()[0])
  start = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  compile_seconds = time.perf_counter() - start
  holder = {'state': state}

  def run(b):
    holder['state'], metrics = compiled(holder['state'], b)
    return metrics
  return (state_bytes, program_bytes(compiled), compile_seconds,
          seconds_per_call(run, batch, repeats=repeats))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='ViT-B_16,ViT-L_16')
  parser.add_argument('--variants', default='data,fsdp,fsdp+scan',
                      help=f'comma-separated, of {", ".join(VARIANTS)}')
  parser.add_argument('--batch', type=int, default=16, help='global batch')
  parser.add_argument('--image-size', type=int, default=64)
  parser.add_argument('--devices', type=int, default=8, help='simulated CPU devices')
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  variants = args.variants.split(',')
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    parser.error(f'unknown variants {unknown}; use {", ".join(VARIANTS)}')
  if 'jax' not in sys.modules:  # before JAX starts: the simulated devices of a CPU host
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                               f' --xla_force_host_platform_device_count={args.devices}')
  import jax
  import ml_collections

  from configs import common

  device = jax.devices()[0]
  on_cpu = jax.default_backend() == 'cpu'
  print(f'{jax.device_count()} x {device.device_kind}, batch {args.batch}, '
        f'{args.image_size} px, Adam, float32; ratios against the model\'s first variant run')
  print(f'{"model":<12}{"variant":>17}{"state MiB/dev":>15}{"plan MiB":>10}{"compile s":>11}'
        f'{"s/step":>8}{"state ratio":>13}{"time ratio":>12}')
  for name in args.models.split(','):
    first = None  # (state bytes, s/step) of the model's first variant measured
    for variant in variants:
      rule, scan, remat = VARIANTS[variant]
      config = common.base_config()
      config.update(model_name=name, image_size=args.image_size, batch_size=args.batch,
                    optimizer='adam', lr=1e-3, weight_decay=1e-4, sharding=rule)
      config.model = ml_collections.ConfigDict(dict(scan_layers=scan, remat=remat))
      if on_cpu and rule == 'data':
        needed = jax.device_count() * state_bytes_per_copy(config, 1000)
        if needed > 0.8 * host_memory_bytes():
          print(f'{name:<12}{variant:>17}  skipped: {jax.device_count()} replicas of the '
                f'state need {needed / 2**30:.1f} GiB of the host\'s '
                f'{host_memory_bytes() / 2**30:.1f} GiB', flush=True)
          continue
      state_bytes, plan_bytes, compile_seconds, seconds = measure(config, args.repeats)
      first = first or (state_bytes, seconds)
      print(f'{name:<12}{variant:>17}{state_bytes / 2**20:15.1f}'
            f'{plan_bytes / 2**20:10.0f}{compile_seconds:11.1f}{seconds:8.2f}'
            f'{state_bytes / first[0]:13.3f}{seconds / first[1]:12.2f}', flush=True)


if __name__ == '__main__':
  main()
