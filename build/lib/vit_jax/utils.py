"""`vit_jax.utils`: the original vit_jax's training utilities
(`vit_jax/original/utils.py`)."""
from vit_jax.original.utils import (  # noqa: F401
    GFileHandler, accumulate_gradient, add_gfile_logger, create_learning_rate_schedule)
