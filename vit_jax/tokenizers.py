"""Text to token ids as LiT's preprocessing makes them, with TensorFlow Text.

'bert': lower-cased WordPiece over a BERT vocabulary (`.txt`, one token a
line), cut to `max_len - 1` tokens, zero-padded, and `[CLS]` put first (the
BERT tower reads it). 'sentencepiece': a SentencePiece model (`.model`) with
an end-of-sequence token added, cut to `max_len - 1` tokens and padded with
that token, so the last position is always `</s>` (the small text tower reads
it). Both work on a numpy batch (`__call__`) and inside a `tf.data` map
(`preprocess_tf`).
"""
import dataclasses
from typing import Any, Sequence, Union

import numpy as np
import tensorflow as tf
from etils import epath

from vit_jax.errors import UserError
from vit_jax.models.family import CheckpointError
from vit_jax.models.lit import LIT_DIR



def _text():
  """tensorflow_text, or an error saying how to install it beside tensorflow-cpu."""
  try:
    import tensorflow_text  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise UserError(
        'Tokenizing text for LiT needs tensorflow-text: `pip install --no-deps '
        f'tensorflow-text=={tf.__version__}` (its own dependency is the full tensorflow '
        'wheel, which tensorflow-cpu replaces; scripts/setup.sh installs it).') from e
  return tensorflow_text


def _read(path: str, mode: str, model_name: str) -> Any:
  path = epath.Path(path)
  if not path.exists():
    raise CheckpointError(
        f'The vocabulary {path} does not exist. {model_name} tokenizes with the file '
        f'published beside its checkpoint, {LIT_DIR}/{model_name}{path.suffix}: download it '
        'next to the .npz, or point to it with --vocab.')
  return path.read_bytes() if mode == 'rb' else path.read_text()


@dataclasses.dataclass(frozen=True)
class BertTokenizer:
  """WordPiece with `[CLS]` first and zero padding to `max_len`."""
  vocab_path: str
  max_len: int
  model_name: str = 'this model'

  def __post_init__(self):
    vocab = _read(self.vocab_path, 'r', self.model_name).splitlines()
    if '[CLS]' not in vocab:
      raise CheckpointError(f'{self.vocab_path} has no [CLS] token: it is not a BERT vocabulary.')
    object.__setattr__(self, 'cls_token', vocab.index('[CLS]'))
    object.__setattr__(self, 'vocab_size', len(vocab))
    object.__setattr__(self, '_tokenizer', _text().BertTokenizer(
        self.vocab_path, token_out_type=tf.int32, lower_case=True))

  def _batch(self, texts: tf.Tensor) -> tf.Tensor:
    pieces = self._tokenizer.tokenize(texts).merge_dims(-2, -1)
    tokens, _ = _text().pad_model_inputs(pieces, self.max_len - 1)
    return tf.concat([tf.fill([tf.shape(tokens)[0], 1], self.cls_token), tokens], axis=1)

  def preprocess_tf(self, text: tf.Tensor) -> tf.Tensor:
    """One text's (max_len,) ids, inside a TensorFlow graph.

    Args:
      text: a scalar string tensor.

    Returns:
      The (max_len,) token ids.
    """
    return self._batch(text[None])[0]

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    """A batch of texts -> (B, max_len) int32 ids."""
    return self._batch(tf.constant(list(texts))).numpy()


@dataclasses.dataclass(frozen=True)
class SentencepieceTokenizer:
  """SentencePiece with `</s>` added, cut to keep it, and `</s>` padding."""
  vocab_path: str
  max_len: int
  model_name: str = 'this model'

  def __post_init__(self):
    model = _read(self.vocab_path, 'rb', self.model_name)
    tokenizer = _text().SentencepieceTokenizer(model=model, add_eos=True)
    object.__setattr__(self, 'eos_token', int(tokenizer.string_to_id('</s>')))
    object.__setattr__(self, 'vocab_size', int(tokenizer.vocab_size()))
    object.__setattr__(self, '_tokenizer', tokenizer)

  def preprocess_tf(self, text: tf.Tensor) -> tf.Tensor:
    """One text's (max_len,) ids, inside a TensorFlow graph.

    Args:
      text: a scalar string tensor.

    Returns:
      The (max_len,) token ids.
    """
    tokens = self._tokenizer.tokenize(text)[:self.max_len - 1]
    return tf.pad(tokens, [(0, self.max_len - tf.shape(tokens)[0])],
                  constant_values=self.eos_token)

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    """A batch of texts -> (B, max_len) int32 ids."""
    return tf.stack([self.preprocess_tf(tf.constant(t)) for t in texts]).numpy()


TOKENIZERS = {'bert': BertTokenizer, 'sentencepiece': SentencepieceTokenizer}


def get_tokenizer(name: str, vocab_path: str, max_len: int,
                  model_name: str = 'this model'
                  ) -> Union[BertTokenizer, SentencepieceTokenizer]:
  """The tokenizer `name` ('bert' or 'sentencepiece') over the vocabulary at `vocab_path`.

  Args:
    name: 'bert' or 'sentencepiece'.
    vocab_path: the vocabulary file.
    max_len: the token sequence's length.
    model_name: the model it is for, in messages.

  Returns:
    The tokenizer.
  """
  if name not in TOKENIZERS:
    raise ValueError(f'Unknown tokenizer {name!r}; use one of {tuple(TOKENIZERS)}.')
  return TOKENIZERS[name](vocab_path, max_len, model_name)
