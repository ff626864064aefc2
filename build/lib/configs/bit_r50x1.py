"""BiT-M-R50x1 fine-tuning with the BiT-HyperRule.

    python -m vit_jax.train --config configs/bit_r50x1.py:cifar10 --workdir DIR \
        --config.pretrained=/path/to/BiT-M-R50x1.npz

The rule: SGD momentum 0.9, lr 0.003, batch 512, 500 warmup steps; images
under 96x96 px train at 128 px, larger ones at 384 px; 500 steps under 20k
training examples, 10k under 500k, 20k above; mixup 0.1 above 20k examples.
BiT decays the rate in steps at 30/60/90% of training; here it decays by
cosine.
"""
import ml_collections

from configs import common

# dataset: (train examples, image side in px, eval split)
DATASETS = {
    'cifar10': (50_000, 32, 'test'),
    'cifar100': (50_000, 32, 'test'),
    'oxford_iiit_pet': (3_680, 500, 'test'),
    'oxford_flowers102': (1_020, 500, 'test'),
    'imagenet2012': (1_281_167, 400, 'validation'),
    'fashion_mnist': (60_000, 28, 'test'),
}


def get_config(arg: str = 'cifar10') -> ml_collections.ConfigDict:
  if arg not in DATASETS:
    raise ValueError(f'Unknown arg {arg!r} for bit_r50x1.py; use one of {sorted(DATASETS)}.')
  num_examples, side, eval_split = DATASETS[arg]
  config = common.base_config()
  config.model_name = 'BiT-M-R50x1'
  config.model = ml_collections.ConfigDict(dict(dtype='bfloat16'))
  config.pretrained = 'BiT-M-R50x1.npz'  # gs://bit_models/BiT-M-R50x1.npz, downloaded
  config.dataset = arg
  config.eval_split = eval_split
  config.image_size = 128 if side < 96 else 384
  config.total_steps = 500 if num_examples < 20_000 else 10_000 if num_examples < 500_000 else 20_000
  config.input.mixup_alpha = 0.1 if num_examples > 20_000 else 0.
  config.batch_size = 512
  config.optimizer = 'sgd'
  config.lr = 0.003
  config.warmup_steps = 500
  config.weight_decay = 0.
  return config
