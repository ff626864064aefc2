"""The original vit_jax's `models_resnet`: the hybrids' ResNet parts."""
from vit_jax.original.models import ResidualUnit, ResNetStage  # noqa: F401
from vit_jax.models.resnet import StdConv, weight_standardize  # noqa: F401
