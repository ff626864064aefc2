"""The paper-like tier: Park & Kim's three CIFAR models brought to Fashion-MNIST at
their token grid, each trained within its time budget on a 2-core CPU.

    python -m vit_jax.train --config configs/papers.py:vit --workdir workdirs/papers/vit
    python -m vit_jax.sweep --config configs/papers.py:window --workdir workdirs/papers/window

Args:
  vit       a ViT on 2 px patches of 28 px images: 14x14 tokens and a class
            token, as Park & Kim's ViT-Ti sees 16x16 on 32 px CIFAR (2 px
            patches, 12 blocks of width 192, 3 heads); here 6 blocks of width
            96 and 3 heads of 32, the largest that trains several epochs in
            its budget (see docs/papers.md for the measured step);
  resnet    their ResNet-50 layout (bottleneck units 3, 4, 6, 3) as a BiT
            ResNetV2 at half width, the root's 7x7/2 conv without its
            max-pool (stage maps 14, 7, 4, 2: the first at the ViT's grid);
  alternet  their AlterNet-50 (blocks 3, 4, 6, 4, of which MSA 0, 1, 3, 2 at
            the end of each stage, heads 3, 6, 12, 24 of 32) at half width;
  vit-authors, resnet-authors, alternet-authors
            the same models under the authors' CIFAR recipe unchanged;
  posemb, pool, skip, window, data, buildup
            the ablation sweeps of configs/ablations.py over these recipes.

The authors' strong-augmentation recipe (`configs/cifar10_vit.yaml` of
github.com/xxxnell/how-do-vits-work, which their `classification.ipynb` loads
for the CNNs as for the ViTs) is AdamW at lr 1.25e-4 for batches of 96 and
weight decay 0.05, a cosine schedule after 5 of 300 epochs of warm-up, label
smoothing 0.1, mixup with alpha 1.0 and CutMix, RandAugment with 2 layers at
magnitude 9, gradient norms clipped at 5 and stochastic depth 0.1. Set for 300
epochs, it does not train these models in the hour (the ViT: 57.8%), so the
tier's recipes keep its optimiser family, batch, schedule shape, label
smoothing, clipping and stochastic depth, and take the learning rate and
augmentation of the quick-start recipes that train in minutes: AdamW at lr 1e-3
for the ViT (decay 0.05 per unit of rate, as theirs), SGD with momentum at lr
0.075 for the two convolutional models (the quick start's 0.1 at batch 128),
flips only, no mixup or RandAugment. Each trains under a time budget: its
schedule follows the clock, fewer steps on a slower or busier CPU.
"""
import ml_collections

from configs import ablations, quickstart_alternet, quickstart_resnet, quickstart_vit

TIER = 'paper-like'
BUDGET = '45m'
BATCH = 96
EPOCHS = 10  # the schedule of each recipe; the budget ends it where a CPU is slower
STEPS = EPOCHS * 60_000 // BATCH  # the data and buildup sweeps' fixed steps
AUTHORS = '-authors'


def _tier(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """What every recipe of the tier shares: the authors' batch, schedule shape,
  label smoothing and clipping, under the tier's time budget."""
  config.tier = TIER
  config.time_budget = BUDGET
  config.batch_size = BATCH
  config.eval_batch_size = 480  # splits over 1 to 32 devices in powers of two, as 96 does
  config.num_epochs = EPOCHS
  config.warmup_steps = round(STEPS * 5 / 300)
  config.decay = 'cosine'
  config.grad_clip = 5.
  config.label_smoothing = 0.1
  config.eval_every = STEPS // 2  # an evaluation costs minutes of steps
  config.checkpoint_every = STEPS // EPOCHS
  config.keep_params_at = 'warmup'  # early training, for the Hessian's --steps warmup,last
  return config


def _adamw(config: ml_collections.ConfigDict, lr: float) -> ml_collections.ConfigDict:
  """AdamW at `lr` with the authors' weight decay 0.05, decoupled per step at the
  peak rate as this project's `weight_decay` is."""
  config.optimizer = 'adam'
  config.lr = lr
  config.weight_decay = lr * 0.05
  return config


def authors_recipe(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` under Park & Kim's strong-augmentation recipe unchanged (CutMix
  aside, which this pipeline does not have)."""
  config = _adamw(_tier(config), 1.25e-4)
  config.input.mixup_alpha = 1.
  config.input.randaugment = (2, 9)
  return config


def vit() -> ml_collections.ConfigDict:
  config = quickstart_vit.get_config()
  config.model = ml_collections.ConfigDict(dict(
      patch_size=2, hidden_size=96, mlp_dim=384, num_heads=3, num_layers=6,
      classifier='token', stochastic_depth=0.1, dtype='float32'))
  return _adamw(_tier(config), 1e-3)


def _sgd(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The quick-start convolutional models' SGD, its rate scaled to batch 96."""
  config.optimizer = 'sgd'
  config.lr = 0.075  # 0.1 at batch 128, times 96 / 128
  config.weight_decay = 1e-4
  return config


def resnet() -> ml_collections.ConfigDict:
  config = quickstart_resnet.get_config()
  config.model = ml_collections.ConfigDict(dict(
      num_layers=(3, 4, 6, 3), width_factor=0.5, root_pool=False, dtype='float32'))
  return _sgd(_tier(config))


def alternet() -> ml_collections.ConfigDict:
  config = quickstart_alternet.get_config()
  config.model = ml_collections.ConfigDict(dict(
      num_layers=(3, 4, 6, 4), num_msa=(0, 1, 3, 2), num_heads=(3, 6, 12, 24), width=32,
      head_dim=32, stem_pool=False, stochastic_depth=0.1, dtype='float32'))
  return _sgd(_tier(config))


RECIPES = {recipe.__name__: recipe for recipe in (vit, resnet, alternet)}
MODELS = tuple(RECIPES)


def get_config(arg: str = 'vit') -> ml_collections.ConfigDict:
  if arg in RECIPES:
    return RECIPES[arg]()
  if arg.endswith(AUTHORS) and arg[:-len(AUTHORS)] in RECIPES:
    return authors_recipe(RECIPES[arg[:-len(AUTHORS)]]())
  if arg not in ablations.SWEEPS:
    raise ValueError(f'Unknown recipe {arg!r} for papers.py; use one of '
                     f'{MODELS + tuple(m + AUTHORS for m in MODELS) + ablations.SWEEPS}.')
  return ablations.sweep(arg, vit(), resnet(), alternet(), STEPS)
