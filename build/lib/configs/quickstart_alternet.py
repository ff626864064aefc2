"""Quick start: a small AlterNet trained from scratch on Fashion-MNIST.

    python -m vit_jax.train --config configs/quickstart_alternet.py --workdir workdirs/quickstart_alternet
"""
import ml_collections

from configs import quickstart_resnet


def get_config() -> ml_collections.ConfigDict:
  # The quick-start ResNet's recipe (data, SGD, schedule) with AlterNet-50's
  # bottleneck layout at half width over three stages of 1, 2, 2 blocks, the last
  # block of stages 2 and 3 an MSA block (2 and 4 heads of 32); the stem keeps its
  # 7x7/2 conv but not the max-pool, as the ResNet's root, so 28 px images give
  # stage maps 14, 7, 4 and each MSA's window spans its map.
  config = quickstart_resnet.get_config()
  config.model_name = 'AlterNet-50'
  config.model = ml_collections.ConfigDict(dict(
      num_layers=(1, 2, 2), num_msa=(0, 1, 1), num_heads=(1, 2, 4), width=32, head_dim=32,
      stem_pool=False, dtype='float32'))
  config.num_epochs = 8  # its step costs about 1.1x the ResNet's: the same time
  return config
