"""The original vit_jax's notebooks (tests/original_notebooks/, as published) run
top to bottom on this project, on CPU at small size.

Only these cells change: the ones that download (the repository, packages,
checkpoints, datasets, files), pointed at local files instead (a checkpoint
the project writes in the published layout, the offline Fashion-MNIST, image
folders, a local AugReg index), the Colab-only ones (its editor, TensorBoard's
server), the size settings, and two pandas calls that today's pandas refuses. Every change names text the
original cell holds, so a notebook that changes fails here instead of running
something else.
"""
import importlib.util
import os

import nbformat
import pytest
from nbclient import NotebookClient

from xla_flags import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, 'tests', 'original_notebooks')

# The offline Fashion-MNIST, prepared from its local files, in place of a TFDS download:
# as TFRecord (in the notebook's folder), which the notebook's own tf.data code reads.
_FASHION_MNIST = """from vit_jax.data.datasets import FashionMnistIdx
_builder = FashionMnistIdx(data_dir='tensorflow_datasets', file_format='tfrecord')
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
    'vit_jax_augreg.ipynb': [
        (6, 'git clone', '# The package is installed: nothing to clone.'),
        (7, 'pip install', '# The packages are installed.'),
        (12, 'gs://vit_models/augreg/index.csv', [('gs://vit_models/augreg/index.csv',
                                                   'index.csv')]),
        (14, 'gs://vit_models/augreg/*.npz', [('gs://vit_models/augreg/*.npz', '*.npz')]),
        # pandas >= 2 takes dropna's `how` by keyword only (the notebook predates it).
        (17, ".dropna(1, 'all')", [(".dropna(1, 'all')", ".dropna(axis=1, how='all')")]),
        (18, ".dropna(1, 'all')", [(".dropna(1, 'all')", ".dropna(axis=1, how='all')")]),
        (25, "path = f'gs://vit_models/augreg/{filename}.npz'", [
            ("path = f'gs://vit_models/augreg/{filename}.npz'", "path = f'{filename}.npz'")]),
        (26, 'tfds.load(tfds_name, with_info=True)', [
            ('ds, ds_info = tfds.load(tfds_name, with_info=True)',
             "_builder = tfds.ImageFolder(tfds_name)\n"
             'ds, ds_info = _builder.as_dataset(), _builder.info')]),
        (34, '!pip install timm', [('!pip install timm\n', '')]),
        (40, '%tensorboard', "# TensorBoard's server is not started here."),
        (43, "config.dataset = 'tf_flowers'", [
            ("config.dataset = 'tf_flowers'",
             "config.dataset = 'fashion_mnist'\nconfig.pretrained_dir = '.'"),
            ('config.total_steps = 100', 'config.total_steps = 2'),
            ("config.pp['crop'] = 224", "config.pp['crop'] = 64")]),
        (48, 'flower_photos.tgz',
         'import numpy as _np\n'
         'import PIL.Image\n'
         'for _name in ("daisy", "roses", "tulips"):\n'
         '  os.makedirs(f"{base}/flower_photos/{_name}", exist_ok=True)\n'
         '  for _i in range(100):  # 10% to the test split: each class there\n'
         '    PIL.Image.fromarray(_np.random.RandomState(_i).randint(\n'
         '        0, 256, (60, 80, 3), _np.uint8)).save(f"{base}/flower_photos/{_name}/{_i}.jpg")'),
    ],
}
# The AugReg files the notebook reads: a fine-tuned R26+S/32 (on `pets`, three
# classes, at 384 px) and the R+Ti/16 it fine-tunes, named as the index names them.
PETS_FINE_TUNED = ('R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0--'
                   'oxford_iiit_pet-steps_0k-lr_0.003-res_384')
AUGREG_INDEX_COLUMNS = ('name', 'ds', 'lr', 'aug', 'wd', 'do', 'sd', 'best_val', 'final_val',
                        'final_test', 'adapt_ds', 'adapt_lr', 'adapt_steps',
                        'adapt_resolution', 'adapt_final_val', 'adapt_final_test', 'params',
                        'infer_samples_per_sec', 'filename', 'adapt_filename')


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


def _augreg_files(folder: str) -> None:
  """A local AugReg index (rows for three models, made up), the two checkpoints the
  notebook loads, in the published layout, and `oxford_iiit_pet/{train,test}/CLASS/`
  JPEGs standing in for the TFDS dataset."""
  import csv
  import jax
  import numpy as np
  import PIL.Image
  from vit_jax import checkpoint, models
  rows = []
  for name, prefix in (('R26+S/32', 'R26_S_32'), ('R+Ti/16', 'R_Ti_16'), ('B/16', 'B_16')):
    for ds, val in (('i21k', 0.5), ('i1k', 0.4)):
      filename = f'{prefix}-{ds}-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0'
      for adapt_ds in ('oxford_iiit_pet', 'imagenet2012'):
        for resolution in (224, 384):
          rows.append(dict(
              name=name, ds=ds, lr=0.001, aug='light1', wd=0.1, do=0., sd=0., best_val=val,
              final_val=val, final_test=val, adapt_ds=adapt_ds, adapt_lr=0.003,
              adapt_steps=500, adapt_resolution=resolution, adapt_final_val=val + 0.3,
              adapt_final_test=val + 0.3, params=1e7, infer_samples_per_sec=1000. / resolution,
              filename=filename,
              adapt_filename=f'{filename}--{adapt_ds}-steps_0k-lr_0.003-res_{resolution}'))
  with open(os.path.join(folder, 'index.csv'), 'w', newline='') as f:
    writer = csv.DictWriter(f, AUGREG_INDEX_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  for name, classes, size, file in (
      ('R26+ViT-S_32', 3, 384, PETS_FINE_TUNED),
      ('R+ViT-Ti_16', 10, 64, rows[8]['filename'])):
    model = models.get_model(name, classes)
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, size, size, 3), np.float32))
    checkpoint.save(os.path.join(folder, f'{file}.npz'), params['params'])
  rng = np.random.RandomState(0)
  for split in ('train', 'test'):
    for label in range(3):
      directory = os.path.join(folder, 'oxford_iiit_pet', split, f'breed_{label}')
      os.makedirs(directory)
      for i in range(2):
        PIL.Image.fromarray(rng.randint(0, 256, (48, 64, 3), np.uint8)).save(
            os.path.join(directory, f'{i}.jpg'))


def test_every_notebook_is_covered():
  assert sorted(os.listdir(FOLDER)) == sorted(list(CHANGES) + ['README.md'])
  for name in CHANGES:
    _changed(name)  # every marker and replacement is found


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(CHANGES))
def test_original_notebook_runs(name, tmp_path, monkeypatch):
  if name == 'lit.ipynb':
    _lit_files(str(tmp_path))
  if name == 'vit_jax_augreg.ipynb':
    if importlib.util.find_spec('timm') is None:  # not imported here: see below
      pytest.skip('the notebook loads a checkpoint into timm, which is not installed')
    _augreg_files(str(tmp_path))
    # PyPI's triton (which torchvision, imported by timm, loads) crashes a process
    # that loaded TensorFlow first; the kernel loads it at its start instead, as a
    # user does by importing timm before TensorFlow (docs/original.md).
    profile = tmp_path / 'ipython' / 'profile_default'
    profile.mkdir(parents=True)
    (profile / 'ipython_kernel_config.py').write_text(
        "c.InteractiveShellApp.exec_lines = ['import torchvision']\n")
    monkeypatch.setenv('IPYTHONDIR', str(tmp_path / 'ipython'))
  # One CPU device, as a user's kernel, compiled as the tests' processes are (xla_flags.py).
  monkeypatch.setenv('XLA_FLAGS', FAST_COMPILE)
  monkeypatch.setenv('MPLBACKEND', 'Agg')
  monkeypatch.setenv('PYTHONPATH', ROOT)
  NotebookClient(_changed(name), timeout=900, kernel_name='python3',
                 resources={'metadata': {'path': str(tmp_path)}}).execute()
