"""Representation similarity: all-pairs minibatch linear CKA of every model's
residual stream, within and across models (Raghu et al. Fig. 1-2)."""
import os
from typing import Dict, List, Mapping, Sequence

import numpy as np

from analysis.measures import similarity, uncertainty
from analysis.reporting import plots, verdict
from analysis.runtime import features
from analysis.tool import ALL_MODELS, Batches, Figure, Subject, Tool, register


def measure(subjects: Sequence[Subject], batches: Batches, unbiased: bool = True) -> Dict:
  """All-pairs minibatch linear CKA of every subject's residual stream, within and
  across models, in one pass over the evaluation split; its spread is the standard
  error of the per-batch CKA over batches (entry by entry, and of each model's mean
  over distinct layer pairs).

  Args:
    subjects: the models.
    batches: split -> its (images, labels) batches.
    unbiased: HSIC1 (Nguyen et al.) instead of the biased HSIC.

  Returns:
    The tool's JSON but its figures (`draw`'s).
  """
  names = [s.layers.stream for s in subjects]
  stream = similarity.MinibatchCKA('linear', unbiased=unbiased)
  sizes = []
  for images, _ in batches('eval'):
    stream.update(features.layer_representations(subjects, names, images))
    sizes.append(len(images))
  matrix = stream.result()
  result = {'layers': {s.label: list(s.layers.labels) for s in subjects},
            'stages': {s.label: list(s.layers.stages) for s in subjects},
            'num_examples': stream.num_examples, 'num_batches': len(sizes),
            'unbiased': unbiased, 'cka': {}, 'cka_stderr': {}, 'offdiag_mean_stderr': {}}
  bounds = np.cumsum([0] + [len(n) for n in names])
  for i, a in enumerate(subjects):
    for j, b in enumerate(subjects[i:], start=i):
      rows, cols = slice(bounds[i], bounds[i + 1]), slice(bounds[j], bounds[j + 1])
      block, per_batch = matrix[rows, cols], np.stack([m[rows, cols] for m in stream.per_batch])
      key = a.label if i == j else f'{a.label} vs {b.label}'
      result['cka'][key] = block.tolist()
      result['cka_stderr'][key] = uncertainty.weighted_mean_stderr(per_batch, sizes).tolist()
      if i == j:
        result['offdiag_mean_stderr'][key] = float(uncertainty.weighted_mean_stderr(
            [similarity.offdiag_mean(m) for m in per_batch], sizes))
  return result


def draw(result: Mapping, subjects: Sequence[Subject], out: str) -> List[str]:
  """The figures of the tool's numbers (`measure`): a heatmap of CKA per pair of
  models (each model with itself too), in `result['cka']`'s order.

  See `analysis.tool.Draw`.
  """
  figures = []
  for i, a in enumerate(subjects):
    for j, b in enumerate(subjects[i:], start=i):
      key = a.label if i == j else f'{a.label} vs {b.label}'
      figures.append(plots.heatmap(
          np.asarray(result['cka'][key]).T, os.path.join(out, f'cka_{a.label}_{b.label}.png'),
          f'CKA: {key}', f'{a.label} layer', f'{b.label} layer', xlabels=a.layers.labels,
          ylabels=b.layers.labels, xstages=a.layers.stages, ystages=b.layers.stages,
          colorbar_label='linear CKA'))
  return figures


def _models(key: str) -> List[str]:
  a, _, b = key.partition(' vs ')
  return [a, b or a]


def layer_panels(matrices: Mapping[str, Sequence], layers: Mapping[str, Sequence[str]],
                 stages: Mapping[str, Sequence]) -> List[plots.Panel]:
  """One heat-map panel per key ('a' within a model, 'a vs b' between two), layer 0
  of the first model along x.

  Args:
    matrices: key -> its (layers of a, layers of b) matrix.
    layers: each model's layer labels.
    stages: each model's stage per layer (models without stages may be missing).

  Returns:
    The panels, in the keys' order.
  """
  panels = []
  for key, matrix in matrices.items():
    a, b = _models(key)
    panels.append(plots.Panel(np.asarray(matrix, np.float64).T, key, layers[a], layers[b],
                              stages.get(a, ()), stages.get(b, ()), f'{a} layer', f'{b} layer'))
  return panels


def findings(result: Mapping, q) -> Dict[str, list]:
  """What the models show, per caption key.

  Args:
    result: the tool's JSON.
    q: makes a quote of a number of the JSON (`tool.QuoteFn`).

  Returns:
    Text fragments per caption key.
  """
  out = {}
  for key in result['cka']:
    if ' vs ' in key:
      out[key] = [f'{key}: mean CKA ', q('cka', key, reduce='mean'), ', highest ',
                  q('cka', key, reduce='max')]
      if key in same_layer(result):
        out[key] += ['; same layer: first ', q('cka', key, 0, 0), ', last ',
                     q('cka', key, -1, -1)]
    else:
      out[key] = [f'{key}: first vs last layer ', q('cka', key, 0, -1), ' ± ',
                  q('cka_stderr', key, 0, -1), ', mean over distinct layer pairs ',
                  q('cka', key, reduce='offdiag_mean'), ' ± ', q('offdiag_mean_stderr', key)]
  return out


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  within = [key for key in result['cka'] if ' vs ' not in key]
  return [verdict.contrast(
      'uniform representations',
      'ViT\'s representations are more uniform across depth than ResNet\'s, whose lower and '
      'higher layers differ (Raghu et al. Fig. 1).',
      'mean CKA between distinct layers (one measure, minibatch linear CKA; the similarities '
      'tool judges the claim under seven)', models, within,
      lambda label: (similarity.offdiag_mean(result['cka'][label]),
                     result['offdiag_mean_stderr'][label]))]


def figures(result: Mapping) -> List[Figure]:
  """One heatmap per key of 'cka', in the keys' order.

  Args:
    result: the tool's JSON.

  Returns:
    The figures.
  """
  return [Figure(path, key, tuple(dict.fromkeys(_models(key))))
          for key, path in zip(result['cka'], result['figures'])]


def scalars(result: Mapping, label: str) -> Dict[str, List[float]]:
  """A model's TensorBoard series from the tool's JSON.

  Args:
    result: the tool's JSON.
    label: the model's label.

  Returns:
    tag -> values.
  """
  if label not in result['cka']:
    return {}
  return {'cka/first_layer_vs_layer': list(result['cka'][label][0])}


def joint(result: Mapping, colour_of: Mapping[str, str], out: str) -> List[str]:
  """Every heatmap side by side on one colour scale (Raghu et al. Fig. 1).

  Args:
    result: the tool's JSON.
    colour_of: each model label's colour.
    out: the directory the figures go to.

  Returns:
    The figures' paths.
  """
  layers = result['layers']
  stages = result.get('stages', {})
  panels = layer_panels(result['cka'], layers, stages)
  figures = [plots.heatmaps(panels, os.path.join(out, 'joint_cka.png'),
                            f'Linear CKA on {result["num_examples"]} images (one colour scale)',
                            colorbar_label='linear CKA')]
  same = same_layer(result)
  if same:
    a = _models(next(iter(same)))[0]
    figures.append(plots.curves(
        same, os.path.join(out, 'joint_cka_same_layer.png'),
        'CKA between the same layer of two models of one architecture', 'layer', 'linear CKA',
        xlabels=layers[a], stages=stages.get(a, ()),
        errors={key: np.diag(np.asarray(result['cka_stderr'][key])) for key in same}))
  return figures


def same_layer(result: Mapping) -> Dict[str, np.ndarray]:
  """For each pair of models with the same layers (seeds, data fractions, a skip
  removed: a sweep's rows), the CKA of each layer with the same layer of the other.

  Args:
    result: the cka tool's JSON.

  Returns:
    {pair: CKA per layer}.
  """
  layers = result['layers']
  return {key: np.diag(np.asarray(matrix)) for key, matrix in result['cka'].items()
          if ' vs ' in key and layers[_models(key)[0]] == layers[_models(key)[1]]}


TOOL = register(Tool(
    name='cka', importance=1, title='Representation similarity (CKA)',
    quantity='Linear CKA between every pair of residual-stream layers, minibatch HSIC '
             '(Nguyen et al.; unbiased unless the JSON says otherwise) over the evaluation '
             'images; layer 0 at the bottom left; ± the standard error of the per-batch CKA '
             'over batches.',
    paper='Raghu et al. (Fig. 1-2): ViT\'s representations are uniform across depth, while '
          'ResNet\'s lower and higher layers differ (block structure); ViT\'s lower half '
          'matches a larger share of ResNet\'s depth.',
    run=measure, draw=draw, runs_on=ALL_MODELS, findings=findings, figures=figures, scalars=scalars,
    joint=joint, models=lambda result: list(result['layers']), verdicts=verdicts))
