"""Hessian-vector products of a zoo model's training loss, as one fixed symmetric
operator on flat parameter vectors for `analysis.lanczos`.

The loss is evaluated in inference mode (no dropout, no stochastic depth) on a
fixed list of batches whose augmentation was drawn once, averaged over the
batches, plus an optional explicit L2 term, so every product uses the same matrix.
"""
from typing import Callable, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from vit_jax import train

Loss = Callable[[object], jax.Array]


def training_loss(model, batches: Sequence[Tuple[jax.Array, jax.Array]], l2: float = 0.,
                  kind: str = 'softmax', label_smoothing: float = 0.) -> Loss:
  """params -> mean over the fixed batches of the cross-entropy (one-hot labels)
  + l2/2 ||params||^2."""
  def loss(params):
    total = 0.
    for images, labels in batches:
      logits = model.apply({'params': params}, images, train=False)
      total += train.loss_fn(logits, labels, kind, label_smoothing).mean()
    penalty = sum(jnp.sum(p**2) for p in jax.tree_util.tree_leaves(params))
    return total / len(batches) + 0.5 * l2 * penalty
  return loss


def hvp(loss: Loss, params, vector):
  """H v at `params` by forward-over-reverse differentiation: jvp of the gradient."""
  return jax.jvp(jax.grad(loss), (params,), (vector,))[1]


def flat_hvp(loss: Loss, params) -> Tuple[Callable[[jax.Array], jax.Array], int]:
  """(v -> H v on flat float vectors, dimension) for the parameters' ravelled form."""
  flat, unravel = ravel_pytree(params)
  return lambda v: ravel_pytree(hvp(loss, params, unravel(v)))[0], flat.shape[0]
