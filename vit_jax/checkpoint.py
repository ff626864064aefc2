"""`.npz` parameter files in the published layouts, and fine-tuning from them.

A file maps '/'-joined parameter paths to arrays, as the public ViT
(gs://vit_models/imagenet21k/, gs://vit_models/augreg/), BiT
(gs://bit_models/) and Mixer (gs://mixer_models/) checkpoints do. Paths may be local or any filesystem
`etils.epath` knows (gs:// through TensorFlow's gfile).
"""
import csv
import io
import os
import re
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import flax
import jax.numpy as jnp
import numpy as np
from etils import epath

from vit_jax import models
from vit_jax.models.family import CheckpointError

Params = Dict[str, Any]
# Current Flax auto-names the parts of an encoder block per type; the published
# files were written when the counter ran over all children of the block.
_CURRENT_TO_PUBLISHED = {
    'LayerNorm_1': 'LayerNorm_2',
    'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
    'MlpBlock_0': 'MlpBlock_3',
}
_BLOCK = re.compile(r'encoderblock_\d+$')
AUGREG_DIR = 'gs://vit_models/augreg'  # index.csv and {filename}.npz of "How to train your ViT?"
AUGREG_PREFIX = 'augreg:'
AUGREG_COLUMNS = ('name', 'ds', 'final_val', 'filename', 'adapt_filename')


def published_names(flat: Mapping[str, Any]) -> Dict[str, Any]:
  """Renames encoder-block children written with current Flax auto-names
  (`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`) to the
  published ones; trees already in the published form are returned as they are."""
  if not any('/MultiHeadDotProductAttention_0/' in k for k in flat):
    return dict(flat)
  renamed = {}
  for key, value in flat.items():
    parts = key.split('/')
    for i in range(1, len(parts)):
      if _BLOCK.match(parts[i - 1]):
        parts[i] = _CURRENT_TO_PUBLISHED.get(parts[i], parts[i])
    renamed['/'.join(parts)] = value
  return renamed


def from_big_vision(flat: Mapping[str, Any]) -> Dict[str, Any]:
  """A big_vision ViT checkpoint (its `vit_i1k` baselines, SigLIP image towers,
  FlexiViT) in our layout; other files are returned as they are.

  big_vision writes whole checkpoints under 'params/' (the image tower of a
  two-tower model under 'params/img/'), keeps the learned position embedding at
  the root without a class-token row (it prepends the class token after adding
  it), may scan the blocks into one 'Transformer/encoderblock' with the layer
  axis first, and names block children as current Flax does."""
  flat = dict(flat)
  for prefix in ('params/', 'img/'):
    inner = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
    if inner and (prefix == 'params/' or any(k.startswith('img/embedding/') for k in flat)):
      flat = inner
  scanned = {k: v for k, v in flat.items() if k.startswith('Transformer/encoderblock/')}
  for key, value in scanned.items():
    del flat[key]
    rest = key[len('Transformer/encoderblock/'):]
    for i, layer in enumerate(value):
      flat[f'Transformer/encoderblock_{i}/{rest}'] = layer
  if 'pos_embedding' in flat:
    posemb = flat.pop('pos_embedding')
    if 'cls' in flat:  # the class token enters after the embedding: its row is zero
      posemb = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
    flat['Transformer/posembed_input/pos_embedding'] = posemb
  return flat


def _flatten(params: Mapping[str, Any]) -> Dict[str, Any]:
  params = flax.core.unfreeze(params)
  if set(params) == {'params'}:
    params = params['params']
  return flax.traverse_util.flatten_dict(params, sep='/')


def _unflatten(flat: Mapping[str, Any]) -> Params:
  return flax.traverse_util.unflatten_dict(dict(flat), sep='/')


def load(path: str) -> Params:
  """Reads a published (or our) `.npz` as a nested parameter dict of numpy arrays.

  Files with current-Flax block names and big_vision ViT files
  (`from_big_vision`) load under the published names. Pickled objects are refused.
  """
  path = epath.Path(path)
  if not path.exists():
    raise CheckpointError(f'Checkpoint {path} does not exist. Public ones live under '
                          'gs://vit_models/imagenet21k/, gs://vit_models/augreg/, '
                          'gs://bit_models/ and gs://mixer_models/; download one or point '
                          'to your own .npz.')
  source = os.fspath(path) if '://' not in os.fspath(path) else io.BytesIO(path.read_bytes())
  try:
    with np.load(source, allow_pickle=False) as data:
      flat = {key: data[key] for key in data.files}
  except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
    raise CheckpointError(
        f'{path} is not a readable .npz parameter file ({type(e).__name__}: {e}). It may be '
        'truncated or corrupt: download it again or use an earlier copy.') from e
  if not flat:
    raise CheckpointError(f'{path} holds no arrays.')
  return _unflatten(published_names(from_big_vision(flat)))


def save(path: str, params: Mapping[str, Any]) -> None:
  """Writes `params` (or `{'params': params}`) as a published-layout `.npz`.

  Floating arrays are stored as float32, as in the public files. The file is
  written beside the target and renamed over it, so a kill never leaves a
  partial file under `path`.
  """
  flat = published_names(_flatten(params))
  arrays = {}
  for key, value in flat.items():
    value = np.asarray(value)
    arrays[key] = value.astype(np.float32) if jnp.issubdtype(value.dtype, jnp.floating) else value
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / f'.{path.name}.tmp-{os.getpid()}'
  if '://' in os.fspath(path):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    tmp.write_bytes(buffer.getvalue())
    tmp.rename(path)
    return
  try:
    with open(tmp, 'wb') as f:
      np.savez(f, **arrays)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def load_pretrained(path: str, init_params: Mapping[str, Any], model_config: Any,
                    grid_shape: Optional[Sequence[int]] = None, keep_head: bool = False
                    ) -> Params:
  """Parameters for fine-tuning: the checkpoint at `path` fitted to a new model.

  `init_params` are the new model's freshly initialised parameters and
  `model_config` its config (`vit_jax.models.get_config`). The head is taken
  from `init_params`; the family fits the rest (`Family.fit_checkpoint`: for a
  ViT, `pre_logits` dropped without a representation size and position
  embeddings resized to the new grid, `grid_shape` inferred when square).
  Anything else that differs raises a CheckpointError listing missing,
  unexpected and wrongly shaped keys. `keep_head` keeps the checkpoint's head
  instead (a second stage of fine-tuning on the same classes).
  """
  restored = _flatten(load(path))
  init = _flatten(init_params)
  family = models.family_of(model_config)
  if not keep_head:
    restored = {k: v for k, v in restored.items() if not k.startswith(family.head)}
    restored.update({k: v for k, v in init.items() if k.startswith(family.head)})
  restored = family.fit_checkpoint(restored, init, model_config, grid_shape, str(path))
  check_matches(restored, init, str(path))
  return _unflatten({k: np.asarray(v, dtype=init[k].dtype) for k, v in restored.items()})


def check_matches(flat: Mapping[str, Any], reference: Mapping[str, Any], source: str) -> None:
  """Raises a CheckpointError naming every missing, unexpected and misshaped key."""
  missing = sorted(set(reference) - set(flat))
  unexpected = sorted(set(flat) - set(reference))
  misshaped = sorted(f'{k}: checkpoint {tuple(np.shape(flat[k]))}, model '
                     f'{tuple(np.shape(reference[k]))}'
                     for k in set(flat) & set(reference)
                     if np.shape(flat[k]) != np.shape(reference[k]))
  if missing or unexpected or misshaped:
    lines = [f'{source} does not fit the model:']
    for title, keys in (('missing', missing), ('unexpected', unexpected),
                        ('wrongly shaped', misshaped)):
      if keys:
        lines.append(f'  {len(keys)} {title}: ' + ', '.join(keys[:20]) +
                     (', ...' if len(keys) > 20 else ''))
    lines.append('Check that the model name and its overrides match the checkpoint.')
    raise CheckpointError('\n'.join(lines))


def augreg_index(path_or_url: str = AUGREG_DIR) -> List[Dict[str, Any]]:
  """The rows of the AugReg index (`index.csv`, or the directory holding it), one
  per fine-tuning run of a pre-training checkpoint: name ('B/16', 'R26+S/32'), ds
  ('i21k', 'i21k_30', 'i1k'), the hyperparameters, accuracies (floats), filename,
  adapt_filename, ... as the published file has them."""
  path = epath.Path(path_or_url)
  if not os.fspath(path).endswith('.csv'):
    path = path / 'index.csv'
  if not path.exists():
    raise CheckpointError(
        f'No AugReg index at {path}. It is published at {AUGREG_DIR}/index.csv: copy it and '
        'the .npz files you need into a directory (gsutil cp) and name that directory '
        '(--config.augreg_dir).')
  rows = list(csv.DictReader(io.StringIO(path.read_text())))
  missing = [c for c in AUGREG_COLUMNS if not rows or c not in rows[0]]
  if missing:
    raise CheckpointError(f'{path} is not an AugReg index: it lacks the columns {missing}.')
  for row in rows:
    for key, value in row.items():
      try:
        row[key] = float(value)
      except (TypeError, ValueError):
        pass
  return rows


def augreg_model_name(name: str) -> str:
  """The zoo name of an AugReg model name: 'B/16' -> 'ViT-B_16', 'R26+S/32' ->
  'R26+ViT-S_32'."""
  body, _, rest = name.rpartition('+')
  size, _, patch = rest.partition('/')
  return f'{body + "+" if body else ""}ViT-{size}_{patch}'


def augreg_select(index: Sequence[Mapping[str, Any]], spec: str) -> Mapping[str, Any]:
  """The index row of `spec`: an exact pre-training or fine-tuned filename, or a
  model name with an optional pre-training dataset, 'B/16' or 'B/16@i1k' (default
  i21k), whose recommended checkpoint is the one with the best final validation
  accuracy (`final_val`) among that name's pre-training runs."""
  for row in index:
    if spec in (row['filename'], row['adapt_filename']):
      return row
  name, _, ds = spec.partition('@')
  ds = ds or 'i21k'
  rows = [row for row in index if row['name'] == name and row['ds'] == ds]
  if not rows:
    known = sorted({f"{row['name']}@{row['ds']}" for row in index})
    raise CheckpointError(f'No AugReg checkpoint {spec!r} (model {name!r} pre-trained on '
                          f'{ds!r}) in the index; it has {", ".join(known)}, or give an exact '
                          'filename.')
  return max(rows, key=lambda row: row['final_val'])


def augreg_lookup(spec: str, augreg_dir: Optional[str] = None
                  ) -> Tuple[str, Mapping[str, Any]]:
  """The file and index row of an AugReg name or filename (`augreg_select`), through
  the index in `augreg_dir` (default the public bucket)."""
  directory = (augreg_dir or AUGREG_DIR).rstrip('/')
  row = augreg_select(augreg_index(directory), spec)
  filename = row['adapt_filename'] if spec == row['adapt_filename'] else row['filename']
  return f'{directory}/{filename}.npz', row


def resolve(pretrained: str, augreg_dir: Optional[str] = None) -> str:
  """The file a `pretrained` setting names: 'augreg:<name or filename>' through the
  AugReg index (`augreg_lookup`), anything else as it is."""
  if not pretrained.startswith(AUGREG_PREFIX):
    return pretrained
  return augreg_lookup(pretrained[len(AUGREG_PREFIX):], augreg_dir)[0]


def to_timm(params: Mapping[str, Any], model_name: str) -> Dict[str, np.ndarray]:
  """The timm `state_dict` (name -> float32 array in PyTorch's layout) of a ViT,
  hybrid or BiT parameter tree: what timm's own `.npz` loader would produce
  from our saved file. Wrap the arrays with `torch.from_numpy` to load them."""
  flat = {k: np.asarray(v, np.float32) for k, v in published_names(_flatten(params)).items()}
  family = models.family_of(models.get_config(model_name)).name
  if family == 'bit':
    return _bit_to_timm(flat)
  if family != 'vit':
    raise ValueError(f'timm export covers the ViT, hybrid and BiT families, not {model_name}.')
  if any(k.startswith('pre_logits/') for k in flat):
    raise ValueError('timm ViTs have no pre_logits (representation) layer; export a model '
                     'without representation_size.')
  posembs = {k for k in flat if k.startswith('Transformer/posembed')}
  if posembs != {'Transformer/posembed_input/pos_embedding'}:
    raise ValueError('timm ViTs take one learned 1-D position embedding at the input '
                     '(posemb="learn", posemb_where="input") only.')
  out = {}
  if 'conv_root/kernel' in flat:
    out.update(_hybrid_backbone_to_timm(flat))
  out['patch_embed.proj.weight'] = _oihw(flat['embedding/kernel'])
  out['patch_embed.proj.bias'] = flat['embedding/bias']
  if 'cls' in flat:
    out['cls_token'] = flat['cls']
  out['pos_embed'] = flat['Transformer/posembed_input/pos_embedding']
  blocks = sorted({int(k.split('/')[1].split('_')[1]) for k in flat
                   if k.startswith('Transformer/encoderblock_')})
  for i in blocks:
    p, t = f'Transformer/encoderblock_{i}/', f'blocks.{i}.'
    out.update(_attention_to_timm(flat, p + 'MultiHeadDotProductAttention_1/', t + 'attn.'))
    out.update(_layernorm_to_timm(flat, p + 'LayerNorm_0/', t + 'norm1.'))
    out.update(_layernorm_to_timm(flat, p + 'LayerNorm_2/', t + 'norm2.'))
    out.update(_mlp_to_timm(flat, p + 'MlpBlock_3/', t + 'mlp.'))
  out.update(_layernorm_to_timm(flat, 'Transformer/encoder_norm/', 'norm.'))
  if 'MAPHead_0/probe' in flat:
    p, t = 'MAPHead_0/', 'attn_pool.'
    attention = p + 'MultiHeadDotProductAttention_0/'
    out[t + 'latent'] = flat[p + 'probe']
    heads = lambda name: flat[f'{attention}{name}/kernel'].reshape(
        flat[f'{attention}{name}/kernel'].shape[0], -1).T
    out[t + 'q.weight'] = heads('query')
    out[t + 'q.bias'] = flat[attention + 'query/bias'].reshape(-1)
    out[t + 'kv.weight'] = np.concatenate([heads('key'), heads('value')])
    out[t + 'kv.bias'] = np.concatenate([flat[attention + f'{n}/bias'].reshape(-1)
                                         for n in ('key', 'value')])
    out[t + 'proj.weight'] = _out_projection(flat[attention + 'out/kernel'])
    out[t + 'proj.bias'] = flat[attention + 'out/bias']
    out.update(_layernorm_to_timm(flat, p + 'LayerNorm_0/', t + 'norm.'))
    out.update(_mlp_to_timm(flat, p + 'MlpBlock_0/', t + 'mlp.'))
  if 'head/kernel' in flat:
    out['head.weight'], out['head.bias'] = flat['head/kernel'].T, flat['head/bias']
  return out


def _oihw(kernel: np.ndarray) -> np.ndarray:
  """A Flax conv kernel (HWIO) in PyTorch's layout (OIHW)."""
  return kernel.transpose(3, 2, 0, 1)


def _out_projection(kernel: np.ndarray) -> np.ndarray:
  """(heads, head_dim, D) attention output kernel -> (D, heads * head_dim) Linear weight."""
  return kernel.reshape(-1, kernel.shape[-1]).T


def _attention_to_timm(flat, p, t):
  kernels = [flat[f'{p}{n}/kernel'] for n in ('query', 'key', 'value')]
  return {t + 'qkv.weight': np.concatenate([k.reshape(k.shape[0], -1).T for k in kernels]),
          t + 'qkv.bias': np.concatenate([flat[f'{p}{n}/bias'].reshape(-1)
                                          for n in ('query', 'key', 'value')]),
          t + 'proj.weight': _out_projection(flat[p + 'out/kernel']),
          t + 'proj.bias': flat[p + 'out/bias']}


def _layernorm_to_timm(flat, p, t):
  return {t + 'weight': flat[p + 'scale'], t + 'bias': flat[p + 'bias']}


def _mlp_to_timm(flat, p, t):
  return {f'{t}fc{r + 1}.{kind}': flat[f'{p}Dense_{r}/{name}'].T if kind == 'weight'
          else flat[f'{p}Dense_{r}/{name}']
          for r in range(2) for kind, name in (('weight', 'kernel'), ('bias', 'bias'))}


def _hybrid_backbone_to_timm(flat):
  """The hybrid's ResNet under timm's `patch_embed.backbone`."""
  stages = sorted({k.split('/')[0] for k in flat if re.match(r'block\d+/', k)})
  stem = 'patch_embed.backbone.' + ('stem.' if stages else '')
  out = {stem + 'conv.weight': _oihw(flat['conv_root/kernel']),
         stem + 'norm.weight': flat['gn_root/scale'], stem + 'norm.bias': flat['gn_root/bias']}
  for key, value in flat.items():
    m = re.match(r'block(\d+)/unit(\d+)/(conv|gn)(\d|_proj)/(kernel|scale|bias)$', key)
    if not m:
      continue
    stage, unit, kind, index, name = m.groups()
    t = f'patch_embed.backbone.stages.{int(stage) - 1}.blocks.{int(unit) - 1}.'
    module = ('downsample.' + ('conv' if kind == 'conv' else 'norm') if index == '_proj'
              else ('conv' if kind == 'conv' else 'norm') + index)
    out[f'{t}{module}.{"weight" if name != "bias" else "bias"}'] = (
        _oihw(value) if name == 'kernel' else value)
  return out


def _bit_to_timm(flat):
  """BiT (`resnet/...`) in timm's ResNetV2 names."""
  out = {'stem.conv.weight': _oihw(flat['resnet/root_block/standardized_conv2d/kernel']),
         'norm.weight': flat['resnet/group_norm/gamma'],
         'norm.bias': flat['resnet/group_norm/beta']}
  if 'resnet/head/conv2d/kernel' in flat:
    out['head.fc.weight'] = _oihw(flat['resnet/head/conv2d/kernel'])
    out['head.fc.bias'] = flat['resnet/head/conv2d/bias']
  names = {'a': '1', 'b': '2', 'c': '3'}
  for key, value in flat.items():
    m = re.match(r'resnet/block(\d+)/unit(\d+)/(a|b|c)/(proj/)?(standardized_conv2d/kernel|'
                 r'group_norm/gamma|group_norm/beta)$', key)
    if not m:
      continue
    stage, unit, part, proj, leaf = m.groups()
    t = f'stages.{int(stage) - 1}.blocks.{int(unit) - 1}.'
    if proj:
      out[t + 'downsample.conv.weight'] = _oihw(value)
    elif leaf.endswith('kernel'):
      out[f'{t}conv{names[part]}.weight'] = _oihw(value)
    else:
      out[f'{t}norm{names[part]}.{"weight" if leaf.endswith("gamma") else "bias"}'] = value
  return out
