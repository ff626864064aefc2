"""Fields every recipe has, with neutral defaults; recipes override what they set.

Each field's default and what it allows are declared together in
`vit_jax.settings.FIELDS`."""
import ml_collections

from vit_jax import settings


def base_config() -> ml_collections.ConfigDict:
  return settings.base_config()
