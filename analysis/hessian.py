"""Hessian-vector products of a zoo model's training loss, as one fixed symmetric
operator on flat parameter vectors for `analysis.lanczos`.

The loss is evaluated in inference mode (no dropout, no stochastic depth) on a
fixed list of batches whose augmentation was drawn once, averaged over the
batches, plus an optional explicit L2 term, so every product uses the same matrix.
"""
from typing import Any, Callable, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from vit_jax import steps

Loss = Callable[[Any, Sequence], jax.Array]


def training_loss(model, l2: float = 0., kind: str = 'softmax',
                  label_smoothing: float = 0.) -> Loss:
  """(params, batches) -> mean over the batches, each (images, one-hot labels), of
  the cross-entropy, + l2/2 ||params||^2."""
  def loss(params, batches):
    total = 0.
    for images, labels in batches:
      logits = model.apply({'params': params}, images, train=False)
      total += steps.loss_fn(logits, labels, kind, label_smoothing).mean()
    penalty = sum(jnp.sum(p**2) for p in jax.tree_util.tree_leaves(params))
    return total / len(batches) + 0.5 * l2 * penalty
  return loss


def hvp(loss: Loss, params, batches, vector):
  """H v at `params` by forward-over-reverse differentiation: jvp of the gradient."""
  return jax.jvp(lambda p: jax.grad(loss)(p, batches), (params,), (vector,))[1]


def flat_hvp(loss: Loss, params) -> Tuple[Callable[..., jax.Array], int]:
  """(matvec, dimension): matvec(v, params, batches) = H v on flat vectors.

  Parameters and batches are arguments, not closed over, so that under `jit`
  they are inputs rather than constants XLA would try to fold; pass them to the
  `analysis.lanczos` functions as `operands=(params, batches)`.
  """
  _, unravel = ravel_pytree(params)

  def matvec(v, params, batches):
    return ravel_pytree(hvp(loss, params, batches, unravel(v)))[0]
  return matvec, ravel_pytree(params)[0].shape[0]
