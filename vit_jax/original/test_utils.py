"""The original vit_jax's test helper: a checkpoint of a freshly initialised model."""
import os
from typing import Any

import jax
import jax.numpy as jnp

from vit_jax import files
from vit_jax.original import models as original


def create_checkpoint(model_config: Any, path: str) -> None:
  """Writes the parameters of `VisionTransformer(num_classes=1, **model_config)`,
  initialised at 16 x 16 px, to the `.npz` at `path` (`checkpoint.save`).

  Args:
    model_config: an original model config (`MODEL_CONFIGS['testing']`).
    path: the file to write; its directory is made.
  """
  model = original.VisionTransformer(num_classes=1, **model_config)
  variables = model.init(jax.random.PRNGKey(0), jnp.ones([1, 16, 16, 3], jnp.float32),
                         train=False)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  files.save(path, variables['params'])
