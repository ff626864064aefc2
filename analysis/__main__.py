"""Command line of the analysis tools: figures (PNG) and their numbers (JSON).

    python -m analysis <tool> --config configs/quickstart_vit.py --workdir workdirs/quickstart_vit \
        [--config2 configs/quickstart_resnet.py --workdir2 workdirs/quickstart_resnet] --out DIR

A model is the recipe that trained it (`--config`: model name, architecture,
image size, dataset) and its parameters (`--workdir` with params.npz, or
`--checkpoint` with any .npz, published or ours). Tools: see TOOLS; `all` runs
every one on every model it applies to.
"""
import functools
import json
import os
import sys
import time
from typing import Dict

from absl import app, flags
from ml_collections import config_flags

from analysis import features
from analysis import landscape_tools as lt
from analysis import representation_tools as rt
from vit_jax import sweep

# tool: (function, what it needs). 'pair' tools take every model at once; 'attention'
# tools run on the models that sow global attention weights (ViTs); 'any' on all.
TOOLS = {
    'cka': (rt.run_cka, 'pair'),
    'attention_distance': (rt.run_attention_distance, 'attention'),
    'norm_ratio': (rt.run_norm_ratio, 'any'),
    'erf': (rt.run_erf, 'any'),
    'probes': (rt.run_probes, 'any'),
    'localisation': (rt.run_localisation, 'attention'),
    'vit_figures': (rt.run_vit_figures, 'attention'),
    'hessian': (lt.run_hessian, 'any'),
    'fourier': (lt.run_fourier, 'any'),
    'robustness': (lt.run_robustness, 'any'),
}

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'Recipe of the (first) model.')
config_flags.DEFINE_config_file('config2', None, 'Recipe of a second model, to compare.')
flags.DEFINE_string('workdir', None, 'Training workdir of the first model (its params.npz).')
flags.DEFINE_string('workdir2', None, 'Training workdir of the second model.')
flags.DEFINE_string('checkpoint', None, '.npz of the first model; overrides --workdir.')
flags.DEFINE_string('checkpoint2', None, '.npz of the second model; overrides --workdir2.')
flags.DEFINE_string('row', None, 'With a sweep recipe as --config (configs/ablations.py:...), '
                    'the row whose model --workdir holds.')
flags.DEFINE_string('row2', None, 'The same for --config2.')
flags.DEFINE_string('out', 'analysis_out', 'Directory for figures and JSON.')
flags.DEFINE_string('dataset', None, 'Dataset instead of the recipe\'s (TFDS name or folder:).')
flags.DEFINE_integer('num_images', 1000, 'Images per split the tools use.')
flags.DEFINE_integer('batch_size', 100, 'Images per forward pass.')
flags.DEFINE_integer('hessian_batches', 4, 'Minibatches (of --batch_size) for the Hessian.')
flags.DEFINE_integer('lanczos_steps', 20, 'Lanczos steps per top-k estimate; twice as many '
                     'for the density.')
flags.DEFINE_enum('hessian_objective', 'training', ['training', 'clean'],
                  'training: the recipe\'s loss plus L2 on augmented training batches (Park & '
                  'Kim); clean: plain cross-entropy on evaluation-preprocessed images.')


def _subject(config, workdir, path, which: str) -> features.Subject:
  path = path or workdir
  if path is None:
    raise app.UsageError(f'Give --workdir{which} or --checkpoint{which} with --config{which}.')
  label = os.path.splitext(os.path.basename(config_flags.get_config_filename(
      FLAGS['config' + which])))[0]
  row = FLAGS['row' + which].value
  if 'sweep' in config:
    rows = [name for name, _ in config.sweep.rows]
    if row not in rows:
      raise app.UsageError(f'--config{which} is the sweep {config.sweep.name!r}: name its row '
                           f'with --row{which}, one of {rows}.')
    config, label = sweep.row_config(config, row), f'{config.sweep.name}_{row}'
  elif row is not None:
    raise app.UsageError(f'--row{which} needs a sweep recipe as --config{which}.')
  return features.load_subject(config.model_name, path, config.image_size, dict(config.model),
                               label=label, recipe=config)


def run(tool: str) -> Dict:
  if FLAGS.config is None:
    raise app.UsageError('--config is required: the recipe of the model to analyse.')
  subjects = [_subject(FLAGS.config, FLAGS.workdir, FLAGS.checkpoint, '')]
  if FLAGS.config2 is not None:
    subjects.append(_subject(FLAGS.config2, FLAGS.workdir2, FLAGS.checkpoint2, '2'))
  if len({s.label for s in subjects}) < len(subjects):
    subjects[1].label += '_2'

  def batches_for(subject):
    return features.recipe_batches(subject.recipe, FLAGS.num_images, FLAGS.batch_size,
                                   FLAGS.dataset)

  os.makedirs(FLAGS.out, exist_ok=True)
  results, seconds = {}, {}
  for name in (TOOLS if tool == 'all' else [tool]):
    start = time.perf_counter()
    fn, needs = TOOLS[name]
    if name == 'hessian':
      fn = functools.partial(fn, num_minibatches=FLAGS.hessian_batches,
                             steps_top=FLAGS.lanczos_steps, steps_density=2 * FLAGS.lanczos_steps,
                             objective=FLAGS.hessian_objective)
    if needs == 'pair':
      results[name] = fn(subjects, batches_for(subjects[0]), FLAGS.out)
    else:
      results[name] = {s.label: fn(s, batches_for(s), FLAGS.out) for s in subjects
                       if needs == 'any' or s.layers.attention_weights}
    with open(os.path.join(FLAGS.out, f'{name}.json'), 'w') as f:
      json.dump(results[name], f)
    seconds[name] = round(time.perf_counter() - start, 1)
    print(f'{name}: wrote {os.path.join(FLAGS.out, name + ".json")} in {seconds[name]} s',
          flush=True)
  with open(os.path.join(FLAGS.out, 'timings.json'), 'w') as f:
    json.dump(seconds, f)  # wall seconds per tool, compilation and data included
  return results


def main(argv):
  if len(argv) != 2 or argv[1] not in list(TOOLS) + ['all']:
    raise app.UsageError(f'Usage: python -m analysis <tool> --config ... ; tools: '
                         f'{", ".join(TOOLS)}, all.')
  run(argv[1])


if __name__ == '__main__':
  app.run(main, argv=sys.argv)
