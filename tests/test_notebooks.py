"""Every notebook runs top to bottom at its small size (`SMALL = True`) on CPU."""
import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

from xla_flags import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, 'notebooks', '*.ipynb')))


def is_parameters(cell) -> bool:
  """The cell tagged `parameters` (papermill's convention) holds the notebook's settings."""
  return 'parameters' in cell.metadata.get('tags', [])


def test_there_are_notebooks_without_outputs():
  assert len(NOTEBOOKS) >= 3
  for path in NOTEBOOKS:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == 'code']
    assert not any(c.outputs or c.execution_count for c in code), f'{path} has outputs'
    assert sum(map(is_parameters, code)) == 1, path


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_at_small_size(path, monkeypatch):
  nb = nbformat.read(path, as_version=4)
  index = next(i for i, c in enumerate(nb.cells) if is_parameters(c))
  nb.cells.insert(index + 1, nbformat.v4.new_code_cell('SMALL = True'))
  # The kernel runs as a user's would, on one CPU device, compiled as the tests'
  # processes are (tests/xla_flags.py).
  monkeypatch.setenv('XLA_FLAGS', FAST_COMPILE)
  monkeypatch.setenv('MPLBACKEND', 'Agg')
  NotebookClient(nb, timeout=900, kernel_name='python3',
                 resources={'metadata': {'path': ROOT}}).execute()
