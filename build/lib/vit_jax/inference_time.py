"""`vit_jax.inference_time`: the original vit_jax's timing of a model's forward pass
(`vit_jax/original/inference_time.py`)."""
from vit_jax.original.inference_time import inference_time  # noqa: F401
