"""The original vit_jax's `models_resnet`: the hybrids' ResNet parts."""
from vit_jax.models.original import ResidualUnit, ResNetStage  # noqa: F401
from vit_jax.models.resnet import StdConv, weight_standardize  # noqa: F401
