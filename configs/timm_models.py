"""The ViTs studied today from timm's files (DINOv3, DINOv2 with and without registers,
SigLIP, CLIP, DeiT): analysed, or fine-tuned, at the resolution they were trained
at, with the pixel statistics their zoo entry declares.

    python -m analysis attention_distance --config configs/timm_models.py:DINOv2-S_14 \
        --checkpoint vit_small_patch14_dinov2.safetensors --out DIR
    python -m vit_jax.train --config configs/timm_models.py:DeiT-S_16 --workdir DIR \
        --config.pretrained=deit_small_patch16_224.safetensors

Arg: a name of `vit_jax.models.vit.TIMM_VARIANTS` (the file is timm's
`timm_name` of it, saved as a state dict). Fine-tuning follows the ViT paper's
recipe (SGD momentum 0.9, batch 512, 10k steps, warm-up 500, cosine, clip 1.0)
on CIFAR-10 with a new head.
"""
import ml_collections

from configs import common
from vit_jax.models.vit import TIMM_VARIANTS


def get_config(arg: str = 'DINOv2-S_14') -> ml_collections.ConfigDict:
  if arg not in TIMM_VARIANTS:
    raise ValueError(f'Unknown arg {arg!r} for timm_models.py; use one of '
                     f'{sorted(TIMM_VARIANTS)}.')
  config = common.base_config()
  config.model_name = arg
  config.model = ml_collections.ConfigDict(dict(dtype='bfloat16'))
  config.dataset = 'cifar10'
  config.image_size = TIMM_VARIANTS[arg].resolution
  return common.vit_fine_tuning(config)
