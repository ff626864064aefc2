"""The original vit_jax's notebooks (tests/original_notebooks/, as published) run
top to bottom on this project, on CPU at small size.

Only these cells change: the ones that download (the repository, packages,
checkpoints, datasets, files), pointed at local files instead (a checkpoint
the project writes in the published layout, the offline Fashion-MNIST), the
Colab-only ones (its editor), and the size settings. Every change names text the
original cell holds, so a notebook that changes fails here instead of running
something else.
"""
import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, 'tests', 'original_notebooks')

# The offline Fashion-MNIST, prepared from its local files, in place of a TFDS download.
_FASHION_MNIST = """from vit_jax.datasets import FashionMnistIdx
_builder = FashionMnistIdx()
_builder.download_and_prepare(
    download_config=tfds.download.DownloadConfig(manual_dir=FashionMnistIdx.local_files()))
"""

# notebook: [(cell index, text the original cell holds, the cell's new source, or
# (old, new) replacements within it)].
CHANGES = {
    'vit_jax.ipynb': [
        (7, 'git clone', '# The package is installed: nothing to clone.'),
        (8, 'pip install', '# The packages are installed.'),
        (10, 'gsutil ls', '# The public buckets are not reached from here.'),
        (11, 'gsutil cp gs://vit_models/imagenet21k',
         "model_name = 'testing'\n"
         'from vit_jax import test_utils\n'
         'from vit_jax.configs import models as _configs\n'
         "test_utils.create_checkpoint(_configs.MODEL_CONFIGS[model_name], f'{model_name}.npz')\n"
         'import os\n'
         "assert os.path.exists(f'{model_name}.npz')"),
        (14, 'from google.colab import files', "# Colab's editor is not here."),
        (18, "dataset = 'cifar10'",
         "dataset = 'fashion_mnist'\n"
         'batch_size = 64\n'
         "config = common_config.with_dataset(common_config.get_config(), 'cifar10')\n"
         'config.dataset = dataset\n'
         'config.batch = batch_size\n'
         'config.pp.crop = 32'),
        (33, 'total_steps = 100', [('total_steps = 100', 'total_steps = 10')]),
        (39, 'imagenet21k+imagenet2012',
         'model = models.VisionTransformer(num_classes=1000, **model_config)\n'
         'import numpy as _np\n'
         "_params = model.init(jax.random.PRNGKey(0), _np.zeros((1, 384, 384, 3), _np.float32),\n"
         "                     train=False)['params']\n"
         "checkpoint.save(f'{model_name}_imagenet2012.npz', _params)"),
        (41, 'wget', "with open('ilsvrc2012_wordnet_lemmas.txt', 'w') as _f:\n"
                     "  _f.write(''.join(f'class {i}\\n' for i in range(1000)))\n"
                     "imagenet_labels = dict(enumerate(open('ilsvrc2012_wordnet_lemmas.txt')))"),
        (42, 'picsum',
         'resolution = 224 if model_name.startswith("Mixer") else 384\n'
         'import PIL\n'
         'import numpy as _np\n'
         'PIL.Image.fromarray(_np.random.RandomState(0).randint(\n'
         '    0, 256, (resolution, resolution, 3), _np.uint8)).save("picsum.jpg")\n'
         "img = PIL.Image.open('picsum.jpg')\n"
         'img'),
    ],
    'lit.ipynb': [
        (2, 'pip install', '# The package is installed.'),
        (5, "model_name = 'LiT-B16B'", [("model_name = 'LiT-B16B'", "model_name = 'LiT-testing'")]),
        (7, "tfds.load('imagenette'", [("ds = tfds.load('imagenette', split='train')",
                                        _FASHION_MNIST + "ds = _builder.as_dataset(split='train')")]),
        (17, "tfds.builder('cifar100')", [
            ("builder = tfds.builder('cifar100')\nbuilder.download_and_prepare()\n",
             _FASHION_MNIST + 'builder = _builder\n')]),
    ],
}


def _changed(name: str) -> nbformat.NotebookNode:
  nb = nbformat.read(os.path.join(FOLDER, name), as_version=4)
  for index, marker, change in CHANGES[name]:
    cell = nb.cells[index]
    assert cell.cell_type == 'code' and marker in cell.source, (name, index, marker)
    if isinstance(change, str):
      cell.source = change
    else:
      for old, new in change:
        assert old in cell.source, (name, index, old)
        cell.source = cell.source.replace(old, new)
  return nb


def _lit_files(folder: str) -> None:
  """`LiT-testing.npz` (initialised, the published layout) and its BERT vocabulary
  in `folder`, where `LitModel.load_variables` and `vocab_path` look first."""
  import jax
  import numpy as np
  from helpers import VOCAB
  from vit_jax import checkpoint, models
  config = models.get_config('LiT-testing')
  variables = models.build_model(config).init(
      jax.random.PRNGKey(0), images=np.zeros((1, 32, 32, 3), np.float32),
      tokens=np.ones((1, config.max_len), np.int32))
  checkpoint.save(os.path.join(folder, 'LiT-testing.npz'), variables)
  with open(os.path.join(folder, 'LiT-testing.txt'), 'w') as f:
    f.write('\n'.join(VOCAB) + '\n')


def test_every_notebook_is_covered():
  assert sorted(os.listdir(FOLDER)) == sorted(list(CHANGES) + ['README.md',
                                                               'vit_jax_augreg.ipynb'])
  for name in CHANGES:
    _changed(name)  # every marker and replacement is found


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(CHANGES))
def test_original_notebook_runs(name, tmp_path, monkeypatch):
  if name == 'lit.ipynb':
    _lit_files(str(tmp_path))
  monkeypatch.delenv('XLA_FLAGS', raising=False)  # one CPU device, as a user's kernel
  monkeypatch.setenv('MPLBACKEND', 'Agg')
  monkeypatch.setenv('PYTHONPATH', ROOT)
  NotebookClient(_changed(name), timeout=900, kernel_name='python3',
                 resources={'metadata': {'path': str(tmp_path)}}).execute()
