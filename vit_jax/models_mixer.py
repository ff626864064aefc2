"""The original vit_jax's `models_mixer`: the MLP-Mixer (`vit_jax.models.original`)."""
from vit_jax.models.mixer import MixerBlock, MlpBlock  # noqa: F401
from vit_jax.models.original import MlpMixer  # noqa: F401
