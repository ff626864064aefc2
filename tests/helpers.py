"""Small models, parameters, recipes and image folders shared by the tests (the
fixtures built from them are in conftest.py)."""
import functools
import glob
import os
import shutil

import chex
import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import PIL.Image

from analysis.runtime import features
from configs import common
from vit_jax import checkpoint, models

# The tiny models the families declare (`Family.tiny`), by the names tests use.
TINY_VIT = dict(models.FAMILIES['vit'].tiny[1])
TINY_MIXER = dict(models.FAMILIES['mixer'].tiny[1])
TINY_ALTERNET = dict(models.FAMILIES['alternet'].tiny[1])


def tiny_family_config(family: str, num_classes: int = 3, **overrides):
  """The model config of a registered family's tiny model (`Family.tiny`)."""
  name, fields = models.FAMILIES[family].tiny
  return models.get_config(name, num_classes=num_classes, **{**fields, **overrides})


def tiny_vit(num_classes=10, **overrides):
  return models.get_model('ViT-Ti_16', num_classes, **{**TINY_VIT, **overrides})


def tiny_bit(num_classes=10, **overrides):
  return models.get_model('BiT-M-R50x1', num_classes, **{'num_layers': (1, 1), **overrides})


def tiny_mixer(num_classes=10, **overrides):
  return models.get_model('Mixer-B_16', num_classes, **{**TINY_MIXER, **overrides})


def tiny_alternet(num_classes=10, **overrides):
  return models.get_model('AlterNet-18', num_classes, **{**TINY_ALTERNET, **overrides})


def param_shapes(name, image_size=224, num_classes=1000, **overrides):
  """Parameter shapes of a zoo model (1000 classes unless told), without allocating it."""
  model = models.get_model(name, num_classes, **overrides)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                             jnp.zeros((1, image_size, image_size, 3)))
  return {k: v.shape for k, v in flax.traverse_util.flatten_dict(variables['params'],
                                                                   sep='/').items()}


def init(model, image_size=32, seed=0):
  """The model's variables for images of `image_size`. A test process initialises
  each (model, size, seed) once: later calls get the same arrays in new containers."""
  if isinstance(image_size, int):
    image_size = (image_size, image_size)
  try:
    variables = _init(model, tuple(image_size), seed)
  except TypeError:  # a model with a field that cannot be hashed
    variables = _init.__wrapped__(model, tuple(image_size), seed)
  return jax.tree_util.tree_map(lambda x: x, variables)


@functools.lru_cache(maxsize=64)
def _init(model, image_size, seed):
  # Computed even when first asked for under a transformation (`jax.eval_shape(lambda:
  # init(model))`): the cache would otherwise keep that trace's tracers for later tests.
  with jax.ensure_compile_time_eval():
    return jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros((1,) + image_size + (3,)))


def apply(model, variables, x, **kwargs):
  """`model.apply` compiled once, as training and analysis run it."""
  return jax.jit(model.apply, static_argnames='train')(variables, x, **kwargs)


def apply_with_intermediates(model, variables, x, **kwargs):
  """`models.apply_with_intermediates` compiled once; kwargs are closed over."""
  return jax.jit(lambda v, x: models.apply_with_intermediates(model, v, x, **kwargs))(
      variables, x)


def perturbed(variables, seed=1, scale=0.1):
  """Parameters with normal noise added, so zero-initialised heads and biases matter.
  The noise is drawn on the host: drawn by JAX, each leaf's shape compiled a program
  of its own."""
  rng = np.random.default_rng(seed)

  def add_noise(x):
    dtype = jnp.result_type(x, jnp.float32)
    return np.asarray(x, dtype) + (scale * rng.standard_normal(np.shape(x))).astype(dtype)

  return jax.device_put(jax.tree_util.tree_map(add_noise, variables))


def images(batch=2, size=32, seed=0):
  if isinstance(size, int):
    size = (size, size)
  return np.random.RandomState(seed).uniform(-1, 1, (batch,) + tuple(size) + (3,)).astype(
      np.float32)


def make_folder(root, counts, size=(20, 30)):
  """Random JPEGs (and every third a grey PNG) in root/<split>/class_<i>/; returns
  the `folder:` dataset name. `counts[split][i]` images go to class i."""
  rng = np.random.RandomState(0)
  for split, per_class in counts.items():
    for label, n in enumerate(per_class):
      d = os.path.join(root, split, f'class_{label}')
      os.makedirs(d, exist_ok=True)
      for i in range(n):
        pixels = rng.randint(0, 256, size + (3,), dtype=np.uint8)
        if i % 3 == 1:  # a grey PNG among the colour JPEGs
          PIL.Image.fromarray(pixels[..., 0]).save(os.path.join(d, f'{i}.png'))
        else:
          PIL.Image.fromarray(pixels).save(os.path.join(d, f'{i}.JPEG'), quality=95)
  return f'folder:{root}'


def read_events(logdir):
  """The TensorBoard events in `logdir`'s event files, read by TensorBoard's own
  loader: {tag: {step: value}}, a scalar's value a numpy array, an image's the
  encoded strings (width, height, PNGs)."""
  from tensorboard.backend.event_processing import event_file_loader
  from tensorboard.util import tensor_util
  values = {}
  for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
    for event in event_file_loader.EventFileLoader(path).Load():
      for value in event.summary.value:
        plugin = value.metadata.plugin_data.plugin_name
        if plugin == 'images':
          values.setdefault(value.tag, {})[event.step] = list(value.tensor.string_val)
        elif plugin == 'scalars':
          values.setdefault(value.tag, {})[event.step] = tensor_util.make_ndarray(value.tensor)
  return values


def assert_close_at_scale(actual, expected, rtol: float, ulps: float = 64.):
  """Trees equal to `rtol` of each value, and to `ulps` float32 units of the largest
  |value| among all leaves: two summation orders of one float32 computation differ
  by rounding relative to the sizes summed, which a near-zero leaf (a LayerNorm
  bias's gradient) does not have on its own."""
  scale = max(float(np.max(np.abs(np.asarray(leaf)))) for leaf in jax.tree_util.tree_leaves(expected))
  chex.assert_trees_all_close(actual, expected, rtol=rtol,
                              atol=ulps * float(np.finfo(np.float32).eps) * scale)


NO_CHROMIUM = ('No Chromium here: scripts/test.sh installs the Debian package chromium where '
               'apt-get runs as root.')


def chromium():
  """The path of a Chromium-like browser, or None."""
  for name in ('chromium', 'chromium-browser', 'google-chrome'):
    if shutil.which(name):
      return shutil.which(name)
  return None


def subject(name, label, **overrides):
  """A 3-class analysis subject of zoo model `name` with perturbed fresh parameters
  at 32 px, with a recipe for the tools that need its training objective."""
  return subject_of(models.get_config(name, num_classes=3, **overrides), label)


def subject_of(config, label):
  """An analysis subject of model `config` (3 classes) with perturbed fresh parameters."""
  params = perturbed(init(models.build_model(config), 32))['params']
  recipe = common.base_config()
  recipe.update(lr=0.1, weight_decay=1e-4, label_smoothing=0.1)
  return features.Subject(label, config, params, 32, recipe)


def batches(split):
  """Three batches of 12 random 32 px images of 3 classes per split (mixup-like
  label distributions for the augmented training split)."""
  rng = np.random.RandomState({'train': 0, 'eval': 1, features.TRAIN_AUGMENTED: 2}[split])
  for _ in range(3):
    labels = np.arange(12) % 3
    if split == features.TRAIN_AUGMENTED:  # label distributions, as mixup gives
      labels = 0.8 * np.eye(3)[labels] + 0.2 * np.eye(3)[(labels + 1) % 3]
    yield rng.uniform(-1, 1, (12, 32, 32, 3)).astype(np.float32), labels


def quickstart_vit_checkpoint(tmp_path) -> str:
  """A .npz of the quick-start ViT recipe's model with fresh, perturbed parameters."""
  from configs import quickstart_vit
  config = quickstart_vit.get_config()
  model = models.get_model(config.model_name, 10, **config.model)
  path = str(tmp_path / 'vit.npz')
  checkpoint.save(path, perturbed(init(model, 28), scale=0.02)['params'])
  return path


def tiny_config(dataset='', **overrides):
  """The recipe fields of configs/common.py set for a tiny ViT on 8 px images."""
  fields = common.base_config().to_dict()
  fields.update(
      model_name='ViT-Ti_16', model=dict(TINY_VIT, patch_size=4), dataset=dataset,
      image_size=8, batch_size=16, eval_batch_size=16, total_steps=6, optimizer='adam',
      lr=1e-2, warmup_steps=2, weight_decay=1e-4, log_every=1, eval_every=3,
      checkpoint_every=3, keep_checkpoints=3)
  fields.update(overrides)
  return ml_collections.ConfigDict(fields)


def damage(directory, stride=None):
  """In every data file of a checkpoint (orbax's `d/` directories), the middle byte
  inverted, or with `stride` every stride-th byte."""
  for base, _, names in os.walk(directory):
    for name in names if os.path.basename(base) == 'd' else ():
      path = os.path.join(base, name)
      data = bytearray(open(path, 'rb').read())
      for i in range(len(data) // 2, len(data), len(data)) if stride is None else range(
          0, len(data), stride):
        data[i] ^= 0xFF
      open(path, 'wb').write(bytes(data))


def tiny_sweep(folder):
  """A two-row sweep (global attention, a 3x3 window) of the tiny 8 px ViT on `folder`."""
  fields = common.base_config().to_dict()
  fields.update(model_name='ViT-Ti_16', model=dict(TINY_VIT, patch_size=4), dataset=folder,
                image_size=8, batch_size=16, eval_batch_size=16, total_steps=2,
                optimizer='adam', lr=1e-2, warmup_steps=1, log_every=1, eval_every=2,
                checkpoint_every=2)
  config = ml_collections.ConfigDict(fields)
  config.sweep = ml_collections.ConfigDict(dict(name='tiny', rows=(
      ('global', {}), ('k3', dict(model=dict(attention_window=3))))))
  return config


AUGREG_HEADER = ('name,ds,lr,aug,wd,do,sd,best_val,final_val,final_test,adapt_ds,adapt_lr,'
                 'adapt_steps,adapt_resolution,adapt_final_val,adapt_final_test,params,'
                 'infer_samples_per_sec,filename,adapt_filename')


def write_augreg_index(directory, rows):
  """An index.csv in the published columns; rows are (name, ds, final_val, filename)."""
  lines = [AUGREG_HEADER] + [
      f'{name},{ds},0.001,light1,0.1,0.0,0.0,{val + 0.01},{val},{val - 0.01},cifar100,0.01,'
      f'2500,224,0.9,0.9,5700000,3000.0,{filename},{filename}--cifar100-steps_2k'
      for name, ds, val, filename in rows]
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'index.csv'), 'w') as f:
    f.write('\n'.join(lines) + '\n')


AUGREG_ROWS = [('Ti/16', 'i21k', 0.50, 'Ti_16-i21k-low'), ('Ti/16', 'i21k', 0.70, 'Ti_16-i21k-best'),
               ('Ti/16', 'i1k', 0.90, 'Ti_16-i1k'), ('R26+S/32', 'i21k', 0.80, 'R26_S_32-i21k')]


VOCAB = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', 'a', 'photo', 'of', 'the', 'cat', 'dog', '##s', '.',
         'itap', 'bad', 'origami', 'large', 'small', 'in', 'video', 'game', 'art']


def write_saev_file(path, state, header, threshold=None):
  """A sparse autoencoder file as saev's `dump` writes it (OSU-NLP-Group/saev,
  src/saev/nn/modeling.py): the header as one JSON line, then `torch.save` of the
  state dict (`state`'s arrays, and `activation.threshold` where given)."""
  import json
  import torch
  tensors = {k: torch.from_numpy(np.asarray(v)) for k, v in state.items()}
  if threshold is not None:
    tensors['activation.threshold'] = torch.tensor(threshold)
  with open(path, 'wb') as f:
    f.write(json.dumps(header).encode() + b'\n')
    torch.save(tensors, f)
