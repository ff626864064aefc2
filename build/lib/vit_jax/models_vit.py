"""The original vit_jax's `models_vit`: the ViT and its parts (`vit_jax.original.models`)."""
from vit_jax.original.models import (  # noqa: F401
    AddPositionEmbs, Encoder, Encoder1DBlock, IdentityLayer, MlpBlock, VisionTransformer)
