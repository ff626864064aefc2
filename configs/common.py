"""Fields every recipe has, with neutral defaults; recipes override what they set."""
import ml_collections


def base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Model: a zoo name plus architecture overrides (see vit_jax.models.get_config).
  config.model_name = 'ViT-B_16'
  config.model = ml_collections.ConfigDict()
  config.pretrained = None  # a published or our .npz to fine-tune from, or 'augreg:B/16'
  config.keep_head = False  # keep the pretrained head (same classes) instead of a new one
  config.augreg_dir = None  # where the AugReg index.csv and files are; None: gs://vit_models/augreg

  # Data.
  config.dataset = 'fashion_mnist'  # a TFDS name or folder:/path
  config.data_dir = None
  config.train_split = 'train'
  config.eval_split = 'test'
  config.image_size = 224
  config.inception_crop = True
  config.crop_padding = 0  # with inception_crop False: random shifts of up to this many px
  config.mixup_alpha = 0.
  config.randaugment = None  # (layers, magnitude)

  # Optimisation.
  config.batch_size = 512
  config.eval_batch_size = 512
  config.accum_steps = 1
  config.num_epochs = 1.
  config.total_steps = 0  # 0: derived from num_epochs
  # e.g. '15m': as many of those steps as fit in 15 minutes, evaluations and saving
  # included (timed on a few steps before the schedule is built); '' for no budget.
  config.time_budget = ''
  config.optimizer = 'sgd'  # or 'adam'
  config.momentum = 0.9
  config.lr = 0.03
  config.warmup_steps = 500
  config.decay = 'cosine'  # or 'linear'
  config.weight_decay = 0.  # decoupled, kernels only, per step at the peak lr
  config.grad_clip = 1.0
  config.loss = 'softmax'  # or 'sigmoid'
  config.label_smoothing = 0.
  # (regex, factor) pairs: a parameter whose '/'-joined path the first regex finds
  # in trains at factor x lr; 0 freezes it. E.g. ((Family.body, 0.1),): body at lr/10.
  config.lr_mults = ()

  # Bookkeeping.
  config.seed = 0
  config.log_every = 50
  config.eval_every = 1000
  config.checkpoint_every = 1000
  config.keep_checkpoints = 2
  return config
