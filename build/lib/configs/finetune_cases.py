"""The four fine-tuning cases of the ViT reviews, as one sweep from the quick-start ViT.

    python -m vit_jax.train --config configs/quickstart_vit.py --workdir workdirs/quickstart_vit
    python -m vit_jax.sweep --config configs/finetune_cases.py --workdir workdirs/finetune_cases

The quick-start ViT (28 px Fashion-MNIST, 7x7 patches) is fine-tuned with a new
head at 40 px (10x10 patches, position embeddings resized) on 3,000 training
images (`train[:5%]`), as pre-trained ViTs are fine-tuned at a higher resolution
on a smaller task; every row takes the same number of steps:
  scratch        the same model trained from scratch (what pre-training is worth);
  all            every parameter trained;
  head-only      the pretrained body frozen, only the new head trained;
  body-lr0.1     everything trained, the body at a tenth of the learning rate;
  head-then-all  the head-only row's model (its head kept), then everything trained.
`--config.pretrained=` names another upstream checkpoint.
"""
import ml_collections

from configs import quickstart_vit
from vit_jax import models

# Every parameter path outside the classifier head.
BODY = models.family_of(models.get_config(quickstart_vit.get_config().model_name)).body


def get_config() -> ml_collections.ConfigDict:
  config = quickstart_vit.get_config()
  config.pretrained = 'workdirs/quickstart_vit/params.npz'
  config.image_size = 40
  config.train_split = 'train[:5%]'
  config.num_epochs = 5  # 115 steps of 128
  config.lr = 1e-3
  config.warmup_steps = 20
  config.eval_every = 1000
  rows = {
      'scratch': dict(pretrained=None, lr=2e-3),
      'all': {},
      'head-only': dict(lr_mults=((BODY, 0.),)),
      'body-lr0.1': dict(lr_mults=((BODY, 0.1),)),
      'head-then-all': dict(pretrained='row:head-only', keep_head=True),
  }
  config.sweep = ml_collections.ConfigDict(dict(name='finetune_cases', rows=tuple(rows.items())))
  return config
