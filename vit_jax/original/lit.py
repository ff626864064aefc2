"""The original vit_jax's `LitModel` methods, as functions of the model: a LiT
model's files (its checkpoint and vocabulary by `model_name`, in the working
directory or the public bucket) and its preprocessing (`pp`: `tokenizer_name`,
`size`, `max_len`). The original's `LitModel` and the zoo's
`vit_jax.models.lit.LitModel` have them as methods (`vit_jax.original.lit_method`).
"""
import os
from typing import Any, Callable, Dict, Optional

from vit_jax import files
from vit_jax.models.lit import LIT_DIR, TOKENIZERS
from vit_jax.original import preprocess
from vit_jax.original import checkpoint as original_checkpoint


def _local(model: Any, suffix: str) -> Optional[str]:
  local = f'{model.model_name}.{suffix}'
  return local if os.path.exists(local) else None


def _named(model: Any, what: str) -> str:
  if not model.model_name:
    raise ValueError(f'This LiT module has no model_name, so {what} is not known; build it '
                     "with vit_jax.models.get_model('LiT-B16B') or give the path.")
  return model.model_name


def load_variables(model: Any, path: Optional[str] = None, cache: bool = True) -> Dict[str, Any]:
  """The model's variables from `path`; by default from `{model_name}.npz` in the
  working directory, copied there from the public bucket first if absent.

  Args:
    model: the LiT module.
    path: the checkpoint, or None.
    cache: copy the public file into the working directory (without `path`).

  Returns:
    `{'params': ...}` for `apply`.
  """
  name = _named(model, 'its checkpoint')
  if path is None:
    path = _local(model, 'npz')
    if path is None:
      path = f'{LIT_DIR}/{name}.npz'
      if cache:
        original_checkpoint.copy(path, f'{name}.npz')
        path = f'{name}.npz'
  return {'params': files.load(path, name)}


def vocab_path(model: Any) -> str:
  """The vocabulary: `{model_name}.txt` (BERT) or `.model` (SentencePiece) in the
  working directory where it is there, else the public file.

  Args:
    model: the LiT module.

  Returns:
    The path.
  """
  suffix = TOKENIZERS[model.pp['tokenizer_name']]
  return _local(model, suffix[1:]) or f'{LIT_DIR}/{_named(model, "its vocabulary")}{suffix}'


def get_tokenizer(model: Any) -> Any:
  """The model's tokenizer: texts -> (N, max_len) token ids.

  Args:
    model: the LiT module.

  Returns:
    The tokenizer.
  """
  return preprocess.get_tokenizer(model.pp['tokenizer_name'])(
      vocab_path=vocab_path(model), max_len=model.pp['max_len'])


def get_image_preprocessing(model: Any, crop: bool = False) -> Any:
  """Images (a list of uint8 arrays) -> (N, size, size, 3) in [-1, 1].

  Args:
    model: the LiT module.
    crop: resize the short side, then crop the centre.

  Returns:
    A `preprocess.PreprocessImages`.
  """
  return preprocess.PreprocessImages(size=model.pp['size'], crop=crop)


def get_pp(model: Any, crop: bool = False) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
  """A `tf.data` map function: 'image' resized to [-1, 1], 'text' tokenized into 'tokens'.

  Args:
    model: the LiT module.
    crop: resize the short side, then crop the centre.

  Returns:
    The function.
  """
  return preprocess.get_pp(tokenizer_name=model.pp['tokenizer_name'],
                           vocab_path=vocab_path(model), max_len=model.pp['max_len'],
                           size=model.pp['size'], crop=crop)
