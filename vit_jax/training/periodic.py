"""What the training loop does after each step, and in which order: the periodic
actions (in the manner of clu's `periodic_actions`), their triggers, and the one
order they run in, declared here as data (`ORDER`) and tested.

The order's rules: the step's loss is checked finite and logged before any save
(no checkpoint holds a diverged state); the checkpoint is saved before the
parameters kept at a step and before stopping for a preemption (training is
never lost); the evaluation comes after the save (an evaluation that fails
loses no training); the throughput's clock restarts after the evaluations and
saves it must not count.
"""
from typing import Callable, Collection, Dict, Mapping

# The actions after a training step, in the order they run.
LOG = 'log'                  # check the loss and gradient finite, write and print the scalars
SAVE = 'save'                # write the checkpoint
KEEP_PARAMS = 'keep_params'  # write params_<step>.npz (config.keep_params_at)
STOP = 'stop'                # stop for a preemption, naming the checkpoint
EVALUATE = 'evaluate'        # evaluate the weights (and their moving average)
RESTART_THROUGHPUT = 'restart_throughput'  # time the next steps from now
ORDER = (LOG, SAVE, KEEP_PARAMS, STOP, EVALUATE, RESTART_THROUGHPUT)


def due(step: int, *, last: bool, stopping: bool, log_every: int, checkpoint_every: int,
        eval_every: int, kept: Collection[int]) -> Dict[str, bool]:
  """Which actions fall on `step`.

  Args:
    step: the step just trained.
    last: whether it is the run's last (the recipe's steps, or the budget spent).
    stopping: whether the run stops after it (a preemption).
    log_every: the logging period.
    checkpoint_every: the checkpointing period.
    eval_every: the evaluation period.
    kept: the steps whose parameters are kept.

  Returns:
    {action: whether it runs}, for every action of `ORDER`.
  """
  save = step % checkpoint_every == 0 or last or stopping
  return {LOG: step % log_every == 0 or save,  # every save is checked first
          SAVE: save,
          KEEP_PARAMS: step in kept,
          STOP: stopping,
          EVALUATE: step % eval_every == 0 or last,
          RESTART_THROUGHPUT: step % eval_every == 0 or save}


def run(actions: Mapping[str, Callable[[int], None]], step: int, dues: Mapping[str, bool]) -> None:
  """Runs the actions due at `step`, in `ORDER`.

  Args:
    actions: {action: function of the step}, one for every action of `ORDER`.
    step: the step just trained.
    dues: `due`'s answer for the step.
  """
  for name in ORDER:
    if dues[name]:
      actions[name](step)
