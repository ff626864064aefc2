"""Training: pretraining from scratch and fine-tuning, data-parallel over all devices.

    python -m vit_jax.train --config configs/quickstart_vit.py --workdir DIR \
        [--config.batch_size=256 ...]

The batch is sharded over a one-axis mesh of every device of every process;
parameters and optimizer state are replicated. Checkpoints (orbax, atomic)
go to DIR/checkpoints and a run resumes from the newest complete one; the
final parameters are also written as DIR/params.npz in the published layout.
"""
import functools
import logging
import math
import os
import time
from typing import Any, Dict, Iterator, Tuple

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import app, flags
from clu import metric_writers, periodic_actions
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from ml_collections import config_flags

from vit_jax import checkpoint, input_pipeline, models

PUBLIC_CHECKPOINTS = 'gs://vit_models/imagenet21k/, gs://vit_models/augreg/, gs://bit_models/'


class TrainingError(RuntimeError):
  """A run that cannot go on (a non-finite loss, a missing checkpoint, ...)."""


class TrainState(train_state.TrainState):
  """Parameters, optimizer state and step; `rng` drives dropout and stochastic depth."""
  rng: jax.Array


# ---------------------------------------------------------------------------
# Optimizer


def learning_rate_schedule(config: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to `config.lr`, then cosine or linear decay to 0."""
  decay_steps = max(total_steps - config.warmup_steps, 1)
  decay = {'cosine': optax.cosine_decay_schedule(config.lr, decay_steps),
           'linear': optax.linear_schedule(config.lr, 0., decay_steps)}
  if config.decay not in decay:
    raise ValueError(f'Unknown decay {config.decay!r}; use one of {sorted(decay)}.')
  warmup = optax.linear_schedule(0., config.lr, config.warmup_steps)
  return optax.join_schedules([warmup, decay[config.decay]], [config.warmup_steps])


def kernel_mask(params) -> Any:
  """True for weight matrices and conv kernels: weight decay applies to those only."""
  return flax.traverse_util.path_aware_map(lambda path, _: path[-1] == 'kernel', params)


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int
                   ) -> optax.GradientTransformation:
  """clip -> Adam or SGD-momentum -> decoupled weight decay on kernels -> -lr.

  `config.weight_decay` is the decoupled decay per step at the peak learning
  rate (params shrink by weight_decay * lr / config.lr each step).
  """
  schedule = learning_rate_schedule(config, total_steps)
  directions = {'adam': optax.scale_by_adam(), 'sgd': optax.trace(decay=config.momentum)}
  if config.optimizer not in directions:
    raise ValueError(f'Unknown optimizer {config.optimizer!r}; use one of {sorted(directions)}.')
  parts = [optax.clip_by_global_norm(config.grad_clip)] if config.grad_clip else []
  parts.append(directions[config.optimizer])
  if config.weight_decay:
    parts.append(optax.add_decayed_weights(config.weight_decay / config.lr, mask=kernel_mask))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts)


# ---------------------------------------------------------------------------
# Steps


def loss_fn(logits: jax.Array, labels: jax.Array, kind: str, label_smoothing: float) -> jax.Array:
  """Per-example softmax or sigmoid cross-entropy against (smoothed) one-hot labels."""
  num_classes = labels.shape[-1]
  labels = labels * (1 - label_smoothing) + label_smoothing / num_classes
  if kind == 'softmax':
    return optax.softmax_cross_entropy(logits, labels)
  if kind == 'sigmoid':
    return optax.sigmoid_binary_cross_entropy(logits, labels).sum(-1)
  raise ValueError(f'Unknown loss {kind!r}; use softmax or sigmoid.')


def train_step(state: TrainState, batch: Dict[str, jax.Array], *, model, config,
               schedule) -> Tuple[TrainState, Dict[str, jax.Array]]:
  """One update from the mean gradient over the batch, in `accum_steps` pieces.

  Accumulating over pieces gives the update of the whole batch (the loss is a
  mean over examples) at the memory of one piece.
  """
  rng, step_rng = jax.random.split(state.rng)
  accum = config.accum_steps
  pieces = jax.tree_util.tree_map(
      lambda x: x.reshape((accum, x.shape[0] // accum) + x.shape[1:]), batch)

  def piece_grad(params, piece_and_index):
    piece, index = piece_and_index
    def loss_of(p):
      logits = model.apply({'params': p}, piece['image'], train=True,
                           rngs={'dropout': jax.random.fold_in(step_rng, index)})
      return loss_fn(logits, piece['label'], config.loss, config.label_smoothing).mean()
    return jax.value_and_grad(loss_of)(params)

  def accumulate(carry, piece_and_index):
    loss, grads = piece_grad(state.params, piece_and_index)
    return jax.tree_util.tree_map(jnp.add, carry, (loss, grads)), None

  if accum == 1:
    # XLA:CPU runs convolutions inside a loop body far slower than outside one.
    loss, grads = piece_grad(state.params, (batch, 0))
  else:
    zeros = (jnp.zeros(()), jax.tree_util.tree_map(jnp.zeros_like, state.params))
    (loss, grads), _ = jax.lax.scan(accumulate, zeros, (pieces, jnp.arange(accum)))
    loss, grads = jax.tree_util.tree_map(lambda x: x / accum, (loss, grads))
  new_state = state.apply_gradients(grads=grads, rng=rng)
  metrics = {'loss': loss, 'grad_norm': optax.global_norm(grads),
             'learning_rate': schedule(state.step)}
  return new_state, metrics


def eval_step(params, batch: Dict[str, jax.Array], *, model, config) -> Dict[str, jax.Array]:
  """Sums over the real (mask 1) examples: correct predictions, loss, count."""
  logits = model.apply({'params': params}, batch['image'], train=False)
  mask = batch['mask']
  loss = loss_fn(logits, batch['label'], config.loss, 0.)
  correct = jnp.argmax(logits, -1) == jnp.argmax(batch['label'], -1)
  return {'correct': jnp.sum(correct * mask), 'loss': jnp.sum(loss * mask),
          'count': jnp.sum(mask)}


# ---------------------------------------------------------------------------
# State and checkpoints


def model_config(config: ml_collections.ConfigDict, num_classes: int) -> ml_collections.ConfigDict:
  return models.get_config(config.model_name, num_classes=num_classes, **config.model)


def create_train_state(config, model, model_cfg, optimizer, image_size: int) -> TrainState:
  """Fresh parameters, or those of `config.pretrained` fitted to the model."""
  init_rng, state_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  params = jax.jit(model.init)(init_rng, jnp.zeros((1, image_size, image_size, 3)))['params']
  if config.pretrained:
    if not os.path.exists(config.pretrained) and '://' not in config.pretrained:
      raise TrainingError(
          f'Pretrained checkpoint {config.pretrained} does not exist. Public ones live under '
          f'{PUBLIC_CHECKPOINTS}; download one and set --config.pretrained=<path>.')
    params = checkpoint.load_pretrained(config.pretrained, params, model_cfg)
  return TrainState.create(apply_fn=model.apply, params=params, tx=optimizer, rng=state_rng)


def restore_latest(manager: ocp.CheckpointManager, abstract_state) -> Any:
  """The newest checkpoint that restores; unreadable newer ones are reported and skipped."""
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
    except Exception as e:  # orbax raises many kinds for a damaged checkpoint.
      logging.warning('Checkpoint at step %d in %s cannot be restored (%s: %s); '
                      'trying an earlier one.', step, manager.directory, type(e).__name__, e)
  return None


def compile_steps(model, config, schedule, mesh: Mesh):
  """The jitted train and eval steps: batch sharded over `mesh`, state replicated."""
  replicated, data_sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))
  step_fn = jax.jit(functools.partial(train_step, model=model, config=config, schedule=schedule),
                    in_shardings=(replicated, data_sharded), out_shardings=(replicated, replicated),
                    donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, model=model, config=config),
                    in_shardings=(replicated, data_sharded), out_shardings=replicated)
  return step_fn, eval_fn


# ---------------------------------------------------------------------------
# The loop


def _check_config(config: ml_collections.ConfigDict) -> None:
  if config.batch_size < 1 or config.accum_steps < 1:
    raise ValueError(f'batch_size ({config.batch_size}) and accum_steps ({config.accum_steps}) '
                     'must be positive.')
  if config.batch_size % config.accum_steps:
    raise ValueError(f'batch_size {config.batch_size} is not divisible by accum_steps '
                     f'{config.accum_steps}.')
  if (config.batch_size // config.accum_steps) % jax.device_count():
    raise ValueError(f'Each of the {config.accum_steps} accumulation pieces of the batch '
                     f'({config.batch_size // config.accum_steps} examples) must split evenly '
                     f'over the {jax.device_count()} devices; change batch_size.')


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, float]:
  """Trains, evaluates every `eval_every` steps and at the end; returns final metrics."""
  _check_config(config)
  train_source = input_pipeline.get_source(config.dataset, config.train_split, config.data_dir,
                                           shuffle_files=True, seed=config.seed)
  eval_source = input_pipeline.get_source(config.dataset, config.eval_split, config.data_dir)
  steps_per_epoch = max(train_source.num_examples * jax.process_count() // config.batch_size, 1)
  total_steps = config.total_steps or int(config.num_epochs * steps_per_epoch)

  model_cfg = model_config(config, train_source.num_classes)
  model = models.build_model(model_cfg)
  schedule = learning_rate_schedule(config, total_steps)
  optimizer = make_optimizer(config, total_steps)
  state = create_train_state(config, model, model_cfg, optimizer, config.image_size)

  mesh = Mesh(np.array(jax.devices()), ('data',))
  replicated, data_sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))
  step_fn, eval_fn = compile_steps(model, config, schedule, mesh)
  manager = ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), 'checkpoints'),
      options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints,
                                           enable_async_checkpointing=False))
  restored = restore_latest(manager, jax.tree_util.tree_map(
      ocp.utils.to_shape_dtype_struct, state))
  if restored is not None:
    state = restored
    logging.info('Resumed from step %d.', int(state.step))
  state = jax.device_put(state, replicated)
  start_step = int(state.step)

  def evaluate(params) -> Dict[str, float]:
    batches = input_pipeline.eval_dataset(eval_source, batch_size=config.eval_batch_size,
                                          image_size=config.image_size)
    sums = None
    for batch in input_pipeline.prefetch_to_devices(batches.as_numpy_iterator(), data_sharded):
      out = eval_fn(params, batch)
      sums = out if sums is None else jax.tree_util.tree_map(jnp.add, sums, out)
    sums = jax.device_get(sums)
    return {'eval_accuracy': float(sums['correct'] / sums['count']),
            'eval_loss': float(sums['loss'] / sums['count']),
            'eval_examples': int(sums['count'])}

  train_batches = input_pipeline.train_dataset(
      train_source, batch_size=config.batch_size, image_size=config.image_size,
      seed=config.seed, mixup_alpha=config.mixup_alpha, randaugment=config.randaugment,
      crop=config.inception_crop, crop_padding=config.crop_padding, start_step=start_step)
  batches: Iterator = input_pipeline.prefetch_to_devices(train_batches.as_numpy_iterator(),
                                                        data_sharded)
  writer = metric_writers.create_default_writer(workdir, just_logging=jax.process_index() > 0)
  progress = periodic_actions.ReportProgress(num_train_steps=total_steps, writer=writer,
                                             every_secs=30)
  summary: Dict[str, float] = {}
  for step in range(start_step + 1, total_steps + 1):
    state, metrics = step_fn(state, next(batches))
    if step == start_step + 1:
      # Throughput is timed from here (compiled) between metrics fetches, leaving out
      # evaluations and saves: `timed_from` is (step, time) of the last fetch.
      jax.block_until_ready(metrics)
      timed_from = (step, time.perf_counter())
    progress(step)
    last = step == total_steps
    saving = step % config.checkpoint_every == 0 or last
    # Checked before every save too, so no checkpoint ever holds a diverged state.
    if step % config.log_every == 0 or saving:
      metrics = jax.device_get(metrics)
      if not (np.isfinite(metrics['loss']) and np.isfinite(metrics['grad_norm'])):
        raise TrainingError(
            f'Loss is {metrics["loss"]} (gradient norm {metrics["grad_norm"]}) at step {step}; '
            f'stopped without saving, the last good checkpoint in {manager.directory} is '
            'intact. Lower lr or check the data.')
      scalars = {k: float(v) for k, v in metrics.items()}
      if step > timed_from[0]:
        seconds = time.perf_counter() - timed_from[1]
        scalars['images_per_sec_per_core'] = (
            (step - timed_from[0]) * config.batch_size / seconds / jax.device_count())
      writer.write_scalars(step, scalars)
      timed_from = (step, time.perf_counter())
    if step % config.eval_every == 0 or last:
      summary = evaluate(state.params)
      writer.write_scalars(step, summary)
      logging.info('Step %d: %s', step, summary)
    if saving:
      manager.save(step, args=ocp.args.StandardSave(state))
    if step % config.eval_every == 0 or saving:
      timed_from = (step, time.perf_counter())
  manager.wait_until_finished()
  if not summary:  # resumed at the last step: nothing trained, so evaluate what was restored
    summary = evaluate(state.params)
  if jax.process_index() == 0:
    checkpoint.save(os.path.join(workdir, 'params.npz'), jax.device_get(state.params))
  writer.flush()
  return summary


def cpu_device_count(config: ml_collections.ConfigDict, cores: int, processes: int = 1) -> int:
  """Devices to split a CPU host into: one per core, cut to a divisor of every batch.

  XLA:CPU runs a train step faster as one program per core than as one
  program threaded over the cores (ViT-S/16 at 224 px: 1.3-1.5x on 2 cores).
  """
  batch = math.gcd(config.batch_size // max(config.accum_steps, 1), config.eval_batch_size)
  per_process = batch // processes if batch % processes == 0 else 1
  return max(n for n in range(1, max(cores, 1) + 1) if per_process % n == 0)


def split_cpu_into_devices(config: ml_collections.ConfigDict, requested: int,
                           processes: int = 1) -> None:
  """Sets JAX's CPU device count before the backend starts, unless the user has.

  `requested` 0 picks `cpu_device_count` over the cores this process may use;
  GPU and TPU runs are unaffected (their devices are not CPU devices).
  """
  forced = ('xla_force_host_platform_device_count' in os.environ.get('XLA_FLAGS', '')
            or 'JAX_NUM_CPU_DEVICES' in os.environ)
  if forced and not requested:
    return
  count = requested or cpu_device_count(config, len(os.sched_getaffinity(0)), processes)
  jax.config.update('jax_num_cpu_devices', count)


FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command-line flags; defined only when run as a program, so that importing
  this module (as the analysis tools do) leaves the flag namespace free."""
  config_flags.DEFINE_config_file('config', None, 'Recipe file, e.g. configs/quickstart_vit.py.',
                                  lock_config=True)
  flags.DEFINE_string('workdir', None, 'Where checkpoints, params.npz and logs go.')
  flags.DEFINE_string('coordinator_address', None,
                      'host:port of process 0, for multi-process runs.')
  flags.DEFINE_integer('num_processes', None, 'Number of processes in a multi-process run.')
  flags.DEFINE_integer('process_id', None, 'Index of this process in a multi-process run.')
  flags.DEFINE_integer('cpu_devices', 0,
                       'Data-parallel devices a CPU host is split into; 0: one per core, '
                       'fewer if the batch does not divide. No effect on GPU or TPU.')
  flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  del argv
  split_cpu_into_devices(FLAGS.config, FLAGS.cpu_devices, FLAGS.num_processes or 1)
  if FLAGS.coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS'):
    # CPU processes need gloo for cross-process collectives; TPUs and GPUs ignore it.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  logging.getLogger().setLevel(logging.INFO)
  print(f'Process {jax.process_index()} of {jax.process_count()}, '
        f'{jax.device_count()} devices in all.', flush=True)
  summary = train_and_evaluate(FLAGS.config, FLAGS.workdir)
  print(f'Final: {summary}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
