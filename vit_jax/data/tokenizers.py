"""Text to token ids as LiT's preprocessing makes them, in Python.

'bert': lower-cased WordPiece over a BERT vocabulary (`.txt`, one token a
line), cut to `max_len - 1` tokens, zero-padded, and `[CLS]` put first (the
BERT tower reads it), as TensorFlow Text's `BertTokenizer(lower_case=True)`
splits and pieces text. 'sentencepiece': a SentencePiece model (`.model`)
with an end-of-sequence token added, cut to `max_len - 1` tokens and padded
with that token, so the last position is always `</s>` (the small text tower
reads it). Both work on a batch of texts (`__call__`), and for the original
vit_jax's users inside a `tf.data` map (`preprocess_tf`, with TensorFlow).
"""
import dataclasses
import unicodedata
from typing import Any, Dict, List, Sequence, Tuple, Union

import numpy as np
from etils import epath

from vit_jax.errors import UserError
from vit_jax.models.family import CheckpointError
from vit_jax.models.lit import LIT_DIR

# TensorFlow Text's BERT splitting (tensorflow_text/python/ops/bert_tokenizer.py,
# _DELIM_REGEX and BasicTokenizer.tokenize): after lower-casing, control and format
# characters become spaces; ASCII whitespace separates words; punctuation, ASCII
# symbols and CJK ideographs are words of their own.
_WHITESPACE = frozenset(' \t\n\r\f')
_ASCII_SYMBOLS = frozenset('!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~')
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# Unicode's default-ignorable code points, which NFKC_Casefold removes.
_IGNORABLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
              (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
              (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
              (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
              (0xE0000, 0xE0FFF))
# Words longer than this (in UTF-8 bytes) are unknown.
_MAX_WORD_BYTES = 100


def _within(char: str, ranges: Sequence[Tuple[int, int]]) -> bool:
  return any(low <= ord(char) <= high for low, high in ranges)


def _alone(char: str) -> bool:
  """Whether a character is a word of its own: punctuation, an ASCII symbol, CJK."""
  return (unicodedata.category(char).startswith('P') or char in _ASCII_SYMBOLS
          or _within(char, _CJK))


def lower_case(text: str) -> str:
  """BERT's lower-casing as TensorFlow Text does it: Unicode's NFKC_Casefold
  (compatibility forms, case folding, default-ignorable characters removed),
  then the accents removed (NFD, the non-spacing marks dropped).

  Args:
    text: the text.

  Returns:
    The lower-cased text.
  """
  folded = unicodedata.normalize('NFKC', unicodedata.normalize('NFKC', text).casefold())
  return ''.join(c for c in unicodedata.normalize('NFD', folded)
                 if unicodedata.category(c) != 'Mn' and not _within(c, _IGNORABLE))


def bert_words(text: str) -> List[str]:
  """The words BERT's basic tokenizer makes of `text`: `lower_case`, control and
  format characters as spaces, split at ASCII whitespace, each punctuation mark,
  ASCII symbol and CJK ideograph a word of its own.

  Args:
    text: the text.

  Returns:
    The words.
  """
  words, word = [], []
  for char in lower_case(text):
    if unicodedata.category(char) in ('Cc', 'Cf'):
      char = ' '
    if char in _WHITESPACE or _alone(char):
      if word:
        words.append(''.join(word))
        word = []
      if char not in _WHITESPACE:
        words.append(char)
    else:
      word.append(char)
  if word:
    words.append(''.join(word))
  return words


def wordpiece(word: str, vocab: Dict[str, int], unknown: int) -> List[int]:
  """A word's WordPiece ids: the longest vocabulary entry from its start, then
  from where that ends the longest entry with `##` before it, and so on; the
  unknown id alone when some part matches nothing or the word is too long.

  Args:
    word: the word.
    vocab: token -> id.
    unknown: the `[UNK]` id.

  Returns:
    The ids.
  """
  if len(word.encode('utf-8')) > _MAX_WORD_BYTES:
    return [unknown]
  ids, start = [], 0
  while start < len(word):
    for end in range(len(word), start, -1):
      piece = word[start:end] if start == 0 else '##' + word[start:end]
      if piece in vocab:
        ids.append(vocab[piece])
        start = end
        break
    else:
      return [unknown]
  return ids


def tensorflow() -> Any:
  """TensorFlow, for the `preprocess_tf` methods, or an error saying how to install it."""
  try:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise UserError('preprocess_tf runs inside TensorFlow graphs: pip install tensorflow-cpu '
                    '(without it, call the preprocessing on numpy arrays and texts).') from e
  return tf


class _InGraph:
  """A tokenizer's `preprocess_tf`: its call on one text, as a TensorFlow op."""
  max_len: int

  def preprocess_tf(self, text: Any) -> Any:
    """One text's (max_len,) ids, inside a TensorFlow graph (needs TensorFlow).

    Args:
      text: a scalar string tensor.

    Returns:
      The (max_len,) token ids.
    """
    tf = tensorflow()
    ids = tf.numpy_function(lambda t: self([t.decode('utf-8')])[0], [text], tf.int32)
    return tf.ensure_shape(ids, [self.max_len])


def _read(path: str, mode: str, model_name: str) -> Any:
  path = epath.Path(path)
  if not path.exists():
    raise CheckpointError(
        f'The vocabulary {path} does not exist. {model_name} tokenizes with the file '
        f'published beside its checkpoint, {LIT_DIR}/{model_name}{path.suffix}: download it '
        'next to the .npz, or point to it with --vocab.')
  return path.read_bytes() if mode == 'rb' else path.read_text()


@dataclasses.dataclass(frozen=True)
class BertTokenizer(_InGraph):
  """WordPiece with `[CLS]` first and zero padding to `max_len`."""
  vocab_path: str
  max_len: int
  model_name: str = 'this model'

  def __post_init__(self):
    # One token a line, lines ending at '\n' only (a token may hold other line breaks).
    vocab = _read(self.vocab_path, 'r', self.model_name).split('\n')
    if vocab[-1] == '':
      vocab.pop()
    if '[CLS]' not in vocab:
      raise CheckpointError(f'{self.vocab_path} has no [CLS] token: it is not a BERT '
                            'vocabulary.')
    object.__setattr__(self, 'cls_token', vocab.index('[CLS]'))
    object.__setattr__(self, 'vocab_size', len(vocab))
    object.__setattr__(self, '_ids', {token: i for i, token in enumerate(vocab)})

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    """A batch of texts -> (B, max_len) int32 ids."""
    out = np.zeros((len(texts), self.max_len), np.int32)
    out[:, 0] = self.cls_token
    # A vocabulary without [UNK]: the id after its last, as tensorflow_text's lookup
    # gives an unknown word (its out-of-vocabulary bucket).
    unknown = self._ids.get('[UNK]', self.vocab_size)
    for row, text in enumerate(texts):
      ids = [i for word in bert_words(text) for i in wordpiece(word, self._ids, unknown)]
      ids = ids[:self.max_len - 1]
      out[row, 1:1 + len(ids)] = ids
    return out


@dataclasses.dataclass(frozen=True)
class SentencepieceTokenizer(_InGraph):
  """SentencePiece with `</s>` added, cut to keep it, and `</s>` padding."""
  vocab_path: str
  max_len: int
  model_name: str = 'this model'

  def __post_init__(self):
    model = _read(self.vocab_path, 'rb', self.model_name)
    try:
      import sentencepiece  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise UserError('SentencePiece vocabularies need the sentencepiece package: pip install '
                      'sentencepiece (the lit extra, which scripts/setup.sh installs).') from e
    processor = sentencepiece.SentencePieceProcessor(model_proto=model)
    object.__setattr__(self, 'eos_token', int(processor.eos_id()))
    object.__setattr__(self, 'vocab_size', int(processor.get_piece_size()))
    object.__setattr__(self, '_processor', processor)

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    """A batch of texts -> (B, max_len) int32 ids."""
    out = np.full((len(texts), self.max_len), self.eos_token, np.int32)
    for row, ids in enumerate(self._processor.encode(list(texts), add_eos=True)):
      ids = ids[:self.max_len - 1]
      out[row, :len(ids)] = ids
    return out


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
