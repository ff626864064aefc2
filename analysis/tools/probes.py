"""Linear probes per layer and token kind, few-shot accuracy on the pre-logits
(Raghu et al. Fig. 12-13), and a few-shot probe on each final-layer token (Fig. 11)."""
import time
from typing import Dict, Iterator, List, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from analysis.measures import linear_probes, uncertainty
from analysis.reporting import joint_figures, plots, verdict
from analysis.runtime import features
from analysis.runtime.estimate import Amounts, Work
from analysis.tool import (Batches, Subject, Tool, each_model, figure_path, model_scalars,
                           per_model, register)


def _token_features(subject: Subject, x: jax.Array) -> Dict[str, jax.Array]:
  """Per-example probe inputs from one representation: the class token, the centre
  spatial token (position) and the mean over spatial tokens (positions)."""
  grid = features.spatial_map(subject, x)
  h, w = grid.shape[1:3]
  out = {'centre token': grid[:, h // 2, w // 2], 'token mean': jnp.mean(grid, axis=(1, 2))}
  if subject.has_cls:
    out['class token'] = x[:, 0]
  return out


def _collect(subject: Subject, iterator: Iterator, names: Sequence[str], mapped: str):
  """Probe inputs per (layer, token kind) and the labels; for layer `mapped`, also
  every spatial token, kind 'map' (N, H, W, D)."""
  feats, labels = {}, []
  for images, batch_labels in iterator:
    inter = subject.intermediates(images, names)
    for name in names:
      per_token = inter[name] if inter[name].ndim == 2 else _token_features(subject, inter[name])
      if inter[name].ndim == 2:
        per_token = {'features': per_token}
      if name == mapped:
        per_token['map'] = features.spatial_map(subject, inter[name])
      for kind, value in per_token.items():
        feats.setdefault((name, kind), []).append(np.asarray(value))
    labels.append(batch_labels)
  return {k: np.concatenate(v) for k, v in feats.items()}, np.concatenate(labels)


def _per_token(train_x, train_y, test_x, test_y, num_classes: int, last: str, shots: int,
               subject: Subject) -> Dict:
  """A `shots`-shot probe on each final-layer token, beside the same probe on the
  token mean and the class token."""
  grid = linear_probes.few_shot_per_position(train_x[last, 'map'], train_y,
                                             test_x[last, 'map'], test_y, num_classes, shots)
  pooled = {kind: linear_probes.few_shot_accuracy(train_x[last, kind], train_y,
                                                  test_x[last, kind], test_y, num_classes, shots)
            for kind in ('token mean', 'class token') if (last, kind) in train_x}
  return {'shots': shots, 'layer': subject.layers.labels[-1], 'accuracy': grid.tolist(),
          'mean': float(grid.mean()), 'min': float(grid.min()), 'max': float(grid.max()),
          'pooled': pooled, 'num_classes': num_classes}


TOKEN_SHOTS = 10  # Raghu et al.'s per-token probes are 10-shot


SHOTS = (1, 5, 10, 25)  # the few-shot probes on the pre-logits


def measure(subject: Subject, batches: Batches, shots: Sequence[int] = SHOTS) -> Dict:
  """Ridge probes per layer and token kind, few-shot accuracy on pre-logits, and a
  10-shot probe on each final-layer token.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    shots: the few-shot probes on the pre-logits.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  names, pre_logits = list(subject.layers.stream), subject.layers.pre_logits
  train_x, train_y = _collect(subject, batches('train'), names + [pre_logits], names[-1])
  test_x, test_y = _collect(subject, batches('eval'), names + [pre_logits], names[-1])
  num_classes = int(max(train_y.max(), test_y.max())) + 1
  kinds = sorted({kind for name, kind in train_x if name != pre_logits and kind != 'map'})
  layers = {kind: [linear_probes.probe_accuracy(train_x[n, kind], train_y, test_x[n, kind], test_y,
                                         num_classes) for n in names] for kind in kinds}
  smallest_class = int(np.bincount(train_y, minlength=num_classes).min())
  few_shot = {k: linear_probes.few_shot_accuracy(train_x[pre_logits, 'features'], train_y,
                                          test_x[pre_logits, 'features'], test_y, num_classes, k)
              for k in shots if k <= smallest_class}
  for rows in layers.values():
    for row in rows:
      row['stderr'] = float(uncertainty.binomial_stderr(row['accuracy'], len(test_y)))
  per_token = (_per_token(train_x, train_y, test_x, test_y, num_classes, names[-1], TOKEN_SHOTS,
                          subject) if TOKEN_SHOTS <= smallest_class else None)
  return {'layers': list(subject.layers.labels), 'probes': layers,
          'few_shot_pre_logits': few_shot,
          'few_shot_stderr': {k: float(uncertainty.binomial_stderr(v, len(test_y)))
                              for k, v in few_shot.items()},
          'shots_left_out': [k for k in shots if k > smallest_class],
          'few_shot_per_token': per_token, 'num_train': len(train_y), 'num_test': len(test_y)}


def draw(result: Mapping, subject: Subject, out: str) -> List[str]:
  """The figures of the tool's numbers (`measure`): each token kind's probe accuracy
  per layer, and a heatmap of the per-token probe over the final layer's grid
  (where every class had its shots).

  See `analysis.tool.Draw`.
  """
  layers = result['probes']
  figures = [plots.curves(
      {kind: [r['accuracy'] for r in rows] for kind, rows in layers.items()},
      figure_path(out, 'probes', subject), f'Linear probes: {subject.label}', 'layer',
      'test accuracy', xlabels=subject.layers.labels, stages=subject.layers.stages,
      errors={kind: [r['stderr'] for r in rows] for kind, rows in layers.items()})]
  token = result['few_shot_per_token']
  if token:
    grid = np.asarray(token['accuracy'])
    h, w = grid.shape
    figures.append(plots.heatmap(
        grid[::-1], figure_path(out, 'probes_per_token', subject),
        f'{token["shots"]}-shot probe per final-layer token: {subject.label}', 'column', 'row',
        vmin=1. / token['num_classes'], vmax=1., xlabels=[str(j) for j in range(w)],
        ylabels=[str(i) for i in reversed(range(h))], colorbar_label='test accuracy'))
  return figures


def _findings(label, r, q):
  parts = [f'{label}: last-layer probes ']
  for i, kind in enumerate(r['probes']):
    parts += [', ' if i else '', f'{kind} ', q('probes', kind, -1, 'accuracy'), ' ± ',
              q('probes', kind, -1, 'stderr')]
  for shots in r['few_shot_pre_logits']:
    parts += [f'; {shots}-shot on pre-logits ', q('few_shot_pre_logits', shots), ' ± ',
              q('few_shot_stderr', shots)]
  if r.get('few_shot_per_token'):
    token = r['few_shot_per_token']
    parts += [f'; {token["shots"]}-shot probes on single final-layer tokens ',
              q('few_shot_per_token', 'mean'), ' on average (',
              q('few_shot_per_token', 'min'), ' to ', q('few_shot_per_token', 'max'), ')']
    for kind in token['pooled']:
      parts += [f', on the {kind} ', q('few_shot_per_token', 'pooled', kind)]
  return parts


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  claim = ('A class-token ViT\'s class token becomes decodable only in its last layers, the '
           'spatial tokens\' mean earlier (Raghu et al. Fig. 12).')
  found = []
  for label, r in per_model(result).items():
    if 'class token' not in r['probes']:
      found.append(verdict.Verdict(
          'class token decoded late', claim, f'{label}: no class token', verdict.NOT_COMPARABLE,
          'the claim concerns class-token ViTs; this model pools its final features',
          label=label))
      continue
    middle = len(r['layers']) // 2
    at = lambda kind: (r['probes'][kind][middle]['accuracy'], r['probes'][kind][middle]['stderr'])
    found.append(verdict.single(
        'class token decoded late', claim,
        f'probe accuracy at {r["layers"][middle]}, token mean minus class token', label,
        verdict.difference(at('token mean'), at('class token'))))
  return found


def _scalars(r):
  series = {f'probes/{kind}': [row['accuracy'] for row in rows]
            for kind, rows in r['probes'].items()}
  series.update({f'probes/few_shot_{k}': [v] for k, v in r['few_shot_pre_logits'].items()})
  return series


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """The figures that put every model in one frame.

  Args:
    result: the tool's JSON.
    colour_of: each model label's colour.
    out: the directory the figures go to.

  Returns:
    The figures' paths (none below two models).
  """
  return joint_figures.depth_curves(
      per_model(result), lambda r: [row['accuracy'] for row in r['probes']['token mean']],
      colour_of, joint_figures.path(out, 'probes'), 'Linear probe on the token mean per layer',
      'test accuracy', errors=lambda r: [row['stderr'] for row in r['probes']['token mean']])


LAYER_PROBES, FEW_SHOT_PROBES = 'layer probes', 'few-shot probes'


def work(subject: Subject, options: None, amounts: Amounts) -> Work:
  """A pass over the training and one over the evaluation split; the ridge probes
  of every layer for each token kind, and the few-shot probes.

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  kinds = 2 + subject.has_cls  # the centre token, the token mean (and the class token)
  return Work({'forward': 2 * amounts.batches}, {'forward': 1},
              host={LAYER_PROBES: kinds, FEW_SHOT_PROBES: 1})


def host_prices(subject: Subject, images: np.ndarray, labels: np.ndarray, options: None,
                amounts: Amounts) -> Dict[str, float]:
  """Seconds of one token kind's probes over every layer, and of all the few-shot
  probes, timed on random features of each layer's width at the command's number
  of images (a solve's time depends only on the shapes): a `probe_accuracy` per
  distinct width, and a `few_shot_accuracy` at the final layer's width times the
  few-shot probes run (the pre-logits' shots, the pooled tokens' and every
  final-layer position's).

  Args:
    subject: the model.
    images: one evaluation batch of images.
    labels: their labels.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    Seconds per unit, by the unit's name.
  """
  inter = subject.intermediates(images, subject.layers.stream)
  widths = [np.shape(inter[name])[-1] for name in subject.layers.stream]
  h, w = features.spatial_map(subject, inter[subject.layers.stream[-1]]).shape[1:3]
  num_classes = subject.config.num_classes or len(np.unique(labels))
  labels = np.arange(amounts.num_images) % num_classes
  random = np.random.RandomState(0)

  def timed(fn, width):
    x = random.normal(size=(amounts.num_images, width)).astype(np.float32)
    start = time.perf_counter()
    fn(x, labels, x, labels, num_classes)
    return time.perf_counter() - start
  per_width = {d: timed(linear_probes.probe_accuracy, d) for d in set(widths)}
  shots = max(1, min(TOKEN_SHOTS, amounts.num_images // num_classes))
  few_shot = timed(lambda *a: linear_probes.few_shot_accuracy(*a, shots), widths[-1])
  return {LAYER_PROBES: sum(per_width[d] for d in widths),
          FEW_SHOT_PROBES: few_shot * (len(SHOTS) + 2 + h * w)}


TOOL = register(Tool(
    name='probes', importance=9, title='Linear probes', splits=('train', 'eval'),
    quantity='Ridge linear probes per layer on the class token, the centre token and the token '
             'mean; few-shot linear accuracy on the pre-logits; a 10-shot probe on each '
             'final-layer token (a grid); ± and error bars are binomial standard errors on the '
             'test images.',
    paper='Raghu et al. (Fig. 11-13): a class-token ViT\'s class token becomes decodable only in '
          'the last layers, while the spatial tokens\' mean is decodable earlier; its single '
          'spatial tokens classify poorly, a GAP ViT\'s and a ResNet\'s well.',
    run=measure, draw=draw, findings=each_model(_findings), scalars=model_scalars(_scalars),
    joint=joint, verdicts=verdicts, work=work, host_prices=host_prices))
