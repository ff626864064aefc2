"""Quick start: a small BiT-style ResNetV2 trained from scratch on Fashion-MNIST.

    python -m vit_jax.train --config configs/quickstart_resnet.py --workdir workdirs/quickstart_resnet
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  config.tier = 'quick-start'
  # BiT's R50x1 layout cut to one unit in each of three stages at half width; the
  # root keeps its 7x7/2 conv but not the max-pool, so 28 px images reach the
  # stages at 14x14 (stage maps 14, 7, 4 instead of 7, 4, 2).
  config.model_name = 'BiT-M-R50x1'
  config.model = ml_collections.ConfigDict(dict(
      num_layers=(1, 1, 1), width_factor=0.5, root_pool=False, dtype='float32'))
  config.dataset = 'fashion_mnist'
  config.image_size = 28
  config.input.crop = False
  config.batch_size = 128
  config.num_epochs = 9
  config.optimizer = 'sgd'
  config.lr = 0.1
  config.warmup_steps = 200
  config.weight_decay = 1e-4
  config.label_smoothing = 0.1
  return config
