"""The path of the project's reading and writing of parameter files (`vit_jax.files`:
`load`, `read`, `save`, `from_pretrained`, ...), and of the original vit_jax's names
there (`load_pretrained`, `inspect_params`, ...: vit_jax/original/checkpoint.py).
"""
from vit_jax import original
from vit_jax.files import (FORMATS, WHERE_PUBLIC, CheckpointError, from_pretrained, load, read,
                           save, weights_file)

__getattr__ = original.forward(__name__)  # the original vit_jax's names (vit_jax/original/)
