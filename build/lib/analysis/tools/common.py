"""Helpers the tools share: the Lanczos steps option and its check (the Hessian
and the landscape), training batches drawn once as stacked arrays (the same two),
and the heads of each attention layer (head ablation and activation patching)."""
from typing import List, Optional

import jax
import jax.numpy as jnp

from analysis.measures import curvature
from analysis.runtime import features
from analysis.tool import Batches, Subject
from analysis.tool_options import Budget, option
from vit_jax import models
from vit_jax.errors import ConfigError


def lanczos_steps_option(budget: Optional[Budget] = None) -> int:
  """The `--lanczos_steps` field, which the Hessian and the landscape tools share.

  Args:
    budget: how a time budget shrinks it in this tool, or None.

  Returns:
    The field.
  """
  return option(20, 'Lanczos steps per top-k estimate; twice as many for the density, half '
                'as many per parameter block and as trace probes.', least=1, budget=budget)


def fixed_batches(batches: Batches, split: str, count: int, num_classes: int, mesh=None):
  """`count` batches drawn once, so the loss is one function: stacked (K, B, ...)
  images and (K, B, C) label distributions (integer labels become one-hot), each
  batch split over the devices (`features.shard_examples`).

  Args:
    batches: split -> its (images, labels) batches.
    split: the split to draw from.
    count: how many batches.
    num_classes: the classes, for one-hot labels.
    mesh: the mesh of split parameters, or None.

  Returns:
    (images (K, B, ...), labels (K, B, C)).
  """
  fixed = []
  for images, labels in batches(split):
    if labels.ndim == 1:
      labels = jax.nn.one_hot(labels, num_classes)
    fixed.append((images, labels))
    if len(fixed) == count:
      return tuple(features.shard_examples(x, axis=1, mesh=mesh)
                   for x in curvature.stack_batches(fixed))
  raise ValueError(f'The {split} split gave {len(fixed)} batches, fewer than the {count} '
                   'needed; use more images.')


def check_lanczos(steps: int, dim: int, label: str) -> int:
  """Refuses more Lanczos steps than the Hessian has dimensions, or a basis (steps
  float32 vectors of `dim`) larger than half the memory available now.

  Args:
    steps: the Lanczos steps asked for.
    dim: the Hessian's dimension.
    label: the model's label, for the message.

  Returns:
    The basis's bytes.

  Raises:
    ConfigError: too many steps, or a basis beyond the memory.
  """
  if steps > dim:
    raise ConfigError(f'{steps} Lanczos steps exceed the {dim} parameters of {label}; give '
                      f'--lanczos_steps of at most {dim // 2}.')
  available = curvature.available_memory()
  basis = 4 * steps * dim
  if basis > available / 2:
    raise ConfigError(
        f'{steps} Lanczos steps on the {dim:,} parameters of {label} keep a {basis / 2**30:.1f} '
        f'GiB basis, more than half the {available / 2**30:.1f} GiB of memory available: lower '
        '--lanczos_steps.')
  return basis


def head_counts(subject: Subject) -> List[int]:
  """The number of heads of each attention layer, from the shape of what it sows.

  Args:
    subject: the model.

  Returns:
    One count per entry of `Layers.head_outputs`.
  """
  names = subject.layers.head_outputs
  shapes = jax.eval_shape(
      lambda p, x: models.apply_with_intermediates(
          subject.model, {'params': p}, x, names=names)[1],
      subject.params, jax.ShapeDtypeStruct((1, subject.image_size, subject.image_size, 3),
                                           jnp.float32))
  return [int(shapes[n].shape[2]) for n in names]
