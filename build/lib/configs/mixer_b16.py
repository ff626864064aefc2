"""Mixer-B/16: fine-tune from ImageNet-21k.

    python -m vit_jax.train --config configs/mixer_b16.py:cifar10 --workdir DIR \
        --config.pretrained=/path/to/Mixer-B_16.npz

Args: cifar10 | cifar100 | imagenet2012, with the vit_jax fine-tuning recipe of
`vit_b16.py` (the original code's Mixer recipe too: SGD momentum 0.9, batch
512, 10k steps, warmup 500, cosine, clip 1.0, no weight decay) at 224 px: a
Mixer's token-mixing MLP fixes the number of patches, so it fine-tunes at the
resolution it was trained at (gs://mixer_models/imagenet21k/Mixer-B_16.npz).
"""
import ml_collections

from configs import vit_b16


def get_config(arg: str = 'cifar10') -> ml_collections.ConfigDict:
  if arg not in vit_b16.FINE_TUNE:
    raise ValueError(f'Unknown arg {arg!r} for mixer_b16.py; use one of '
                     f'{sorted(vit_b16.FINE_TUNE)}.')
  config = vit_b16.get_config(arg)
  config.model_name = 'Mixer-B_16'
  config.pretrained = 'Mixer-B_16.npz'  # gs://mixer_models/imagenet21k/Mixer-B_16.npz, downloaded
  config.image_size = 224
  return config
