"""Every code block of README.md and docs/ runs (tests/doc_snippets.py says how),
and the documentation site builds without a warning."""
import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import doc_snippets
from doc_snippets import ROOT
from helpers import NO_CHROMIUM, chromium

ALL_BLOCKS = [b for page in doc_snippets.pages() for b in doc_snippets.blocks(page)]
SKIPPED = [b for b in ALL_BLOCKS if b.skip]
PAGES = [page for page in doc_snippets.pages()
         if any(b.language in doc_snippets.RUN and not b.skip for b in doc_snippets.blocks(page))]


def _published_file(name: str, folder: str) -> None:
  """An initialised `<model>.npz` in the published layout: 21,843 classes at 224
  px, behind a pre-logits layer of the model's width where it has one."""
  from vit_jax import checkpoint, models
  model_name = name[:-len('.npz')]
  if model_name.startswith('LiT-'):
    _lit_files(model_name, folder)
    return
  config = models.get_config(model_name, num_classes=21843)
  if 'representation_size' in config:
    config.representation_size = config.hidden_size
  params = models.build_model(config).init(jax.random.PRNGKey(0),
                                           np.zeros((1, 224, 224, 3), np.float32))['params']
  checkpoint.save(os.path.join(folder, name), params)


def _lit_files(model_name: str, folder: str) -> None:
  """An initialised LiT `<model>.npz` and the BERT vocabulary `<model>.txt` beside it."""
  from helpers import VOCAB
  from vit_jax import checkpoint, models
  config = models.get_config(model_name)
  size = config.image_size
  variables = models.build_model(config).init(
      jax.random.PRNGKey(0), images=np.zeros((1, size, size, 3), np.float32),
      tokens=np.ones((1, config.max_len), np.int32))
  checkpoint.save(os.path.join(folder, f'{model_name}.npz'), variables)
  with open(os.path.join(folder, f'{model_name}.txt'), 'w') as f:
    f.write('\n'.join(VOCAB) + '\n')


def _workdir(name: str, folder: str) -> None:
  """`workdirs/<recipe>` with the initialised params.npz of configs/<recipe>.py."""
  import importlib
  from vit_jax import checkpoint, input_pipeline, models
  recipe = importlib.import_module(f'configs.{os.path.basename(name)}').get_config()
  classes = input_pipeline.get_source(recipe.dataset, recipe.eval_split,
                                      recipe.data_dir).num_classes
  model = models.build_model(models.get_config(recipe.model_name, num_classes=classes,
                                               **recipe.model))
  size = recipe.image_size
  params = model.init(jax.random.PRNGKey(0), np.zeros((1, size, size, 3), np.float32))['params']
  os.makedirs(os.path.join(folder, name))
  checkpoint.save(os.path.join(folder, name, 'params.npz'), params)


def _timm_file(name: str, folder: str) -> None:
  """`<model>.safetensors`: the timm state dict of an initialised model at 224 px, with
  the classes of timm's file of a model of today (`TIMM_VARIANTS`: none for DINOv2
  and SigLIP), 1,000 for the others."""
  from safetensors.numpy import save_file
  from vit_jax import models
  from vit_jax.files import timm_files
  from vit_jax.models.vit import TIMM_VARIANTS
  model_name = name[:-len('.safetensors')]
  variant = TIMM_VARIANTS.get(model_name)
  model = models.get_model(model_name, num_classes=variant.classes if variant else 1000)
  params = model.init(jax.random.PRNGKey(0), np.zeros((1, 224, 224, 3), np.float32))['params']
  save_file(timm_files.to_timm(params, model_name), os.path.join(folder, name))


def _transformers_folder(name: str, folder: str) -> None:
  """`transformers/<name>`: a `Dinov2WithRegistersModel` folder as `save_pretrained`
  writes it (`checkpoint.save(..., format='transformers')`), of an initialised
  headless ViT with LayerScale and 4 registers, 2 blocks of width 32, on 7 px
  patches of 28 px images."""
  from vit_jax import checkpoint, models
  config = models.get_config('ViT-Ti_16', num_classes=0, hidden_size=32, num_layers=2,
                             num_heads=4, mlp_dim=64, patch_size=7, layer_scale_init=0.1,
                             num_registers=4, layer_norm_eps=1e-6, activation='gelu')
  params = models.build_model(config).init(jax.random.PRNGKey(0),
                                           np.zeros((1, 28, 28, 3), np.float32))['params']
  checkpoint.save(os.path.join(folder, name), params, format='transformers', config=config,
                  image_size=28)


def _make(name: str, folder: str) -> None:
  if name.endswith('.npz'):
    _published_file(name, folder)
  elif name.endswith('.safetensors'):
    _timm_file(name, folder)
  elif name.startswith('workdirs/'):
    _workdir(name, folder)
  elif name.endswith('.pt'):  # saev's file of a ReLU SAE on the quick-start ViT's stream
    from helpers import write_saev_file
    rng = np.random.default_rng(0)
    state = {'W_enc': rng.normal(size=(64, 128)).astype(np.float32) / 8,
             'b_enc': np.zeros(128, np.float32),
             'W_dec': rng.normal(size=(128, 64)).astype(np.float32) / 8,
             'b_dec': np.zeros(64, np.float32)}
    write_saev_file(os.path.join(folder, name), state,
                    {'schema': 5, 'cfg': {'activation': {'cls': 'Relu', 'params': {}}}})
  elif name.startswith('transformers/'):
    _transformers_folder(name, folder)
  elif name == 'augreg':  # a local copy of the AugReg index
    from helpers import AUGREG_ROWS, write_augreg_index
    write_augreg_index(os.path.join(folder, name), AUGREG_ROWS)
  else:
    raise ValueError(f'No such test input {name!r}: a <model>.npz or .safetensors, a saev '
                     '<name>.pt, workdirs/<recipe>, transformers/<folder> or augreg.')


def _run(command, cwd, what, env=None):
  done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900,
                        env=env or {**os.environ, 'PYTHONPATH': ROOT})
  assert done.returncode == 0, (f'{what} failed (exit {done.returncode}):\n'
                                f'{done.stdout[-3000:]}\n{done.stderr[-6000:]}')
  return done.stdout


# The optional libraries a block may need (the tests' extras, requirements-timm.txt),
# and the test inputs that need one to be made.
OPTIONAL = ('timm', 'torch', 'transformers')
INPUT_NEEDS = {'.pt': 'torch'}  # saev's files are written by torch.save


def missing_libraries(block: doc_snippets.Block) -> list:
  """The optional libraries `block` needs that are not installed: those its Python
  code imports, and those its inputs are made with."""
  needed = {library for name in block.files for suffix, library in INPUT_NEEDS.items()
            if name.endswith(suffix)}
  if block.language == 'python':
    for node in ast.walk(ast.parse(block.runnable_code())):
      if isinstance(node, ast.Import):
        needed.update(alias.name.split('.')[0] for alias in node.names)
      elif isinstance(node, ast.ImportFrom) and node.module:
        needed.add(node.module.split('.')[0])
  return sorted(n for n in needed if n in OPTIONAL and importlib.util.find_spec(n) is None)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize('page', PAGES)
def test_code_blocks_run(page, tmp_path, warm_python, made_once, user_env):
  """The page's blocks run in order, in the environment the user started the tests in
  (no device count or compiler setting of the tests'); one that needs an optional
  library that is not installed is left out, and the test then says so as a skip
  after the others ran."""
  for name in doc_snippets.LINKED:
    os.symlink(os.path.join(ROOT, name), tmp_path / name)
  runnable = [b for b in doc_snippets.blocks(page) if b.language in doc_snippets.RUN
              and not b.skip]
  left_out = {b.where: missing for b in runnable if (missing := missing_libraries(b))}
  runnable = [b for b in runnable if b.where not in left_out]
  for name in dict.fromkeys(f for b in runnable for f in b.files):
    # The same inputs for every page, made once and copied: a page's commands write.
    shutil.copytree(made_once(name, _make), tmp_path, dirs_exist_ok=True)
  for block in runnable:
    if block.language == 'bash':
      code = doc_snippets.interpreter_commands(block.runnable_code(), warm_python,
                                               os.path.dirname(sys.executable))
      code = re.sub(r'\bDIR\b', 'workdirs/dir', code)
      _run(['bash', '-e', '-o', 'pipefail', '-c', code], tmp_path, block.where, user_env)
  program = [b for b in runnable if b.language == 'python']
  if program:
    _run([warm_python, '-c', doc_snippets.python_program(program)], tmp_path,
         ', '.join(b.where for b in program), user_env)
  if left_out:
    pytest.skip('the other blocks ran; left out, as an optional library is not installed '
                '(requirements-timm.txt): ' + '; '.join(
                    f'{where} (needs {", ".join(names)})' for where, names in left_out.items()))


def test_a_block_needing_an_optional_library_not_installed_is_found(monkeypatch):
  monkeypatch.setattr(sys.modules[__name__], 'OPTIONAL', ('timm', 'no_such_library'))
  block = lambda code, files=(): doc_snippets.Block('page.md', 1, 'python', code, files=files)
  assert missing_libraries(block('import no_such_library.sub, numpy')) == ['no_such_library']
  assert missing_libraries(block('from no_such_library import x')) == ['no_such_library']
  assert missing_libraries(block('import numpy')) == []
  monkeypatch.setattr(sys.modules[__name__], 'INPUT_NEEDS', {'.pt': 'no_such_library'})
  assert missing_libraries(block('pass', files=('sae.pt',))) == ['no_such_library']


def test_every_block_is_run_or_says_why_not():
  """A block is in a language the tests run, a shown-only one, or skipped with a
  reason; its directives parse, and every replacement finds its text."""
  shown_only = {'text', 'console', 'json', 'yaml', 'toml', ''}
  for block in ALL_BLOCKS:
    assert block.language in doc_snippets.RUN or block.language in shown_only, block.where
    if block.skip is not None:
      assert len(block.skip) > 20, f'{block.where}: say why the block is not run'
    else:
      block.runnable_code()
  # The blocks shown untested are few, and each is reported (below).
  assert len(SKIPPED) <= 8, [b.where for b in SKIPPED]


@pytest.mark.parametrize('block', SKIPPED, ids=[b.where for b in SKIPPED])
def test_blocks_shown_untested_are_reported(block):
  pytest.skip(f'{block.where} is not run: {block.skip}')


def test_directives_are_parsed(tmp_path):
  page = tmp_path / 'page.md'
  page.write_text('text\n<!-- test: files A.npz; replace "a b" "c" -->\n```bash\necho a b\n```\n'
                  '```text\nout\n```\n')
  old_root = doc_snippets.ROOT
  doc_snippets.ROOT = str(tmp_path)
  try:
    first, second = doc_snippets.blocks('page.md')
  finally:
    doc_snippets.ROOT = old_root
  assert (first.line, first.files, first.runnable_code()) == (4, ('A.npz',), 'echo c\n')
  assert second.language == 'text'
  assert doc_snippets.interpreter_commands(
      '.venv/bin/python -m x && python y.py\nPYTHONPATH=t .venv/bin/mkdocs build\n', '/w/py',
      '/v/bin') == '/w/py -m x && /w/py y.py\nPYTHONPATH=t /v/bin/mkdocs build\n'


def _ran(*codes: str):
  """Runs blocks of a page as the page test does; returns the completed process."""
  program = doc_snippets.python_program(
      [doc_snippets.Block('page.md', 10 * i + 3, 'python', code) for i, code in enumerate(codes)])
  return subprocess.run([sys.executable, '-c', program], capture_output=True, text=True)


def test_a_page_whose_loop_or_assert_never_runs_fails_naming_the_line():
  fine = _ran('values = [1, 2]\nfor v in values:\n  assert v > 0\n',
              'assert all(v > 0 for v in values)\nwhile values:\n  values.pop()\n')
  assert fine.returncode == 0, fine.stderr
  # A registry that was never filled: the loop's body and its assert never run.
  empty = _ran('registry = {}\n', 'for name in registry:\n  assert name\n')
  assert empty.returncode != 0
  assert 'page.md:13: a loop whose body never runs' in empty.stderr, empty.stderr
  assert 'page.md:14: an assert never reached' in empty.stderr
  comprehension = _ran('assert all(x > 5 for x in [])\n')
  assert 'page.md:3: a comprehension over nothing' in comprehension.stderr
  # A traceback still names the page's line.
  failing = _ran('x = 1\n', 'y = 2\nassert x == y, "differ"\n')
  assert 'File "page.md", line 14' in failing.stderr and 'differ' in failing.stderr


@pytest.mark.parametrize('test', ['(x == 1, "message")', '"text"', '[x]', 'True'])
def test_an_assert_that_cannot_fail_is_refused_before_the_page_runs(test):
  with pytest.raises(ValueError, match='page.md:4: an assert that cannot fail'):
    doc_snippets.python_program([doc_snippets.Block('page.md', 3, 'python',
                                                    f'x = 2\nassert {test}\n')])


def test_the_figures_the_docs_quote_are_their_records():
  """Every measured region of a page is its record's text (scripts/docs_figures.py),
  and every record is quoted."""
  figures = doc_snippets.docs_figures()
  quoted = set()
  for page in figures.pages():
    assert figures.stale_regions(page) == [], (
        f'{page}: run python scripts/docs_figures.py')
    quoted |= {m['name'] for m in figures.REGION.finditer(open(page).read())}
  assert quoted == set(os.listdir(figures.MEASURED)), 'a record no page quotes, or the reverse'


@pytest.mark.slow
def test_a_recorded_session_is_quoted_as_it_ran(tmp_path):
  record = tmp_path / 'suite.json'
  done = subprocess.run(
      [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '-n', '0', '-q',
       'tests/test_docs.py', '-k', 'directives_are_parsed or shown_untested',
       '--record-suite', str(record)], cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, done.stdout[-3000:]
  import json
  fields = json.loads(record.read_text())
  assert (fields['passed'], fields['failed'], fields['skipped']) == (1, 0, len(SKIPPED))
  assert '--record-suite' not in fields['command'] and '-k' in fields['command']
  text = doc_snippets.docs_figures().suite_text(fields)
  assert text.startswith(f'On {fields["date"]}, `pytest ') and ' of pytest on ' in text, text


def test_a_record_replaces_only_a_record_of_its_kind(tmp_path):
  figures = doc_snippets.docs_figures()
  path = tmp_path / 'notes.json'
  path.write_text('{"mine": 1}')
  with pytest.raises(ValueError, match='holds something other than a suite record'):
    figures.write_record(str(path), {'kind': 'suite'})
  assert path.read_text() == '{"mine": 1}'
  figures.write_record(str(tmp_path / 'new.json'), {'kind': 'suite', 'passed': 1})
  figures.write_record(str(tmp_path / 'new.json'), {'kind': 'suite', 'passed': 2})
  assert '"passed": 2' in (tmp_path / 'new.json').read_text()
  done = subprocess.run([sys.executable, os.path.join('benchmarks', 'fault_matrix.py'),
                         '--cases', 'lr', '--record', str(path)], cwd=ROOT, capture_output=True,
                        text=True)
  assert done.returncode == 2 and 'holds something other than a fault_matrix record' in (
      done.stderr) and '| lr |' not in done.stdout
  assert path.read_text() == '{"mine": 1}'


@pytest.fixture(scope='module')
def site(tmp_path_factory):
  """The site as `mkdocs build --strict` writes it: any warning (a broken link, a
  missing reference, a docstring that does not parse) fails the build."""
  folder = tmp_path_factory.mktemp('docs') / 'site'
  mkdocs = os.path.join(os.path.dirname(sys.executable), 'mkdocs')
  _run([mkdocs, 'build', '--strict', '--site-dir', str(folder)], ROOT, 'mkdocs build')
  return folder


@pytest.mark.slow
def test_the_site_builds_without_warnings(site):
  from analysis import tool
  for page in ['index.html', 'api/index.html', 'tools/index.html'] + [
      f'tools/{name}/index.html' for name in tool.TOOLS]:
    assert (site / page).exists(), page
  api = (site / 'api' / 'index.html').read_text()
  assert 'load_pretrained' in api and 'MinibatchCKA' in api


# Injected into each checked page: the images, the errors, the page's title and,
# once the search worker has answered (at most 60 waits), the search results, as
# JSON. Each wait is a request the test's server answers after 0.3 s: while one is
# pending the browser's virtual clock stands still and the worker runs.
CHECK = """<script>
var problems = [];
window.addEventListener('error', function (e) {
  problems.push('error: ' + (e.message || (e.target && (e.target.src || e.target.href))));
}, true);
window.addEventListener('load', async function () {
  var results = 0;
  for (var wait = 0; wait < 60; wait++) {
    await fetch('/wait');
    results = document.querySelectorAll('.md-search-result__item').length;
    if (results > 0 || (wait > 1 && !location.search)) break;
  }
  var pre = document.createElement('pre');
  pre.id = 'browser-check';
  pre.textContent = JSON.stringify({
    images: Array.from(document.images).map(function (img) {
      return {src: img.getAttribute('src'), complete: img.complete, width: img.naturalWidth}; }),
    problems: problems,
    title: (document.querySelector('.md-content h1') || {}).textContent,
    results: results});
  document.body.appendChild(pre);
});
</script>"""


def _served(folder):
  """An HTTP server on localhost for `folder` (the search worker fetches its index,
  which file:// pages may not do) with the `/wait` of CHECK, in a thread; returns
  (server, base URL)."""
  import functools
  import http.server
  import threading
  import time

  class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
      if self.path == '/wait':
        time.sleep(0.3)
        self.send_response(204)
        self.end_headers()
      else:
        super().do_GET()

    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(
      ('127.0.0.1', 0), functools.partial(Handler, directory=str(folder)))
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return server, f'http://127.0.0.1:{server.server_port}/'


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_the_site_renders_in_a_browser_and_its_search_finds(site, tmp_path):
  """Headless Chromium opens pages of the built site over HTTP: each renders its
  title, every image decodes, no script errs, and the search (`?q=`) finds."""
  import html
  import json
  pages = {'index.html?q=hessian': 'Getting started', 'models/index.html': 'Models',
           'analysis/index.html': 'Analysis', 'tools/hessian/index.html': None,
           'api/index.html': 'API reference'}
  for page in pages:
    path = site / page.split('?')[0]
    path.write_text(path.read_text().replace('<head>', '<head>' + CHECK, 1))
  server, base = _served(site)
  try:
    for page, title in pages.items():
      run = subprocess.run(
          [chromium(), '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
           '--disable-background-networking', '--disable-component-update', '--no-first-run',
           f'--user-data-dir={tmp_path / "profile"}', '--virtual-time-budget=60000',
           '--dump-dom', base + page], capture_output=True, text=True, timeout=120)
      dom = run.stdout
      assert 'id="browser-check"' in dom, (page, run.stderr[-2000:])
      start = dom.index('id="browser-check">') + len('id="browser-check">')
      check = json.loads(html.unescape(dom[start:dom.index('</pre>', start)]))
      assert check['problems'] == [], (page, check)
      assert all(i['complete'] and i['width'] > 0 for i in check['images']), (page, check)
      assert check['title'] and (title is None or check['title'].startswith(title)), check
      if '?q=' in page:
        assert check['results'] > 0, check
  finally:
    server.shutdown()


def _table_names(page: str, heading: str) -> set:
  """The `names` in the first column of the table under `## heading` of a page."""
  text = open(os.path.join(ROOT, 'docs', page)).read()
  section = text[text.index(f'## {heading}\n'):]
  table = section[section.index('\n|'):].split('\n\n')[0]
  return {name for row in table.strip().splitlines()[2:]
          for name in re.findall(r'`([\w.]+)`', row.split('|')[1])}


def test_the_training_page_has_a_row_for_every_recipe_field():
  from vit_jax.training import settings
  assert _table_names('training.md', 'Recipe fields') == set(settings.FIELDS)


def test_the_models_page_has_a_row_for_every_model_field(any_family_name):
  """Each family's fields in the table headed '<its title> fields', with those of
  every family (`dtype`) and of every image classifier (`num_classes`)."""
  from vit_jax import models
  family = models.FAMILIES[any_family_name]
  documented = _table_names('models.md', f'{family.title} fields') | _table_names(
      'models.md', 'Fields of every family')
  if family.can(models.CLASSIFY):
    documented |= _table_names('models.md', 'Fields of every image classifier')
  for name in family.variants:
    assert set(models.get_config(name)) - {'name', 'family'} == documented, name
