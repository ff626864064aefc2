"""Quick start: a small ViT trained from scratch on Fashion-MNIST, on CPU in minutes.

    python -m vit_jax.train --config configs/quickstart_vit.py --workdir workdirs/quickstart_vit
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Model: a ViT-Ti layout shrunk to 4 blocks of width 64, 4x4 patches of 28 px images.
  config.model_name = 'ViT-Ti_16'
  config.model = ml_collections.ConfigDict(dict(
      patch_size=4, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=4, classifier='gap',
      dtype='float32'))
  config.pretrained = None

  # Data.
  config.dataset = 'fashion_mnist'
  config.data_dir = None
  config.train_split = 'train'
  config.eval_split = 'test'
  config.image_size = 28
  config.inception_crop = False
  config.mixup_alpha = 0.
  config.randaugment = None

  # Optimisation: Adam, warmup then cosine, decoupled weight decay on kernels.
  config.batch_size = 128
  config.eval_batch_size = 512
  config.accum_steps = 1
  config.num_epochs = 3
  config.total_steps = 0  # 0: derived from num_epochs
  config.optimizer = 'adam'
  config.momentum = 0.9
  config.lr = 2e-3
  config.warmup_steps = 200
  config.decay = 'cosine'
  config.weight_decay = 1e-4
  config.grad_clip = 1.0
  config.loss = 'softmax'
  config.label_smoothing = 0.

  # Bookkeeping.
  config.seed = 0
  config.log_every = 50
  config.eval_every = 1000
  config.checkpoint_every = 1000
  config.keep_checkpoints = 2
  return config
