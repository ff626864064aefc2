"""`vit_jax.preprocess`: the original vit_jax's LiT preprocessing
(`vit_jax/original/preprocess.py`)."""
from vit_jax.original.preprocess import (  # noqa: F401
    BertTokenizer, PreprocessImages, SentencepieceTokenizer, get_pp, get_tokenizer)
