"""The training step and everything it is built from: optimizer, schedule, loss,
state, mesh and the compiled train and eval steps.

Imports no TensorFlow, so benchmarks and analysis tools build the same step as
the train command on machines that have JAX alone.
"""
import dataclasses
import functools
import re
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import optax.tree_utils as otu
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax import calibration, cpu_devices, models
from vit_jax.errors import ConfigError, UserError
from vit_jax.training import sharding

class TrainingError(UserError, RuntimeError):
  """A run that cannot go on (a non-finite loss, a missing checkpoint, ...)."""


class TrainState(train_state.TrainState):
  """Parameters, optimizer state and step; `rng` drives dropout and stochastic
  depth; `ema_params`, for a recipe with `ema_decay`, the exponential moving
  average of the parameters (None otherwise: a state without it has no leaves
  for it)."""
  rng: jax.Array
  ema_params: Any = None


# ---------------------------------------------------------------------------
# Optimizer


Schedule = Callable[[jax.Array], jax.Array]  # training progress in [0, 1] -> learning rate


def learning_rate_schedule(config: ml_collections.ConfigDict, total_steps: int) -> Schedule:
  """The learning rate at a training progress p in [0, 1]: linear warm-up from 0 to
  `config.lr` over the first warmup_steps / total_steps of progress, then cosine
  decay to 0 or linear decay to `config.linear_end` at p = 1. A run's progress is steps done over `total_steps`, so
  unbudgeted this is the usual schedule of steps; with a time budget it is the
  larger of that and the share of the budget spent (`budget.Clock`).

  Args:
    config: the recipe (lr, warmup_steps, decay).
    total_steps: the steps the schedule is laid out over.

  Returns:
    progress -> learning rate.
  """
  if config.decay not in ('cosine', 'linear'):
    raise ValueError(f'Unknown decay {config.decay!r}; use cosine or linear.')
  warmup = min(config.warmup_steps / max(total_steps, 1), 1.)

  def schedule(progress):
    p = jnp.clip(progress, 0., 1.)
    t = jnp.clip((p - warmup) / max(1. - warmup, 1e-12), 0., 1.)
    if config.decay == 'cosine':
      decayed = config.lr * 0.5 * (1 + jnp.cos(jnp.pi * t))
    else:
      end = config.get('linear_end', 0.)
      decayed = end + (config.lr - end) * (1. - t)
    return jnp.where(p < warmup, config.lr * p / max(warmup, 1e-12), decayed)
  return schedule


LEARNING_RATE = 'learning_rate'  # the optimizer's one hyperparameter set from outside


def learning_rate(config: ml_collections.ConfigDict, total_steps: int
                  ) -> optax.GradientTransformationExtraArgs:
  """Updates times -learning rate, the rate an `optax.inject_hyperparams`
  hyperparameter: the schedule at steps counted / `total_steps` (a plain
  step-based optimizer), or, for a run with a `time_budget`, the value set from
  outside before each step (`set_learning_rate`: the loop sets it at its clock's
  progress, `budget.Clock`).

  Args:
    config: the recipe (lr, warmup_steps, decay, time_budget).
    total_steps: the steps the schedule is laid out over.

  Returns:
    The transformation.
  """
  schedule = learning_rate_schedule(config, total_steps)
  if config.get('time_budget'):
    rate = float(schedule(0.))
  else:
    # Steps done over the recipe's in float32, each rounded once on the host: XLA:CPU
    # divides by a reciprocal, an ulp off at some steps, and runs are bit for bit
    # those of earlier versions, whose loop gave the step this progress.
    progress = jnp.asarray(np.arange(total_steps + 1) / max(total_steps, 1), jnp.float32)
    rate = lambda count: schedule(progress[jnp.minimum(count, total_steps)])
  return optax.inject_hyperparams(optax.scale_by_learning_rate)(**{LEARNING_RATE: rate})


def _is_rate(node: Any) -> bool:
  return isinstance(node, optax.InjectStatefulHyperparamsState)


def set_learning_rate(state: 'TrainState', rate: float) -> 'TrainState':
  """`state` with the learning rate of its next update set to `rate` (a run whose
  optimizer takes the rate from outside: `learning_rate` with a time budget).

  Args:
    state: the training state.
    rate: the learning rate.

  Returns:
    The state with the rate in its optimizer state.
  """
  def with_rate(node):
    if not _is_rate(node):
      return node
    return node._replace(hyperparams={**node.hyperparams, LEARNING_RATE: np.float32(rate)})
  return state.replace(opt_state=jax.tree_util.tree_map(with_rate, state.opt_state,
                                                        is_leaf=_is_rate))


def last_learning_rate(opt_state: Any) -> jax.Array:
  """The learning rate of the update that produced `opt_state`.

  Args:
    opt_state: an optimizer state of `make_optimizer`.

  Returns:
    The rate.
  """
  nodes = [n for n in jax.tree_util.tree_leaves(opt_state, is_leaf=_is_rate) if _is_rate(n)]
  return nodes[0].hyperparams[LEARNING_RATE]


def kernel_mask(params: Any) -> Any:
  """True for weight matrices and conv kernels: weight decay applies to those only.

  Args:
    params: a parameter tree.

  Returns:
    A tree of booleans like `params`.
  """
  return flax.traverse_util.path_aware_map(lambda path, _: path[-1] == 'kernel', params)


def _lr_label(factor: float) -> str:
  return 'frozen' if factor == 0 else f'lr_x{factor:g}'


def lr_labels(params: Any, lr_mults: Sequence[Tuple[str, float]]) -> Any:
  """Per parameter, the label of its learning-rate factor: that of the first
  (regex, factor) pair whose regex `re.search` finds in its '/'-joined path, 1
  if none; 'frozen' for factor 0. A regex that matches no parameter is an error.

  Args:
    params: a parameter tree.
    lr_mults: (regex, factor) pairs, the recipe's `lr_mults`.

  Returns:
    A tree of labels like `params`.

  Raises:
    ConfigError: a regex matches no parameter path.
  """
  patterns = [(re.compile(pattern), float(factor)) for pattern, factor in lr_mults]
  used = set()

  def label(path, _):
    name = '/'.join(path)
    for i, (pattern, factor) in enumerate(patterns):
      if pattern.search(name):
        used.add(i)
        return _lr_label(factor)
    return _lr_label(1.)

  labels = flax.traverse_util.path_aware_map(label, params)
  unused = [lr_mults[i][0] for i in range(len(patterns)) if i not in used]
  if unused:
    example = '/'.join(next(iter(flax.traverse_util.flatten_dict(params))))
    raise ConfigError(f'config.lr_mults patterns {unused} match no parameter path: paths look '
                      f'like {example!r}; correct the patterns or remove them.')
  return labels


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int
                   ) -> optax.GradientTransformation:
  """clip -> Adam or SGD-momentum -> decoupled weight decay on kernels -> -lr (the
  schedule of steps, or under a time budget the rate set from outside:
  `learning_rate`), times the parameter's `config.lr_mults` factor (factor 0:
  frozen, no update and no optimizer state, its gradient left out of the
  clipping norm).

  `config.weight_decay` is the decoupled decay per step at the peak learning
  rate (params shrink by weight_decay * lr / config.lr each step).

  Args:
    config: the recipe.
    total_steps: the steps the schedule is laid out over.

  Returns:
    The optimizer.
  """
  directions = {'adam': optax.scale_by_adam(),
                'sgd': optax.trace(decay=config.momentum,
                                   accumulator_dtype=config.get('momentum_dtype', 'float32'))}
  if config.optimizer not in directions:
    raise ValueError(f'Unknown optimizer {config.optimizer!r}; use one of {sorted(directions)}.')
  update = [directions[config.optimizer]]
  if config.weight_decay:
    update.append(optax.add_decayed_weights(config.weight_decay / config.lr, mask=kernel_mask))
  update.append(learning_rate(config, total_steps))
  clip = [optax.clip_by_global_norm(config.grad_clip)] if config.grad_clip else []
  if not config.lr_mults:
    return optax.chain(*clip, *update)
  factors = {float(factor) for _, factor in config.lr_mults} | {1.}
  if min(factors) < 0:
    raise ValueError(f'lr_mults factors must be >= 0 (0 freezes); got {config.lr_mults}.')
  labels = functools.partial(lr_labels, lr_mults=config.lr_mults)
  scaled = {_lr_label(f): optax.set_to_zero() if f == 0 else optax.chain(*update, optax.scale(f))
            for f in factors}
  trainable = {label: optax.set_to_zero() if label == _lr_label(0.) else optax.identity()
               for label in scaled}
  return optax.chain(optax.multi_transform(trainable, labels), *clip,
                     optax.multi_transform(scaled, labels))


# ---------------------------------------------------------------------------
# Steps


def loss_fn(logits: jax.Array, labels: jax.Array, kind: str, label_smoothing: float) -> jax.Array:
  """Per-example softmax or sigmoid cross-entropy against (smoothed) one-hot labels.

  Args:
    logits: (B, classes) logits.
    labels: (B, classes) label distributions.
    kind: 'softmax' or 'sigmoid'.
    label_smoothing: the share of each label spread over every class.

  Returns:
    The (B,) losses.
  """
  labels = optax.smooth_labels(labels, label_smoothing)
  if kind == 'softmax':
    return optax.softmax_cross_entropy(logits, labels)
  if kind == 'sigmoid':
    return optax.sigmoid_binary_cross_entropy(logits, labels).sum(-1)
  raise ValueError(f'Unknown loss {kind!r}; use softmax or sigmoid.')


def accumulate_gradient(value_and_grad: Callable[[Any, Any, jax.Array], Tuple[jax.Array, Any]],
                        params: Any, batch: Any, accum_steps: int) -> Tuple[jax.Array, Any]:
  """The mean loss and gradient over `batch`, computed in `accum_steps` equal
  pieces one after another (the memory of one piece).

  Args:
    value_and_grad: (params, piece, piece index) -> (mean loss, gradient) of a piece.
    params: the parameters.
    batch: a tree of arrays whose leading axis is the batch.
    accum_steps: the pieces; it divides the batch.

  Returns:
    (loss, gradient), each the mean over the pieces.

  Raises:
    ValueError: a batch `accum_steps` does not divide.
  """
  size = jax.tree_util.tree_leaves(batch)[0].shape[0]
  if size % accum_steps:
    raise ValueError(f'accum_steps {accum_steps} does not divide the batch of {size}; choose '
                     'a divisor of the batch size.')
  if accum_steps == 1:
    # XLA:CPU runs convolutions inside a loop body far slower than outside one.
    return value_and_grad(params, batch, 0)
  pieces = jax.tree_util.tree_map(
      lambda x: x.reshape((accum_steps, size // accum_steps) + x.shape[1:]), batch)

  def accumulate(carry, piece_and_index):
    return otu.tree_add(carry, value_and_grad(params, *piece_and_index)), None

  zeros = (jnp.zeros(()), otu.tree_zeros_like(params))
  (loss, grads), _ = jax.lax.scan(accumulate, zeros, (pieces, jnp.arange(accum_steps)))
  return jax.tree_util.tree_map(lambda x: x / accum_steps, (loss, grads))


def update(params: Any, opt_state: Any, batch: Dict[str, jax.Array], *,
           apply_fn: Callable[..., jax.Array], tx: optax.GradientTransformation, loss: str,
           label_smoothing: float, accum_steps: int,
           dropout_key: Callable[[jax.Array], jax.Array],
           axis_name: Optional[str] = None) -> Tuple[Any, Any, jax.Array, Any]:
  """The parameters and optimizer state after one update: the gradient of the mean
  loss over `batch`, in `accum_steps` pieces, averaged over the devices of
  `axis_name` (the mapped axis of a `pmap`) where one is named, applied by `tx`.

  Args:
    params: the parameters.
    opt_state: `tx`'s state.
    batch: {'image': (B, H, W, 3), 'label': (B, classes)}.
    apply_fn: the model's `apply`.
    tx: the optimizer.
    loss: 'softmax' or 'sigmoid' (`loss_fn`).
    label_smoothing: the labels' smoothing.
    accum_steps: the pieces of the batch.
    dropout_key: piece index -> the dropout key of that piece.
    axis_name: the mapped axis to average the loss and gradient over, or None.

  Returns:
    (params, opt_state, the mean loss, the gradient).
  """
  def piece_grad(p, piece, index):
    def loss_of(q):
      logits = apply_fn({'params': q}, piece['image'], train=True,
                        rngs={'dropout': dropout_key(index)})
      return loss_fn(logits, piece['label'], loss, label_smoothing).mean()
    return jax.value_and_grad(loss_of)(p)

  value, grads = accumulate_gradient(piece_grad, params, batch, accum_steps)
  if axis_name is not None:
    value, grads = jax.lax.pmean((value, grads), axis_name)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, value, grads


def train_step(state: TrainState, batch: Dict[str, jax.Array], *, model: nn.Module,
               config: ml_collections.ConfigDict) -> Tuple[TrainState, Dict[str, jax.Array]]:
  """One update from the mean gradient over the batch, in `accum_steps` pieces, at
  the learning rate the optimizer holds (`learning_rate`); with `ema_decay` the
  parameters' moving average follows the updated parameters.

  Accumulating over pieces gives the update of the whole batch (the loss is a
  mean over examples) at the memory of one piece.

  Args:
    state: the training state (donated by the compiled step).
    batch: {'image': (B, H, W, 3), 'label': (B, classes)}.
    model: the Flax module.
    config: the recipe.

  Returns:
    (the new state, {'loss', 'grad_norm', 'learning_rate'}).
  """
  rng, step_rng = jax.random.split(state.rng)
  params, opt_state, loss, grads = update(
      state.params, state.opt_state, batch, apply_fn=model.apply, tx=state.tx,
      loss=config.loss, label_smoothing=config.label_smoothing,
      accum_steps=config.accum_steps,
      dropout_key=lambda index: jax.random.fold_in(step_rng, index))
  ema = state.ema_params
  if config.ema_decay:  # ema * decay + params * (1 - decay)
    decay = ema_decay_at(config, state.step + 1)
    ema = optax.incremental_update(params, ema, step_size=1. - decay)
  new_state = state.replace(step=state.step + 1, rng=rng, opt_state=opt_state, params=params,
                            ema_params=ema)
  metrics = {'loss': loss, 'grad_norm': optax.global_norm(grads),
             'learning_rate': last_learning_rate(opt_state)}
  return new_state, metrics


def ema_decay_at(config: ml_collections.ConfigDict, step: jax.Array) -> jax.Array:
  """The moving average's decay after training step `step` (1 for the first):
  `ema_decay`, or with `ema_warmup` timm's ModelEmaV3 warm-up, min(ema_decay,
  1 - step^(-2/3)) (timm/utils/model_ema.py, `get_decay` with use_warmup,
  warmup_gamma 1 and warmup_power 2/3, as timm's train.py calls it after each
  update: 0 at the first step, so the average starts at the trained weights).

  Args:
    config: the recipe.
    step: the step just trained.

  Returns:
    The decay.
  """
  if not config.ema_warmup:
    return jnp.asarray(config.ema_decay, jnp.float32)
  warm = 1. - jnp.asarray(step, jnp.float32) ** (-2. / 3.)
  return jnp.minimum(config.ema_decay, warm)


def eval_step(params: Any, batch: Dict[str, jax.Array], *, model: nn.Module,
              config: ml_collections.ConfigDict) -> Dict[str, jax.Array]:
  """Sums over the real (mask 1) examples: correct predictions, loss, count, the
  Brier score and the calibration bins of the softmax confidence.

  Args:
    params: the parameters.
    batch: {'image', 'label', 'mask'} of one evaluation batch.
    model: the Flax module.
    config: the recipe.

  Returns:
    The sums.
  """
  logits = model.apply({'params': params}, batch['image'], train=False)
  mask = batch['mask']
  loss = loss_fn(logits, batch['label'], config.loss, 0.)
  correct = jnp.argmax(logits, -1) == jnp.argmax(batch['label'], -1)
  probabilities = jax.nn.softmax(logits.astype(jnp.float32))
  brier = jnp.sum((batch['label'] - probabilities) ** 2, axis=-1)
  return {'correct': jnp.sum(correct * mask), 'loss': jnp.sum(loss * mask),
          'count': jnp.sum(mask), 'brier': jnp.sum(brier * mask),
          'calibration': calibration.bin_sums(jnp.max(probabilities, -1), correct, mask)}


# ---------------------------------------------------------------------------
# The model, its state and the compiled steps


def model_config(config: ml_collections.ConfigDict, num_classes: int) -> ml_collections.ConfigDict:
  """The zoo config of a recipe's model.

  Args:
    config: the recipe (model_name and its model fields).
    num_classes: the data's classes.

  Returns:
    The model config (`models.get_config`).
  """
  return models.get_config(config.model_name, num_classes=num_classes, **config.model)


def init_params(config: ml_collections.ConfigDict, model: nn.Module, image_size: int) -> Any:
  """Fresh parameters of `model`, from the recipe's seed.

  Args:
    config: the recipe (its seed).
    model: the Flax module.
    image_size: the training images' side.

  Returns:
    The parameters.
  """
  init_rng, _ = jax.random.split(jax.random.PRNGKey(config.seed))
  return jax.jit(model.init)(init_rng, jnp.zeros((1, image_size, image_size, 3)))['params']


def create_train_state(config: ml_collections.ConfigDict, model: nn.Module,
                       optimizer: optax.GradientTransformation, params: Any) -> TrainState:
  """The training state of `params`: the optimizer's state, the step's random key
  (from the recipe's seed) and, with `config.ema_decay`, the parameters' average.

  Args:
    config: the recipe (seed, ema_decay).
    model: the Flax module.
    optimizer: the optax optimizer.
    params: the parameters it starts from.

  Returns:
    The training state.
  """
  _, state_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  # The average starts at the parameters, in buffers of its own (the step donates both).
  ema = jax.tree_util.tree_map(jnp.copy, params) if config.ema_decay else None
  return TrainState.create(apply_fn=model.apply, params=params, tx=optimizer, rng=state_rng,
                           ema_params=ema)


def compile_steps(model: nn.Module, config: ml_collections.ConfigDict, mesh: Mesh,
                  state_sharding: Any) -> Tuple[Callable, Callable]:
  """The jitted train and eval steps: batch sharded over `mesh`, the state as
  `state_sharding` (a sharding per leaf, `vit_jax.training.sharding.state_shardings`); on CPU
  devices the train step is compiled with `cpu_devices.gradient_compiler_options`.

  Args:
    model: the Flax module.
    config: the recipe.
    mesh: the device mesh.
    state_sharding: the state's sharding, leaf by leaf.

  Returns:
    (the train step, the eval step).
  """
  replicated, data_sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))
  options = cpu_devices.gradient_compiler_options(mesh.devices.flat[0].platform)
  step_fn = jax.jit(functools.partial(train_step, model=model, config=config),
                    in_shardings=(state_sharding, data_sharded),
                    out_shardings=(state_sharding, replicated), donate_argnums=0,
                    compiler_options=options)
  eval_fn = jax.jit(functools.partial(eval_step, model=model, config=config),
                    in_shardings=(state_sharding.params, data_sharded),
                    out_shardings=replicated)
  return step_fn, eval_fn


@dataclasses.dataclass
class Setup:
  """What a training run is made of, built once by `build`."""
  model: nn.Module
  model_cfg: ml_collections.ConfigDict
  schedule: Schedule
  state: TrainState            # on `mesh` as `config.sharding` says (`vit_jax.training.sharding`)
  mesh: Mesh
  train_step: Callable         # (state, batch) -> (state, metrics); donates the state
  eval_step: Callable          # (params, batch) -> sums of correct, loss, count

  def shard_batch(self, batch: Any) -> Any:
    """Places a host batch on the mesh, split along its first axis.

    Args:
      batch: a tree of host arrays.

    Returns:
      The tree on the mesh.
    """
    return jax.device_put(batch, NamedSharding(self.mesh, P('data')))


def gather(tree: Any, mesh: Mesh) -> Any:
  """`tree` whole on every device of `mesh` (a collective: every process calls it),
  so one process can save it whatever the sharding.

  Args:
    tree: arrays on `mesh`.
    mesh: the device mesh.

  Returns:
    The tree, replicated.
  """
  return jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, P()))(tree)


def build(config: ml_collections.ConfigDict, num_classes: int, total_steps: int,
          devices: Sequence[jax.Device] = None, params: Any = None) -> Setup:
  """Model, schedule, optimizer, state (sharded as `config.sharding` says), mesh and
  compiled steps of a recipe. No file is read here: the parameters a run starts
  from, a `config.pretrained` checkpoint fitted to the model, are
  `finetune.initial_params`'.

  Args:
    config: the recipe.
    num_classes: the data's classes.
    total_steps: the steps the schedule is laid out over.
    devices: the devices to train on (all of them if None).
    params: the initial parameters; None: fresh ones (`init_params`), for a recipe
      without `pretrained`.

  Returns:
    The run's `Setup`.

  Raises:
    ValueError: no `params` for a recipe with `pretrained`.
  """
  model_cfg = model_config(config, num_classes)
  model = models.build_model(model_cfg)
  schedule = learning_rate_schedule(config, total_steps)
  if params is None:
    if config.pretrained:
      raise ValueError(f'config.pretrained names {config.pretrained}, which steps.build does not '
                       'read: pass params=finetune.initial_params(config, num_classes).')
    params = init_params(config, model, config.image_size)
  state = create_train_state(config, model, make_optimizer(config, total_steps), params)
  mesh = sharding.make_mesh(devices, config.model_parallel)
  state_sharding = sharding.state_shardings(state, mesh, config.sharding)
  step_fn, eval_fn = compile_steps(model, config, mesh, state_sharding)
  state = jax.device_put(state, state_sharding)
  return Setup(model, model_cfg, schedule, state, mesh, step_fn, eval_fn)
