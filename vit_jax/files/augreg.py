"""The AugReg checkpoints of "How to train your ViT?" by name: their published
index (`index.csv`), the recommended checkpoint of a model, and the file a
`pretrained='augreg:...'` setting names."""
import csv
import io
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from etils import epath

from vit_jax.models.family import CheckpointError

AUGREG_DIR = 'gs://vit_models/augreg'  # index.csv and {filename}.npz
AUGREG_PREFIX = 'augreg:'
AUGREG_COLUMNS = ('name', 'ds', 'final_val', 'filename', 'adapt_filename')


def index(path_or_url: str = AUGREG_DIR) -> List[Dict[str, Any]]:
  """The rows of the AugReg index (`index.csv`, or the directory holding it), one
  per fine-tuning run of a pre-training checkpoint: name ('B/16', 'R26+S/32'), ds
  ('i21k', 'i21k_30', 'i1k'), the hyperparameters, accuracies (floats), filename,
  adapt_filename, ... as the published file has them.

  Args:
    path_or_url: the index or the directory holding it.

  Returns:
    The rows.
  """
  path = epath.Path(path_or_url)
  if not os.fspath(path).endswith('.csv'):
    path = path / 'index.csv'
  if not path.exists():
    raise CheckpointError(
        f'No AugReg index at {path}. It is published at {AUGREG_DIR}/index.csv: copy it and '
        'the .npz files you need into a directory (gsutil cp) and name that directory '
        '(--config.augreg_dir).')
  rows = list(csv.DictReader(io.StringIO(path.read_text())))
  missing = [c for c in AUGREG_COLUMNS if not rows or c not in rows[0]]
  if missing:
    raise CheckpointError(f'{path} is not an AugReg index: it lacks the columns {missing}.')
  for row in rows:
    for key, value in row.items():
      try:
        row[key] = float(value)
      except (TypeError, ValueError):
        pass
  return rows


def model_name(name: str) -> str:
  """The zoo name of an AugReg model name: 'B/16' -> 'ViT-B_16', 'R26+S/32' ->
  'R26+ViT-S_32'.

  Args:
    name: the AugReg name.

  Returns:
    The zoo name.
  """
  body, _, rest = name.rpartition('+')
  size, _, patch = rest.partition('/')
  return f'{body + "+" if body else ""}ViT-{size}_{patch}'


def select(rows: Sequence[Mapping[str, Any]], spec: str) -> Mapping[str, Any]:
  """The index row of `spec`: an exact pre-training or fine-tuned filename, or a
  model name with an optional pre-training dataset, 'B/16' or 'B/16@i1k' (default
  i21k), whose recommended checkpoint is the one with the best final validation
  accuracy (`final_val`) among that name's pre-training runs.

  Args:
    rows: the index's rows.
    spec: a filename or name[@dataset].

  Returns:
    The row.
  """
  for row in rows:
    if spec in (row['filename'], row['adapt_filename']):
      return row
  name, _, ds = spec.partition('@')
  ds = ds or 'i21k'
  runs = [row for row in rows if row['name'] == name and row['ds'] == ds]
  if not runs:
    known = sorted({f"{row['name']}@{row['ds']}" for row in rows})
    raise CheckpointError(f'No AugReg checkpoint {spec!r} (model {name!r} pre-trained on '
                          f'{ds!r}) in the index; it has {", ".join(known)}, or give an exact '
                          'filename.')
  return max(runs, key=lambda row: row['final_val'])


def lookup(spec: str, augreg_dir: Optional[str] = None
                  ) -> Tuple[str, Mapping[str, Any]]:
  """The file and index row of an AugReg name or filename (`select`), through
  the index in `augreg_dir` (default the public bucket).

  Args:
    spec: a filename or name[@dataset].
    augreg_dir: the directory of the index and files.

  Returns:
    (the file's path, the row).
  """
  directory = (augreg_dir or AUGREG_DIR).rstrip('/')
  row = select(index(directory), spec)
  filename = row['adapt_filename'] if spec == row['adapt_filename'] else row['filename']
  return f'{directory}/{filename}.npz', row


def resolve(pretrained: str, augreg_dir: Optional[str] = None) -> str:
  """The file a `pretrained` setting names: 'augreg:<name or filename>' through the
  AugReg index (`lookup`), anything else as it is.

  Args:
    pretrained: the recipe's `pretrained`.
    augreg_dir: the directory of the AugReg index and files.

  Returns:
    The file's path.
  """
  if not pretrained.startswith(AUGREG_PREFIX):
    return pretrained
  return lookup(pretrained[len(AUGREG_PREFIX):], augreg_dir)[0]
