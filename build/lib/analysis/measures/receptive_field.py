"""Effective receptive fields (Luo et al. 2016): how much each input pixel moves
one location of a feature map, measured by the gradient."""
from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp


def effective_receptive_field(feature_fn: Callable[[jax.Array], jax.Array], images: jax.Array,
                              location: Optional[Tuple[int, int]] = None) -> jax.Array:
  """(H, W) receptive field of `location` (default the centre) of a feature map.

  `feature_fn` maps (B, H, W, 3) images to (B, h, w, C) features. The gradient of
  the sum over channels at `location` with respect to the input, in absolute
  value, is summed over colour channels (sum_c |d/dx_c|, not |sum_c d/dx_c|:
  Luo et al. define the field on one-channel inputs), averaged over images and
  scaled to a maximum of 1. Examples do not interact in the zoo's models, so one gradient of
  the batch sum gives every image's gradient.

  Args:
    feature_fn: (B, H, W, 3) images -> (B, h, w, C) features.
    images: the (B, H, W, 3) images.
    location: the (row, column) of the feature map; its centre if None.

  Returns:
    The (H, W) field, maximum 1.
  """
  def centre_response(x):
    features = feature_fn(x)
    i, j = location if location is not None else (features.shape[1] // 2,
                                                  features.shape[2] // 2)
    return jnp.sum(features[:, i, j, :])

  grads = jax.grad(centre_response)(images)
  field = jnp.mean(jnp.sum(jnp.abs(grads), axis=-1), axis=0)
  return field / jnp.max(field)
