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
  parts = model_dataset.split(',')
  if len(parts) != 2:
    raise ValueError(f'vit.py takes MODEL,DATASET after the colon (e.g. vit.py:b16,cifar10), '
                     f'not {model_dataset!r}.')
  model, dataset = parts
  config = common.with_dataset(common.get_config(), dataset)
  get_model = getattr(models, f'get_{model}_config', None)
  if get_model is None:
    known = sorted(name[len('get_'):-len('_config')] for name in dir(models)
                   if name.startswith('get_') and name.endswith('_config'))
    raise ValueError(f'vit.py knows no model {model!r}; its models are {", ".join(known)}.')
  config.model = get_model()
  if (model, dataset) == ('b16', 'cifar10'):
    config.base_lr = 0.01
  return config
