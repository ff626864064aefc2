"""The analysis report, its joint figures, the figure helpers and the TensorBoard
events, on every tool run over a tiny ViT and a tiny Mixer (no convolutions, so
the Hessian is quick; the tools' own tests cover every family)."""
import glob
import html.parser
import json
import os
import pathlib
import shutil
import subprocess

import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from analysis import tool
from analysis.cli import events, report
from analysis.reporting import plots, verdict
from analysis.runtime import features
from analysis.cli.command import run_tools
from analysis.tools import TOOLS, activation_patching, hessian, landscape, sae
from helpers import NO_CHROMIUM, TINY_ALTERNET, TINY_MIXER, TINY_VIT, chromium
from helpers import batches, read_events, subject
from vit_jax import models



class _Page(html.parser.HTMLParser):
  """Sections, image sources and quoted numbers of a report page."""

  def __init__(self):
    super().__init__()
    self.sections, self.images, self.numbers, self._number = [], [], [], None
    self.alts, self.contents, self._nav = [], [], False

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if tag == 'section':
      self.sections.append(attrs['id'])
    elif tag == 'nav':
      self._nav = True
    elif tag == 'a' and self._nav:
      self.contents.append(attrs['href'])
    elif tag == 'img':
      self.images.append(attrs['src'])
      self.alts.append(attrs['alt'])
    elif tag == 'span' and attrs.get('class') == 'num':
      self._number = attrs

  def handle_endtag(self, tag):
    if tag == 'nav':
      self._nav = False

  def handle_data(self, data):
    if self._number is not None:
      self.numbers.append((self.sections[-1], self._number, data))
      self._number = None


def _leaves(node):
  if isinstance(node, dict):
    return [x for v in node.values() for x in _leaves(v)]
  if isinstance(node, list):
    return [x for v in node for x in _leaves(v)]
  return [node]


def _reduce(node, how):
  """The reductions a caption may name, written out independently of the report."""
  if how == 'value':
    return node
  if how == 'offdiag_mean':
    m = np.array(node)
    return (m.sum() - np.trace(m)) / (m.size - len(m))
  return {'mean': np.mean, 'min': np.min, 'max': np.max}[how](_leaves(node))


@pytest.fixture(scope='module')
def analysed(made_once):
  """Every tool run on a tiny ViT and a tiny Mixer, and their report: built once per
  test session (`made_once`). The tests only read it."""
  out = pathlib.Path(made_once('analysed', lambda name, folder: _analyse(
      pathlib.Path(folder) / name))) / 'analysed'
  return out, {kind: str(out / f'report.{kind}') for kind in ('html', 'md')}


_OPTIONS = {  # Lanczos and SLQ of one length: one program for both.
    'hessian': hessian.Options(hessian_batches=2, lanczos_steps=4, density_steps=4,
                               trace_probes=2, block_steps=2),
    'landscape': landscape.Options(landscape_points=5),
    # Gaussian noise changes 1 of the random Mixer's 36 predictions.
    'activation_patching': activation_patching.Options(patching_corruption='contrast'),
    'sae': sae.Options(sae_steps=20, sae_features=2),
    **{name: TOOLS[name].options(similarity_resamples=3)
       for name in ('similarities', 'head_similarities', 'localisation_similarities')}}


def _subjects():
  return [subject('ViT-Ti_16', 'vit', **TINY_VIT), subject('Mixer-B_16', 'mixer', **TINY_MIXER)]


def _analyse(out):
  out.mkdir(exist_ok=True)
  subjects = _subjects()
  _, _, failed = run_tools(list(TOOLS), subjects, lambda s: batches, str(out), _OPTIONS)
  assert not failed, failed
  about = {s.label: {**features.describe(s), 'source': 'generated',
                     'tensorboard': str(out / 'tb' / s.label)} for s in subjects}
  (out / report.SUBJECTS_FILE).write_text(json.dumps(about))
  report.write_report(str(out))


@pytest.mark.slow
def test_report_has_a_section_per_tool_and_every_image_exists(analysed):
  out, paths = analysed
  page = _Page()
  page.feed(open(paths['html']).read())
  assert page.sections == ['verdicts'] + list(TOOLS)
  assert page.contents == ['#verdicts'] + [f'#{name}' for name in TOOLS]
  assert page.images and all((out / src).is_file() for src in page.images)
  # Each image's alt text is what its PNG says it shows, not its file name.
  assert all(alt != src and len(alt) > 20 for src, alt in zip(page.images, page.alts))
  # Joint figures for the tools that ran on both models; per-model figures kept.
  for name in ('cka', 'fourier', 'variance', 'hessian', 'robustness', 'norm_ratio', 'erf',
               'probes'):
    assert f'joint_{name}.png' in page.images
  assert 'fourier_depth_vit.png' in page.images and 'fourier_depth_mixer.png' in page.images
  markdown = open(paths['md']).read()
  linked = [line[line.rindex('](') + 2:-1] for line in markdown.splitlines()
            if line.startswith('![')]
  assert sorted(linked) == sorted(page.images)
  assert all(f'[{tool}.json]({tool}.json)' in markdown for tool in TOOLS)


@pytest.mark.slow
def test_caption_numbers_equal_the_json(analysed):
  out, paths = analysed
  page = _Page()
  page.feed(open(paths['html']).read())
  assert {section for section, _, _ in page.numbers} == set(TOOLS)
  for section, attrs, text in page.numbers:
    assert attrs['data-file'] == f'{section}.json'
    node = json.loads((out / attrs['data-file']).read_text())
    for key in json.loads(attrs['data-path']):
      node = node[key]
    expected = float(_reduce(node, attrs['data-reduce']))
    # Captions print three significant digits.
    np.testing.assert_allclose(float(text), expected, rtol=5e-3, atol=1e-12,
                               err_msg=f'{section} {attrs}')


@pytest.mark.slow
def test_a_tools_figures_are_drawn_again_from_its_json(analysed, tmp_path):
  """Every tool gives, from its JSON file alone, the very figures (the same bytes) the
  analysis drew."""
  out, _ = analysed
  subjects = _subjects()
  for name in TOOLS:
    record, result = TOOLS[name], json.loads((out / f'{name}.json').read_text())
    given = (_OPTIONS.get(name, record.options()),) if record.options else ()
    if record.runs_on == tool.ALL_MODELS:
      pairs = [(result, subjects)]
    else:
      pairs = [(result[s.label], s) for s in subjects if s.label in result]
    for entry, of in pairs:
      figures = record.draw(entry, of, str(tmp_path), *given)
      assert [os.path.basename(f) for f in figures] == [
          os.path.basename(f) for f in entry['figures']], name
      for f in figures:
        assert (tmp_path / os.path.basename(f)).read_bytes() == (
            out / os.path.basename(f)).read_bytes(), f


@pytest.mark.slow
def test_report_rebuilds_from_the_json_alone(analysed, tmp_path):
  out, _ = analysed
  for path in glob.glob(str(out / '*.json')) + glob.glob(str(out / '*.png')):
    shutil.copy(path, tmp_path)
  paths = report.write_report(str(tmp_path))
  assert open(paths['html']).read() == open(out / 'report.html').read()
  with pytest.raises(FileNotFoundError, match='No analysis results'):
    report.write_report(str(tmp_path / 'empty'))


def _events(logdir):
  scalars, images = {}, set()
  for tag, steps in read_events(logdir).items():
    if isinstance(next(iter(steps.values())), list):
      images.add(tag)
    else:
      scalars[tag] = {step: float(value) for step, value in steps.items()}
  return scalars, images


@pytest.mark.slow
def test_tensorboard_events_hold_the_numbers_and_figures(analysed):
  out, _ = analysed
  logdirs = {label: s['tensorboard'] for label, s in report.load_subjects(str(out)).items()}
  events.write_events(report.load_results(str(out)), logdirs, str(out))
  fourier = json.loads((out / 'fourier.json').read_text())
  hessian = json.loads((out / 'hessian.json').read_text())
  for label, logdir in logdirs.items():
    scalars, images = _events(logdir)
    high = scalars['analysis/fourier/high_frequency']
    np.testing.assert_allclose([high[i] for i in range(len(high))],
                               fourier[label]['high_frequency'], rtol=1e-6)
    np.testing.assert_allclose(scalars['analysis/hessian/top_eigenvalue'][0],
                               max(hessian[label]['top_per_minibatch'][0]), rtol=1e-6)
    assert f'analysis/fourier/fourier_depth_{label}' in images
    assert 'analysis/cka/cka_vit_mixer' in images
  assert 'analysis/attention_distance/mean_over_heads_px' in _events(logdirs['vit'])[0]
  assert 'analysis/attention_distance/mean_over_heads_px' not in _events(logdirs['mixer'])[0]


def _layers(name, **overrides):
  config = models.get_config(name, **overrides)
  return models.family_of(config).layers(config)


def test_heatmap_ticks_are_layer_names_with_stage_boundaries():
  bit = _layers('BiT-M-R50x1', num_layers=(2, 1))
  labels = list(bit.labels)
  assert labels == ['root', 'block1/unit01', 'block1/unit02', 'block2/unit01']
  assert bit.stages == (1, 3)  # the stem is a stage of its own
  assert bit.branch_stages == (2,)
  assert _layers('ViT-Ti_16', **TINY_VIT).stages == ()
  alternet = _layers('AlterNet-18', **TINY_ALTERNET)
  assert list(alternet.labels) == ['stem', 'stage1_unit1', 'stage2_unit1', 'stage2_unit2']
  assert alternet.stages == (1, 2) and alternet.branch_stages == (1,)
  fig = plots.heatmap(np.eye(4), None, 'CKA', 'a', 'b', xlabels=labels, ylabels=labels,
                      xstages=bit.stages, ystages=bit.stages)
  ax = fig.axes[0]
  assert [t.get_text() for t in ax.get_xticklabels()] == labels
  assert [t.get_text() for t in ax.get_yticklabels()] == labels
  dashed = [line for line in ax.get_lines() if line.get_linestyle() == '--']
  assert [l.get_xdata()[0] for l in dashed if l.get_xdata()[0] == l.get_xdata()[1]] == [.5, 2.5]
  assert [l.get_ydata()[0] for l in dashed if l.get_ydata()[0] == l.get_ydata()[1]] == [.5, 2.5]
  many = [f'block{i}/+sa' for i in range(60)]
  fig = plots.heatmap(np.eye(60), None, 'CKA', 'a', 'b', xlabels=many, ylabels=many)
  ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
  assert len(ticks) <= plots.MAX_TICKS and ticks[0] == 'block0/+sa' and set(ticks) <= set(many)


def test_log_density_limits_lie_within_a_few_decades_of_the_peak():
  grid = np.linspace(-10, 10, 400)
  density = np.exp(-grid**2 / 0.02) * 8. + 1e-300  # Gaussian tails underflow
  fig = plots.curves({'density': density}, None, 'd', 'x', 'y', x=grid, logy=True, decades=4)
  bottom, top = fig.axes[0].get_ylim()
  assert density.max() < top <= 2 * density.max()
  np.testing.assert_allclose(bottom, density.max() * 1e-4)
  # Positive data above the floor set the bottom themselves.
  fig = plots.curves({'ratio': [2., 5., 40.]}, None, 'r', 'x', 'y', logy=True, decades=3)
  assert 1. < fig.axes[0].get_ylim()[0] < 2.


CHECK = """<script>
var problems = [];
window.addEventListener('error', function (e) {
  problems.push('error: ' + (e.message || (e.target && (e.target.src || e.target.href))));
}, true);
var consoleError = console.error;
console.error = function () { problems.push('console: ' + Array.from(arguments).join(' '));
                              consoleError.apply(console, arguments); };
window.addEventListener('load', function () {
  var images = Array.from(document.images).map(function (img) {
    return {src: img.getAttribute('src'), complete: img.complete, width: img.naturalWidth};
  });
  var pre = document.createElement('pre');
  pre.id = 'browser-check';
  var contents = Array.from(document.querySelectorAll('#contents a')).map(function (a) {
    return document.getElementById(a.getAttribute('href').slice(1)) !== null; });
  var verdicts = Array.from(document.querySelectorAll('#verdicts tr td:nth-child(4)')).map(
      function (td) { return td.textContent; });
  pre.textContent = JSON.stringify({images: images, problems: problems, contents: contents,
                                    verdicts: verdicts});
  document.body.appendChild(pre);
});
</script>"""


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_report_opens_in_a_real_browser(analysed, tmp_path):
  """Headless Chromium opens the page from disk: every image decodes, nothing errs."""
  out, paths = analysed
  page = open(paths['html']).read()
  checked = out / 'report_checked.html'
  checked.write_text(page.replace('<head>', '<head>' + CHECK, 1))
  run = subprocess.run(
      [chromium(), '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
       f'--user-data-dir={tmp_path / "profile"}', '--virtual-time-budget=20000',
       '--dump-dom', checked.as_uri()], capture_output=True, text=True, timeout=120)
  dom = run.stdout
  assert 'id="browser-check"' in dom, run.stderr[-2000:]
  start = dom.index('id="browser-check">') + len('id="browser-check">')
  check = json.loads(html.unescape(dom[start:dom.index('</pre>', start)]))
  expected = _Page()
  expected.feed(page)
  assert [image['src'] for image in check['images']] == expected.images
  assert all(image['complete'] and image['width'] > 0 for image in check['images']), check
  assert check['problems'] == []
  assert 'ERR_FILE_NOT_FOUND' not in run.stderr
  # The contents link to sections that exist; the verdict table has a verdict per row.
  assert len(check['contents']) == 1 + len(TOOLS) and all(check['contents'])
  verdicts = report.all_verdicts(report.load_results(str(out)), report.load_subjects(str(out)))
  assert check['verdicts'] == [v.verdict for _, v in verdicts] and verdicts


def test_a_point_without_support_is_not_drawn_and_errors_are_bars():
  fig = plots.curves({'eps 1': np.array([np.nan, 0.5, 0.7])}, None, 'r', 'f', 'accuracy',
                     x=np.array([0., 0.5, 1.]), errors={'eps 1': np.array([np.nan, .1, .05])})
  ax = fig.axes[0]
  line = ax.get_lines()[0]
  drawn = np.isfinite(np.asarray(line.get_ydata(), np.float64))
  assert list(drawn) == [False, True, True]  # NaN: a gap, no marker
  bars = [c for c in ax.containers]
  assert len(bars) == 1
  segments = bars[0].lines[2][0].get_segments()
  np.testing.assert_allclose([s[:, 1] for s in segments[1:]], [[0.4, 0.6], [0.65, 0.75]])


@pytest.mark.slow
def test_every_figure_has_readable_text_and_titles_clear_of_other_elements(analysed):
  """Each PNG of the report records its layout check (`plots.layout_problems`):
  no text below plots.MIN_FONT points, no title overlapped."""
  out, _ = analysed
  images = sorted(out.glob('*.png'))
  assert len(images) > 20
  for path in images:
    with Image.open(path) as image:
      assert json.loads(image.text[plots.LAYOUT_KEY]) == [], path.name
      assert image.text[plots.ALT_KEY], path.name


def test_layout_check_finds_small_text_and_overlapped_titles():
  fig, axes = plt.subplots(1, 2)
  axes[0].set_title('a long title that runs into the next panel ' * 2)
  axes[1].set_xticks([0, 1], ['x', 'y'], fontsize=5)
  problems = plots.layout_problems(fig)
  assert any('overlaps' in p for p in problems)
  assert "'x' is 5 pt" in problems and "'y' is 5 pt" in problems
  fig = plots.curves({'a': [1., 2.], 'b': [2., 1.]}, None, 'title', 'x', 'y')
  assert plots.layout_problems(fig) == []
  assert plots.describe(fig) == 'title; y against x; series: a, b.'


@pytest.mark.slow
def test_accuracy_errors_are_binomial(analysed):
  """Every accuracy's standard error in the JSON is sqrt(p (1 - p) / n)."""
  out, _ = analysed
  load = lambda name: json.loads((out / f'{name}.json').read_text())
  se = lambda p, n: np.sqrt(p * (1 - p) / n)
  for label, r in load('probes').items():
    for rows in r['probes'].values():
      np.testing.assert_allclose([row['stderr'] for row in rows],
                                 [se(row['accuracy'], r['num_test']) for row in rows])
  for label, r in load('robustness').items():
    for accuracy, stderr in zip(r['accuracy'], r['accuracy_stderr']):
      assert [a is None for a in accuracy] == [s is None for s in stderr]
      np.testing.assert_allclose([s for s in stderr if s is not None],
                                 [se(a, r['num_images']) for a in accuracy if a is not None])


def test_a_failing_tool_leaves_the_others_and_the_report_says_why(tmp_path, monkeypatch):
  import dataclasses

  def broken(*args, **kwargs):
    raise RuntimeError('out of memory in the test')
  genuine = TOOLS['norm_ratio']
  monkeypatch.setitem(tool.TOOLS, 'norm_ratio', dataclasses.replace(genuine, run=broken))
  subjects = [subject('ViT-Ti_16', 'vit', **TINY_VIT)]
  results, _, failed = run_tools(['norm_ratio', 'attention_distance'], subjects,
                                 lambda s: batches, str(tmp_path))
  assert failed == {'norm_ratio': 'RuntimeError: out of memory in the test'}
  assert set(results) == {'attention_distance'}
  assert (tmp_path / 'attention_distance.json').exists()
  assert not (tmp_path / 'norm_ratio.json').exists()
  (tmp_path / report.SUBJECTS_FILE).write_text(json.dumps(
      {'vit': {**features.describe(subjects[0]), 'source': 'generated'}}))
  text = open(report.write_report(str(tmp_path))['md']).read()
  assert '## Tools that failed' in text and 'out of memory in the test' in text
  # Run again, working: the failure is forgotten.
  monkeypatch.setitem(tool.TOOLS, 'norm_ratio', genuine)
  assert run_tools(['norm_ratio'], subjects, lambda s: batches, str(tmp_path))[2] == {}
  assert report.load_failures(str(tmp_path)) == {}
  assert 'Tools that failed' not in open(report.write_report(str(tmp_path))['md']).read()


def test_a_signal_during_a_tool_stops_the_analysis_and_is_never_that_tools_failure(
    tmp_path, monkeypatch):
  """SIGTERM while a tool runs: a tool that finishes keeps its JSON and the next
  does not start; one stopped inside its batches writes nothing; neither is
  reported as a failed tool, and the failures already recorded stay."""
  import dataclasses
  import signal
  import time
  from analysis.runtime import progress, stopping
  genuine = TOOLS['norm_ratio']

  def signalled(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    return genuine.run(*args, **kwargs)

  def signalled_in_batches(*args, **kwargs):
    done = progress.Progress('test', 2, 'batches')
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    done.advance()

  subjects = [subject('ViT-Ti_16', 'vit', **TINY_VIT)]
  (tmp_path / report.FAILURES_FILE).write_text(json.dumps({'erf': 'RuntimeError: earlier'}))
  for run, written in ((signalled, True), (signalled_in_batches, False)):
    (tmp_path / 'norm_ratio.json').unlink(missing_ok=True)
    monkeypatch.setitem(tool.TOOLS, 'norm_ratio', dataclasses.replace(genuine, run=run))
    with pytest.raises(stopping.Stopped, match='^Stopped by SIGTERM'):
      with stopping.on_signals(str(tmp_path)):
        run_tools(['norm_ratio', 'attention_distance'], subjects, lambda s: batches,
                  str(tmp_path))
    assert (tmp_path / 'norm_ratio.json').exists() == written
    assert not (tmp_path / 'attention_distance.json').exists()
    assert report.load_failures(str(tmp_path)) == {'erf': 'RuntimeError: earlier'}


def test_a_budget_that_left_tools_out_still_gets_a_report_listing_them(tmp_path):
  """The planner leaves norm_ratio out; run_tools runs the others only; the report
  is written, lists the tool left out with the command that runs it, and forgets
  it once it has run."""
  import time
  from analysis.runtime import estimate
  from analysis.cli import planning
  subjects = [subject('ViT-Ti_16', 'vit', **TINY_VIT)]
  names = ['attention_distance', 'norm_ratio']
  amounts = estimate.Amounts(36, 12)
  options = {n: None for n in names}  # neither tool has options
  prices = {'vit': estimate.Prices({'forward': 0.01}, {'forward': 0.})}
  planner = planning.Planner(names, subjects, prices, options, amounts,
                             time.perf_counter() + 1e4, '1h')
  planner.leave_out(['norm_ratio'], 'not fitting --time_budget=1s even at their smallest '
                                    'samples')
  planner.fit(names)
  # Costlier than the hours left: the time it was left out for never comes.
  priced = planner.minimum_seconds
  planner.minimum_seconds = lambda n: 1e9 if n == 'norm_ratio' else priced(n)
  results, _, failed = run_tools(names, subjects, lambda s: batches, str(tmp_path), options,
                                 planner)
  assert set(results) == {'attention_distance'} and not failed
  assert not (tmp_path / 'norm_ratio.json').exists()
  assert set(report.load_left_out(str(tmp_path))) == {'norm_ratio'}
  text = open(report.write_report(str(tmp_path))['md']).read()
  assert '## Tools left out for the time budget' in text
  assert '- Skip connections: norm ratios (norm_ratio): not fitting --time_budget=1s' in text
  from analysis.cli import command
  assert f'to run it: `{command.interpreter()} -m analysis norm_ratio' in text
  # Nothing ran at all: the report still lists what was left out.
  empty = tmp_path / 'empty'
  empty.mkdir()
  report.record_plan(str(empty), '1s', {}, names,
                     {n: ('not priced', f'python -m analysis {n}') for n in names})
  assert report.has_report(str(empty))
  assert 'norm_ratio' in open(report.write_report(str(empty))['md']).read()
  # Run later on its own, it is no longer left out.
  run_tools(['norm_ratio'], subjects, lambda s: batches, str(tmp_path))
  assert report.load_left_out(str(tmp_path)) == {}
  assert 'left out' not in open(report.write_report(str(tmp_path))['md']).read()


def test_a_tool_left_out_runs_at_the_end_where_its_time_is_still_there(tmp_path, capsys):
  """Left out at the start, norm_ratio fits the time left once the tools before it
  have run: it runs last, and the plan no longer lists it as left out."""
  import time
  from analysis.runtime import estimate
  from analysis.cli import planning
  subjects = [subject('ViT-Ti_16', 'vit', **TINY_VIT)]
  names = ['attention_distance', 'norm_ratio']
  options = {n: None for n in names}
  prices = {'vit': estimate.Prices({'forward': 0.01}, {'forward': 0.})}
  planner = planning.Planner(names, subjects, prices, options, estimate.Amounts(36, 12),
                             time.perf_counter() + 1e4, '3h', unpriced=())
  planner.leave_out(['norm_ratio'], 'not fitting the 2s left of --time_budget=3h')
  planner.fit(names)
  results, _, failed = run_tools(names, subjects, lambda s: batches, str(tmp_path), options,
                                 planner)
  assert list(results) == ['attention_distance', 'norm_ratio'] and not failed
  assert 'Taken back, fitting the ' in capsys.readouterr().out
  assert report.load_left_out(str(tmp_path)) == {} and not planner.left_out
  # A tool that was never priced is not taken back: no estimate says it fits.
  planner = planning.Planner(names, subjects, prices, options, estimate.Amounts(36, 12),
                             time.perf_counter() + 1e4, '3h', unpriced=['norm_ratio'])
  planner.leave_out(['norm_ratio'], 'not priced within 20% of --time_budget=3h')
  assert planner.take_back() is None


@pytest.mark.parametrize('recipe,line', [
    ('quickstart_vit', 'the quick-start tier'), ('papers', 'the paper-like tier'),
    ('vit_b16', None)])
def test_the_report_names_the_tier_of_a_models_recipe(recipe, line):
  import dataclasses
  import importlib
  config = importlib.import_module(f'configs.{recipe}').get_config()
  about = features.describe(dataclasses.replace(subject('ViT-Ti_16', 'vit', **TINY_VIT),
                                                recipe=config))
  text = report.describe_model('vit', {**about, 'source': 'generated'})
  if line is None:
    assert 'tier' not in about and 'tier' not in text
  else:
    assert about['tier'] == config.tier and f' px images, {line}' in text


def test_the_verdicts_say_how_many_runs_each_rests_on_and_not_comparable_none(tmp_path):
  """One ViT: each verdict on it rests on one run; one that is not comparable rests
  on no measurement and says so ('-')."""
  subjects = [subject('ViT-Ti_16', 'vit', **TINY_VIT)]
  assert run_tools(['attention_distance', 'norm_ratio'], subjects, lambda s: batches,
                   str(tmp_path))[2] == {}
  (tmp_path / report.SUBJECTS_FILE).write_text(json.dumps(
      {'vit': {**features.describe(subjects[0]), 'source': 'generated'}}))
  text = open(report.write_report(str(tmp_path))['md']).read()
  table = text.split('## Verdicts')[1].split('\n## ')[0]
  runs = {}  # verdict -> the runs cells of its rows
  for line in table.splitlines():
    if line.startswith('| ['):  # finding | the paper | measured here | verdict | runs | why
      cells = line.split(' | ')
      runs.setdefault(cells[3], set()).add(cells[4])
  assert runs.get(verdict.NOT_COMPARABLE) == {'-'}, runs
  assert set(runs) - {verdict.NOT_COMPARABLE} and all(
      cells == {'1'} for v, cells in runs.items() if v != verdict.NOT_COMPARABLE), runs
