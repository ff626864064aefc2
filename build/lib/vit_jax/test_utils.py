"""`vit_jax.test_utils`: the original vit_jax's test helper
(`vit_jax/original/test_utils.py`)."""
from vit_jax.original.test_utils import create_checkpoint  # noqa: F401
