"""The original vit_jax's `models_lit`: LiT and its text towers."""
from vit_jax.models.lit import LIT_DIR as BASE_PATH  # noqa: F401
from vit_jax.models.lit import BertModel, TextTransformer  # noqa: F401
from vit_jax.original.models import LitModel  # noqa: F401
