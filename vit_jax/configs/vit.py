r"""Fine-tunes a ViT: `vit.py:MODEL,DATASET`, MODEL a `models.get_MODEL_config`
(b16, l16, r50_b16, ...) and DATASET a `common.DATASET_PRESETS` key:

    python -m vit_jax.main --workdir=/tmp/vit \
        --config=$(pwd)/vit_jax/configs/vit.py:b16,cifar10 \
        --config.pretrained_dir=DIR_WITH_ViT-B_16.npz
"""
import ml_collections

from vit_jax.configs import common
from vit_jax.configs import models


def get_config(model_dataset: str) -> ml_collections.ConfigDict:
  """The fine-tuning config of 'MODEL,DATASET'.

  Args:
    model_dataset: e.g. 'b16,cifar10'.

  Returns:
    The config.
  """
  model, dataset = model_dataset.split(',')
  config = common.with_dataset(common.get_config(), dataset)
  config.model = getattr(models, f'get_{model}_config')()
  if (model, dataset) == ('b16', 'cifar10'):
    config.base_lr = 0.01
  return config
