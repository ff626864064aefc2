"""This project against timm (PyTorch) on the CPU, side by side in one process.

    python benchmarks/peers_cpu.py [--rounds 5] [--no-compile] [--only vit_b16_infer_8,...]

Each workload is timed as timm runs it, eager and `torch.compile`d, with every
core as a torch thread, and as this project runs it, two ways where a user meets
both:

- *tuned*: as the train command and the analysis run a model (jitted, the CPU
  split into one device per core, batches placed over the devices beforehand,
  BiT's kernels standardised once);
- *notebook*: as a notebook meets it, `jax.jit(model.apply)` on the parameters
  `model.init` gave and a numpy batch, which runs on one device (the first of
  this process's devices: XLA:CPU's threads are the process's, whichever
  device a program runs on).

After one warm-up call each (compilation), `--rounds` rounds call them in turn,
so a machine's slow spell hits all of them; the median is reported. float32,
random images; the `_bf16` workloads set the models' `dtype` to bfloat16 on the
notebook path (timm under `torch.autocast`), beside the same model in float32,
and print how many of the matmuls and convolutions XLA:CPU's compiled program
computes in float32 after converting bfloat16 operands.

Workloads: ViT-B/16 and BiT-M-R50x1 inference (224 px, batch 8 and 32; batch 8
in bfloat16); DINOv3-S/16 and -B/16 inference (224 px, batch 8) against timm's
`vit_{small,base}_patch16_dinov3`; the quick-start ViT and ResNet training steps (their recipes'
optimizer, clipping and label smoothing, batch 128 at 28 px) against timm's
VisionTransformer and ResNetV2 built to the same widths, depths and patch size;
and ViT-B/16's forward pass keeping its residual stream (what CKA reads: 25
maps, against the 12 block outputs of timm's `forward_intermediates`). torch and
timm are optional: without them the benchmark says so and stops.
"""
import argparse
import os
import re
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
  """One comparison: `calls` maps each column (`ours`, `ours notebook`, `timm eager`,
  ...) to a no-argument call that blocks; `note` is printed under its line."""

  def __init__(self, name: str, images: int, calls: Dict[str, Callable],
               compiled: Callable = None, note: str = ''):
    self.name, self.images, self.note = name, images, note
    self.calls = dict(calls)
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


def notebook_forward(name: str, images: np.ndarray, dtype: str = 'float32') -> Callable:
  """The forward pass as a notebook runs it: `jax.jit(model.apply)` on `model.init`'s
  variables and a numpy batch, on the default device, BiT's kernels standardised in
  every call."""
  from vit_jax import models
  model = models.get_model(name, 1000, dtype=dtype)
  variables = model.init(jax.random.PRNGKey(0), images[:1])
  forward = jax.jit(model.apply)
  return lambda: jax.block_until_ready(forward(variables, images))


def float32_kernels(name: str, images: np.ndarray, dtype: str) -> str:
  """How many matmuls and convolutions of the notebook forward pass's compiled
  program take float32 operands (after converts from `dtype`), of how many.

  Args:
    name: the zoo model.
    images: a batch.
    dtype: the model's compute dtype.

  Returns:
    A sentence naming the counts and the XLA:CPU it was compiled by.
  """
  from vit_jax import models
  model = models.get_model(name, 1000, dtype=dtype)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images[:1])
  text = jax.jit(model.apply).lower(shapes, images).compile().as_text()
  kernels = kernel_operand_types(text)
  in_f32 = sum(types == ('f32', 'f32') for types in kernels)
  return (f'{name} in {dtype}: {in_f32} of the {len(kernels)} matmuls and convolutions '
          f'XLA:CPU (jaxlib {jax.lib.__version__}) compiled take float32 operands')


def kernel_operand_types(hlo_text: str) -> list:
  """The operand element types, (lhs, rhs), of every `dot` and `convolution` in an
  HLO module's text (names are looked up in the computation they are in).

  Args:
    hlo_text: `compiled.as_text()`, or `lowered.as_text(dialect='hlo')`.

  Returns:
    One pair of element types (`'f32'`, `'bf16'`, ...) per dot and convolution.
  """
  found = []
  for computation in re.split(r'\n(?=\S)', hlo_text):
    types = dict(re.findall(r'%?([\w.\-]+) = (\w+)\[', computation))
    types.update(re.findall(r'([\w.\-]+): (\w+)\[', computation.split('\n', 1)[0]))
    for lhs, rhs in re.findall(r' (?:dot|convolution)\(%?([\w.\-]+), %?([\w.\-]+)\)',
                               computation):
      found.append((types[lhs], types[rhs]))
  return found


# BiT-M-R50x1's 3x3 convolutions at 224 px: (input height and width, channels, stride).
BIT_3X3_CONVS = ([(56, 64, 1)] * 3 + [(56, 128, 2)] + [(28, 128, 1)] * 3 + [(28, 256, 2)]
                 + [(14, 256, 1)] * 5 + [(14, 512, 2)] + [(7, 512, 1)] * 2)


def our_3x3_convs(batch: int) -> Callable:
  """BiT-M-R50x1's sixteen 3x3 convolutions, each its own jitted program, as XLA:CPU
  runs them (channels last, padding 1, as `vit_jax.models.conv` hands them to
  `lax.conv_general_dilated`)."""
  rng = np.random.RandomState(0)
  calls = []
  for size, channels, stride in BIT_3X3_CONVS:
    x = rng.normal(size=(batch, size, size, channels)).astype(np.float32)
    w = rng.normal(size=(3, 3, channels, channels)).astype(np.float32)
    f = jax.jit(lambda x, w, stride=stride: jax.lax.conv_general_dilated(
        x, w, (stride, stride), ((1, 1), (1, 1)), dimension_numbers=('NHWC', 'HWIO', 'NHWC')))
    calls.append(lambda f=f, x=x, w=w: jax.block_until_ready(f(x, w)))
  return lambda: [call() for call in calls]


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


def timm_forward(model, images: np.ndarray, keep_blocks: bool = False,
                 autocast: str = '') -> Callable:
  """timm's forward pass; with `autocast` ('bfloat16') under `torch.autocast`."""
  import contextlib
  import torch
  x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
  model.eval()
  cast = (lambda: torch.autocast('cpu', dtype=getattr(torch, autocast))) if autocast else (
      contextlib.nullcontext)

  def call():
    with torch.no_grad(), cast():
      if keep_blocks:
        model.forward_intermediates(x)
      else:
        model(x)
  return call


def timm_train_step(model, recipe: str) -> Callable:
  """A step as the recipe trains: its optimizer (decoupled weight decay for
  Adam, as `vit_jax.training.steps` applies it), global-norm clipping, label smoothing."""
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


def timm_3x3_convs(batch: int) -> Callable:
  """The convolutions of `our_3x3_convs` as PyTorch runs them (oneDNN)."""
  import torch
  import torch.nn.functional as F
  calls = []
  for size, channels, stride in BIT_3X3_CONVS:
    x, w = torch.randn(batch, channels, size, size), torch.randn(channels, channels, 3, 3)
    calls.append(lambda x=x, w=w, stride=stride: F.conv2d(x, w, stride=stride, padding=1))

  def call():
    with torch.no_grad():
      for c in calls:
        c()
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
        return Workload(f'{label}_infer_{batch}', batch,
                        {'ours tuned': our_forward(ours, images[batch]),
                         'ours notebook': notebook_forward(ours, images[batch]),
                         'timm eager': timm_forward(model(), images[batch])},
                        compiled(lambda: timm_forward(torch.compile(model()), images[batch])))
      yield f'{label}_infer_{batch}', make

    def bf16(ours=ours, theirs=theirs, label=label):
      model = timm.create_model(theirs, num_classes=1000)
      return Workload(f'{label}_infer_8_bf16', 8,
                      {'ours notebook': notebook_forward(ours, images[8], 'bfloat16'),
                       'ours notebook f32': notebook_forward(ours, images[8]),
                       'timm eager': timm_forward(model, images[8], autocast='bfloat16'),
                       'timm eager f32': timm_forward(model, images[8])},
                      note=float32_kernels(ours, images[8], 'bfloat16'))
    yield f'{label}_infer_8_bf16', bf16
  # DINOv3 (rotary position embeddings, 4 registers) as timm builds it, pooling its
  # class token as DINOv3 does.
  for ours, theirs, label in (('DINOv3-S_16', 'vit_small_patch16_dinov3', 'dinov3_s16'),
                              ('DINOv3-B_16', 'vit_base_patch16_dinov3', 'dinov3_b16')):
    def make(ours=ours, theirs=theirs, label=label):
      model = lambda: timm.create_model(theirs, num_classes=1000, global_pool='token')
      return Workload(f'{label}_infer_8', 8,
                      {'ours tuned': our_forward(ours, images[8]),
                       'ours notebook': notebook_forward(ours, images[8]),
                       'timm eager': timm_forward(model(), images[8])},
                      compiled(lambda: timm_forward(torch.compile(model()), images[8])))
    yield f'{label}_infer_8', make
  for recipe, timm_model in (('quickstart_vit', quickstart_timm_vit),
                             ('quickstart_resnet', quickstart_timm_resnet)):
    def make(recipe=recipe, timm_model=timm_model):
      return Workload(f'{recipe}_train_128', 128,
                      {'ours': our_train_step(recipe),
                       'timm eager': timm_train_step(timm_model(), recipe)},
                      compiled(lambda: timm_train_step(torch.compile(timm_model()), recipe)))
    yield f'{recipe}_train_128', make

  def blocks():
    model = lambda: timm.create_model('vit_base_patch16_224')
    return Workload('vit_b16_blocks_8', 8,
                    {'ours': our_forward('ViT-B_16', images[8], keep_blocks=True),
                     'timm eager': timm_forward(model(), images[8], keep_blocks=True)},
                    compiled(lambda: timm_forward(torch.compile(model()), images[8],
                                                  keep_blocks=True)))
  yield 'vit_b16_blocks_8', blocks
  yield 'bit_r50x1_3x3_convs_8', lambda: Workload(
      'bit_r50x1_3x3_convs_8', 8, {'ours': our_3x3_convs(8), 'timm eager': timm_3x3_convs(8)})


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
        f'devices (ours: all of them; ours notebook: one); torch {torch.__version__} with '
        f'{torch.get_num_threads()} threads, timm {timm.__version__}; float32 unless named, '
        f'median of {args.rounds} alternating rounds')
  only = set(filter(None, args.only.split(',')))
  print(f'{"workload":<30}{"call":<20}{"img/s":>9}{"vs timm eager":>15}{"vs compiled":>13}'
        f'{"vs own f32":>12}')
  for name, make in workloads(not args.no_compile):
    if only and name not in only:
      continue
    workload = make()
    seconds = run(workload, args.rounds, args.pause)
    for line in table_lines(workload.name, {key: workload.images / s
                                            for key, s in seconds.items()}):
      print(line, flush=True)
    if workload.note:
      print(f'{"":<30}{workload.note}', flush=True)


def table_lines(name: str, rates: Dict[str, float]) -> list:
  """A workload's lines: each call's images/s; this project's against timm eager and
  compiled (a float32 twin against timm's); a bfloat16 call against its float32
  twin (the call named `<call> f32`).

  Args:
    name: the workload.
    rates: images/s by call.

  Returns:
    The lines.
  """
  lines = []
  for key, rate in rates.items():
    ours = key.startswith('ours')
    twin = ' f32' if key.endswith(' f32') else ''  # float32 against float32
    against = lambda other: (f'{rate / rates[other + twin]:.2f}x'
                             if ours and other + twin in rates else '')
    own = f'{rate / rates[key + " f32"]:.2f}x' if key + ' f32' in rates else ''
    lines.append(f'{name if not lines else "":<30}{key:<20}{rate:9.2f}'
                 f'{against("timm eager"):>15}{against("timm compiled"):>13}{own:>12}')
  return lines

if __name__ == '__main__':
  main()
