"""The original vit_jax's timing of a model's forward pass (`config.trainer =
'inference_time'`), on the project's model."""
import time
from typing import Any, Dict

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from vit_jax import training
from vit_jax.configs import models as model_configs
from vit_jax.errors import ConfigError
from vit_jax.original import models as original


def _setting(config: ml_collections.ConfigDict, name: str, fallback: Any) -> Any:
  value = config.get(name) or fallback
  if not value:
    raise ConfigError(f'Set --config.{name} (> 0) to time the model.')
  return value


def inference_time(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, float]:
  """Times `config.steps` forward passes of a batch of ones after
  `config.initial_steps` untimed ones, and writes images per second per device
  (min, max, mean, std) to the workdir's metrics.

  The model is `config.model_name` (a `MODEL_CONFIGS` key) or, in a fine-tuning
  config, `config.model`; the image side `config.image_size` or `config.pp.crop`;
  the classes `config.num_classes` (1000 in a fine-tuning config); `steps` and
  `initial_steps` 30 and 10 where the config has none.

  Args:
    config: `vit_jax/configs/inference_time.py`, or a fine-tuning config.
    workdir: where the metrics go.

  Returns:
    The statistics.
  """
  model_config = (model_configs.MODEL_CONFIGS[config.model_name] if config.get('model_name')
                  else config.get('model'))
  if model_config is None:
    raise ConfigError('Set --config.model_name (a vit_jax.configs.models name) to time.')
  pp = config.get('pp') or {}
  batch = _setting(config, 'batch', 0)
  image_size = _setting(config, 'image_size', pp.get('crop'))
  num_classes = _setting(config, 'num_classes', 1000 if config.get('model') else 0)
  devices = jax.local_device_count()
  if batch % devices:
    raise ConfigError(f'--config.batch={batch} does not split over {devices} devices.')
  model = original.VisionTransformer(num_classes=num_classes, **model_config)
  images = jnp.ones([batch, image_size, image_size, 3], jnp.float32)
  variables = jax.jit(lambda: model.init(jax.random.PRNGKey(0), images[:1], train=False))()
  forward = jax.jit(lambda v, x: model.apply(v, x, train=False))
  initial_steps, timed_steps = config.get('initial_steps', 10), config.get('steps', 30)
  logging.info('Compiling; then %d untimed passes.', initial_steps)
  for _ in range(1 + initial_steps):
    forward(variables, images).block_until_ready()
  times = []
  for _ in range(timed_steps):
    start = time.perf_counter()
    forward(variables, images).block_until_ready()
    times.append(time.perf_counter() - start)
  per_device = batch / devices / np.array(times)
  stats = {f'imgs_sec_core_{k}': float(getattr(per_device, k)())
           for k in ('min', 'max', 'mean', 'std')}
  for key, value in stats.items():
    logging.info('%s=%f', key, value)
  writer = training.EventWriter(workdir, log=True)
  writer.write_hparams(config.to_dict())
  writer.write_scalars(0, stats)
  writer.close()
  return stats
