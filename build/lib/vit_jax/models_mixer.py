"""The original vit_jax's `models_mixer`: the MLP-Mixer (`vit_jax.original.models`)."""
from vit_jax.models.mixer import MixerBlock, MlpBlock  # noqa: F401
from vit_jax.original.models import MlpMixer  # noqa: F401
