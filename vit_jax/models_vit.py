"""The original vit_jax's `models_vit`: the ViT and its parts (`vit_jax.models.original`)."""
from vit_jax.models.original import (  # noqa: F401
    AddPositionEmbs, Encoder, Encoder1DBlock, IdentityLayer, MlpBlock, VisionTransformer)
