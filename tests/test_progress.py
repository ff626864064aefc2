"""Progress lines of long analysis passes, with the time left."""
import types

import jax.numpy as jnp

from analysis.measures import lanczos
from analysis.runtime import features, progress
from configs import common
from helpers import make_folder


def test_progress_lines_come_with_an_estimate_of_the_time_left(monkeypatch):
  lines = []
  # The readings of the clock: a line reads it once more, after waiting for the work.
  clock = iter([0., 10., 31., 31., 40., 65., 65.])
  monkeypatch.setattr(progress, 'time', types.SimpleNamespace(perf_counter=lambda: next(clock)))
  done = progress.Progress('hessian vit', 10, 'products', out=lines.append)  # starts at 0 s
  done.advance(1)  # at 10 s: too soon for a line
  done.advance(1)  # at 31 s: 2 of 10 done in 31 s, 8 left at that rate
  done.advance(3)  # at 40 s: 9 s after the last line
  done.advance(2)  # at 65 s: 7 of 10
  assert lines == ['hessian vit: 2/10 products, 31s so far, about 2m04s left',
                   'hessian vit: 7/10 products, 1m05s so far, about 28s left']
  # The Lanczos host loop reports every step to the callback.
  seen = []
  lanczos.lanczos_tridiag(lambda v: 2. * v, jnp.ones(6), 4, host_loop=True,
                          on_step=lambda carry: seen.append(carry[1]))
  assert len(seen) == 4


def test_a_pass_over_a_split_reports_its_progress(tmp_path, monkeypatch, capsys):
  """Tools read the analysis splits through `features.recipe_batches`, which reports
  slow passes: here every batch but the last, with REPORT_EVERY at 0."""
  dataset = make_folder(str(tmp_path), {'train': [4, 4], 'test': [6, 6]}, size=(8, 8))
  recipe = common.base_config()
  recipe.update(dataset=dataset, image_size=8)
  monkeypatch.setattr(progress, 'REPORT_EVERY', 0.)
  batches = list(features.recipe_batches(recipe, num_images=12, batch_size=4)('eval'))
  assert [len(images) for images, _ in batches] == [4, 4, 4]
  lines = [line for line in capsys.readouterr().out.splitlines() if 'eval split' in line]
  assert [line.split(',')[0] for line in lines] == ['  eval split: 1/3 batches',
                                                    '  eval split: 2/3 batches']
