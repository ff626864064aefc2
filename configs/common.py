"""Fields every recipe has, with neutral defaults; recipes override what they set.

Each field's default and what it allows are declared together in
`vit_jax.training.settings.FIELDS`."""
import ml_collections

from vit_jax import training


def base_config() -> ml_collections.ConfigDict:
  return training.base_config()


def vit_fine_tuning(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with the ViT paper's fine-tuning recipe, as vit_jax fine-tunes: SGD
  (momentum 0.9) at lr 0.03, batch 512 in 8 accumulated pieces, 10k steps with
  500 warm-up steps and cosine decay, global-norm clipping at 1, no weight decay.

  Args:
    config: a recipe.

  Returns:
    The recipe, changed.
  """
  config.batch_size = 512
  config.accum_steps = 8
  config.total_steps = 10_000
  config.optimizer = 'sgd'
  config.lr = 0.03
  config.warmup_steps = 500
  config.weight_decay = 0.
  return config
