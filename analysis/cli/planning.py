"""Fitting the analysis tools into `--time_budget`, before they run and between them.

The tools run in the order of their importance (`Tool.importance`: the two
papers' headline figures first). Before any tool runs, each tool's time is
estimated (`analysis.runtime.estimate`; pricing stops at `PRICING_SHARE` of the budget,
leaving out the tools not priced by then) and, while the total is beyond the
budget, the costliest tool that can takes a smaller sample (`tool_options.shrink`).
Where even the smallest samples exceed it, the least important tools are left
out until the rest fit: the analysis always ends with a report of what ran, and
the report names each tool left out with the command that runs it. Between tools
the plan is made again for the tools still to run, against the time then left
and with their estimates scaled by how far the tools already run were off theirs
(a busy machine, host work the prices miss), so that a slow start is made up by
smaller samples or fewer tools later, never by an overrun that could have been
avoided.
"""
import dataclasses
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from analysis import tool, tool_options
from analysis.runtime import estimate
from analysis.runtime.features import Subject
from vit_jax import console

# Seconds of estimated work the tools already run must amount to before their
# measured times rescale the others' estimates: below it, compilation and start-up
# noise would dominate the ratio.
EVIDENCE_SECONDS = 20.


# The share of the time budget that pricing may take: the tools not priced by then
# are left out (on a quiet machine pricing takes a few seconds; under heavy load
# its compilations can take minutes).
PRICING_SHARE = 0.2


def by_importance(names: Sequence[str]) -> List[str]:
  """`names` in the order a budgeted analysis runs them (`Tool.importance`, the
  registry's order among equals).

  Args:
    names: registered tools.

  Returns:
    The same names, the most important first.
  """
  order = {n: i for i, n in enumerate(tool.TOOLS)}
  return sorted(names, key=lambda n: (tool.TOOLS[n].importance, order[n]))


def price(names: Sequence[str], subjects: Sequence[Subject],
          batches_for: Callable[[Subject], tool.Batches], options: Mapping[str, Any],
          amounts: estimate.Amounts, deadline: float = float('inf')
          ) -> Tuple[Dict[str, estimate.Prices], List[str]]:
  """Each model's prices for the tools `names`, taken in their order: one timed
  pass of each kind a tool uses that is not priced yet (`estimate.price`) and its
  host prices (`Tool.host_prices`), on the model's first evaluation batch; once
  `time.perf_counter()` passes `deadline`, the tools left are not priced.

  Args:
    names: the tools to price, the most important first.
    subjects: the models analysed.
    batches_for: a model's batches by split.
    options: each tool's options.
    amounts: the data the command gives every tool.
    deadline: when pricing stops.

  Returns:
    ({model label: its prices}, the tools not priced).
  """
  batch = {}
  run = {s.label: {} for s in subjects}
  compile_ = {s.label: {} for s in subjects}
  host = {s.label: {} for s in subjects}
  host_of = {}
  for i, n in enumerate(names):
    if time.perf_counter() > deadline:
      return _prices(subjects, run, compile_, host), list(names[i:])
    registered = tool.TOOLS[n]
    for s in subjects:
      if not registered.applies_to(s):
        continue
      if s.label not in batch:
        batch[s.label] = next(iter(batches_for(s)('eval')))
      images, labels = batch[s.label]
      kinds = [k for k in estimate.kinds_needed([registered.work(s, options[n], amounts)])
               if k not in run[s.label]]
      if kinds:
        priced = estimate.price(s, images, labels, kinds)
        run[s.label].update(priced.run)
        compile_[s.label].update(priced.compile)
      if registered.host_prices is None:
        continue
      if registered.runs_on == tool.ALL_MODELS and n in host_of:  # done once, for all
        host[s.label].update({unit: 0. for unit in host_of[n]})
      else:
        host_of[n] = registered.host_prices(s, images, labels, options[n], amounts)
        host[s.label].update(host_of[n])
  return _prices(subjects, run, compile_, host), []


def _prices(subjects: Sequence[Subject], run: Mapping[str, Dict], compile_: Mapping[str, Dict],
            host: Mapping[str, Dict]) -> Dict[str, estimate.Prices]:
  """{model label: its `Prices`} of the per-model seconds gathered so far."""
  return {s.label: estimate.Prices(run[s.label], compile_[s.label], host[s.label])
          for s in subjects}


def shown(value: Any) -> str:
  """An option's value as the log and the report show it: numbers to 4 decimals,
  sequences in brackets.

  Args:
    value: the option's value.

  Returns:
    The text.
  """
  if isinstance(value, (list, tuple)):
    return '(' + ', '.join(map(shown, value)) + ')'
  if isinstance(value, (float, np.floating)):
    return str(round(float(value), 4))
  return str(value)


@dataclasses.dataclass
class Planner:
  """The plan of the tools `names` under a time budget.

  Attributes:
    names: the tools, in the order they run.
    subjects: the models analysed.
    prices: each model's prices (`estimate.price`, with its tools' host prices).
    options: each tool's options (its `Tool.options` dataclass, or None), replaced
      as samples shrink.
    amounts: the data the command gives every tool.
    deadline: the `time.perf_counter()` at which the budget ends.
    budget_text: the budget as the user wrote it (`15m`).
    priced: each tool's estimate at its latest plan, as priced.
    estimated: the same scaled by the slowdown then measured (`slowdown`): what
      the plan expected of each tool when it ran.
    ran: each tool run: [its latest priced estimate, its wall seconds].
    left_out: each tool that will not run, with why.
    unpriced: the tools not priced in time, which no estimate can bring back.
  """
  names: Sequence[str]
  subjects: Sequence[Subject]
  prices: Mapping[str, estimate.Prices]
  options: Dict[str, Any]
  amounts: estimate.Amounts
  deadline: float
  budget_text: str
  unpriced: Sequence[str] = ()
  asked: Dict[str, Any] = dataclasses.field(init=False)
  priced: Dict[str, float] = dataclasses.field(init=False, default_factory=dict)
  estimated: Dict[str, float] = dataclasses.field(init=False, default_factory=dict)
  ran: Dict[str, List[float]] = dataclasses.field(init=False, default_factory=dict)
  left_out: Dict[str, str] = dataclasses.field(init=False, default_factory=dict)

  def __post_init__(self):
    self.asked = {n: self.options[n] for n in self.names}

  def seconds(self, name: str) -> float:
    """Estimated seconds of tool `name` at its current options, over every model.

    Args:
      name: the tool.

    Returns:
      The seconds, as priced.
    """
    registered = tool.TOOLS[name]
    return sum(self.prices[s.label].seconds(registered.work(s, self.options[name], self.amounts))
               for s in self.subjects if registered.applies_to(s))

  def slowdown(self) -> float:
    """Measured over estimated seconds of the tools run so far (1 until they amount
    to `EVIDENCE_SECONDS` of estimates)."""
    estimated = sum(priced for priced, _ in self.ran.values())
    if estimated < EVIDENCE_SECONDS:
      return 1.
    return sum(took for _, took in self.ran.values()) / estimated

  def record(self, name: str, seconds: float) -> None:
    """Tool `name` took `seconds` (wall time), against its latest priced estimate.

    Args:
      name: the tool.
      seconds: its wall time.
    """
    self.ran[name] = [self.priced[name], seconds]

  def changed(self) -> Dict[str, Dict[str, list]]:
    """Each tool's options that differ from those asked: {option: [asked, planned]}."""
    return {n: changed for n in self.names
            if (changed := tool_options.changes(self.asked[n], self.options[n]))}

  def minimum_seconds(self, name: str) -> float:
    """Estimated seconds of tool `name` at its smallest sample, as priced.

    Args:
      name: the tool.

    Returns:
      The seconds.
    """
    kept = self.options[name]
    self.options[name] = tool_options.smallest(kept)  # None: a tool without options
    try:
      return self.seconds(name)
    finally:
      self.options[name] = kept

  def leave_out(self, names: Sequence[str], why: str) -> None:
    """Tools `names` will not run, for the reason `why` (said and recorded).

    Args:
      names: the tools.
      why: the reason, a clause.
    """
    for n in names:
      self.left_out[n] = why
    if names:
      print(f'Left out, {why}: {", ".join(names)} (the report gives the command that runs '
            'each).', flush=True)

  def take_back(self) -> Optional[str]:
    """The most important tool left out for the time that fits the time now left at
    its smallest sample (the tools before it having taken less than planned),
    taken back into the plan (`fit` then sizes its sample); None where none fits.

    Returns:
      The tool, or None.
    """
    left = self.deadline - time.perf_counter()
    factor = self.slowdown()
    for name in by_importance([n for n in self.left_out if n not in self.unpriced]):
      if self.minimum_seconds(name) * factor <= left:
        del self.left_out[name]
        print(f'Taken back, fitting the {console.duration(left)} left of '
              f'--time_budget={self.budget_text}: {name}', flush=True)
        return name
    return None

  def fit(self, names: Sequence[str]) -> Dict[str, float]:
    """Fits `names` (the tools still to run, the most important first) into the
    time left: where even their smallest samples exceed it, the least important
    are left out (`left_out`) until the rest fit; then the samples of those
    kept shrink, the costliest first, until their estimates fit. Prints each
    change and the plan.

    Args:
      names: the tools still to run.

    Returns:
      The estimates of the tools kept, scaled by the slowdown measured so far.
    """
    first = not self.ran
    left = self.deadline - time.perf_counter()
    factor = self.slowdown()
    names = [n for n in names if n not in self.left_out]
    why = (f'--time_budget={self.budget_text}' if first else
           f'the {console.duration(left)} left of --time_budget={self.budget_text}'
           + (f' (the tools so far took {factor:.1f}x their estimates)' if factor != 1 else ''))
    smallest = {n: self.minimum_seconds(n) * factor for n in names}
    if sum(smallest.values()) > left:
      kept, room = [], left
      for n in names:  # the most important first; a cheaper one after a dropped one may fit
        if smallest[n] <= room:
          kept.append(n)
          room -= smallest[n]
      self.leave_out([n for n in names if n not in kept],
                     f'not fitting {why} even at their smallest samples')
      names = kept
    before = {n: self.options[n] for n in names}
    while True:
      priced = {n: self.seconds(n) for n in names}
      estimated = {n: t * factor for n, t in priced.items()}
      total = sum(estimated.values())
      if total <= left:
        break
      smaller = [n for n in sorted(estimated, key=estimated.get, reverse=True)
                 if tool_options.shrink(self.options[n]) is not None]
      if not smaller:  # at their smallest samples, which fit (up to rounding)
        break
      self.options[smaller[0]] = tool_options.shrink(self.options[smaller[0]])
    self.priced.update(priced)
    self.estimated.update(estimated)
    for n in names:
      changed = tool_options.changes(before[n], self.options[n])
      if changed:
        print(f'{n}: a smaller sample for {why}: ' +
              ', '.join(f'{k} {shown(a)} -> {shown(b)}' for k, (a, b) in changed.items()),
              flush=True)
    if first and estimated:
      print(f'Estimated: {", ".join(f"{n} {console.duration(t)}" for n, t in estimated.items())}'
            f'; {console.duration(total)} of the {console.duration(left)} left of '
            f'--time_budget={self.budget_text}.', flush=True)
    return estimated
