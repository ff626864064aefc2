r"""Fine-tunes an AugReg ViT or hybrid ("How to train your ViT?"):
`augreg.py:NAME`, NAME an `models.AUGREG_CONFIGS` key ('R_Ti_16', 'B_16'; the
best ImageNet-21k checkpoint by upstream validation accuracy is taken from the
index) or a whole file name without '.npz':

    python -m vit_jax.main --workdir=/tmp/vit \
        --config=$(pwd)/vit_jax/configs/augreg.py:R_Ti_16 \
        --config.dataset=oxford_iiit_pet --config.pp.train='train[:90%]' \
        --config.base_lr=0.01 --config.pretrained_dir=DIR_WITH_index.csv
"""
import ml_collections

from vit_jax.configs import common
from vit_jax.configs import models


def get_config(model_or_filename: str) -> ml_collections.ConfigDict:
  """The fine-tuning config of an AugReg model.

  Args:
    model_or_filename: an `AUGREG_CONFIGS` key, or a file name starting with one.

  Returns:
    The config; `dataset` must be set on the command line.

  Raises:
    ValueError: an unknown model.
  """
  config = common.get_config()
  config.pretrained_dir = 'gs://vit_models/augreg'
  config.model_or_filename = model_or_filename
  model = model_or_filename.split('-')[0]
  if model not in models.AUGREG_CONFIGS:
    raise ValueError(f'Unknown AugReg model {model!r}; use one of '
                     f'{sorted(models.AUGREG_CONFIGS)}.')
  config.model = models.AUGREG_CONFIGS[model].copy_and_resolve_references()
  config.model.transformer.dropout_rate = 0  # no AugReg regularisation when fine-tuning
  config.base_lr = 0.03
  config.total_steps = 500
  config.warmup_steps = 100
  config.pp = ml_collections.ConfigDict(dict(train='train', test='test', resize=448, crop=384))
  config.dataset = ''  # set on the command line
  return config
