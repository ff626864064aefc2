"""ViT-B/16: fine-tune from ImageNet-21k, or pretrain from scratch on ImageNet-1k.

    python -m vit_jax.train --config configs/vit_b16.py:cifar10 --workdir DIR \
        --config.pretrained=/path/to/ViT-B_16.npz

Args: cifar10 | cifar100 | imagenet2012 fine-tune at 384 px with the vit_jax
recipe (SGD momentum 0.9, batch 512, 10k steps, warmup 500, cosine, clip 1.0,
no weight decay; published: 99.02% on CIFAR-10 from imagenet21k/ViT-B_16.npz).
Arg `pretrain` trains on imagenet2012 from scratch with the ViT paper's
ImageNet recipe (Adam, batch 4096, lr 3e-3, weight decay 0.3, 300 epochs,
10k warmup steps, dropout 0.1, representation size 768).
"""
import ml_collections

from configs import common

FINE_TUNE = {'cifar10': 'test', 'cifar100': 'test', 'imagenet2012': 'validation'}


def get_config(arg: str = 'cifar10') -> ml_collections.ConfigDict:
  config = common.base_config()
  config.model_name = 'ViT-B_16'
  if arg == 'pretrain':
    config.model = ml_collections.ConfigDict(dict(
        representation_size=768, dropout_rate=0.1, dtype='bfloat16'))
    config.dataset = 'imagenet2012'
    config.train_split, config.eval_split = 'train[:99%]', 'train[99%:]'
    config.image_size = 224
    config.batch_size = 4096
    config.num_epochs = 300
    config.optimizer = 'adam'
    config.lr = 3e-3
    config.warmup_steps = 10_000
    config.weight_decay = 0.3 * 3e-3  # coupled 0.3 in the paper: per step, times lr
    return config
  if arg not in FINE_TUNE:
    raise ValueError(f'Unknown arg {arg!r} for vit_b16.py; use one of '
                     f'{sorted(FINE_TUNE) + ["pretrain"]}.')
  config.model = ml_collections.ConfigDict(dict(dtype='bfloat16'))
  config.pretrained = 'ViT-B_16.npz'  # gs://vit_models/imagenet21k/ViT-B_16.npz, downloaded
  config.dataset = arg
  config.eval_split = FINE_TUNE[arg]
  config.image_size = 384
  return common.vit_fine_tuning(config)
