"""Quick start: a small ViT trained from scratch on Fashion-MNIST, on CPU in minutes.

    python -m vit_jax.train --config configs/quickstart_vit.py --workdir workdirs/quickstart_vit
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  config.tier = 'quick-start'
  # A ViT-Ti layout shrunk to 4 blocks of width 64 on 4x4 patches of 28 px images.
  config.model_name = 'ViT-Ti_16'
  config.model = ml_collections.ConfigDict(dict(
      patch_size=4, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=4, classifier='gap',
      dtype='float32'))
  config.dataset = 'fashion_mnist'
  config.image_size = 28
  config.input.crop = False  # resize and flip only: the images are already centred
  config.batch_size = 128
  config.num_epochs = 13
  config.optimizer = 'adam'
  config.lr = 2e-3
  config.warmup_steps = 200
  config.weight_decay = 1e-4
  config.label_smoothing = 0.1
  return config
