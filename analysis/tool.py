"""What an analysis tool is, and the registry of tools.

A tool is one `Tool` record, defined in its own module under `analysis/tools/`
beside the function that runs it: its name, what it runs on, how its JSON
becomes report text, TensorBoard scalars and joint figures, and its command-line
options. The command line, the report, the events and the joint figures iterate
over `TOOLS` and name no tool. `register` adds one from anywhere (a module
named with `python -m analysis --tool_modules=...`) and defines the flags of its
options dataclass (`analysis.tool_options`).

A tool's JSON is either per model, {model label: that model's numbers (with
'figures')}, or, for tools that take every model at once, one dict (with
'figures'). A tool measures (`Measure`), writing nothing, then draws its figures
from those numbers alone (`Draw`), so the figures can be drawn again from the JSON.
"""
import dataclasses
import os
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence,
                    Tuple, Union)

import jax
import numpy as np

from analysis import tool_options
from analysis.measures import uncertainty
from analysis.runtime import estimate, features
from analysis.reporting.verdict import Models, Verdict

Batches = Callable[[str], Iterator[Tuple[np.ndarray, np.ndarray]]]
Subject = features.Subject
Result = Mapping[str, Any]  # a tool's JSON
Series = Dict[str, List[float]]  # TensorBoard tag -> values at steps 0, 1, ...
# Text of a caption: strings, and quotes of numbers in the tool's JSON made by a
# `QuoteFn(*key_path, reduce='value' | 'mean' | 'min' | 'max' | 'offdiag_mean')`.
Fragment = Any
QuoteFn = Callable[..., Any]

ANY = 'any'  # runs on each model
ATTENTION = 'attention'  # runs on each model that sows global attention maps (ViTs)
ALL_MODELS = 'all models'  # runs once on every model together


class Measure(Protocol):
  """A tool's `run`: its numbers, measured on the models' batches; it writes no file and
  draws no figure (a file it makes, such as a trained dictionary, it hands back as
  a `Kept`)."""

  def __call__(self, subject: Union['Subject', Sequence['Subject']], batches: 'Batches',
               *options: Any) -> Dict:
    """Measures.

    Args:
      subject: the model; for a tool that takes every model at once, the models.
      batches: split -> its (images, labels) batches (for every model at once, the
        first model's).
      *options: the tool's options, where it has them.

    Returns:
      One model's JSON but its figures; for a tool that takes every model at once,
      the whole JSON but its figures.
    """


class Draw(Protocol):
  """A tool's `draw`: its figures drawn from its numbers alone, as `measure` returned
  them or as its JSON file holds them (the same figures either way)."""

  def __call__(self, entry: Mapping, subject: Union['Subject', Sequence['Subject']], out: str,
               *options: Any) -> List[str]:
    """Draws the figures.

    Args:
      entry: one model's numbers; for a tool that takes every model at once, its
        whole JSON.
      subject: the model; for a tool that takes every model at once, the models.
      out: the directory the figures go to.
      *options: the tool's options, where it has them.

    Returns:
      The figures' paths, in the order the tool's `figures` reads them.
    """


@dataclasses.dataclass(frozen=True)
class Kept:
  """A file a tool's `measure` made but did not write: `Tool.run_one` writes it into
  the analysis folder as `name`, which the JSON then holds in its place."""
  name: str
  write: Callable[[str], None]  # the file's path -> writes it there


@dataclasses.dataclass(frozen=True)
class Figure:
  """A figure file of a tool's JSON: its caption is the findings of `caption`
  (a model label, or a key of the tool's own); `models` are the labels it shows."""
  path: str
  caption: str
  models: Tuple[str, ...]


def per_model(result: Result) -> Dict[str, Mapping]:
  """The per-model entries of a tool's JSON (label -> that model's numbers).

  Args:
    result: a tool's JSON.

  Returns:
    {model label: its entry}: the JSON's entries that are mappings.
  """
  return {label: value for label, value in result.items() if isinstance(value, Mapping)}


def model_figures(result: Result) -> List[Figure]:
  """The figures of a per-model JSON: each model's 'figures', captioned by its model.

  Args:
    result: a tool's per-model JSON.

  Returns:
    The figures.
  """
  return [Figure(path, label, (label,)) for label, r in per_model(result).items()
          for path in r.get('figures', [])]


@dataclasses.dataclass(frozen=True)
class Tool:
  """One analysis tool: how it runs and how its JSON is reported.

  `run(subject, batches, options)` measures one model (for `runs_on` ALL_MODELS,
  `run(subjects, batches, options)` every model at once), writing nothing
  (`Measure`); `draw(entry, subject, out, options)` draws its figures from those
  numbers alone (`Draw`; `no_figures` where it draws none of one model; for
  ALL_MODELS, `draw(result, subjects, out, options)`); a tool without `options` is
  run and drawn without them. `run_one` and `run_on` call both: the JSON's
  'figures' are `draw`'s, and drawing again from the JSON gives the same figures.
  Each tool's module names the two `measure` and `draw`.
  `findings(result, quote)` is what the models show, per caption key, as text
  fragments and quotes of the JSON; `scalars(result, label)` a model's TensorBoard
  series; `joint(result, colour_of, out)` the figures that put every model in one
  frame, which `draw_joint` draws only for two models or more, counted by
  `models(result)` (the labels the JSON holds: its per-model entries unless the
  tool says otherwise); `options` the tool's options, a frozen dataclass
  of `tool_options.option` fields, each a command-line flag of its name (unless
  marked otherwise), an instance of which reaches `run` whole (`read_options`
  reads and checks the command line's);
  `verdicts(result, models)` the paper's claims judged on the JSON (`analysis.reporting.verdict`),
  `models` being what the report knows of each model label. `work(subject, options,
  amounts)` counts the model passes a run makes (`analysis.runtime.estimate`), which
  `--time_budget` prices before any tool runs; `shortened_by` names the flags
  that make it shorter; the fields of `options` marked with a `tool_options.Budget`
  shrink for a smaller sample (`tool_options.shrink`, about two thirds of the work
  or less, down to the smallest sample the tool still reports, which `minimum`
  states): the analysis plans a budget with it.
  `host_prices(subject, images, labels, options, amounts)` times a sample of the tool's
  host-side work on one evaluation batch: the seconds of one unit of each kind
  its `work` counts in `Work.host` (for ALL_MODELS, work done once for all models,
  on the first).
  `splits` are those of `batches` it reads ('train', 'eval'), each of which must
  hold `--num_images` (checked before any tool runs). `importance` orders the
  tools under `--time_budget` (lowest first: 1 and 2 are the two papers' headline
  figures, Raghu et al.'s CKA and Park & Kim's Hessian spectra): they run in
  that order, and when even the smallest samples do not fit, the least important
  are left out rather than the analysis refused.
  """
  name: str
  title: str
  quantity: str  # what is measured and by which convention
  paper: str  # the paper's finding, with figure numbers
  run: Measure
  findings: Callable[[Result, QuoteFn], Dict[str, List[Fragment]]]
  draw: Draw
  scalars: Callable[[Result, str], Series] = lambda result, label: {}
  runs_on: str = ANY
  figures: Callable[[Result], List[Figure]] = model_figures
  joint: Optional[Callable[[Result, Mapping[str, str], str], List[str]]] = None
  models: Callable[[Result], List[str]] = lambda result: list(per_model(result))
  options: Optional[type] = None
  verdicts: Callable[[Result, Models], List[Verdict]] = lambda result, models: []
  work: Callable[[Subject, Any, estimate.Amounts], estimate.Work] = \
      estimate.one_pass_over_the_data
  shortened_by: Tuple[str, ...] = ('num_images',)
  minimum: str = ''
  host_prices: Optional[Callable[[Subject, np.ndarray, np.ndarray, Any,
                                  estimate.Amounts], Mapping[str, float]]] = None
  splits: Tuple[str, ...] = ('eval',)
  reads_logits: bool = False  # it needs a classifier head (not a headless DINOv2 or SigLIP)
  importance: int = 100  # lower runs first and is left out last under a time budget
  # What the models must have beyond `runs_on`: (models) -> why the tool cannot run on
  # them, a clause after the tool's name ('compares ...'), or '' where it can.
  needs: Optional[Callable[[Sequence[Subject]], str]] = None

  def run_one(self, subject: Subject, batches: Batches, out: str, options: Any = None) -> Dict:
    """One model's JSON with its figures in `out`: `run`, then `draw` from the numbers;
    the files the measure kept (`Kept`) are written into `out` too.

    Args:
      subject: the model.
      batches: split -> its (images, labels) batches.
      out: the directory the figures go to.
      options: the tool's options (None: their defaults).

    Returns:
      The model's JSON.
    """
    given = () if self.options is None else (self.options() if options is None else options,)
    entry = {key: _written(value, out) for key, value in self.run(subject, batches, *given).items()}
    return {**entry, 'figures': self.draw(entry, subject, out, *given)}

  def draw_joint(self, result: Result, colour_of: Mapping[str, str], out: str) -> List[str]:
    """The joint figures of `result`: none for a tool without `joint`, or below two
    models (one model has nothing to be set beside).

    Args:
      result: the tool's JSON.
      colour_of: each model label's colour.
      out: the directory the figures go to.

    Returns:
      The figures' paths.
    """
    if self.joint is None or len(self.models(result)) < 2:
      return []
    return self.joint(result, colour_of, out)

  def read_options(self) -> Any:
    """The options the command line's flags give, checked.

    Returns:
      An instance of `options`, or None for a tool without options.
    """
    return tool_options.from_flags(self.options) if self.options else None

  def applies_to(self, subject: Subject) -> bool:
    """Whether the tool runs on `subject` (an ATTENTION tool on models that sow
    global attention maps only).

    Args:
      subject: the model.

    Returns:
      Whether it applies.
    """
    return self.runs_on != ATTENTION or bool(subject.layers.attention_weights)

  def cannot_run(self, subjects: Sequence[Subject]) -> str:
    """Why the tool has nothing to compute on `subjects`, or '' where it has.

    Args:
      subjects: the models analysed.

    Returns:
      The reason, a sentence, or ''.
    """
    if not any(self.applies_to(s) for s in subjects):
      return (f'{self.name} reads global attention over tokens, and '
              f'{", ".join(f"{s.label} ({s.config.name})" for s in subjects)} '
              f'{"sows" if len(subjects) == 1 else "sow"} none: give it a ViT, a hybrid or a '
              'timm ViT')
    why = self.needs(subjects) if self.needs else ''
    return f'{self.name} {why}' if why else ''


TOOLS: Dict[str, Tool] = {}


def register(tool: Tool) -> Tool:
  """Adds `tool` to TOOLS (after those registered before it); names are unique.

  Args:
    tool: the tool's record.

  Returns:
    `tool`.
  """
  if tool.runs_on not in (ANY, ATTENTION, ALL_MODELS):
    raise ValueError(f'Tool {tool.name!r}: runs_on must be {ANY!r}, {ATTENTION!r} or '
                     f'{ALL_MODELS!r}, not {tool.runs_on!r}.')
  if tool.name in TOOLS and TOOLS[tool.name] is not tool:
    raise ValueError(f'An analysis tool named {tool.name!r} is registered already.')
  fields = dataclasses.fields(tool.options) if tool.options else ()
  named = {'num_images'} | {f.name for f in fields}
  if set(tool.shortened_by) - named:
    raise ValueError(f'Tool {tool.name!r}: shortened_by names '
                     f'{", ".join(sorted(set(tool.shortened_by) - named))}, not options of it.')
  if tool.options is not None:
    for field in tool_options.budgeted(tool.options):
      follows = field.metadata['budget'].follows
      if follows and not hasattr(tool.options, follows):
        raise ValueError(f'Tool {tool.name!r}: {field.name} follows {follows!r}, which its '
                         'options do not have.')
    tool_options.define_flags(tool.options)
  TOOLS[tool.name] = tool
  return tool


def each_model(findings_of: Callable[[str, Mapping, QuoteFn], List[Fragment]]
               ) -> Callable[[Result, QuoteFn], Dict[str, List[Fragment]]]:
  """Findings of a per-model JSON from those of one model: `findings_of(label, r,
  quote)` quotes paths inside that model's entry `r`.

  Args:
    findings_of: (label, the model's entry, quote) -> text fragments.

  Returns:
    The tool's `findings`.
  """
  def findings(result: Result, quote: QuoteFn) -> Dict[str, List[Fragment]]:
    return {label: findings_of(label, r, lambda *path, **kw: quote(label, *path, **kw))
            for label, r in per_model(result).items()}
  return findings


def _written(value: Any, out: str) -> Any:
  """`value`, or a `Kept` file's name once it is written into `out`."""
  if not isinstance(value, Kept):
    return value
  value.write(os.path.join(out, value.name))
  return value.name


def no_figures(entry: Mapping, subject: Subject, out: str, *options: Any) -> List[str]:
  """The `draw` of a tool that draws no figure of one model (its figures are joint).

  Args:
    entry: the model's numbers.
    subject: the model.
    out: the directory the figures go to.
    *options: the tool's options.

  Returns:
    No figures.
  """
  return []


def model_scalars(series_of: Callable[[Mapping], Series]) -> Callable[[Result, str], Series]:
  """Scalars of a per-model JSON from those of one model's entry (none for a
  model the tool did not run on).

  Args:
    series_of: a model's entry -> its TensorBoard series.

  Returns:
    The tool's `scalars`.
  """
  return lambda result, label: series_of(result[label]) if label in result else {}


# Helpers the tools' runners share.


def to_json(node: Any) -> Any:
  """A tool's result as JSON holds it: NaN and infinite values (a quantity without
  support, a spread from one batch) become null, never the non-standard NaN token.

  Args:
    node: a result: dicts, lists, arrays and numbers.

  Returns:
    The same of plain Python types.
  """
  if isinstance(node, Mapping):
    return {key: to_json(value) for key, value in node.items()}
  if isinstance(node, (list, tuple)):
    return [to_json(value) for value in node]
  if isinstance(node, (float, np.floating)):
    return float(node) if np.isfinite(node) else None
  return node


def figure_path(out: str, tool: str, subject: Subject) -> str:
  """Where a tool writes its figure of one subject.

  Args:
    out: the output directory.
    tool: the figure's name (the tool's, or a variant of it).
    subject: the model.

  Returns:
    The PNG's path.
  """
  return os.path.join(out, f'{tool}_{subject.label}.png')


def batch_mean(batches: Iterator, fn: Callable[[np.ndarray, np.ndarray], jax.Array]
               ) -> Tuple[np.ndarray, np.ndarray]:
  """Mean of fn(images, labels) over batches, weighted by batch size, and its
  standard error from the spread over batches (`uncertainty.weighted_mean_stderr`).

  Args:
    batches: (images, labels) batches.
    fn: (images, labels) -> a batch's value.

  Returns:
    (the mean, its standard error).
  """
  values, sizes = [], []
  for images, labels in batches:
    values.append(np.asarray(fn(images, labels), np.float64))
    sizes.append(len(images))
  return (np.average(values, axis=0, weights=sizes),
          uncertainty.weighted_mean_stderr(values, sizes))


def take(iterator: Iterator, num_images: int) -> Iterator:
  """The batches of `iterator` until `num_images` images have come.

  Args:
    iterator: (images, labels) batches.
    num_images: how many images to take (whole batches: the last may go past it).

  Returns:
    The batches.
  """
  seen = 0
  for batch in iterator:
    if seen >= num_images:
      return
    seen += len(batch[0])
    yield batch


def run_on(tool: Tool, subjects: Sequence[Subject], batches_for: Callable[[Subject], Batches],
           out: str, options: Any = None) -> Dict:
  """The JSON of `tool` on `subjects` (those it applies to), figures written to `out`.

  Args:
    tool: the tool.
    subjects: the models.
    batches_for: a model -> its batches by split.
    out: the output directory.
    options: the tool's options (an instance of its `options`; None: their defaults).

  Returns:
    The tool's JSON.
  """
  given = () if tool.options is None else (tool.options() if options is None else options,)
  if tool.runs_on == ALL_MODELS:
    result = tool.run(list(subjects), batches_for(subjects[0]), *given)
    return {**result, 'figures': tool.draw(result, list(subjects), out, *given)}
  return {s.label: tool.run_one(s, batches_for(s), out, options) for s in subjects
          if tool.applies_to(s)}

