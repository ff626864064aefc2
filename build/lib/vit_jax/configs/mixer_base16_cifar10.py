"""Fine-tunes Mixer-B/16 on CIFAR-10 at 224 px."""
import ml_collections

from vit_jax.configs import common
from vit_jax.configs import models


def get_config() -> ml_collections.ConfigDict:
  """The Mixer-B/16 CIFAR-10 config.

  Returns:
    The config, with `model_type` 'Mixer'.
  """
  config = ml_collections.ConfigDict(common.get_config().to_dict())
  config.model_type = 'Mixer'
  config.model = models.get_mixer_b16_config()
  config.dataset = 'cifar10'
  config.total_steps = 10_000
  config.pp = ml_collections.ConfigDict(dict(train='train[:98%]', test='test', crop=224))
  return config
