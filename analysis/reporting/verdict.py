"""Verdicts: whether what this run measured agrees with a paper's claim.

Each tool states its rules in its record (`Tool.verdicts`): from the tool's JSON
and what is known of the models (their architecture kind, `Layers.architecture`),
a rule forms one number whose sign the paper predicts, with its standard error,
and `judge` says 'agrees' or 'differs' only when the number lies more than Z
standard errors from 0, 'within uncertainty' otherwise. A claim that needs a kind
of model (a ViT against a ResNet) absent here, or a value without support, is
'not comparable', with the reason.
"""
import dataclasses
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from vit_jax.models.family import CONVNET, TRANSFORMER

AGREES, DIFFERS, UNCERTAIN, NOT_COMPARABLE = (
    'agrees', 'differs', 'within uncertainty', 'not comparable')
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
  verdict: str  # AGREES, DIFFERS, UNCERTAIN or NOT_COMPARABLE
  why: str  # the rule as applied, or why it cannot be


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
    return UNCERTAIN, f'{value:.3g} predicted > 0, but its spread is unknown (one batch)'
  margin = Z * stderr
  if value > margin:
    return AGREES, f'{value:.3g} > {Z:g} SE ({margin:.2g})'
  if value < -margin:
    return DIFFERS, f'{value:.3g} < -{Z:g} SE ({-margin:.2g}); the claim predicts > 0'
  return UNCERTAIN, f'|{value:.3g}| <= {Z:g} SE ({margin:.2g})'


def difference(a: Estimate, b: Estimate) -> Estimate:
  """a - b with the standard error of independent estimates.

  Args:
    a: (value, standard error).
    b: (value, standard error).

  Returns:
    (a - b, sqrt(se_a^2 + se_b^2)).
  """
  return _number(a[0]) - _number(b[0]), float(np.hypot(_number(a[1]), _number(b[1])))


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
  architecture `higher` than for the one of `lower`.

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
  ea, eb = estimate(a), estimate(b)
  verdict, why = judge(difference(ea, eb))
  return Verdict(finding, claim, f'{what}: {a} {show(ea, fmt)}, {b} {show(eb, fmt)}', verdict,
                 f'{a} - {b}: {why}')


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
  return Verdict(finding, claim, f'{label}: {what} {show(value, fmt)}', verdict, why)


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
