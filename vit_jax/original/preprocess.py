"""The original vit_jax's LiT preprocessing: tokenizers by name, images resized
to [-1, 1], and one `tf.data` map function for both (`vit_jax.data.tokenizers`,
`vit_jax.zeroshot.preprocess_image`). Its `tf.data` parts need TensorFlow, which
the project does not install: they run the numpy code inside the graph."""
import dataclasses
from typing import Any, Callable, Dict, Sequence, Type

import numpy as np

from vit_jax.data import BertTokenizer, SentencepieceTokenizer, TOKENIZERS, tensorflow
from vit_jax.zeroshot import preprocess_image

__all__ = ['BertTokenizer', 'PreprocessImages', 'SentencepieceTokenizer', 'get_pp',
           'get_tokenizer']


def get_tokenizer(tokenizer_name: str) -> Type[Any]:
  """The tokenizer class of 'bert' or 'sentencepiece'; build it with
  `(vocab_path=..., max_len=...)`.

  Args:
    tokenizer_name: the name.

  Returns:
    The class.
  """
  if tokenizer_name not in TOKENIZERS:
    raise ValueError(f'Unknown tokenizer {tokenizer_name!r}; use one of {tuple(TOKENIZERS)}.')
  return TOKENIZERS[tokenizer_name]


@dataclasses.dataclass(frozen=True)
class PreprocessImages:
  """uint8 images resized to size x size (with `crop`: the short side to `size`,
  then the centre) and scaled to [-1, 1]."""
  size: int
  crop: bool = False

  def preprocess_tf(self, image: Any) -> Any:
    """One uint8 image, inside a TensorFlow graph (needs TensorFlow).

    Args:
      image: (H, W, C) uint8.

    Returns:
      (size, size, 3) float32 in [-1, 1].
    """
    tf = tensorflow()
    if image.dtype != tf.uint8:
      raise ValueError(f'PreprocessImages takes uint8 images, not {image.dtype.name}.')
    out = tf.numpy_function(lambda x: preprocess_image(x, self.size, self.crop), [image],
                            tf.float32)
    return tf.ensure_shape(out, [self.size, self.size, 3])

  def __call__(self, images: Sequence[np.ndarray]) -> np.ndarray:
    """A sequence of uint8 images of any sizes -> (N, size, size, 3) numpy."""
    return np.stack([preprocess_image(image, self.size, self.crop) for image in images])


def get_pp(*, tokenizer_name: str, vocab_path: str, max_len: int, size: int,
           crop: bool = False) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
  """A `tf.data` map function: 'image' resized (`PreprocessImages`), 'text'
  tokenized into a new 'tokens'; features without them pass unchanged.

  Args:
    tokenizer_name: 'bert' or 'sentencepiece'.
    vocab_path: the vocabulary.
    max_len: the token sequence's length.
    size: the images' side.
    crop: resize the short side, then crop the centre.

  Returns:
    The function.
  """
  tokenizer = get_tokenizer(tokenizer_name)(vocab_path=vocab_path, max_len=max_len)
  images = PreprocessImages(size=size, crop=crop)

  def pp(features: Dict[str, Any]) -> Dict[str, Any]:
    features = dict(features)
    if 'image' in features:
      features['image'] = images.preprocess_tf(features['image'])
    if 'text' in features:
      features['tokens'] = tokenizer.preprocess_tf(features['text'])
    return features

  return pp
