"""MkDocs hook: a page per registered analysis tool, written from its `Tool`
record (`analysis.tool.TOOLS`) and its options' flags, so the site says what
the registry holds. A figure of the quick-start models, where one was saved as
`docs/figures/<tool>.png`, comes with it."""
import html
import os

from mkdocs.structure.files import File

from analysis import tool, tool_options
from analysis import tools  # noqa: F401  (registers the built-in tools)

RUNS_ON = {tool.ANY: 'each model', tool.ATTENTION: 'each model with global attention maps (ViT)',
           tool.ALL_MODELS: 'every model together'}
FIRST = '--config configs/quickstart_vit.py --workdir workdirs/quickstart_vit'
SECOND = '--config2 configs/quickstart_resnet.py --workdir2 workdirs/quickstart_resnet'


def _options(registered: tool.Tool) -> str:
  defined = tool_options.flag_fields(registered.options) if registered.options else []
  if not defined:
    return 'None beyond the common ones (`--num_images`, `--batch_size`, `--dataset`).\n'
  rows = ['| flag | default | meaning |', '| --- | --- | --- |']
  cell = lambda text: html.escape(str(text)).replace('|', '\\|')
  rows += [f'| `--{f.name}` | `{f.default}` | {cell(f.metadata["help"])} |' for f in defined]
  return '\n'.join(rows) + '\n'


def tool_page(registered: tool.Tool, docs_dir: str) -> str:
  name = registered.name
  command = f'python -m analysis {name} \\\n    {FIRST}'
  if registered.runs_on != tool.ATTENTION:  # the ViT alone where the tool needs attention maps
    command += f' \\\n    {SECOND}'
  figure = os.path.join(docs_dir, 'figures', f'{name}.png')
  shown = (f'![{registered.title} of the quick-start models](../figures/{name}.png)\n\n'
           'The quick-start ViT and ResNet of [Results](../results.md#quick-start-training) '
           '(the run with load after the probe), as `python -m analysis all` drew them.\n'
           if os.path.exists(figure) else
           'No figure is stored with the docs for this tool; `python -m analysis all` writes '
           'them into the report.\n')
  return (f'# {registered.title}\n\n'
          f'`{name}` runs on {RUNS_ON[registered.runs_on]}.\n\n'
          f'## What it measures\n\n{registered.quantity}\n\n'
          f'The conventions of every tool, as the papers\' code has them: '
          f'[Analysis](../analysis.md#conventions).\n\n'
          f'## The paper\'s finding\n\n{registered.paper}\n\n'
          f'## Command\n\n```bash\n{command} \\\n    --out workdirs/analysis\n```\n\n'
          f'## Options\n\n{_options(registered)}\n'
          f'## Figure\n\n{shown}')


def on_files(files, config):
  listing = ['# Analysis tools\n', 'The registry (`analysis.tool.TOOLS`), a page each:\n']
  for name, registered in tool.TOOLS.items():
    files.append(File.generated(config, f'tools/{name}.md',
                                content=tool_page(registered, config['docs_dir'])))
    listing.append(f'- [{registered.title}]({name}.md) (`{name}`)')
  files.append(File.generated(config, 'tools/index.md', content='\n'.join(listing) + '\n'))
  return files
