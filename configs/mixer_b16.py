"""Mixer-B/16: fine-tune from ImageNet-21k.

    python -m vit_jax.train --config configs/mixer_b16.py:cifar10 --workdir DIR \
        --config.pretrained=/path/to/Mixer-B_16.npz

Args: cifar10 | cifar100 | imagenet2012, fine-tuned with the original vit_jax
Mixer recipe (SGD momentum 0.9, batch 512, 10k steps, warmup 500, cosine, clip
1.0, no weight decay) at 224 px: a Mixer's token-mixing MLP fixes the number of
patches, so it fine-tunes at the resolution it was trained at
(gs://mixer_models/imagenet21k/Mixer-B_16.npz).
"""
import ml_collections

from configs import common

EVAL_SPLITS = {'cifar10': 'test', 'cifar100': 'test', 'imagenet2012': 'validation'}


def get_config(arg: str = 'cifar10') -> ml_collections.ConfigDict:
  if arg not in EVAL_SPLITS:
    raise ValueError(f'Unknown arg {arg!r} for mixer_b16.py; use one of {sorted(EVAL_SPLITS)}.')
  config = common.base_config()
  config.model_name = 'Mixer-B_16'
  config.model = ml_collections.ConfigDict(dict(dtype='bfloat16'))
  config.pretrained = 'Mixer-B_16.npz'  # gs://mixer_models/imagenet21k/Mixer-B_16.npz, downloaded
  config.dataset = arg
  config.eval_split = EVAL_SPLITS[arg]
  config.image_size = 224
  config.batch_size = 512
  config.accum_steps = 8
  config.total_steps = 10_000
  config.optimizer = 'sgd'
  config.lr = 0.03
  config.warmup_steps = 500
  config.weight_decay = 0.
  return config
