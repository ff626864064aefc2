"""Fitting the analysis tools into `--time_budget`, before they run and between them.

Before any tool runs, each tool's time is estimated (`analysis.estimate`) and,
while the total is beyond the budget, the costliest tool that can takes a
smaller sample (`Tool.shrink`); a budget that even the smallest samples exceed
is refused. Between tools the plan is made again for the tools still to run,
against the time then left and with their estimates scaled by how far the
tools already run were off theirs (a busy machine, host work the prices miss),
so that a slow start is made up by smaller samples later, never by an overrun
that could have been avoided.
"""
import dataclasses
import inspect
import time
from typing import Any, Callable, Dict, List, Mapping, Sequence

import numpy as np

from analysis import estimate, tool
from analysis.features import Subject
from vit_jax import console
from vit_jax.errors import ConfigError

# Seconds of estimated work the tools already run must amount to before their
# measured times rescale the others' estimates: below it, compilation and start-up
# noise would dominate the ratio.
EVIDENCE_SECONDS = 20.


def price(names: Sequence[str], subjects: Sequence[Subject],
          batches_for: Callable[[Subject], tool.Batches], options: Mapping[str, Mapping],
          amounts: estimate.Amounts) -> Dict[str, estimate.Prices]:
  """Each model's prices for the tools `names`: one timed pass of each kind they
  use (`estimate.price`) and their host prices (`Tool.host_prices`), on the
  model's first evaluation batch.

  Args:
    names: the tools to price.
    subjects: the models analysed.
    batches_for: a model's batches by split.
    options: each tool's options.
    amounts: the data the command gives every tool.

  Returns:
    {model label: its prices}.
  """
  def applying(s):
    return [n for n in names if tool.TOOLS[n].applies_to(s)]
  kinds = estimate.kinds_needed([tool.TOOLS[n].work(s, options[n], amounts)
                                 for s in subjects for n in applying(s)])
  prices, host_of = {}, {}
  for s in subjects:
    images, labels = next(iter(batches_for(s)('eval')))
    priced = estimate.price(s, images, labels, kinds)
    host = {}
    for n in applying(s):
      registered = tool.TOOLS[n]
      if registered.host_prices is None:
        continue
      if registered.runs_on == tool.ALL_MODELS and n in host_of:  # done once, for all
        host.update({unit: 0. for unit in host_of[n]})
      else:
        host_of[n] = registered.host_prices(s, images, labels, options[n], amounts)
        host.update(host_of[n])
    prices[s.label] = dataclasses.replace(priced, host=host)
  return prices


def _given(name: str, options: Mapping, key: str):
  """Option `key` of tool `name` in `options`, or where they leave it out the
  default of the tool's `run`."""
  if key in options:
    return options[key]
  parameter = inspect.signature(tool.TOOLS[name].run).parameters.get(key)
  return None if parameter is None else parameter.default


def _changes(name: str, before: Mapping, after: Mapping) -> Dict[str, list]:
  """{option: [its value before, after]} of tool `name`'s options that changed."""
  return {k: [_given(name, before, k), v] for k, v in after.items()
          if _given(name, before, k) != v}


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
    options: each tool's options, changed in place as samples shrink.
    amounts: the data the command gives every tool.
    deadline: the `time.perf_counter()` at which the budget ends.
    budget_text: the budget as the user wrote it (`15m`).
    priced: each tool's estimate at its latest plan, as priced.
    estimated: the same scaled by the slowdown then measured (`slowdown`): what
      the plan expected of each tool when it ran.
  """
  names: Sequence[str]
  subjects: Sequence[Subject]
  prices: Mapping[str, estimate.Prices]
  options: Dict[str, Dict]
  amounts: estimate.Amounts
  deadline: float
  budget_text: str
  asked: Dict[str, Dict] = dataclasses.field(init=False)
  priced: Dict[str, float] = dataclasses.field(init=False, default_factory=dict)
  estimated: Dict[str, float] = dataclasses.field(init=False, default_factory=dict)
  ran: Dict[str, List[float]] = dataclasses.field(init=False, default_factory=dict)

  def __post_init__(self):
    self.asked = {n: dict(self.options[n]) for n in self.names}

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
            if (changed := _changes(n, self.asked[n], self.options[n]))}

  def fit(self, names: Sequence[str]) -> Dict[str, float]:
    """Shrinks the samples of `names` (the tools still to run), the costliest first,
    until their estimates fit the time left; prints each change and the plan.
    Before any tool ran, a budget the smallest samples exceed is refused
    (ConfigError, naming each tool's minimum); later the tools run at their
    minimums and the expected overrun is said.

    Args:
      names: the tools still to run.

    Returns:
      Their estimates, scaled by the slowdown measured so far.
    """
    first = not self.ran
    left = self.deadline - time.perf_counter()
    factor = self.slowdown()
    before = {n: dict(self.options[n]) for n in names}
    while True:
      priced = {n: self.seconds(n) for n in names}
      estimated = {n: t * factor for n, t in priced.items()}
      total = sum(estimated.values())
      if total <= left:
        break
      smaller = [n for n in sorted(estimated, key=estimated.get, reverse=True)
                 if tool.TOOLS[n].shrink and tool.TOOLS[n].shrink(self.options[n]) is not None]
      if not smaller:
        if first:
          listed = '; '.join(f'{n} {console.duration(estimated[n])}' + (
              f' (at its minimum, {tool.TOOLS[n].minimum})' if tool.TOOLS[n].minimum else '')
              for n in sorted(estimated, key=estimated.get, reverse=True))
          raise ConfigError(
              f'The analysis would take about {console.duration(total)} even with the smallest '
              f'samples, more than the {console.duration(left)} left of '
              f'--time_budget={self.budget_text}: {listed}. Run fewer tools (python -m '
              'analysis <tool>), fewer --num_images, or give a longer --time_budget.')
        break
      self.options[smaller[0]] = tool.TOOLS[smaller[0]].shrink(self.options[smaller[0]])
    self.priced.update(priced)
    self.estimated.update(estimated)
    why = (f'--time_budget={self.budget_text}' if first else
           f'the {console.duration(left)} left of --time_budget={self.budget_text}'
           + (f' (the tools so far took {factor:.1f}x their estimates)' if factor != 1 else ''))
    for n in names:
      changed = _changes(n, before[n], self.options[n])
      if changed:
        print(f'{n}: a smaller sample for {why}: ' +
              ', '.join(f'{k} {shown(a)} -> {shown(b)}' for k, (a, b) in changed.items()),
              flush=True)
    if first:
      print(f'Estimated: {", ".join(f"{n} {console.duration(t)}" for n, t in estimated.items())}'
            f'; {console.duration(total)} of the {console.duration(left)} left of '
            f'--time_budget={self.budget_text}.', flush=True)
    elif total > left:
      print(f'The remaining tools at their smallest samples would take about '
            f'{console.duration(total)}, more than the {console.duration(max(left, 0.))} left '
            f'of --time_budget={self.budget_text}: they run at those.', flush=True)
    return estimated
