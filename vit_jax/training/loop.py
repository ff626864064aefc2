"""The training loop: pretraining from scratch and fine-tuning, data-parallel over
all devices (`train_and_evaluate`; the command line is `vit_jax.train`).

The batch is sharded over a one-axis mesh of every device of every process;
parameters and optimizer state are replicated (the step itself: `steps.py`).
Checkpoints (orbax, atomic, checksummed: `run_state`) go to DIR/checkpoints and a
run resumes from the newest one that checks out; the final parameters are also
written as DIR/params.npz in the published layout, and those of the steps that
`keep_params_at` names as DIR/params_<step>.npz. The data's modules (TFDS,
Grain, OpenCV) are imported only once the settings are checked, so a wrong
setting is answered in seconds.
"""
import dataclasses
import json
import logging
import os
import tempfile
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax import calibration, console, data, files, models
from vit_jax.errors import ConfigError, DataError, WorkdirError
from vit_jax.files import atomic_write, flatten
from vit_jax.training import budget, finetune, periodic, run_state, settings, signals, stall, steps
from vit_jax.training.steps import TrainingError
from vit_jax.training import workdir as workdirs

if TYPE_CHECKING:  # the data's module imports TFDS and Grain, which take seconds
  from vit_jax.data import Source

log = logging.getLogger(__name__)


def _check_config(config: ml_collections.ConfigDict) -> None:
  """Every field's own constraint (`settings.check`), then how they fit together and
  with the devices."""
  settings.check(config)
  if config.batch_size % config.accum_steps:
    raise ConfigError(f'config.batch_size {config.batch_size} is not divisible by '
                      f'config.accum_steps {config.accum_steps}.')
  if jax.device_count() % config.model_parallel:
    raise ConfigError(f'config.model_parallel={config.model_parallel} does not divide the '
                      f'{jax.device_count()} devices; use a divisor of {jax.device_count()}.')
  shards = jax.device_count() // config.model_parallel  # the mesh's data axis
  if (config.batch_size // config.accum_steps) % shards:
    raise ConfigError(f'Each of the {config.accum_steps} accumulation pieces of the batch '
                      f'({config.batch_size // config.accum_steps} examples) must split evenly '
                      f'over the {shards} devices of the data axis; change batch_size.')
  if config.eval_batch_size % jax.device_count():  # every device evaluates a slice
    raise ConfigError(f'config.eval_batch_size {config.eval_batch_size} does not split over '
                      f'the {jax.device_count()} devices; choose a multiple of '
                      f'{jax.device_count()}.')


def check_inputs(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Every input of a run, checked in seconds before any download or compilation:
  the pretrained file, the dataset and a writable workdir.

  Args:
    config: the recipe.
    workdir: the run's directory (created if missing).

  Raises:
    TrainingError: naming all that is missing and what to do.
  """
  augreg_dir = config.augreg_dir or files.AUGREG_DIR
  if (str(config.pretrained).startswith(files.AUGREG_PREFIX) and '://' in augreg_dir
      and not data.can_download()):
    missing = (f'{config.pretrained} needs the AugReg index in {augreg_dir}, which cannot be '
               f'reached. Copy {files.AUGREG_DIR}/index.csv and the files you need to a '
               'directory and set --config.augreg_dir=<directory>.')
  else:
    missing = finetune.missing_pretrained(config)
  if missing and resumes_without_pretrained(config, workdir):
    missing = None
  problems = [missing, data.unavailable(config.dataset, config.data_dir)]
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as e:
    problems.append(f'the workdir {workdir} is not writable ({e}).')
  problems = [p for p in problems if p]
  if problems:
    raise TrainingError(
        'This run cannot start:\n' + '\n'.join(f'- {p}' for p in problems) +
        '\nWithout network, train on the offline Fashion-MNIST instead: scripts/get_data.sh, '
        'then --config.dataset=fashion_mnist, or the quick start (configs/quickstart_vit.py).')


def resumes_without_pretrained(config: ml_collections.ConfigDict, workdir: str) -> bool:
  """Whether a fine-tune whose `pretrained` file is gone (a cleaned cache, a moved
  `.npz`) can go on from its own checkpoints, which hold every parameter it
  trains.

  Args:
    config: the recipe.
    workdir: the run's directory.

  Returns:
    True where the workdir holds the run's checkpoints and `pretrained` a local
    path that is not there.
  """
  path = config.pretrained
  checkpoints = os.path.join(workdir, 'checkpoints')
  return bool(path and '://' not in str(path) and not str(path).startswith(files.AUGREG_PREFIX)
              and not os.path.exists(path) and os.path.isdir(checkpoints)
              and os.listdir(checkpoints))


BUDGET_FILE = 'budget.json'


def device_batches(config: ml_collections.ConfigDict, source: 'Source', sharding: NamedSharding,
                   seed: int, start_step: int = 0) -> Iterator:
  """The recipe's training batches on the devices.

  Args:
    config: the recipe (batch size, image size, augmentation).
    source: the training split (`input_pipeline.get_source`).
    sharding: where a batch goes (split over the mesh's data axis).
    seed: the order of the examples and of the augmentation draws.
    start_step: the first step to give a batch for (a resumed run's).

  Returns:
    An iterator of batches on the devices.
  """
  batches = data.train_dataset(
      source, batch_size=config.batch_size, image_size=config.image_size, seed=seed,
      start_step=start_step, **config.input)
  return data.prefetch_to_devices(iter(batches), sharding)


def budgeted_seconds(config: ml_collections.ConfigDict, workdir: str, setup: steps.Setup,
                     train_source: 'Source', eval_source: 'Source', recipe_steps: int,
                     started: float) -> Dict:
  """When a run with `config.time_budget` ends its training. Decided once per
  workdir (kept in budget.json), so a resumed run goes on with the same clock.

  Args:
    config: the recipe.
    workdir: the run's directory.
    setup: the built steps and state, timed on copies.
    train_source: the training split, for the timed steps.
    eval_source: the evaluation split, for the timed evaluation.
    recipe_steps: the recipe's steps.
    started: `time.perf_counter()` at the run's start.

  Returns:
    budget.json's record: 'train_seconds' (after `started`, the final evaluation
    and save set aside: `budget.train_seconds`) and the timing it rests on.
  """
  path = os.path.join(workdir, BUDGET_FILE)
  if os.path.exists(path):
    with open(path) as f:
      record = json.load(f)
    if 'train_seconds' in record:
      return record
  seconds = budget.parse_duration(config.time_budget)
  data_sharded = NamedSharding(setup.mesh, P('data'))
  probe = device_batches(config, train_source, data_sharded, config.seed + 1)
  eval_batches = data.eval_dataset(eval_source, batch_size=config.eval_batch_size,
                                   image_size=config.image_size)
  eval_batch = next(data.prefetch_to_devices(iter(eval_batches), data_sharded))
  timing = budget.time_steps(
      setup.train_step, setup.state, probe,
      lambda: jax.block_until_ready(setup.eval_step(setup.state.params, eval_batch)),
      -(-eval_source.num_examples // config.eval_batch_size))
  set_up = time.perf_counter() - started
  training = budget.train_seconds(seconds, timing)
  if training <= set_up + timing.compile_seconds + timing.step_seconds:
    raise TrainingError(
        f'time_budget {config.time_budget} leaves no time to train: set-up took '
        f'{set_up:.0f} s, a step takes {timing.step_seconds:.3f} s and an evaluation '
        f'{timing.eval_seconds:.1f} s. Give a longer budget.')
  # At the probed speed; the clock, not this estimate, ends the run.
  expected = budget.fit_steps(timing, seconds - set_up, config.eval_every,
                              config.checkpoint_every, save_seconds=1. + timing.step_seconds,
                              margin_seconds=0.)
  log.info('Time budget %s: training ends %s after the start (set-up took %s); a step takes '
           '%.3f s, an evaluation %.1f s, compiling %.1f s: about %d of the recipe\'s %d steps '
           'fit, and the schedule follows the clock.', config.time_budget,
           console.duration(training), console.duration(set_up), timing.step_seconds,
           timing.eval_seconds, timing.compile_seconds, expected, recipe_steps)
  record = {'time_budget': config.time_budget, 'train_seconds': training,
            'recipe_steps': recipe_steps, 'expected_steps': expected,
            **dataclasses.asdict(timing)}
  if jax.process_index() == 0:
    with atomic_write(path) as f:
      json.dump(record, f, indent=1)
  return record


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       reconfigure: bool = False) -> Dict[str, float]:
  """Trains, evaluates every `eval_every` steps and at the end; returns final metrics.

  The settings and inputs are checked before any work; the workdir is held for
  this run (`workdir.claim`: a second trainer is refused, and so are settings that
  differ from those it was trained with, unless `reconfigure`). SIGTERM saves a
  checkpoint at the current step and stops with a `Preempted` error naming it.

  Args:
    config: the recipe (`settings.FIELDS`).
    workdir: the run's directory: checkpoints, params.npz, results.json, logs.
    reconfigure: go on from the workdir's checkpoint with settings other than
      those it recorded.

  Returns:
    The final evaluation: eval_accuracy, eval_loss, eval_ece, eval_brier and
    eval_examples.
  """
  started = time.perf_counter()
  _check_config(config)
  primary = jax.process_index() == 0
  with workdirs.claim(workdir, config, reconfigure, primary, settings.defaults()) as record, \
      Preemption() as preemption:
    check_inputs(config, workdir)
    return _train(config, workdir, started, preemption, record, reconfigure)


def check_data(workdir: str, identity: Dict[str, Any], reconfigure: bool) -> List[str]:
  """The changes between the data the run in `workdir` recorded and `identity`, refused
  unless `reconfigure`.

  Args:
    workdir: the run's directory.
    identity: split -> the identity of the data given now (`Source.identity`).
    reconfigure: accept the changes (they are recorded with the data).

  Returns:
    The changes accepted (none where the data is the run's or none was recorded).

  Raises:
    DataError: the data differs from the run's, without `reconfigure`.
  """
  recorded = workdirs.recorded_data(workdir)
  changes = workdirs.data_changes(recorded, identity) if recorded else []
  if changes and not reconfigure:
    raise DataError(f'The data is not what the run in {workdir} trained on: '
                    f'{"; ".join(changes)}. Train into a new workdir, or rerun with '
                    f'--reconfigure to go on with this data (the change is recorded in '
                    f'{workdirs.DATA}).')
  return changes


def _describe(source: 'Source', split: str) -> str:
  """One line: a split's images per class, as a run starts on it."""
  counts = source.identity.get('images_per_class')
  if not counts:
    return f'{source.name} {split}: {source.num_examples} images, {source.num_classes} classes.'
  return (f'{source.name} {split}: {sum(counts)} images in {len(counts)} classes (' +
          ', '.join(f'{c} {n}' for c, n in zip(source.class_names, counts)) + ').')


def _sources(config: ml_collections.ConfigDict, workdir: str, reconfigure: bool
             ) -> Tuple['Source', 'Source', Dict[str, Any], List[str]]:
  """The training and evaluation splits, checked against each other and against the
  data the run in `workdir` recorded: (train, eval, the data's identity, the
  changes `reconfigure` accepted)."""
  train_source = data.get_source(config.dataset, config.train_split, config.data_dir)
  eval_source = data.get_source(config.dataset, config.eval_split, config.data_dir)
  data.check_same_classes(train_source, eval_source)
  if train_source.num_classes < 2:
    raise DataError(f'{config.dataset} has {train_source.num_classes} class: a classifier '
                    'needs at least two (a folder dataset has one folder per class).')
  identity = {'train': train_source.identity, 'eval': eval_source.identity}
  accepted = check_data(workdir, identity, reconfigure) if '://' not in workdir else []
  for source, split in ((train_source, config.train_split), (eval_source, config.eval_split)):
    log.info(_describe(source, split))
  return train_source, eval_source, identity, accepted


def _steps(config: ml_collections.ConfigDict, train_source: 'Source'
           ) -> Tuple[int, Tuple[int, ...]]:
  """The run's steps (the recipe's, or its epochs') and the steps whose parameters it
  keeps, refused where one lies beyond the run."""
  steps_per_epoch = max(train_source.num_examples * jax.process_count() // config.batch_size, 1)
  total_steps = config.total_steps or int(config.num_epochs * steps_per_epoch)
  kept = workdirs.kept_steps(config.keep_params_at, config.warmup_steps)
  beyond = [s for s in kept if s > total_steps]
  if beyond:
    raise ConfigError(f'config.keep_params_at names step {", ".join(map(str, beyond))}, beyond '
                      f'the run\'s {total_steps} steps: name steps up to {total_steps}.')
  return total_steps, kept


def _initial_params(config: ml_collections.ConfigDict, workdir: str, num_classes: int) -> Any:
  """The parameters the run starts from: the pretrained checkpoint's fitted to the
  model, or, where a resumed fine-tune's pretrained file is gone, initialised ones
  (the run's own checkpoint replaces them)."""
  if resumes_without_pretrained(config, workdir):
    log.warning('The pretrained checkpoint %s is gone: the run goes on from its own checkpoint, '
                'which holds every parameter it trains.', config.pretrained)
    return steps.init_params(  # replaced by the checkpoint's: their shapes alone count
        config, models.build_model(steps.model_config(config, num_classes)), config.image_size)
  return finetune.initial_params(config, num_classes)


@dataclasses.dataclass(frozen=True)
class Built:
  """A run as it stands before its first step."""
  eval_source: 'Source'
  total_steps: int
  kept: Tuple[int, ...]  # the steps whose parameters are kept (`keep_params_at`)
  setup: steps.Setup
  data_sharded: NamedSharding  # a batch's sharding, split over the mesh's data axis
  manager: ocp.CheckpointManager
  state: steps.TrainState  # restored where the run resumes
  start_step: int
  spent: float  # the seconds the workdir's earlier runs trained
  sizes: Tuple[int, int]  # the state's and the parameters' bytes (`workdirs.sizes`)
  train_seconds: Optional[float]  # with a time budget: when training ends
  batches: Iterator


def build_run(config: ml_collections.ConfigDict, workdir: str, started: float,
              record: Callable[[], None], reconfigure: bool = False) -> Built:
  """Builds the run in `workdir`: its data, steps, parameters, compiled steps,
  checkpoints and batches, everything checked before its settings are recorded.

  Args:
    config: the recipe, checked.
    workdir: the run's directory, claimed.
    started: `time.perf_counter()` at the run's start (the time budget's clock).
    record: records the settings (`workdirs.claim`'s); its `changes` are those
      `reconfigure` accepted.
    reconfigure: accept other data and settings than the run's.

  Returns:
    The run before its first step.
  """
  train_source, eval_source, identity, accepted = _sources(config, workdir, reconfigure)
  total_steps, kept = _steps(config, train_source)
  params = _initial_params(config, workdir, train_source.num_classes)
  setup = steps.build(config, train_source.num_classes, total_steps, params=params)
  seconds = None
  if config.time_budget:
    seconds = budgeted_seconds(config, workdir, setup, train_source, eval_source, total_steps,
                               started)['train_seconds']
  data_sharded = NamedSharding(setup.mesh, P('data'))
  manager = ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), 'checkpoints'),
      options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints,
                                           enable_async_checkpointing=False))
  if record.changes and manager.all_steps():
    check_reconfigured_shapes(workdir, config, train_source.num_classes)
  state, spent = run_state.resume(manager, setup.state)
  start_step = int(state.step)
  if record.changes and start_step >= total_steps:
    raise WorkdirError(
        f'The run in {workdir} is finished (step {start_step} of {total_steps}): --reconfigure '
        f'would record settings its parameters were not trained with ({"; ".join(record.changes)}'
        f'). Train into a new workdir, from these parameters with --config.pretrained='
        f'{os.path.join(workdir, "params.npz")}, or give more total_steps to go on.')
  record()  # the settings are the run's from here on
  if jax.process_index() == 0 and '://' not in workdir:
    workdirs.record_data(workdir, identity, accepted)
  sizes = workdirs.sizes(state)
  if jax.process_index() == 0:
    workdirs.check_space(workdir, *sizes, config.keep_checkpoints)
  return Built(eval_source=eval_source, total_steps=total_steps, kept=kept, setup=setup,
               data_sharded=data_sharded, manager=manager, state=state, start_step=start_step,
               spent=spent, sizes=sizes, train_seconds=seconds,
               batches=device_batches(config, train_source, data_sharded, config.seed,
                                      start_step))


def _train(config: ml_collections.ConfigDict, workdir: str, started: float,
           preemption: 'Preemption', record: Callable[[], None],
           reconfigure: bool = False) -> Dict[str, float]:
  """The loop: a step, then the actions due after it (`periodic`), until the run's
  last step or its clock's end."""
  from vit_jax.training import events
  built = build_run(config, workdir, started, record, reconfigure)
  writer = events.EventWriter(workdir if jax.process_index() == 0 else None, log=True)
  try:  # the writer is closed on every way out, so its files are released
    seconds, total_steps = built.train_seconds, built.total_steps
    clock = budget.Clock(total_steps, seconds, built.spent, started, agree=(
        (lambda t: float(multihost_utils.broadcast_one_to_all(np.float32(t))))
        if seconds and jax.process_count() > 1 else float))
    run = Run(config, workdir, built, writer, clock, preemption)
    actions = {periodic.LOG: run.log, periodic.SAVE: run.save,
               periodic.KEEP_PARAMS: run.keep_params, periodic.STOP: run.stop,
               periodic.EVALUATE: run.evaluate,
               periodic.RESTART_THROUGHPUT: run.throughput.restart}
    # A budgeted run resumed after its clock ran out has nothing left to train.
    start = built.start_step
    to_train = range(start + 1, total_steps + 1) if not clock.done(start) else ()
    with stall.Watchdog(_cpu_devices(), lambda: run.saved) as watchdog:
      for step in to_train:
        if clock.budgeted and run.metrics is not None:
          jax.block_until_ready(run.metrics)  # the clock reads time trained, not dispatched
        if clock.budgeted:  # the schedule at the clock's progress, set from outside the step
          run.state = steps.set_learning_rate(run.state,
                                              built.setup.schedule(clock.progress(step - 1)))
        try:
          batch = next(built.batches)
        except DataError as e:  # a file gone or damaged since the run began: keep the steps
          if run.saved != step - 1 and step > 1:
            run.save(step - 1)
          saved = (f'the checkpoint is {run.manager.directory}/{run.saved}' if run.saved
                   else 'no step had been trained')
          raise DataError(f'{e} Stopped at step {step - 1} of {total_steps}; {saved}.') from None
        run.state, run.metrics = built.setup.train_step(run.state, batch)
        run.throughput.started(step, run.metrics)
        stopping = preemption.requested(step, config.log_every)
        last = clock.done(step)
        if last and step < total_steps:
          log.info('Time budget %s spent at step %d of the recipe\'s %d: the schedule has run '
                   'to its end; evaluating, saving and stopping.', config.time_budget, step,
                   total_steps)
        periodic.run(actions, step, periodic.due(
            step, last=last, stopping=stopping, log_every=config.log_every,
            checkpoint_every=config.checkpoint_every, eval_every=config.eval_every,
            kept=built.kept))
        watchdog.beat(step)
        if last:
          break
    return run.finish()
  finally:
    writer.close()


def _cpu_devices() -> int:
  """The CPU devices this process splits its cores into, where they can deadlock at a
  collective (`stall.Watchdog`): 1 on other platforms and in multi-process runs,
  whose processes may wait for each other idle while none is stuck."""
  if jax.default_backend() != 'cpu' or jax.process_count() > 1:
    return 1
  return jax.local_device_count()


class Run:
  """A training run's actions after its steps (`periodic.ORDER`) and its end, on
  the state it holds: logging, checkpoints, kept parameters, preemption,
  evaluation, the final files."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, built: Built,
               writer: Any, clock: budget.Clock, preemption: 'Preemption'):
    self.config, self.workdir, self.setup = config, workdir, built.setup
    self.eval_source, self.data_sharded = built.eval_source, built.data_sharded
    self.manager, self.total_steps = built.manager, built.total_steps
    self.writer, self.clock, self.preemption = writer, clock, preemption
    self.state, self.metrics = built.state, None
    self.saved = built.start_step or None  # the last good checkpoint's step
    self.summary: Dict[str, float] = {}  # the last evaluation
    self.state_bytes, self.params_bytes = built.sizes  # for the disk-space checks
    self.throughput = Throughput(config.batch_size)
    self.loads = []  # the 1-minute load average at each log step: how busy the machine was
    self.cores = len(os.sched_getaffinity(0))
    self.cpu_began, self.wall_began = time.process_time(), time.perf_counter()

  def log(self, step: int) -> None:
    """Checks the step's loss and gradient finite (before every save too, so that no
    checkpoint holds a diverged state), then writes and prints its scalars."""
    scalars = check_finite(jax.device_get(self.metrics), step, self.manager.directory)
    self.loads.append(os.getloadavg()[0])
    rate = self.throughput.rate(step)
    self.writer.write_scalars(step, {**scalars, **(
        {'images_per_sec_per_core': rate / jax.device_count()} if rate else {})})
    clock = self.clock
    left = (clock.seconds - clock.elapsed() if clock.budgeted else
            (self.total_steps - step) * self.config.batch_size / rate if rate else 0.)
    log.info(console.training_line(step, self.total_steps, clock.progress(step), scalars, rate,
                                   left, clock.budgeted))

  def save(self, step: int) -> None:
    """Writes the checkpoint (before the evaluation, which may fail: training is
    never lost to it)."""
    began = time.perf_counter()
    with workdirs.guard_disk(self.workdir, 'checkpoint', self.state_bytes, self.saved):
      run_state.save(self.manager, step, self.state, self.clock.elapsed())
      self.manager.wait_until_finished()
    self.saved = step
    log.info('step %d: checkpoint saved in %s (%s)', step, self.manager.directory,
             console.duration(time.perf_counter() - began))

  def keep_params(self, step: int) -> None:
    """Writes params_<step>.npz (config.keep_params_at)."""
    params = jax.device_get(steps.gather(self.state.params, self.setup.mesh))
    if jax.process_index() == 0:
      with workdirs.guard_disk(self.workdir, f'params_{step}.npz', self.params_bytes, self.saved):
        files.save(workdirs.kept_params_path(self.workdir, step), params)

  def stop(self, step: int) -> None:
    """Stops for a preemption, naming the checkpoint just saved."""
    raise Preempted(
        f'Stopped by {self.preemption.name or "another process"} at step {step} of '
        f'{self.total_steps}; the checkpoint is {self.manager.directory}/{step}. Rerun the '
        'same command to resume from it.')

  def evaluate(self, step: int) -> None:
    """Evaluates the state and writes the metrics."""
    began = time.perf_counter()
    self.summary = self.evaluation()
    self.writer.write_scalars(step, self.summary)
    log.info('step %d: %s (%s)', step, evaluation_line(self.summary),
             console.duration(time.perf_counter() - began))

  def evaluation(self) -> Dict[str, float]:
    """The weights' metrics, and with `ema_decay` their average's, prefixed 'ema_'."""
    summary = {}
    for prefix, params in (('', self.state.params), ('ema_', self.state.ema_params)):
      if params is None:
        continue
      batches = data.eval_dataset(self.eval_source,
                                  batch_size=self.config.eval_batch_size,
                                  image_size=self.config.image_size)
      sums = None
      for batch in data.prefetch_to_devices(iter(batches), self.data_sharded):
        # Summed on the host: eager sums of arrays on several CPU devices, queued
        # behind the steps, can leave XLA:CPU's collectives waiting on each other.
        out = jax.device_get(self.setup.eval_step(params, batch))
        sums = out if sums is None else jax.tree_util.tree_map(np.add, sums, out)
      summary.update({prefix + k: v for k, v in {
          'eval_accuracy': float(sums['correct'] / sums['count']),
          'eval_loss': float(sums['loss'] / sums['count']),
          'eval_ece': calibration.ece(calibration.bins(sums['calibration'])),
          'eval_brier': float(sums['brier'] / sums['count']),
          'eval_examples': int(sums['count'])}.items()})
    return summary

  def finish(self) -> Dict[str, float]:
    """The run's end: params.npz (and the moving average's), an evaluation where
    none ran (a run resumed at its end), results.json; returns the evaluation."""
    self.manager.wait_until_finished()
    state, workdir = self.state, self.workdir
    for name, tree in (('params.npz', state.params), (workdirs.EMA_PARAMS, state.ema_params)):
      if tree is None:
        continue
      params = steps.gather(tree, self.setup.mesh)
      if jax.process_index() == 0:
        with workdirs.guard_disk(workdir, name, self.params_bytes, self.saved):
          files.save(os.path.join(workdir, name), jax.device_get(params))
        log.info('step %d: %s written to %s', int(state.step),
                 'parameters' if tree is state.params else 'their moving average',
                 os.path.join(workdir, name))
    if not self.summary:  # resumed at its end: nothing trained, so evaluate what was restored
      self.summary = self.evaluation()
    wall = self.clock.elapsed()  # the workdir's runs together, so that a resumed run counts all
    if jax.process_index() == 0:  # what the run ended with, for the analysis and summaries
      with atomic_write(os.path.join(workdir, files.RESULTS)) as f:
        json.dump({'step': int(state.step), 'total_steps': self.total_steps, **self.summary,
                   'wall_seconds': round(wall, 1),
                   **busy_record(self.loads, self.cores, self.cpu_began, self.wall_began)},
                  f, indent=1)
    return self.summary


def busy_record(loads: Sequence[float], cores: int, cpu_began: float,
                wall_began: float) -> Dict[str, float]:
  """How busy the machine was while this run trained, for results.json: the
  cores it could use, the mean of the load averages sampled at its log steps,
  and its share of those cores (its processes' CPU seconds over wall seconds
  times cores: about 1 on a quiet machine, cores / load on a busy one).

  Args:
    loads: the 1-minute load averages sampled.
    cores: the cores the process may run on.
    cpu_began: `time.process_time()` when training began.
    wall_began: `time.perf_counter()` then.

  Returns:
    {'cpu_count', 'cpu_share'[, 'load_average']}.
  """
  wall = max(time.perf_counter() - wall_began, 1e-9)
  record = {'cpu_count': cores,
            'cpu_share': round((time.process_time() - cpu_began) / (wall * cores), 3)}
  if loads:
    record['load_average'] = round(float(np.mean(loads)), 2)
  return record


def evaluation_line(summary: Dict[str, float]) -> str:
  """An evaluation's metrics as a person reads them.

  Args:
    summary: what `train_and_evaluate` returns.

  Returns:
    'evaluation on N images: accuracy A%, loss L, ECE E, Brier B', and with a
    moving average of the weights '; their moving average: accuracy ...'.
  """
  line = (f'evaluation on {summary["eval_examples"]} images: accuracy '
          f'{100 * summary["eval_accuracy"]:.2f}%, loss {summary["eval_loss"]:.4f}, ECE '
          f'{summary["eval_ece"]:.4f}, Brier {summary["eval_brier"]:.4f}')
  if 'ema_eval_accuracy' in summary:
    line += (f'; their moving average: accuracy {100 * summary["ema_eval_accuracy"]:.2f}%, '
             f'loss {summary["ema_eval_loss"]:.4f}, ECE {summary["ema_eval_ece"]:.4f}, '
             f'Brier {summary["ema_eval_brier"]:.4f}')
  return line


def check_finite(metrics: Dict[str, Any], step: int, checkpoints: Any) -> Dict[str, float]:
  """The step's metrics as floats; a non-finite loss or gradient stops the run.

  Args:
    metrics: the step's metrics on the host.
    step: the step, for the message.
    checkpoints: the checkpoint directory, for the message.

  Returns:
    The metrics as floats.

  Raises:
    TrainingError: when the loss or the gradient norm is not finite.
  """
  if not (np.isfinite(metrics['loss']) and np.isfinite(metrics['grad_norm'])):
    raise TrainingError(
        f'Loss is {metrics["loss"]} (gradient norm {metrics["grad_norm"]}) at step {step}; '
        f'stopped without saving, the last good checkpoint in {checkpoints} is intact. Lower '
        'lr or check the data.')
  return {k: float(v) for k, v in metrics.items()}


def parameter_shapes(model_name: str, fields: Dict[str, Any], num_classes: int,
                     image_size: int) -> Dict[str, tuple]:
  """{'/'-joined name: shape} of the parameters of a zoo model, without allocating them.

  Args:
    model_name: the zoo name.
    fields: its architecture fields.
    num_classes: its classes.
    image_size: the side of its images.

  Returns:
    The shapes.
  """
  model = models.get_model(model_name, num_classes, **fields)
  tree = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                        jax.ShapeDtypeStruct((1, image_size, image_size, 3), np.float32))
  return {k: v.shape for k, v in flatten(tree['params']).items()}


def check_reconfigured_shapes(workdir: str, config: ml_collections.ConfigDict,
                              num_classes: int) -> None:
  """Refuses a --reconfigure whose settings change the shape of a parameter the
  workdir's checkpoints hold (registers, heads, the patch), in one sentence, before
  the checkpointer tries to restore them.

  Args:
    workdir: the run's directory, its settings recorded.
    config: the settings given now.
    num_classes: the data's classes.

  Raises:
    WorkdirError: a parameter would change its shape.
  """
  recorded = workdirs.recorded_settings(workdir)
  if not recorded:
    return
  before = parameter_shapes(recorded['model_name'], recorded.get('model', {}), num_classes,
                            recorded.get('image_size', config.image_size))
  after = parameter_shapes(config.model_name, dict(config.model), num_classes, config.image_size)
  changed = [f'{k} {before.get(k)} -> {after.get(k)}' for k in sorted(set(before) | set(after))
             if before.get(k) != after.get(k)]
  if changed:
    params = os.path.join(workdir, 'params.npz')
    start = (f'from its parameters with --config.pretrained={params}' if os.path.exists(params)
             else 'from scratch')
    raise WorkdirError(
        f'--reconfigure cannot go on from the checkpoints in {workdir}: the new settings change '
        f'the shapes of {len(changed)} parameter(s) they hold ({"; ".join(changed[:3])}'
        f'{"; ..." if len(changed) > 3 else ""}). Train into a new workdir, {start}.')


class Preempted(TrainingError):
  """A run stopped by SIGTERM or Ctrl-C after saving its checkpoint."""


class Preemption(signals.NotedSignals):
  """SIGTERM or Ctrl-C noted while training (`signals.NotedSignals`), so the loop
  saves and stops at the next step. Processes of a multi-process run agree on it
  every `log_every` steps."""

  def __init__(self):
    super().__init__('saving a checkpoint at the next step, then stopping')

  def requested(self, step: int, every: int) -> bool:
    """Whether to save and stop after `step`: a signal came, to this process or,
    checked every `every` steps, to any process of the run.

    Args:
      step: the step just trained.
      every: steps between checks across processes.

    Returns:
      Whether to save and stop.
    """
    if jax.process_count() == 1:
      return self.signalled
    if step % every:
      return False
    return bool(np.any(multihost_utils.process_allgather(np.array(self.signalled))))


class Throughput:
  """Images per second over the training steps between two reports, from the
  first compiled step on, evaluations and saves left out."""

  def __init__(self, batch_size: int):
    self.batch_size, self.since = batch_size, None  # since: (step, time) counted from

  def started(self, step: int, metrics: Any) -> None:
    """Starts the clock after the run's first step (its compilation) is done.

    Args:
      step: the step just trained.
      metrics: its metrics, waited for on the first call.
    """
    if self.since is None:  # the first step of the run compiles: time from its end
      jax.block_until_ready(metrics)
      self.restart(step)

  def restart(self, step: int) -> None:
    """Counts from `step` now (after an evaluation or a save).

    Args:
      step: the step counted from.
    """
    self.since = (step, time.perf_counter())

  def rate(self, step: int) -> float:
    """The rate since the last report (0 on the step it started), then restarts.

    Args:
      step: the step just trained.

    Returns:
      Images per second.
    """
    (first, start), now = self.since, time.perf_counter()
    self.restart(step)
    return (step - first) * self.batch_size / (now - start) if step > first else 0.
