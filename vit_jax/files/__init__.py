"""Parameter files: the published `.npz` (`checkpoint`), timm's state dicts
(`timm_files`), `transformers` folders (`hf_files`), PyTorch's `torch.save` archives
read without PyTorch (`torch_save`), the tree layout and its checks (`layout`), the
AugReg index (`augreg`), the files of a training run's workdir (`run_folder`) and
atomic writes (`atomic`). It imports the zoo (`vit_jax.models`), never training or data.

The face holds the names the rest of the project uses (`vit_jax.faces`).
"""
from typing import TYPE_CHECKING

from vit_jax import faces

if TYPE_CHECKING:
  from vit_jax.files.atomic import atomic_write
  from vit_jax.files.augreg import (AUGREG_DIR, AUGREG_PREFIX, index as augreg_index,
                                    lookup as augreg_lookup, model_name as augreg_model_name,
                                    resolve as augreg_resolve, select as augreg_select)
  from vit_jax.files.checkpoint import (CheckpointError, FORMATS, WHERE_PUBLIC, from_pretrained,
                                        load, read, save, weights_file)
  from vit_jax.files.fit import load_pretrained
  from vit_jax.files.hf_files import (CARD as TRANSFORMERS_CARD, CONFIG as TRANSFORMERS_CONFIG,
                                      check_fits as check_transformers_fits,
                                      check_writable as check_transformers_writable,
                                      claim_folder as claim_transformers_folder,
                                      is_folder as is_transformers_folder,
                                      model_of as transformers_model, write as write_transformers)
  from vit_jax.files.layout import Params, check_matches, flatten, non_finite, unflatten
  from vit_jax.files.run_folder import DATA, LOCK, RECORD, RESULTS, has_results, is_run
  from vit_jax.files.timm_files import STATE_DICT_SUFFIXES, from_timm, to_timm
  from vit_jax.files.torch_save import (UnsafeFileError, ZIP_ERRORS, load as torch_load,
                                        loads as torch_loads)

__getattr__, __dir__ = faces.names(__name__, {
    'atomic': ('atomic_write',),
    'augreg': ('AUGREG_DIR', 'AUGREG_PREFIX', 'index as augreg_index', 'lookup as augreg_lookup',
               'model_name as augreg_model_name', 'resolve as augreg_resolve',
               'select as augreg_select'),
    'checkpoint': ('CheckpointError', 'FORMATS', 'WHERE_PUBLIC', 'from_pretrained', 'load',
                   'read', 'save', 'weights_file'),
    'fit': ('load_pretrained',),
    'hf_files': ('CARD as TRANSFORMERS_CARD', 'CONFIG as TRANSFORMERS_CONFIG',
                 'check_fits as check_transformers_fits',
                 'check_writable as check_transformers_writable',
                 'claim_folder as claim_transformers_folder',
                 'is_folder as is_transformers_folder', 'model_of as transformers_model',
                 'write as write_transformers'),
    'layout': ('Params', 'check_matches', 'flatten', 'non_finite', 'unflatten'),
    'run_folder': ('DATA', 'LOCK', 'RECORD', 'RESULTS', 'has_results', 'is_run'),
    'timm_files': ('STATE_DICT_SUFFIXES', 'from_timm', 'to_timm'),
    'torch_save': ('UnsafeFileError', 'ZIP_ERRORS', 'load as torch_load', 'loads as torch_loads'),
})
