"""ViT-S/16 on ImageNet-1k from scratch: the plain-ViT baseline (Beyer et al. 2022).

    python -m vit_jax.train --config configs/vit_s16_i1k.py --workdir DIR

GAP head, fixed sin-cos position embeddings, batch 1024, Adam with lr 1e-3 and
decoupled weight decay 1e-4, 10k warmup steps then cosine, RandAugment(2, 10),
mixup 0.2, Inception crop, 90 epochs. Published: 76.5% top-1 (minival).
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  config.model_name = 'ViT-S_16'
  config.model = ml_collections.ConfigDict(dict(classifier='gap', posemb='sincos2d',
                                                dtype='bfloat16'))
  config.dataset = 'imagenet2012'
  config.train_split, config.eval_split = 'train[:99%]', 'train[99%:]'
  config.image_size = 224
  config.input.randaugment = (2, 10)
  config.input.mixup_alpha = 0.2
  config.batch_size = 1024
  config.num_epochs = 90
  config.optimizer = 'adam'
  config.lr = 1e-3
  config.warmup_steps = 10_000
  config.weight_decay = 1e-4
  config.eval_every = 5000
  return config
