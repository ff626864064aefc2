"""The config of `vit_jax.inference_time`: time a model's forward pass.

    python -m vit_jax.main --workdir=/tmp/timing \
        --config=$(pwd)/vit_jax/configs/inference_time.py \
        --config.batch=64 --config.num_classes=1000 --config.image_size=224
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The timing config.

  Returns:
    The config: `model_name` (a `models.MODEL_CONFIGS` key), `batch`,
    `num_classes` and `image_size` (each must be set), the steps timed after
    `initial_steps`, and `log_dir`.
  """
  return ml_collections.ConfigDict(dict(
      model_name='ViT-B_32', log_dir='.', steps=30, initial_steps=10, batch=0, num_classes=0,
      image_size=0, trainer='inference_time',
      train='inference_time'))  # the original's name of `trainer` in this file
