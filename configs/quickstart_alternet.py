"""Quick start: a small AlterNet trained from scratch on Fashion-MNIST.

    python -m vit_jax.train --config configs/quickstart_alternet.py --workdir workdirs/quickstart_alternet
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  # AlterNet's bottleneck layout at half width over three stages of 1, 2, 2 blocks,
  # the last block of stages 2 and 3 an MSA block (2 and 4 heads of 32); the stem
  # keeps its 7x7/2 conv but not the max-pool, as the quick-start ResNet's root,
  # so 28 px images give stage maps 14, 7, 4 and each MSA's window spans its map.
  config.model_name = 'AlterNet-50'
  config.model = ml_collections.ConfigDict(dict(
      num_layers=(1, 2, 2), num_msa=(0, 1, 1), num_heads=(1, 2, 4), width=32, head_dim=32,
      stem_pool=False, dtype='float32'))
  config.dataset = 'fashion_mnist'
  config.image_size = 28
  config.inception_crop = False
  config.batch_size = 128
  config.num_epochs = 8  # its step costs about 1.1x the quick-start ResNet's: the same time
  config.optimizer = 'sgd'
  config.lr = 0.1
  config.warmup_steps = 200
  config.weight_decay = 1e-4
  config.label_smoothing = 0.1
  return config
