"""The original vit_jax's training functions (docs/original.md): `train_and_evaluate`
for its configs (`vit_jax/configs/`), on the project's loop, and `make_update_fn`, the
project's step (`steps.update`) in its data-parallel `pmap`. Imported as
`vit_jax.train.<name>`.
"""
import os
from typing import Any, Callable, Optional

import flax
import jax
import ml_collections
import numpy as np
import optax
from absl import logging

from vit_jax import data, files, models, training
from vit_jax.configs import common as original_common
from vit_jax.errors import ConfigError, WorkdirError
from vit_jax.original import fields as original_fields

ORIGINAL_NAMES = ('make_update_fn', 'recipe', 'train_and_evaluate',
                  'adopt_original_checkpoint')


def make_update_fn(*, apply_fn: Callable[..., Any], accum_steps: int,
                   tx: optax.GradientTransformation) -> Callable[..., Any]:
  """The original's data-parallel update, the project's `steps.update` under the
  original's signature: a `pmap` over the local devices of (params, opt_state,
  batch, rng) -> (params, opt_state, loss, rng), the softmax cross-entropy's
  gradient over the batch (in `accum_steps` pieces, one dropout key for the step
  as the original) averaged over the devices. Params are donated.

  Args:
    apply_fn: the model's `apply`.
    accum_steps: the pieces of each device's batch.
    tx: the optimizer.

  Returns:
    The pmapped update.
  """

  def update_fn(params, opt_state, batch, rng):
    _, new_rng = jax.random.split(rng)
    dropout_rng = jax.random.fold_in(rng, jax.lax.axis_index('batch'))
    params, opt_state, loss, _ = training.update_step(
        params, opt_state, {'image': batch['image'], 'label': batch['label']},
        apply_fn=apply_fn, tx=tx, loss='softmax', label_smoothing=0.,
        accum_steps=accum_steps or 1, dropout_key=lambda index: dropout_rng,
        axis_name='batch')
    return params, opt_state, loss, new_rng

  return jax.pmap(update_fn, axis_name='batch', donate_argnums=(0,))


def _pretrained_file(config: ml_collections.ConfigDict) -> str:
  """The checkpoint an original config fine-tunes from: `{model_name}.npz`, or the
  AugReg file named (or the best ImageNet-21k one by upstream validation) in
  `pretrained_dir`."""
  name = config.get('model_or_filename')
  if not name:
    return os.path.join(config.pretrained_dir, f'{config.model.model_name}.npz')
  if '-' not in name:
    rows = [row for row in files.augreg_index(config.pretrained_dir)
            if row['filename'].split('-')[0] == name and row['ds'] == 'i21k']
    if not rows:
      raise ConfigError(f'The AugReg index in {config.pretrained_dir} has no ImageNet-21k '
                        f'checkpoint of {name}; name the file with '
                        '--config=.../files.py:<file name without .npz>.')
    name = max(rows, key=lambda row: row['final_val'])['filename']
  return os.path.join(config.pretrained_dir, f'{name}.npz')


def _check_pretrained(path: str, config: ml_collections.ConfigDict) -> None:
  """Refuses a checkpoint an original config names that is not there, with advice
  in the original's fields (`pretrained_dir`, `model_or_filename`)."""
  if '://' in path or os.path.exists(path):
    return
  field = ('--config.model_or_filename names another file'
           if config.get('model_or_filename') else
           f'the file is {config.model.model_name}.npz')
  raise ConfigError(f'{path} does not exist: the original\'s config fine-tunes from '
                    f'--config.pretrained_dir ({config.pretrained_dir}), where {field}. Download '
                    f'it there (from gs://vit_models/imagenet21k/ or gs://vit_models/augreg/), or '
                    'set --config.pretrained_dir to the folder that holds it.')


def recipe(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The project's recipe (`settings.FIELDS`) of an original fine-tuning config: the
  same model in float32, data, batch sizes, SGD momentum (its dtype `optim_dtype`),
  schedule (with `linear_end` 1e-5), clipping and intervals.

  Args:
    config: an original config (`vit_jax/configs/vit.py`, ...).

  Returns:
    The recipe.
  """
  missing = [k for k in ('dataset', 'model', 'pp', 'total_steps') if not config.get(k)]
  if missing:
    raise ConfigError(f'The config sets no {", ".join(missing)}; set them, e.g. '
                      '--config.dataset=cifar10 (files.py needs the dataset).')
  defaults = original_common.get_config()
  ignored = [k for k in ('shuffle_buffer', 'prefetch', 'tfds_manual_dir')
             if config.get(k) not in (None, defaults.get(k))]
  if ignored:
    logging.warning('%s: the project\'s pipeline shuffles and reads ahead by itself, and '
                    'prepares TFDS data from its offline copies; these settings change nothing '
                    'in train_and_evaluate (docs/original.md).', ', '.join(ignored))
  model = original_fields.project_config(config.model)
  fields = {k: v for k, v in model.to_dict().items() if k not in ('family', 'name', 'num_classes')}
  dataset = config.dataset
  if os.path.isdir(dataset):  # the original reads DIR/train and DIR/test, whatever pp says
      dataset, train_split, eval_split = data.FOLDER_PREFIX + dataset, 'train', 'test'
  else:
    splits = [k for k in ('train', 'test') if k not in config.pp]
    if splits:
      raise ConfigError(f'config.pp names no {" or ".join(splits)} split of {dataset}; set it, '
                        f'e.g. --config.pp.{splits[0]}={splits[0]} (a folder of images needs '
                        'none: it reads its train/ and test/).')
    train_split, eval_split = config.pp['train'], config.pp['test']
  every = config.eval_every or config.total_steps
  project = training.base_config()
  project.update(dict(
      model_name=model.name, model=fields, pretrained=_pretrained_file(config),
      dataset=dataset, data_dir=config.get('tfds_data_dir'), train_split=train_split,
      eval_split=eval_split, image_size=config.pp['crop'], batch_size=config.batch,
      eval_batch_size=config.batch_eval, accum_steps=config.accum_steps or 1,
      total_steps=config.total_steps, optimizer='sgd', momentum=0.9,
      momentum_dtype=config.optim_dtype, lr=config.base_lr, warmup_steps=config.warmup_steps,
      decay=config.decay_type, linear_end=1e-5, grad_clip=config.grad_norm_clip,
      log_every=config.progress_every or every, eval_every=every,
      checkpoint_every=every if config.checkpoint_every else config.total_steps))
  return project


def _project_tree(raw: Any, template: Any, model_name: str, fields: Any) -> Any:
  """A tree of the original's parameter names (its params, or its momentum) as the
  project's module tree `template` holds them."""
  config = models.get_config(model_name, **fields)
  flat = models.family_of(config).to_published(files.flatten(raw))
  tree = flax.serialization.from_state_dict(
      template, files.unflatten(models.family_of(config).module_layout(flat, config)))
  for (path, have), want in zip(files.flatten(tree).items(), files.flatten(template).values()):
    if np.shape(have) != np.shape(want):
      raise ValueError(f'{path} is {np.shape(have)} where the model has {np.shape(want)}')
  return tree


def adopt_original_checkpoint(config: ml_collections.ConfigDict, workdir: str) -> Optional[int]:
  """Takes on the newest `checkpoint_N` an original vit_jax run left in `workdir`,
  as the original resumes from it: its parameters, momentum and step become the
  project's checkpoint of step N (`workdir/checkpoints`), from which the loop goes
  on. Nothing in the workdir is removed or changed. A workdir whose run the
  project already holds (`checkpoints/`), or without such a file, is left alone.

  Args:
    config: the project's recipe (`recipe`).
    workdir: the run's directory.

  Returns:
    N, or None where nothing was taken on.

  Raises:
    WorkdirError: a `checkpoint_N` whose parameters or momentum are not this
      recipe's model's, naming the file.
  """
  from flax.training import checkpoints as flax_checkpoints  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  held = os.path.join(os.path.abspath(workdir), 'checkpoints')
  found = flax_checkpoints.latest_checkpoint(workdir) if os.path.isdir(workdir) else None
  if found is None or (os.path.isdir(held) and os.listdir(held)):
    return None
  try:
    raw = flax_checkpoints.restore_checkpoint(found, target=None)
    params, step = raw['0'], int(raw['2'])
    trace = optax.tree_utils.tree_get(raw['1'], 'trace')  # SGD's momentum, found once
    if trace is None:
      raise KeyError('its optimizer state keeps no momentum trace')
  except (KeyError, TypeError, ValueError, IndexError, OSError) as e:  # msgpack's: ValueErrors
    raise WorkdirError(f'{found} is not a checkpoint of the original vit_jax\'s train.py '
                       f'(params, optimizer state, step): {e}. Give another --workdir.') from None
  broken = files.non_finite({'params': params, 'momentum': trace})
  if broken:
    raise WorkdirError(f'{found}, left by an original vit_jax run, holds NaN or infinite values '
                       f'({", ".join(broken[:3])}): its run diverged. Give another --workdir, or '
                       'move the file away to train from the pretrained model (it is kept).')
  source = data.get_source(config.dataset, config.train_split, config.data_dir)
  setup = training.build_steps(config, source.num_classes, config.total_steps,
                               params=training.initial_params(config, source.num_classes))
  state = jax.device_get(setup.state)
  try:
    ours = _project_tree(params, state.params, config.model_name, config.model.to_dict())
    momentum = optax.tree_utils.tree_get(state.opt_state, 'trace')
    if momentum is None:
      raise ValueError('this recipe\'s optimizer keeps no momentum to take the file\'s into')
    trace = _project_tree(trace, momentum, config.model_name, config.model.to_dict())
  except (ValueError, KeyError, TypeError) as e:
    raise WorkdirError(f'{found}, left by an original vit_jax run, does not fit this config\'s '
                       f'{config.model_name} ({e}); give the config that run used, or another '
                       '--workdir (the file is kept).') from None
  opt = _counted_to(optax.tree_utils.tree_set(state.opt_state, trace=trace), step)
  adopted = state.replace(step=step, params=ours, opt_state=opt)
  adopted = jax.device_put(adopted, jax.tree_util.tree_map(lambda x: x.sharding, setup.state))
  # The workdir, held while the adopted state is written, then recorded as the run's.
  with training.claim_workdir(workdir, config, defaults=training.defaults()) as record:
    manager = ocp.CheckpointManager(held, options=ocp.CheckpointManagerOptions(
        enable_async_checkpointing=False))
    training.save_state(manager, step, adopted)
    manager.close()
    record()
  logging.info('Resuming from %s, left by an original vit_jax run, at step %d.', found, step)
  return step


def _counted_to(opt_state: Any, step: int) -> Any:
  """An optimizer state with every step count in it at `step`: the optimizer's and
  each of its schedules' (`optax.inject_hyperparams` keeps the learning rate's
  schedule at a count of its own), as `step` updates from the start leave them."""
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: (np.asarray(step, np.int32)
                          if getattr(path[-1], 'name', None) == 'count' else leaf), opt_state)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Any:
  """The original's fine-tuning run on the project's loop (`loop.train_and_evaluate`
  with `recipe(config)`), resumable as the original is: from the project's own
  checkpoints, or from the newest `checkpoint_N` an original run left
  (`adopt_original_checkpoint`). At the end `workdir/checkpoint_N` holds (params,
  optimizer state, N) as `flax.training.checkpoints` writes them; no checkpoint
  already in the workdir is removed or replaced.

  Args:
    config: an original config.
    workdir: the run's directory.

  Returns:
    The trained parameters.
  """
  from flax.training import checkpoints as flax_checkpoints  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  original_config, config = config, recipe(config)
  _check_pretrained(config.pretrained, original_config)
  adopted = adopt_original_checkpoint(config, workdir)
  if adopted is not None and adopted >= config.total_steps:
    logging.info('%s holds the original run\'s checkpoint_%d, at or past total_steps=%d: '
                 'nothing to train.', workdir, adopted, config.total_steps)
  training.train_and_evaluate(config, workdir, reconfigure=False)
  source = data.get_source(config.dataset, config.train_split, config.data_dir)
  setup = training.build_steps(config, source.num_classes, config.total_steps,
                               params=training.initial_params(config, source.num_classes))
  manager = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), 'checkpoints'))
  state, _ = training.resume_state(manager, setup.state)
  params, opt_state = jax.device_get((state.params, state.opt_state))
  step = int(state.step)
  newest = flax_checkpoints.latest_checkpoint(workdir)
  newest_step = int(newest.rsplit('_', 1)[1]) if newest else -1
  if newest_step < step:  # `keep` as large as can be: flax removes none of the older
    flax_checkpoints.save_checkpoint(os.path.abspath(workdir), (params, opt_state, step), step,
                                     keep=2**31 - 1)
  elif newest_step > step:
    logging.warning('%s is kept; the parameters of step %d are in %s/params.npz.', newest, step,
                    workdir)
  return flax.core.unfreeze(params)
