"""Verdicts: whether what this run measured agrees with a paper's claim.

Each tool states its rules in its record (`Tool.verdicts`): from the tool's JSON
and what is known of the models (their architecture kind, `Layers.architecture`),
a rule forms one number whose sign the paper predicts, with its standard error,
and `judge` says 'agrees' or 'differs' only when the number lies more than Z
standard errors from 0, 'inconclusive' otherwise. A claim that needs a kind
of model (a ViT against a ResNet) absent here, or a value without support, is
'not comparable', with the reason.

A model given as several training runs of one recipe (its seeds, a `group` in
what the report knows of each model) is judged once, on the mean over its runs:
`combine` joins the runs' estimates so that the uncertainty holds training
randomness as well as each run's own, and every verdict says how many runs per
model it rests on (`Verdict.runs`).
"""
import dataclasses
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from analysis.reporting import runs
from vit_jax.models.family import CONVNET, TRANSFORMER

AGREES, DIFFERS, INCONCLUSIVE, NOT_COMPARABLE = (
    'agrees', 'differs', 'inconclusive', 'not comparable')
Z = 2.  # beyond two standard errors: about 95% two-sided for a normal estimate
Models = Mapping[str, Mapping]  # model label -> what the report knows of it (subjects.json)
Estimate = Tuple[Optional[float], Optional[float]]  # a value and its standard error
# (None or NaN where unknown: JSON holds no value as null)


def _number(x: Optional[float]) -> float:
  return np.nan if x is None else float(x)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """One finding: the paper's claim, what was measured here, the verdict and why."""
  finding: str  # a short name
  claim: str  # the paper's claim, with its figure
  measured: str  # the numbers compared, each with its standard error
  verdict: str  # AGREES, DIFFERS, INCONCLUSIVE or NOT_COMPARABLE
  why: str  # the rule as applied, or why it cannot be
  runs: int = 1  # training runs (seeds) per model behind it: the fewest of its models'
  # A verdict on one model's number (`single`): the model (a run's label; once its
  # runs are joined by `across_seeds`, the model's), the quantity and the number, so
  # that the runs of one model join into one verdict.
  label: Optional[str] = None
  what: str = ''
  estimate: Optional[Estimate] = None


def show(estimate: Estimate, fmt: str = '.3g') -> str:
  """'value ± stderr'.

  Args:
    estimate: (value, standard error).
    fmt: the numbers' format.

  Returns:
    The text.
  """
  value, stderr = map(_number, estimate)
  if not np.isfinite(value):
    return 'no value'
  if not np.isfinite(stderr):
    return f'{value:{fmt}} (spread unknown)'
  return f'{value:{fmt}} ± {stderr:.2g}'


def judge(difference: Estimate) -> Tuple[str, str]:
  """The verdict on a number the claim predicts to be positive, and the rule as
  applied: beyond Z standard errors either way, or within them.

  Args:
    difference: (value, standard error) of the number.

  Returns:
    (the verdict, the rule in words).
  """
  value, stderr = map(_number, difference)
  if not np.isfinite(value):
    return NOT_COMPARABLE, 'the quantity has no value here'
  if not np.isfinite(stderr):
    return INCONCLUSIVE, f'{value:.3g} predicted > 0, but its spread is unknown (one batch)'
  margin = Z * stderr
  if value > margin:
    return AGREES, f'{value:.3g} > {Z:g} SE ({margin:.2g})'
  if value < -margin:
    return DIFFERS, f'{value:.3g} < -{Z:g} SE ({-margin:.2g}); the claim predicts > 0'
  return INCONCLUSIVE, f'|{value:.3g}| <= {Z:g} SE ({margin:.2g})'


def difference(a: Estimate, b: Estimate) -> Estimate:
  """a - b with the standard error of independent estimates.

  Args:
    a: (value, standard error).
    b: (value, standard error).

  Returns:
    (a - b, sqrt(se_a^2 + se_b^2)).
  """
  return _number(a[0]) - _number(b[0]), float(np.hypot(_number(a[1]), _number(b[1])))


def combine(estimates: Sequence[Estimate]) -> Tuple[Estimate, float]:
  """The mean of one quantity over several training runs (seeds), with an
  uncertainty that holds training randomness.

  Each run's estimate v_i has its own standard error s_i (over images, batches or
  probes). The spread of the v_i beyond what the s_i explain is the between-run
  variance tau^2 = max(0, var(v) - mean(s^2)) (var with n - 1; the moment
  estimator of a random-effects model with equal weights, DerSimonian & Laird
  1986); the mean's standard error is sqrt((tau^2 + mean(s^2)) / n), which is
  sqrt(var(v) / n) unless the runs agree more closely than their own errors say.
  A run whose error is unknown leaves the spread of the v_i alone: sqrt(var(v) / n).

  Args:
    estimates: (value, standard error) of each run; one gives itself back.

  Returns:
    ((mean, its standard error), the between-run standard deviation tau; NaN for one run).
  """
  values = np.array([_number(v) for v, _ in estimates])
  errors = np.array([_number(e) for _, e in estimates])
  if len(values) == 1:
    return (values[0], errors[0]), np.nan
  spread = np.var(values, ddof=1)
  within = np.mean(errors ** 2)
  if not np.isfinite(within):
    return (float(values.mean()), float(np.sqrt(spread / len(values)))), float(np.sqrt(spread))
  between = max(0., spread - within)
  return ((float(values.mean()), float(np.sqrt((between + within) / len(values)))),
          float(np.sqrt(between)))


def members(models: Models, labels: Sequence[str], label: str) -> List[str]:
  """The labels among `labels` that are runs of `label`'s model: those of its group
  (its seeds), or `label` alone.

  Args:
    models: what the report knows of each model label (a run's 'group').
    labels: the labels to look among.
    label: one run.

  Returns:
    The runs, in order.
  """
  group = models.get(label, {}).get('group')
  if group is None:
    return [label]
  return [other for other in runs.groups(models)[group] if other in labels]


def name(models: Models, labels: Sequence[str], label: str) -> str:
  """How verdicts call `label`'s model: its label, or its group with the number of runs.

  Args:
    models: what the report knows of each model label.
    labels: the labels the tool ran on.
    label: one run.

  Returns:
    The name.
  """
  runs = members(models, labels, label)
  return label if len(runs) == 1 else f'{models[label]["group"]} ({len(runs)} seeds)'


def across_seeds(verdicts: Sequence[Verdict], models: Models) -> List[Verdict]:
  """The verdicts with those on single runs of one model (`single`, on each seed)
  joined into one verdict on the model, judged on the runs' `combine`d estimate.

  Args:
    verdicts: a tool's verdicts.
    models: what the report knows of each model label.

  Returns:
    The verdicts, a joined one where its first run's was.
  """
  labels = list(dict.fromkeys(v.label for v in verdicts if v.label is not None))
  joined, out = {}, []
  for v in verdicts:
    runs = members(models, labels, v.label) if v.label is not None else []
    if len(runs) < 2 or v.estimate is None:
      out.append(v)
      continue
    key = (v.finding, v.claim, models[v.label]['group'])
    if key in joined:
      continue
    same = [w for w in verdicts if (w.finding, w.claim) == key[:2] and w.label in runs]
    (mean, stderr), between = combine([w.estimate for w in same])
    judged, why = judge((mean, stderr))
    per_run = ', '.join(show(w.estimate) for w in same)
    joined[key] = Verdict(
        v.finding, v.claim,
        f'{name(models, labels, v.label)}: {v.what} {show((mean, stderr))} over the runs '
        f'(between-run SD {between:.2g}; each: {per_run})', judged, why, len(same), key[2],
        v.what, (mean, stderr))
    out.append(joined[key])
  return out


def of_kind(models: Models, labels: Sequence[str], kind: str) -> Optional[str]:
  """The first label among `labels` whose model is of architecture `kind`.

  Args:
    models: what the report knows of each model label.
    labels: the labels to look among.
    kind: an architecture (`Layers.architecture`).

  Returns:
    The label, or None.
  """
  return next((label for label in labels if models.get(label, {}).get('architecture') == kind),
              None)


def contrast(finding: str, claim: str, what: str, models: Models, labels: Sequence[str],
             estimate: Callable[[str], Estimate], higher: str = TRANSFORMER, lower: str = CONVNET,
             fmt: str = '.3g') -> Verdict:
  """The claim that `what` (`estimate(label)` -> Estimate) is larger for the model of
  architecture `higher` than for the one of `lower`; a model given as several
  training runs is judged on their `combine`d mean.

  Args:
    finding: the finding's short name.
    claim: the paper's claim in words.
    what: the quantity compared, in words.
    models: what the report knows of each model label.
    labels: the labels the tool ran on.
    estimate: label -> (value, standard error).
    higher: the architecture the claim says is higher.
    lower: the one it says is lower.
    fmt: the numbers' format.

  Returns:
    The verdict (not comparable without a model of each architecture).
  """
  a, b = of_kind(models, labels, higher), of_kind(models, labels, lower)
  if a is None or b is None:
    present = ', '.join(f'{label} ({models.get(label, {}).get("architecture", "unknown")})'
                        for label in labels) or 'none'
    return Verdict(finding, claim, f'{what}: ' + '; '.join(
        f'{label} {show(estimate(label), fmt)}' for label in labels), NOT_COMPARABLE,
                   f'needs a {higher} and a {lower} model; here: {present}')
  runs_a, runs_b = members(models, labels, a), members(models, labels, b)
  (ea, _), (eb, _) = (combine([estimate(label) for label in runs])
                      for runs in (runs_a, runs_b))
  verdict, why = judge(difference(ea, eb))
  na, nb = name(models, labels, a), name(models, labels, b)
  return Verdict(finding, claim, f'{what}: {na} {show(ea, fmt)}, {nb} {show(eb, fmt)}', verdict,
                 f'{na} - {nb}: {why}', min(len(runs_a), len(runs_b)))


def single(finding: str, claim: str, what: str, label: str, value: Estimate,
           fmt: str = '.3g') -> Verdict:
  """The claim that `value` of one model is positive.

  Args:
    finding: the finding's short name.
    claim: the paper's claim in words.
    what: the quantity, in words.
    label: the model's label.
    value: (value, standard error).
    fmt: the numbers' format.

  Returns:
    The verdict.
  """
  verdict, why = judge(value)
  return Verdict(finding, claim, f'{label}: {what} {show(value, fmt)}', verdict, why,
                 label=label, what=what, estimate=value)


def by_kind(models: Models, labels: Sequence[str], kinds: Sequence[str]) -> List[str]:
  """The labels whose model is of one of `kinds`.

  Args:
    models: what the report knows of each model label.
    labels: the labels to look among.
    kinds: architectures (`Layers.architecture`).

  Returns:
    Those labels, in order.
  """
  return [label for label in labels if models.get(label, {}).get('architecture') in kinds]
