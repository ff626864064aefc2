"""This project against timm (PyTorch) on the CPU, side by side in one process.

    python benchmarks/peers_cpu.py [--rounds 5] [--no-compile] [--only vit_b16_infer_8,...]

Each workload is timed as this project runs it (jitted, the CPU split into one
device per core as the train command splits it, batches over the devices) and
as timm runs it, eager and `torch.compile`d, with every core as a torch thread.
After one warm-up call each (compilation), `--rounds` rounds call the three in
turn, so a machine's slow spell hits all of them; the median is reported.
float32 throughout, random images.

Workloads: ViT-B/16 and BiT-M-R50x1 inference (224 px, batch 8 and 32); the
quick-start ViT and ResNet training steps (their recipes' optimizer, clipping
and label smoothing, batch 128 at 28 px) against timm's VisionTransformer and
ResNetV2 built to the same widths, depths and patch size; and ViT-B/16's
forward pass keeping its residual stream (what CKA reads: 25 maps, against the
12 block outputs of timm's `forward_intermediates`). torch and timm are optional: without them the
benchmark says so and stops.
"""
import argparse
import os
import statistics
import time
from typing import Callable, Dict

import jax
import ml_collections
import numpy as np

from vit_jax import cpu_devices


def cpu_name() -> str:
  """The CPU model and the vector extensions that decide XLA's and oneDNN's kernels."""
  name, flags = cpu_devices.cpu_info()
  isa = [f for f in ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16') if f in flags]
  return f'{name} ({", ".join(isa) or "no AVX2"})'


class Workload:
  """One comparison: `ours`, `eager` and `compiled` are no-argument calls that block."""

  def __init__(self, name: str, images: int, ours: Callable, eager: Callable,
               compiled: Callable = None):
    self.name, self.images = name, images
    self.calls = {'ours': ours, 'timm eager': eager}
    if compiled is not None:
      self.calls['timm compiled'] = compiled


def run(workload: Workload, rounds: int, pause: float) -> Dict[str, float]:
  """Median seconds per call of each of the workload's calls, in alternating rounds.

  `pause` seconds pass before each timed call: a framework's worker threads
  spin a while after its call returns (OpenMP's wait policy, XLA's thread
  pool), which would take cores from the next call of the other framework."""
  for call in workload.calls.values():
    call()
  times = {key: [] for key in workload.calls}
  for _ in range(rounds):
    for key, call in workload.calls.items():
      time.sleep(pause)
      start = time.perf_counter()
      call()
      times[key].append(time.perf_counter() - start)
  return {key: statistics.median(values) for key, values in times.items()}


# ---------------------------------------------------------------------------
# This project's side


def _mesh_put(tree, batch_axis: bool):
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()), ('data',))
  return jax.device_put(tree, NamedSharding(mesh, P('data') if batch_axis else P()))


def our_forward(name: str, images: np.ndarray, keep_blocks: bool = False) -> Callable:
  """The jitted forward pass of a zoo model (1,000 classes); with `keep_blocks`,
  the whole residual stream kept (every block's input, the stream after each
  attention and MLP branch), which the CKA tool reads."""
  from vit_jax import models
  model = models.get_model(name, 1000)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), images[:1])['params']
  # As inference and the analysis apply a model: BiT's kernels standardised once.
  variables = _mesh_put(models.fixed_variables(model, params, images.shape[1]), False)
  x = _mesh_put(images, True)
  if keep_blocks:
    config = models.get_config(name)
    names = models.family_of(config).layers(config).stream
    forward = jax.jit(lambda v, x: models.apply_with_intermediates(model, v, x, names=names))
  else:
    forward = jax.jit(model.apply)
  return lambda: jax.block_until_ready(forward(variables, x))


def our_train_step(recipe: str) -> Callable:
  """The train command's step for `configs/<recipe>.py` on a random batch."""
  import importlib
  from timing import train_step_and_batches
  config = importlib.import_module(f'configs.{recipe}').get_config()
  step, state, (batch,) = train_step_and_batches(config, 10)
  holder = {'state': state}

  def call():
    holder['state'], metrics = step(holder['state'], batch)
    jax.block_until_ready(metrics)
  return call


# ---------------------------------------------------------------------------
# timm's side


def timm_forward(model, images: np.ndarray, keep_blocks: bool = False) -> Callable:
  import torch
  x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
  model.eval()

  def call():
    with torch.no_grad():
      if keep_blocks:
        model.forward_intermediates(x)
      else:
        model(x)
  return call


def timm_train_step(model, recipe: str) -> Callable:
  """A step as the recipe trains: its optimizer (decoupled weight decay for
  Adam, as `vit_jax.steps` applies it), global-norm clipping, label smoothing."""
  import importlib
  import torch
  import torch.nn.functional as F
  config = importlib.import_module(f'configs.{recipe}').get_config()
  rng = np.random.RandomState(0)
  size = config.image_size
  x = torch.from_numpy(rng.uniform(-1, 1, (config.batch_size, 3, size, size)).astype(np.float32))
  y = torch.from_numpy(rng.randint(0, 10, config.batch_size))
  if config.optimizer == 'adam':
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                  weight_decay=config.weight_decay / config.lr)
  else:
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay / config.lr)
  model.train()

  def call():
    loss = F.cross_entropy(model(x), y, label_smoothing=config.label_smoothing)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
  return call


def quickstart_timm_vit():
  """timm's VisionTransformer in configs/quickstart_vit.py's shape (GAP head, no class token)."""
  from timm.models.vision_transformer import VisionTransformer
  from configs import quickstart_vit
  config = quickstart_vit.get_config()
  m = config.model
  return VisionTransformer(img_size=config.image_size, patch_size=m.patch_size,
                           embed_dim=m.hidden_size, depth=m.num_layers, num_heads=m.num_heads,
                           mlp_ratio=m.mlp_dim / m.hidden_size, num_classes=10,
                           class_token=False, global_pool='avg', fc_norm=False)


def quickstart_timm_resnet():
  """timm's ResNetV2 (pre-activation, GroupNorm, weight-standardised convs) in
  configs/quickstart_resnet.py's shape: one unit per stage, half width, no stem pool."""
  import torch
  from timm.models.resnetv2 import ResNetV2
  from configs import quickstart_resnet
  m = quickstart_resnet.get_config().model
  stages = len(m.num_layers)
  model = ResNetV2(layers=list(m.num_layers), channels=(256, 512, 1024, 2048)[:stages],
                   num_classes=10, width_factor=m.width_factor)
  if not m.root_pool:
    model.stem.pool = torch.nn.Identity()
  return model


# ---------------------------------------------------------------------------


def workloads(compile_timm: bool):
  """(name, make) pairs; `make()` builds the workload's models and calls."""
  import timm
  import torch
  compiled = (lambda make: make()) if compile_timm else (lambda make: None)
  rng = np.random.RandomState(0)
  images = {b: rng.uniform(-1, 1, (b, 224, 224, 3)).astype(np.float32) for b in (8, 32)}
  for ours, theirs, label in (('ViT-B_16', 'vit_base_patch16_224', 'vit_b16'),
                              ('BiT-M-R50x1', 'resnetv2_50x1_bit', 'bit_r50x1')):
    for batch in (8, 32):
      def make(ours=ours, theirs=theirs, batch=batch, label=label):
        model = lambda: timm.create_model(theirs, num_classes=1000)
        return Workload(f'{label}_infer_{batch}', batch, our_forward(ours, images[batch]),
                        timm_forward(model(), images[batch]),
                        compiled(lambda: timm_forward(torch.compile(model()), images[batch])))
      yield f'{label}_infer_{batch}', make
  for recipe, timm_model in (('quickstart_vit', quickstart_timm_vit),
                             ('quickstart_resnet', quickstart_timm_resnet)):
    def make(recipe=recipe, timm_model=timm_model):
      return Workload(f'{recipe}_train_128', 128, our_train_step(recipe),
                      timm_train_step(timm_model(), recipe),
                      compiled(lambda: timm_train_step(torch.compile(timm_model()), recipe)))
    yield f'{recipe}_train_128', make

  def blocks():
    model = lambda: timm.create_model('vit_base_patch16_224')
    return Workload('vit_b16_blocks_8', 8, our_forward('ViT-B_16', images[8], keep_blocks=True),
                    timm_forward(model(), images[8], keep_blocks=True),
                    compiled(lambda: timm_forward(torch.compile(model()), images[8],
                                                  keep_blocks=True)))
  yield 'vit_b16_blocks_8', blocks


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--pause', type=float, default=0.5,
                      help='idle seconds before each timed call')
  parser.add_argument('--no-compile', action='store_true', help='skip torch.compile')
  parser.add_argument('--only', default='', help='comma-separated workload names')
  args = parser.parse_args()
  try:
    import timm
    import torch
  except ImportError as e:
    print(f'Skipped: this benchmark needs torch and timm ({e}); `pip install torch timm`.')
    return
  cores = len(os.sched_getaffinity(0))
  # As the train command: one device per core (every batch here divides by the cores).
  cpu_devices.split_cpu_into_devices(ml_collections.ConfigDict(
      dict(batch_size=8, accum_steps=1, eval_batch_size=8)), 0)
  torch.set_num_threads(cores)
  print(f'{cpu_name()}, {cores} cores; jax {jax.__version__} on {jax.device_count()} CPU '
        f'devices; torch {torch.__version__} with {torch.get_num_threads()} threads, timm '
        f'{timm.__version__}; float32, median of {args.rounds} alternating rounds')
  only = set(filter(None, args.only.split(',')))
  columns = ['ours', 'timm eager'] + ([] if args.no_compile else ['timm compiled'])
  print(f'{"workload":<26}' + ''.join(f'{c + " img/s":>20}' for c in columns)
        + f'{"vs eager":>10}' + ('' if args.no_compile else f'{"vs compiled":>13}'))
  for name, make in workloads(not args.no_compile):
    if only and name not in only:
      continue
    workload = make()
    seconds = run(workload, args.rounds, args.pause)
    rates = {key: workload.images / s for key, s in seconds.items()}
    line = f'{workload.name:<26}' + ''.join(f'{rates[c]:20.2f}' for c in columns)
    line += f'{rates["ours"] / rates["timm eager"]:9.2f}x'
    if not args.no_compile:
      line += f'{rates["ours"] / rates["timm compiled"]:12.2f}x'
    print(line, flush=True)


if __name__ == '__main__':
  main()
