"""The files that mark a folder as a training run's workdir: its lock, its record of
the recipe, its data's identity, its results, its checkpoints and parameters. The
workdir's rules (`vit_jax.training.workdir`) and the writers that refuse a run's
folder (`hf_files.claim_folder`) read them here.
"""
import os

LOCK = 'lock.json'
RECORD = 'config.json'
DATA = 'data.json'  # the identity of the data the run trains on (`workdir.record_data`)
# A finished run's final step, evaluation and wall seconds (those of the workdir's
# runs, resumed ones included, up to its last checkpoint and after), written by the
# train command.
RESULTS = 'results.json'


def has_results(workdir: str) -> bool:
  """Whether a run left checkpoints or parameters in `workdir`.

  Args:
    workdir: the directory.

  Returns:
    Whether it holds results.
  """
  checkpoints = os.path.join(workdir, 'checkpoints')
  return (os.path.exists(os.path.join(workdir, 'params.npz'))
          or (os.path.isdir(checkpoints) and any(os.scandir(checkpoints))))


def is_run(path: str) -> bool:
  """Whether `path` holds a training run: its record, lock, results, checkpoints or
  parameters.

  Args:
    path: a directory.

  Returns:
    Whether it holds one.
  """
  return has_results(path) or any(os.path.exists(os.path.join(path, name))
                                  for name in (RECORD, LOCK, RESULTS))
