"""Hessian-vector products of a zoo model's training loss, as one fixed symmetric
operator on flat parameter vectors for `analysis.lanczos`.

The loss is evaluated in inference mode (no dropout, no stochastic depth) on a
fixed list of batches (drawn once, with whatever augmentation they were drawn
with), averaged over the batches, plus an optional explicit L2 term, so every
product uses the same matrix.
"""
from typing import Any, Callable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import ml_collections
from jax.flatten_util import ravel_pytree

from vit_jax import steps

Loss = Callable[[Any, Sequence], jax.Array]


def training_loss(model, l2: float = 0., kind: str = 'softmax', label_smoothing: float = 0.,
                  l2_mask: Optional[Callable[[Any], Any]] = None) -> Loss:
  """(params, batches) -> mean over the batches, each (images, label distributions),
  of the loss (`steps.loss_fn`), + l2/2 ||params||^2 over the parameters that
  `l2_mask(params)` marks True (all of them without a mask)."""
  def loss(params, batches):
    total = 0.
    for images, labels in batches:
      logits = model.apply({'params': params}, images, train=False)
      total += steps.loss_fn(logits, labels, kind, label_smoothing).mean()
    mask = l2_mask(params) if l2_mask else jax.tree_util.tree_map(lambda _: True, params)
    penalty = sum(jnp.sum(p**2) for p, decayed in zip(jax.tree_util.tree_leaves(params),
                                                      jax.tree_util.tree_leaves(mask)) if decayed)
    return total / len(batches) + 0.5 * l2 * penalty
  return loss


def recipe_objective(model, recipe: ml_collections.ConfigDict) -> Tuple[Loss, dict]:
  """The loss a recipe trains with, as Park & Kim measure the Hessian (NLL plus L2):
  its loss kind and label smoothing, plus L2 on the kernels that its weight decay
  touches, with the coupled coefficient l2 = weight_decay / lr. That is the L2 term
  whose gradient, scaled by the learning rate, is the decay `steps.make_optimizer`
  applies (exact for SGD; for Adam the decay is decoupled from the moments).
  Returns the loss and a description of it for the JSON."""
  l2 = recipe.weight_decay / recipe.lr if recipe.weight_decay else 0.
  loss = training_loss(model, l2, recipe.loss, recipe.label_smoothing, steps.kernel_mask)
  return loss, {'loss': recipe.loss, 'label_smoothing': recipe.label_smoothing, 'l2': l2,
                'l2_on': 'kernels'}


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
