"""Fine-tuning's fit: a checkpoint fitted to a new model (a new head, position
embeddings resized to a new grid: `Family.fit`), refused where it does not fit."""
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from vit_jax import models
from vit_jax.files import hf_files
from vit_jax.files.checkpoint import read
from vit_jax.files.layout import Params, check_matches, flatten, non_finite, unflatten
from vit_jax.models.family import CheckpointError


def load_pretrained(path: str, init_params: Mapping[str, Any], model_config: Any,
                    grid_shape: Optional[Sequence[int]] = None, keep_head: bool = False
                    ) -> Params:
  """Parameters for fine-tuning: the checkpoint at `path` fitted to a new model.

  `init_params` are the new model's freshly initialised parameters and
  `model_config` its config (`vit_jax.models.get_config`); `path` is an `.npz`
  or a timm state dict of that model (`checkpoint.load`). The head is taken
  from `init_params`; the family fits the rest (`Family.fit`, its named rules: for a
  ViT, `pre_logits` dropped without a representation size and position
  embeddings resized to the new grid, `grid_shape` inferred when square).
  Anything else that differs raises a CheckpointError listing missing,
  unexpected and wrongly shaped keys, and so does an array the new model takes
  from the checkpoint with NaN or infinity. `keep_head` keeps the checkpoint's head
  instead (a second stage of fine-tuning on the same classes).

  Args:
    path: the checkpoint (`.npz`, or a timm file of the same model).
    init_params: the new model's initialised parameters.
    model_config: the new model's config.
    grid_shape: the new patch grid, when not square.
    keep_head: keep the checkpoint's head instead of the new one.

  Returns:
    The new model's parameters, in its dtypes.
  """
  if hf_files.is_folder(str(path)):
    hf_files.check_fits(str(path), model_config)
  restored = read(path, model_config)
  init = flatten(init_params)
  restored = models.family_of(model_config).fit(restored, init, model_config, grid_shape,
                                                str(path), keep_head)
  broken = non_finite(restored)
  if broken:
    raise CheckpointError(
        f'{path} holds NaN or infinity in {len(broken)} array(s), first {broken[0]}: it is '
        'damaged or from a diverged run; fine-tune from another checkpoint.')
  check_matches(restored, init, str(path))
  return unflatten({k: np.asarray(v, dtype=init[k].dtype) for k, v in restored.items()})
