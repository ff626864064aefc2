"""An analysis as the command line asks for it: its flags (`define_flags`), read once
into a frozen `Request` that the command (`analysis.cli.command`) runs.
"""
import dataclasses
import os
from typing import Any, Mapping, Optional, Tuple

import ml_collections
from absl import flags
from ml_collections import config_flags

from analysis import tool
from vit_jax import entry

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The analysis command's flags (each tool's options are its own flags, which
  the tool defines when it registers); once per process."""
  if 'tool_modules' in FLAGS:  # defined already in this process
    return
  entry.define_recipe_flag('config', 'Recipe of the (first) model.')
  entry.define_recipe_flag('config2', 'Recipe of a second model, to compare.')
  flags.DEFINE_string('workdir', None, 'Training workdir of the first model (its params.npz); '
                      'several, comma-separated, for the training runs (seeds) of one recipe.')
  flags.DEFINE_string('workdir2', None, 'Training workdir(s) of the second model.')
  flags.DEFINE_string('checkpoint', None, '.npz of the first model; overrides --workdir.')
  flags.DEFINE_string('checkpoint2', None, '.npz of the second model; overrides --workdir2.')
  flags.DEFINE_string('row', None, 'With a sweep recipe as --config (configs/ablations.py:...), '
                      'the row whose model --workdir holds.')
  flags.DEFINE_string('row2', None, 'The same for --config2.')
  flags.DEFINE_list('rows', None, 'With a sweep recipe as --config and the sweep\'s directory as '
                    '--workdir: analyse these rows together, each from <workdir>/<row> '
                    '(instead of --row and a second model).')
  flags.DEFINE_list('seeds', None, 'With --rows: each row as one model given as its training '
                    'runs of these seeds, from <workdir>/<row>.seed<N> (as `vit_jax.sweep --seeds` '
                    'trains them).')
  flags.DEFINE_list('steps', None, 'Analyse each model from a --workdir at these steps of its '
                    'run, as one model per step: \'warmup\' (the end of warm-up), step numbers '
                    '(kept by training with --config.keep_params_at) and \'last\' (params.npz); '
                    'a model given as its seeds\' runs, as one model per step whose runs are '
                    'its seeds at that step.')
  flags.DEFINE_string('out', 'analysis_out', 'Directory for figures and JSON.')
  flags.DEFINE_string('dataset', None, 'Dataset instead of the recipe\'s (TFDS name or folder:).')
  flags.DEFINE_integer('num_images', 1000, 'Images per split the tools use.')
  flags.DEFINE_integer('batch_size', 100, 'Images per forward pass.')
  flags.DEFINE_list('tool_modules', [], 'Importable modules that register more analysis tools '
                    '(`analysis.tool.register`); imported before the flags are read, so their '
                    'tools may define flags too.')
  flags.DEFINE_enum('sharding', 'data', ['data', 'fsdp'], 'data: each device holds the whole '
                    'parameters; fsdp: they are split over every device as fully sharded '
                    'training splits them, with the batches and Lanczos vectors, for models too '
                    'big for one.')
  flags.DEFINE_bool('overwrite', False, 'Replace the analysis of other models in --out.')
  flags.DEFINE_string('time_budget', '', 'A duration (6m, 90s, 1h): before any tool runs, each '
                      "tool's time is estimated from one timed pass of each kind on each model "
                      'and a sample of its host work, and the costliest tools take smaller samples '
                      'until the whole fits (re-planned between tools against the clock); only a '
                      'budget the smallest samples exceed is refused.')
  flags.DEFINE_bool('tensorboard', True, 'Also write the results as TensorBoard events in '
                    '<workdir>/analysis (or <out>/tensorboard/<model> for a --checkpoint).')


@dataclasses.dataclass(frozen=True)
class Request:
  """One analysis: the tool (or 'all') and every flag's value, read once.

  `config_files` holds each recipe flag's file name and argument
  ('configs/papers.py:vit' -> ('papers.py', 'vit')) by '' and '2'; `options` each
  named tool's options, checked, by tool (every registered one for 'all', in the
  registry's order); `argv` the command line, for the commands of the
  tools a time budget leaves out.
  """
  tool: str
  config: Optional[ml_collections.ConfigDict]
  config2: Optional[ml_collections.ConfigDict]
  config_files: Mapping[str, Tuple[str, str]]
  workdir: Optional[str]
  workdir2: Optional[str]
  checkpoint: Optional[str]
  checkpoint2: Optional[str]
  row: Optional[str]
  row2: Optional[str]
  rows: Optional[Tuple[str, ...]]
  seeds: Optional[Tuple[str, ...]]
  steps: Optional[Tuple[str, ...]]
  out: str
  dataset: Optional[str]
  num_images: int
  batch_size: int
  sharding: str
  overwrite: bool
  time_budget: str
  tensorboard: bool
  options: Mapping[str, Any]
  argv: Tuple[str, ...]


def _config_file(which: str) -> Tuple[str, str]:
  name, _, arg = os.path.basename(config_flags.get_config_filename(
      FLAGS['config' + which])).partition(':')
  return name, arg


def from_flags(name: str, argv: Tuple[str, ...]) -> Request:
  """The request of the parsed flags for tool `name` (or 'all'); each named tool
  reads and checks its options.

  Args:
    name: the tool the command line names, or 'all'.
    argv: the command line.

  Returns:
    The request.
  """
  as_tuple = lambda value: tuple(value) if value else None
  names = list(tool.TOOLS) if name == 'all' else [name]
  return Request(
      tool=name, config=FLAGS.config, config2=FLAGS.config2,
      config_files={which: _config_file(which) for which in ('', '2')
                    if FLAGS['config' + which].value is not None},
      workdir=FLAGS.workdir, workdir2=FLAGS.workdir2, checkpoint=FLAGS.checkpoint,
      checkpoint2=FLAGS.checkpoint2, row=FLAGS.row, row2=FLAGS.row2,
      rows=as_tuple(FLAGS.rows), seeds=as_tuple(FLAGS.seeds), steps=as_tuple(FLAGS.steps),
      out=FLAGS.out, dataset=FLAGS.dataset, num_images=FLAGS.num_images,
      batch_size=FLAGS.batch_size, sharding=FLAGS.sharding, overwrite=FLAGS.overwrite,
      time_budget=FLAGS.time_budget, tensorboard=FLAGS.tensorboard,
      options={n: tool.TOOLS[n].read_options() for n in names}, argv=tuple(argv))
