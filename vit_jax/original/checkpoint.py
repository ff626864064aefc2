"""The original vit_jax's checkpoint functions (docs/original.md), on the project's
readers and fine-tuning (`vit_jax.training.finetune`); the original's `load` is the
project's own `vit_jax.checkpoint.load`. Imported as `vit_jax.checkpoint.<name>`.
"""
import logging
import os
from typing import Any, Sequence

import flax
import jax.numpy as jnp
import numpy as np
from etils import epath

from vit_jax import files
from vit_jax.files import Params, atomic_write, unflatten
from vit_jax.models.family import CheckpointError
from vit_jax.original import fields
from vit_jax import models as zoo

ORIGINAL_NAMES = ('copy', 'get_augreg_df', 'inspect_params', 'interpolate_posembed',
                  'load_pretrained', 'recover_tree')


def inspect_params(*, params: Any, expected: Any, fail_if_extra: bool = True,
                   fail_if_missing: bool = True) -> Any:
  """`params` checked against the keys of `expected`; empty sub-trees that
  `expected` has (a ViT's parameterless `pre_logits`) are added to `params`.

  Args:
    params: a nested parameter tree.
    expected: the tree the model wants.
    fail_if_extra: raise on keys `expected` lacks.
    fail_if_missing: raise on keys `params` lacks.

  Returns:
    `params`.

  Raises:
    ValueError: missing or extra keys, where told to fail on them.
  """
  tree = lambda t: flax.traverse_util.flatten_dict(flax.core.unfreeze(t), keep_empty_nodes=True,
                                                   sep='/')
  have, want = tree(params), tree(expected)
  for key in [k for k in want.keys() - have.keys()
              if want[k] is flax.traverse_util.empty_node]:
    params[key] = {}
    have[key] = want[key]
  missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
  if (missing and fail_if_missing) or (extra and fail_if_extra):
    raise ValueError(f'Missing params from checkpoint: {missing}. '
                     f'Extra params in checkpoint: {extra}.')
  return params


def recover_tree(keys: Sequence[str], values: Sequence[Any]) -> Params:
  """The nested dict of '/'-joined `keys` and their `values`.

  Args:
    keys: the flat names.
    values: the leaves.

  Returns:
    The nested tree.
  """
  return unflatten(dict(zip(keys, values)))


def copy(src: str, dst: str, progress: bool = True, block_size: int = 10 * 1024 * 1024) -> None:
  """Copies a file (local or any filesystem `etils.epath` reads) to `dst`, which
  appears whole or not at all.

  Args:
    src: the source.
    dst: the destination.
    progress: show a progress bar.
    block_size: bytes per read.
  """
  source = epath.Path(src)
  if not source.exists():
    raise CheckpointError(f'{src} does not exist (or cannot be reached from here): download '
                          f'it by hand to {dst}.')
  blocks = range(-(-source.stat().length // block_size))
  if progress:
    import tqdm  # pylint: disable=import-outside-toplevel
    blocks = tqdm.tqdm(blocks, desc=os.path.basename(src))
  with source.open('rb') as fin, atomic_write(dst, 'wb') as fout:
    for _ in blocks:
      fout.write(fin.read(block_size))


def load_pretrained(*, pretrained_path: str, init_params: Any, model_config: Any) -> Any:
  """Fine-tuning's start, with the original's keywords: the checkpoint fitted to
  the model of `model_config` (an original model config) by `files.load_pretrained`
  (new head from `init_params`, pre-logits dropped without a representation size,
  position embeddings resized to the new grid).

  Args:
    pretrained_path: the checkpoint.
    init_params: the new model's initialised parameters.
    model_config: its original model config (`MODEL_CONFIGS[name]`).

  Returns:
    The parameters, a FrozenDict like `init_params`.
  """
  init = flax.core.unfreeze(init_params)
  params = files.load_pretrained(pretrained_path, init, fields.project_config(model_config))
  return flax.core.freeze(params)


def interpolate_posembed(posemb: Any, num_tokens: int, has_class_token: bool) -> jnp.ndarray:
  """Position embeddings (1, N, D) of a square grid resized to `num_tokens` rows
  (`vit.interpolate_posembed`), the class token's row kept first.

  Args:
    posemb: the embeddings.
    num_tokens: the rows wanted, the class token's included.
    has_class_token: whether the first row is the class token's.

  Returns:
    The (1, num_tokens, D) embeddings.
  """
  posemb = np.asarray(posemb)
  head = int(has_class_token)
  old, new = len(posemb[0]) - head, num_tokens - head
  old_side, new_side = round(old ** .5), round(new ** .5)
  if posemb.shape[0] != 1 or old_side ** 2 != old or new_side ** 2 != new:
    raise ValueError(f'Position embeddings {posemb.shape} (class token: {has_class_token}) and '
                     f'{num_tokens} tokens are not square grids; resize with '
                     'vit_jax.models.vit.interpolate_posembed, naming both grids.')
  logging.info('interpolate_posembed: grid-size from %s to %s', old_side, new_side)
  grid = zoo.vit.interpolate_posembed(posemb[:, head:], (old_side, old_side),
                                         (new_side, new_side))
  return jnp.array(np.concatenate([posemb[:, :head], grid], axis=1))


def get_augreg_df(directory: str = files.AUGREG_DIR) -> Any:
  """The AugReg index (`directory/index.csv`) as a pandas DataFrame: one row per
  fine-tuning of a pre-training checkpoint (name, ds, lr, aug, wd, do, sd,
  best_val, final_val, adapt_*, filename, adapt_filename, ...).

  Args:
    directory: the directory holding `index.csv`.

  Returns:
    The DataFrame.
  """
  import pandas as pd  # pylint: disable=import-outside-toplevel
  files.augreg_index(directory)  # a missing or wrong index, in one sentence
  with epath.Path(directory, 'index.csv').open() as f:
    return pd.read_csv(f)
