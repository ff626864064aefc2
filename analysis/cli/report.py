"""The analysis report: one page (report.html, and the same as report.md) that
describes each model, lists its sections, opens with a verdict table (each
paper's claim, what this run measured with its standard error, and whether they
agree: `analysis.reporting.verdict`), then has a section per tool that ran, its figures
(joint ones first, each with the alt text its PNG carries) and captions built
from the tools' JSON: the quantity and its convention (the conventions the JSON
records named, each the authors' or a departure: `analysis.reporting.conventions`), the
paper's finding, and what these models show. Every number in a caption is a value of the JSON file
beside it (in the HTML, tagged with its file, path and reduction).
"""
import html
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

from analysis import tool, tools  # noqa: F401  (tools: the built-in ones)
from analysis.cli import planning
from analysis.measures import similarity
from analysis.reporting import conventions, document, joint_figures, plots, runs, verdict
from analysis.reporting.verdict import Z, Verdict
from vit_jax.files import atomic_write

SUBJECTS_FILE = 'subjects.json'
FAILURES_FILE = 'failures.json'  # tool name -> why it failed
PLAN_FILE = 'plan.json'  # tool name -> the smaller samples it took for a time budget
RUNS_FILE = 'runs.json'  # the tools' numbers over the runs of a model given as its seeds
REDUCTIONS = ('value', 'mean', 'min', 'max', 'offdiag_mean')
NO_VALUE = 'n/a'  # a quoted value without support (null in the JSON)


class Quote:
  """A number quoted from a tool's JSON: the file, the key path into it and a
  reduction over the leaves found there."""

  def __init__(self, results: Mapping, tool: str, path: Sequence[Union[str, int]],
               reduce: str = 'value', fmt: str = '.3g'):
    assert reduce in REDUCTIONS, reduce
    node = results[tool]
    for key in path:
      node = node[key]
    self.file, self.path, self.reduce = f'{tool}.json', list(path), reduce
    self.value = reduce_value(node, reduce)
    self.text = format(self.value, fmt) if np.isfinite(self.value) else NO_VALUE

  def html(self) -> str:
    """The number tagged with its file, path and reduction."""
    return (f'<span class="num" data-file="{self.file}" '
            f'data-path="{html.escape(json.dumps(self.path))}" '
            f'data-reduce="{self.reduce}">{self.text}</span>')


def model_colours(results: joint_figures.Results, kinds: Mapping[str, str]) -> Dict[str, str]:
  """A colour per model label of the results: its kind's (`plots.KIND_COLOURS`), or a
  spare one where two models are of one kind.

  Args:
    results: each tool's JSON.
    kinds: each model label's kind (`Layers.architecture`).

  Returns:
    {model label: colour}.
  """
  labels = sorted({label for name, result in results.items()
                   if tool.TOOLS[name].runs_on != tool.ALL_MODELS
                   for label in tool.per_model(result)})
  return dict(zip(labels, plots.colours([plots.KIND_COLOURS.get(kinds.get(label, ''))
                                         for label in labels])))


def draw_joint_figures(results: joint_figures.Results, kinds: Mapping[str, str], out: str,
                  groups: Optional[Mapping[str, List[str]]] = None) -> Dict[str, List[str]]:
  """The joint figures of every registered tool in `results`, by tool.

  Args:
    results: each tool's JSON.
    kinds: each model label's kind (`Layers.architecture`), for its colour.
    out: the directory the figures go to.
    groups: the models given as several runs, {model: [run labels]} (`runs.groups`).

  Returns:
    {tool name: its joint figures' paths}.
  """
  colour_of = joint_figures.Palette(model_colours(results, kinds), groups)
  figures = {}
  for name, result in results.items():
    drawn = tool.TOOLS[name].draw_joint(result, colour_of, out)
    if drawn:
      figures[name] = drawn
  return figures


def leaves(node: Any) -> List[float]:
  """Every number under a JSON node, in order; nulls (no value) left out.

  Args:
    node: a JSON value.

  Returns:
    The numbers.
  """
  if isinstance(node, Mapping):
    return [x for v in node.values() for x in leaves(v)]
  if isinstance(node, (list, tuple)):
    return [x for v in node for x in leaves(v)]
  return [] if node is None else [float(node)]


def reduce_value(node: Any, reduce: str) -> float:
  """A reduction of the numbers under a JSON node; NaN where it holds none.

  Args:
    node: a JSON value.
    reduce: 'value', 'mean', 'min', 'max' or 'offdiag_mean'.

  Returns:
    The number.
  """
  if reduce == 'value':
    return np.nan if node is None else float(node)
  if reduce == 'offdiag_mean':
    return similarity.offdiag_mean(node)
  values = leaves(node)
  return float(getattr(np, reduce)(values)) if values else np.nan


Fragment = Union[str, Quote]


def findings(name: str, results: Mapping) -> Dict[str, List[Fragment]]:
  """What the models show, per caption key of the tool `name` (a model label, or a
  model pair for CKA), as text and quotes of its JSON.

  Args:
    name: the tool.
    results: its JSON.

  Returns:
    {caption key: text fragments}.
  """
  return tool.TOOLS[name].findings(
      results[name], lambda *path, reduce='value': Quote(results, name, path, reduce))


def load_results(out: str) -> Dict[str, Mapping]:
  """Every registered tool's JSON in `out`, in the registry's order.

  Args:
    out: the analysis directory.

  Returns:
    {tool name: its JSON}.
  """
  results = {}
  for name in tool.TOOLS:
    path = os.path.join(out, f'{name}.json')
    if os.path.exists(path):
      with open(path) as f:
        results[name] = json.load(f)
  return results


def load_failures(out: str) -> Dict[str, str]:
  """The tools that failed in `out`'s last runs, with why (`failures.json`).

  Args:
    out: the analysis directory.

  Returns:
    {tool name: why}.
  """
  return _load_json(os.path.join(out, FAILURES_FILE))


def record_plan(out: str, budget: str, smaller: Mapping[str, Mapping[str, list]],
                names: Sequence[str],
                left_out: Optional[Mapping[str, Tuple[str, str]]] = None) -> None:
  """Keeps in `out` (`plan.json`) the options each of `names` took smaller samples
  of to fit `budget` ({option: [asked, planned]}; tools run at their asked sizes
  are dropped from it), and the tools the plan left out, with why and the command
  that runs each, for the report.

  Args:
    out: the analysis directory.
    budget: the time budget as the user wrote it.
    smaller: each shrunk tool's changed options.
    names: the tools this run planned.
    left_out: {tool: (why, command)} of the tools it left out.
  """
  plan = {k: v for k, v in _load_json(os.path.join(out, PLAN_FILE)).items() if k not in names}
  plan.update({n: {'time_budget': budget, 'options': dict(o)} for n, o in smaller.items()})
  plan.update({n: {'time_budget': budget, 'left_out': why, 'command': command}
               for n, (why, command) in (left_out or {}).items()})
  with atomic_write(os.path.join(out, PLAN_FILE)) as f:
    json.dump(plan, f, indent=1)


def load_left_out(out: str) -> Dict[str, Mapping[str, str]]:
  """The tools a time budget left out of the analysis in `out` and that have no
  results there: {tool: {'left_out': why, 'command': the command that runs it}}.

  Args:
    out: the analysis directory.

  Returns:
    The tools left out.
  """
  return {n: p for n, p in _load_json(os.path.join(out, PLAN_FILE)).items()
          if 'left_out' in p and not os.path.exists(os.path.join(out, f'{n}.json'))}


def has_report(out: str) -> bool:
  """Whether `out` holds anything a report shows: tools' results, or tools a
  time budget left out.

  Args:
    out: the analysis directory.

  Returns:
    Whether a report can be written.
  """
  return bool(load_results(out) or load_left_out(out))


def plan_note(out: str, name: str) -> str:
  """One sentence on the smaller samples tool `name` took for a time budget, or ''.

  Args:
    out: the analysis directory.
    name: the tool.

  Returns:
    The sentence.
  """
  planned = _load_json(os.path.join(out, PLAN_FILE)).get(name)
  if not planned or 'options' not in planned:
    return ''
  return (f'Smaller samples to fit --time_budget={planned["time_budget"]}: ' + ', '.join(
      f'{k} {planning.shown(a)} instead of {planning.shown(b)}'
      for k, (b, a) in planned['options'].items()) +
      '; the standard errors are those of these samples.')


def _load_json(path: str) -> Dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def load_subjects(out: str) -> Dict[str, Mapping]:
  """What the report knows of each model analysed in `out` (`subjects.json`).

  Args:
    out: the analysis directory.

  Returns:
    {model label: what is known of it}.
  """
  return _load_json(os.path.join(out, SUBJECTS_FILE))


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
figure{display:inline-block;margin:0.5em;vertical-align:top;max-width:100%}
figure img{max-width:100%}figcaption{font-size:0.9em;max-width:640px}
p.quantity{color:#444}p.paper{font-style:italic}.num{font-weight:bold}
table{border-collapse:collapse;font-size:0.9em}td,th{border:1px solid #ccc;padding:3px 6px;
vertical-align:top;text-align:left}td.agrees{background:#e3f3e3}td.differs{background:#f8e0e0}
td.inconclusive{background:#f4f0dc}td.not{background:#eee}"""


def describe_model(label: str, about: Mapping) -> str:
  """One line of what a model is: its zoo name and family, its shape, parameters,
  image size, its recipe's tier, and the steps and accuracy it was trained to where known.

  Args:
    label: the model's label.
    about: what the report knows of it.

  Returns:
    The line.
  """
  parts = [f'{about.get("model_name", "")} ({about.get("family", "")})']
  if 'shape' in about:
    parts.append(about['shape'])
  if 'parameters' in about:
    parts.append(f'{about["parameters"] / 1e6:.3g}M parameters')
  if 'image_size' in about:
    parts.append(f'{about["image_size"]} px images')
  if 'tier' in about:
    parts.append(f'the {about["tier"]} tier')
  if 'steps' in about:
    parts.append(f'trained {about["steps"]:,} steps to {100 * about["accuracy"]:.1f}% '
                 'evaluation accuracy')
  return f'{label}: ' + ', '.join(parts) + f'; from {about.get("source", "")}'


def all_verdicts(results: Mapping, subjects: Mapping) -> List[Tuple[str, Verdict]]:
  """(tool name, verdict) of every registered tool in `results`, in the report's order.

  Args:
    results: each tool's JSON.
    subjects: what the report knows of each model.

  Returns:
    The verdicts.
  """
  return [(name, v) for name, result in results.items()
          for v in verdict.across_seeds(tool.TOOLS[name].verdicts(result, subjects), subjects)]


def _occurrences(keys: Sequence[Tuple]) -> List[Tuple]:
  """Each key with its occurrence among the keys before it equal to it."""
  seen: Dict[Tuple, int] = {}
  out = []
  for key in keys:
    seen[key] = seen.get(key, -1) + 1
    out.append(key + (seen[key],))
  return out


def each_run(results: Mapping, subjects: Mapping) -> List[List[str]]:
  """Every verdict of `all_verdicts` again on each run alone: with the i-th run of
  each model given as runs (its seeds) in place of all of them, the verdict the
  report would give. A verdict that changes from run to run rests on training
  randomness, whatever the combined one says. A verdict on one model's runs
  joined (`verdict.across_seeds`) gets one per run, one on a single run its own.

  Args:
    results: each tool's JSON.
    subjects: what the report knows of each model (a run's 'group').

  Returns:
    Per verdict of `all_verdicts`, in its order, the verdict on each run ([] where
    no model is given as runs).
  """
  combined = all_verdicts(results, subjects)
  groups = runs.groups(subjects)
  count = max((len(labels) for labels in groups.values()), default=0)
  found: Dict[Tuple, List[str]] = {}
  for i in range(count if count > 1 else 0):
    chosen = {labels[i] for labels in groups.values() if i < len(labels)}
    alone = {label: {k: x for k, x in about.items() if k != 'group'}
             for label, about in subjects.items() if 'group' not in about or label in chosen}
    verdicts = [(name, v) for name, v in all_verdicts(results, alone)
                if v.label is None or v.label in alone]
    by_run = [((name, v.finding, v.label), v.verdict) for name, v in verdicts]
    by_model = [((name, v.finding, subjects[v.label]['group']), v.verdict)
                for name, v in verdicts if 'group' in subjects.get(v.label, {})]
    for pairs in (by_run, by_model):
      for key, said in zip(_occurrences([key for key, _ in pairs]), [v for _, v in pairs]):
        found.setdefault(key, []).append(said)
  keys = _occurrences([(name, v.finding, v.label) for name, v in combined])
  return [found.get(key, []) for key in keys]


def _image_alt(path: str) -> str:
  """The PNG's own description of what it shows (`plots.ALT_KEY`), else its name."""
  with Image.open(path) as image:
    return image.text.get(plots.ALT_KEY) or os.path.basename(path)


VERDICT_NOTE = ('Each claim is judged by the rule in its tool\'s record, on this run\'s JSON: '
                '"agrees" or "differs" only where the compared number lies more than '
                f'{Z:g} standard errors from zero, "inconclusive" otherwise, "not '
                'comparable" where the models or values the claim needs are absent. The '
                'verdicts are about the models above at their scale, not the papers\' '
                'ImageNet-scale models. "Runs" is the number of training runs (seeds) per '
                'model a verdict rests on; with two or more its uncertainty holds training '
                'randomness (verdict.combine); "-" where the verdict is "not comparable" and '
                'rests on no measurement.')
EACH_RUN_NOTE = ('"Each run alone" is the verdict with one run of each model given as '
                 'runs in place of all of them, run by run (the first seed of each, then the '
                 'second, ...): a finding whose verdict changes from run to run rests on '
                 'training randomness, whatever the verdict on their mean says.')
SEEDS_NOTE = ('Each model here is one training run: its standard errors are over images, '
              'batches or probes, and training randomness (initialisation, data order, '
              'dropout) is not in them. To add it, train seeds of each recipe (python -m '
              'vit_jax.sweep --config RECIPE --workdir DIR --seeds 0,1,2) and analyse them '
              'as one model (--workdir DIR/seed0,DIR/seed1,DIR/seed2).')


def write_report(out: str) -> Dict[str, str]:
  """Writes the joint figures, report.html and report.md for the JSON in `out`: one
  page (`page`), rendered twice (`analysis.reporting.document`).

  Args:
    out: the analysis directory.

  Returns:
    {'html': path, 'md': path}.
  """
  title, blocks = page(out)
  paths = {'html': os.path.join(out, 'report.html'), 'md': os.path.join(out, 'report.md')}
  for kind, text in (('html', document.to_html(title, blocks, STYLE)),
                     ('md', document.to_markdown(title, blocks))):
    with atomic_write(paths[kind]) as f:
      f.write(text)
  return paths


def page(out: str) -> Tuple[str, List[document.Block]]:
  """The report of the JSON in `out`, its joint figures drawn there: the models, the
  contents, the tools that failed or were left out, the verdicts and a section per
  tool.

  Args:
    out: the analysis directory.

  Returns:
    (its title, its blocks).
  """
  results, subjects, left_out = load_results(out), load_subjects(out), load_left_out(out)
  if not results and not left_out:
    raise FileNotFoundError(f'No analysis results (tool JSON files) in {out}; run '
                            '`python -m analysis all --out DIR ...` first.')
  kinds = {label: s.get('architecture', '') for label, s in subjects.items()}
  joint = draw_joint_figures(results, kinds, out, runs.groups(subjects))
  title = 'Analysis of ' + ', '.join(subjects or sorted(
      {label for r in results.values() for label in tool.per_model(r)}))
  blocks = []
  if subjects:
    blocks.append(document.Items([[describe_model(label, about)]
                                  for label, about in subjects.items()], id='models'))
  contents = [('verdicts', 'Verdicts')] + [(name, tool.TOOLS[name].title) for name in results]
  blocks.append(document.Section('contents', 'Contents', [document.Items(
      [[document.Link(text, f'#{name}')] for name, text in contents], numbered=True)], 'nav'))
  title_of = lambda n: tool.TOOLS[n].title if n in tool.TOOLS else n
  failed = load_failures(out)
  if failed:
    blocks.append(document.Section('failed', 'Tools that failed', [document.Items(
        [[f'{title_of(n)} ({n}): {why}'] for n, why in failed.items()])]))
  if left_out:
    blocks.append(document.Section('left-out', 'Tools left out for the time budget', [
        document.Items([[f'{title_of(n)} ({n}): {p["left_out"]}; to run it: ',
                         document.Code(p['command'])] for n, p in left_out.items()])]))
  blocks.append(_verdicts_section(results, subjects))
  for name, result in results.items():
    blocks.append(_tool_section(out, name, result, results, joint.get(name, [])))
  return title, blocks


def _verdicts_section(results: Mapping, subjects: Mapping) -> document.Section:
  """The verdict table, a row per claim judged, with the notes that read it."""
  verdicts = all_verdicts(results, subjects)
  seeded = any('group' in about for about in subjects.values())
  per_run = [', '.join(got) or '-' for got in each_run(results, subjects)]
  rests_on = lambda v: '-' if v.verdict == verdict.NOT_COMPARABLE else str(v.runs)
  notes = [VERDICT_NOTE] + ([EACH_RUN_NOTE] if seeded else [SEEDS_NOTE])
  columns = ['finding', 'the paper', 'measured here', 'verdict', 'runs'] + (
      ['each run alone'] if seeded else []) + ['why']
  rows = [[([document.Link(v.finding, f'#{name}')], ''), ([v.claim], ''), ([v.measured], ''),
           ([v.verdict], v.verdict.split()[0]), ([rests_on(v)], '')] +
          ([([each], '')] if seeded else []) + [([v.why], '')]
          for (name, v), each in zip(verdicts, per_run)]
  return document.Section('verdicts', 'Verdicts', [document.Paragraph([note]) for note in notes]
                          + [document.Table(columns, rows)])


def _tool_section(out: str, name: str, result: Mapping, results: Mapping,
                  joint: Sequence[str]) -> document.Section:
  """A tool's section: what it measures and by which convention, the paper's finding,
  its JSON, and its figures (joint ones first) with what the models show."""
  record, shown, json_file = tool.TOOLS[name], findings(name, results), f'{name}.json'
  used = ' '.join(filter(None, [conventions.caption(name, result), plan_note(out, name)]))
  blocks = [document.Paragraph([record.quantity], 'quantity'),
            *([document.Paragraph([used], 'conventions')] if used else []),
            document.Paragraph([record.paper], 'paper'),
            document.Paragraph(['Numbers: ', document.Link(json_file, json_file)])]
  figures = [(path, list(shown)) for path in joint]
  figures += [(figure.path, [figure.caption]) for figure in record.figures(result)]
  for path, keys in figures:
    image = os.path.basename(path)
    blocks.append(document.Figure(image, _image_alt(os.path.join(out, image)),
                                  [shown[k] for k in keys]))
  return document.Section(name, record.title, blocks)
