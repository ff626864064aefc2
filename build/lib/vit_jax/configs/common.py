"""The original vit_jax's fine-tuning defaults (`get_config`), its dataset presets
(`DATASET_PRESETS`, `with_dataset`) and `flatten` for sweeps. `vit_jax.train`
maps these fields onto the project's recipe (docs/original.md lists each)."""
import copy
from typing import Any, Dict, Iterable, Tuple, Union

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The fields of a fine-tuning run other than the model's, locked.

  Returns:
    The config: where checkpoints and data are, batch sizes, the SGD-momentum
    schedule, how often to log, evaluate and save, and `trainer` ('train' or
    'inference_time'); `model`, `dataset` and `pp` are set by the config files.
  """
  config = ml_collections.ConfigDict()
  config.pretrained_dir = '.'  # holds {model_name}.npz (gs://vit_models/imagenet21k)
  config.dataset = ''  # a TFDS name, or a directory with {train,test}/CLASS/*.jpg
  config.tfds_manual_dir = None
  config.tfds_data_dir = None
  config.total_steps = None
  config.grad_norm_clip = 1.0
  config.optim_dtype = 'bfloat16'  # the momentum's dtype
  config.accum_steps = 8
  config.batch = 512
  config.batch_eval = 512
  config.shuffle_buffer = 50_000
  config.eval_every = 100
  config.progress_every = 10
  config.checkpoint_every = 1_000  # 0: no checkpoints
  config.prefetch = 2
  config.base_lr = 0.03
  config.decay_type = 'cosine'  # or 'linear' (to 1e-5)
  config.warmup_steps = 500
  config.trainer = 'train'  # or 'inference_time'
  config.model = None
  config.model_or_filename = None  # augreg.py's
  config.pp = None
  return config.lock()


def _preset(total_steps: int, train: str, test: str) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      total_steps=total_steps,
      pp=ml_collections.ConfigDict(dict(train=train, test=test, crop=384))))


# Part of the training split is held out for validation.
DATASET_PRESETS = {
    'cifar10': _preset(10_000, 'train[:98%]', 'test'),
    'cifar100': _preset(10_000, 'train[:98%]', 'test'),
    'imagenet2012': _preset(20_000, 'train[:99%]', 'validation'),
}


def with_dataset(config: ml_collections.ConfigDict, dataset: str) -> ml_collections.ConfigDict:
  """An unlocked copy of `config` with `dataset` and its preset.

  Args:
    config: a config from `get_config`.
    dataset: a `DATASET_PRESETS` key.

  Returns:
    The new config.
  """
  if dataset not in DATASET_PRESETS:
    raise ValueError(f'The original\'s configs have no preset for the dataset {dataset!r}; '
                     f'its presets are {", ".join(DATASET_PRESETS)}. Give one of them, then '
                     'set --config.dataset (a TFDS name or a folder of images) and '
                     '--config.pp.train, --config.pp.test, --config.pp.crop for another.')
  config = ml_collections.ConfigDict(config.to_dict())
  config.dataset = dataset
  config.update(copy.deepcopy(DATASET_PRESETS[dataset]))  # the presets stay as they are
  return config


def flatten(config: Union[ml_collections.ConfigDict, Dict[str, Any]],
            prefix: Tuple[str, ...] = ('config',)) -> Iterable[Tuple[str, Any]]:
  """('config.a.b', value) pairs of every leaf of `config`, e.g. for sweeps.

  Args:
    config: a nested config or dict.
    prefix: the names before the first key.

  Yields:
    The dotted name and value of each leaf.
  """
  for key, value in config.items():
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      yield from flatten(value, prefix + (key,))
    else:
      yield '.'.join(prefix + (key,)), value
