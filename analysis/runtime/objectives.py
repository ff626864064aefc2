"""The objectives whose curvature the Hessian and landscape tools measure: a zoo
model's training loss (`vit_jax.training.steps.loss_fn`) on fixed stacked batches, plus an
explicit L2 term, as functions (params, batches) -> a scalar for
`analysis.measures.curvature`'s products.
"""
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import optax.tree_utils as otu

from analysis.measures.curvature import Loss, sum_over_batches
from vit_jax import cpu_devices, training


def training_loss(model: Any, l2: float = 0., kind: str = 'softmax', label_smoothing: float = 0.,
                  l2_mask: Optional[Callable[[Any], Any]] = None, unroll: bool = False) -> Loss:
  """(params, stacked batches) -> mean over the K batches of the loss
  (`steps.loss_fn`) against their label distributions, + l2/2 ||params||^2 over
  the parameters that `l2_mask(params)` marks True (all of them without a mask).
  The batches are summed by `sum_over_batches` (`unroll` for ResNets on CPU).

  Args:
    model: the Flax module.
    l2: the L2 coefficient.
    kind: the loss (`steps.loss_fn`: 'softmax' or 'sigmoid').
    label_smoothing: its label smoothing.
    l2_mask: params -> a tree of booleans, the parameters the L2 term covers.
    unroll: as in `sum_over_batches`.

  Returns:
    The loss, (params, stacked batches) -> a scalar.
  """
  def loss(params, batches):
    def batch_loss(batch):
      images, labels = batch
      logits = model.apply({'params': params}, images, train=False)
      return training.loss_fn(logits, labels, kind, label_smoothing).mean()
    count = batches[0].shape[0]
    total = sum_over_batches(batch_loss, batches, jnp.zeros(()), unroll)
    mask = l2_mask(params) if l2_mask else jax.tree_util.tree_map(lambda _: True, params)
    decayed = jax.tree_util.tree_map(lambda p, on: p if on else jnp.zeros_like(p), params, mask)
    return total / count + 0.5 * l2 * otu.tree_norm(decayed, squared=True)
  return loss


L2_ON = ('all', 'kernels')  # the parameters an L2 term covers


def l2_coefficient(recipe: ml_collections.ConfigDict) -> float:
  """weight_decay / lr: the coefficient of the L2 term whose gradient, scaled by the
  learning rate, is the decay the recipe's optimizer applies each step (PyTorch's
  AdamW weight_decay, which Park & Kim's code multiplies in).

  Args:
    recipe: the training recipe (its weight_decay and lr).

  Returns:
    The coefficient (0 without weight decay).
  """
  return recipe.weight_decay / recipe.lr if recipe.weight_decay else 0.


def recipe_objective(model: Any, recipe: ml_collections.ConfigDict, unroll: bool = False,
                     l2_on: str = 'all') -> Tuple[Loss, dict]:
  """The loss a recipe trains with, as Park & Kim measure the Hessian (NLL plus L2).

  Its loss kind and label smoothing, plus L2 with the coupled coefficient
  l2 = weight_decay / lr: the L2 term whose gradient, scaled by the learning rate,
  is the decay the optimizer applies (exact for SGD; for Adam the decay is
  decoupled from the moments). By default the term covers every parameter, as the
  authors' AdamW decays all of `model.parameters()` (how-do-vits-work
  `ops/trains.py`, `get_optimizer`: `optim.AdamW(model.parameters(), ...)`);
  `l2_on='kernels'` covers the kernels alone, the parameters this project's
  optimizer decays (`steps.kernel_mask`).

  Args:
    model: the zoo model.
    recipe: the training recipe (its loss, label_smoothing, weight_decay, lr).
    unroll: as in `training_loss`.
    l2_on: 'all' (the authors') or 'kernels' (this project's decay mask).

  Returns:
    The loss, and a description of it for the JSON.
  """
  if l2_on not in L2_ON:
    raise ValueError(f'Unknown L2 coverage {l2_on!r}; use one of {", ".join(L2_ON)}.')
  l2 = l2_coefficient(recipe)
  loss = training_loss(model, l2, recipe.loss, recipe.label_smoothing,
                       training.kernel_mask if l2_on == 'kernels' else None, unroll)
  return loss, {'loss': recipe.loss, 'label_smoothing': recipe.label_smoothing, 'l2': l2,
                'l2_on': l2_on}


def compiler_options() -> Optional[Dict[str, str]]:
  """The compiler options of the Hessian and landscape tools' host-driven products:
  the train step's (`vit_jax.cpu_devices.gradient_compiler_options`), with which the
  quick-start ResNet's product ran 1.26x faster (docs/benchmarks.md).

  Returns:
    `jax.jit`'s `compiler_options` on this process's default backend, or None.
  """
  return cpu_devices.gradient_compiler_options(jax.default_backend())
