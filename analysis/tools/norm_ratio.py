"""Skip connections: the norm of the stream entering each residual branch over the
norm of what the branch adds (Raghu et al. Fig. 7)."""
from typing import Dict, List, Mapping

import jax.numpy as jnp
import numpy as np

from analysis.measures import skip
from analysis.reporting import joint_figures, plots, verdict
from analysis.tool import (Batches, Subject, Tool, batch_mean, each_model, figure_path,
                           model_scalars, per_model, register)


def measure(subject: Subject, batches: Batches) -> Dict:
  """||z|| / ||f(z)|| for every residual branch, class token apart from the rest.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.

  Returns:
    The model's JSON but its figures (`draw`'s).
  """
  rows = subject.layers.branches
  names = sorted({n for row in rows for n in (row.skip, row.output)})
  kinds = ('cls', 'spatial') if subject.has_cls else ('spatial',)

  def ratios(images, _):
    inter = subject.intermediates(images, names)
    values = [skip.token_norm_ratios(inter[row.skip], inter[row.output], subject.has_cls,
                                     subject.registers) for row in rows]
    return jnp.array([[v[k] for k in kinds] for v in values])

  table, stderr = batch_mean(batches('eval'), ratios)
  result = {row.label: dict(zip(kinds, map(float, values))) for row, values in zip(rows, table)}
  result_stderr = {row.label: dict(zip(kinds, map(float, values)))
                   for row, values in zip(rows, stderr)}
  return {'ratios': result, 'ratios_stderr': result_stderr}


def draw(result: Mapping, subject: Subject, out: str) -> List[str]:
  """The figure of the tool's numbers (`measure`): one curve per kind of branch and
  token, each over the branches of that kind in depth order, at their positions
  among all branches; attention branches shaded.

  See `analysis.tool.Draw`.
  """
  rows = subject.layers.branches
  kinds = list(next(iter(result['ratios'].values())))
  series, x, errors = {}, {}, {}
  for branch in dict.fromkeys(row.kind for row in rows):
    where = [i for i, row in enumerate(rows) if row.kind == branch]
    for kind in kinds:
      name = f'{branch} ({kind})'
      series[name] = np.array([result['ratios'][rows[i].label][kind] for i in where])
      errors[name] = np.array([result['ratios_stderr'][rows[i].label][kind] for i in where])
      x[name] = where
  return [plots.curves(series, figure_path(out, 'norm_ratio', subject),
                         f'||z|| / ||f(z)||: {subject.label}', 'residual branch', 'ratio',
                         x=x, logy=True, decades=3, xlabels=[row.label for row in rows],
                         stages=subject.layers.branch_stages, errors=errors,
                         shade=[i for i, row in enumerate(rows) if row.kind == 'attention'],
                         shade_label='attention branch')]


def _findings(label, r, q):
  kind = 'cls' if 'cls' in next(iter(r['ratios'].values())) else 'spatial'
  branches = list(r['ratios'])
  return [f'{label}: {kind} tokens {branches[0]} ', q('ratios', branches[0], kind),
          f', {branches[-1]} ', q('ratios', branches[-1], kind),
          '; all branches and tokens from ', q('ratios', reduce='min'), ' to ',
          q('ratios', reduce='max')]


def _scalars(r):
  kinds = next(iter(r['ratios'].values()))
  return {f'norm_ratio/{kind}': [row[kind] for row in r['ratios'].values()] for kind in kinds}


def _mean_log_ratio(r: Mapping) -> verdict.Estimate:
  """Mean over branches of log10 of the spatial tokens' ratio, with a standard error
  bounded by the mean of the terms' (which share their batches)."""
  ratios = np.asarray([row['spatial'] for row in r['ratios'].values()], np.float64)
  se = np.asarray([row['spatial'] for row in r['ratios_stderr'].values()], np.float64)
  return float(np.mean(np.log10(ratios))), float(np.mean(se / (ratios * np.log(10))))


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  by_model = per_model(result)
  return [verdict.contrast(
      'stronger skips in ViT',
      'Skip connections carry the representation more strongly in ViT than in ResNet: '
      'higher ||z|| / ||f(z)|| (Raghu et al. Fig. 7).',
      'mean log10 ratio over branches (spatial tokens)', models, list(by_model),
      lambda label: _mean_log_ratio(by_model[label]))]


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
      per_model(result), lambda r: [row.get('spatial', np.nan) for row in r['ratios'].values()],
      colour_of, joint_figures.path(out, 'norm_ratio'),
      '||z|| / ||f(z)|| of spatial tokens per branch', 'ratio', logy=True, decades=3,
      errors=lambda r: [row.get('spatial', np.nan) for row in r['ratios_stderr'].values()])


TOOL = register(Tool(
    name='norm_ratio', importance=7, title='Skip connections: norm ratios',
    quantity='||z|| / ||f(z)||: norm of the stream entering a residual branch over the norm of '
             'what the branch adds, per token, class token apart; one curve per kind of branch '
             '(attention branches shaded), error bars are standard errors over batches.',
    paper='Raghu et al. (Fig. 7): in ViT the ratio is high for the class token in early blocks '
          'and for spatial tokens later; skips carry representations more strongly in ViT '
          'than in ResNet.',
    run=measure, draw=draw, findings=each_model(_findings), scalars=model_scalars(_scalars),
    joint=joint, verdicts=verdicts))
