"""Hugging Face `transformers` folders read here (`vit_jax.files.hf_files`): a model
`transformers` builds from a small config with random weights and saves with
`save_pretrained` gives here the outputs `transformers`' PyTorch forward gives, and
a folder with a field the project cannot express is refused naming it.

`transformers` and torch stay test-only dependencies and run in a subprocess, as
timm does in tests/test_timm.py (torchvision crashes a process that imported
TensorFlow first, as the test helpers do): a fork of the `torch_python` fixture's
warm interpreter.
"""
import importlib.util
import json
import os
import shutil
import subprocess

import chex
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from doc_snippets import ROOT
from helpers import images
from vit_jax import checkpoint, entry
from vit_jax.errors import UserError
from vit_jax.files import hf_files, timm_files
from vit_jax.models.family import CheckpointError

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec('torch') is None or importlib.util.find_spec('transformers') is None,
    reason='torch and transformers are not installed (optional: pip install torch transformers)')

# The inputs of a transformers model from images (NCHW): SigLIP 2 (`patches`: the
# patch size) takes its processor's patches, every one an image's.
INPUTS = r'''
import json, sys
import numpy as np
import torch
import transformers

spec = json.loads(sys.argv[1])


def inputs(x):
  if 'patches' not in spec:
    return {'pixel_values': x}
  from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches
  patches = torch.stack([convert_image_to_patches(image, spec['patches']) for image in x])
  grid = [x.shape[-2] // spec['patches'], x.shape[-1] // spec['patches']]
  return {'pixel_values': patches,
          'pixel_attention_mask': torch.ones(patches.shape[:2], dtype=torch.int32),
          'spatial_shapes': torch.tensor([grid] * len(x))}
'''

# Builds a small transformers model with random weights, saves it with
# save_pretrained and writes its output on the given images.
TRANSFORMERS_SIDE = INPUTS + r'''
torch.manual_seed(0)
config = getattr(transformers, spec['config'])(**spec['fields'])
model = getattr(transformers, spec['model'])(config).eval()
with torch.no_grad():  # random weights beyond the initialiser's zeros and ones
  for p in model.parameters():
    p.add_(0.02 * torch.randn_like(p))
model.save_pretrained(spec['folder'])
x = torch.from_numpy(np.load(spec['images']).transpose(0, 3, 1, 2))
with torch.no_grad():  # the forward, or a two-tower model's image features
  out = getattr(model, spec.get('method', '__call__'))(**inputs(x))
read, _, token = spec['read'].partition(':')  # ':0': one token's; ':mean': their mean
out = getattr(out, read)
np.save(spec['output'], (out.mean(1) if token == 'mean' else out[:, int(token)] if token
                         else out).numpy())
'''

SMALL_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 image_size=32, patch_size=8)


def run_transformers(python, tmp_path, **spec):
  files = {'folder': str(tmp_path / 'model'), 'images': str(tmp_path / 'images.npy'),
           'output': str(tmp_path / 'output.npy')}
  np.save(files['images'], images(2, 32))
  subprocess.run([python, '-c', TRANSFORMERS_SIDE, json.dumps({**spec, **files})],
                 check=True, capture_output=True)
  return files['folder'], np.load(files['images']), np.load(files['output'])


SMALL_TOWER = dict(SMALL_VIT)
SMALL_SIGLIP2 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, patch_size=8, num_patches=16)
SMALL_TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
SMALL_DINOV2 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2,
                   image_size=32, patch_size=8)
# DINOv3's: rotary position embeddings, registers, LayerScale, no key bias.
SMALL_DINOV3 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, image_size=32, patch_size=8, num_register_tokens=4,
                    layerscale_value=0.1)
# AIMv2's: RMSNorms, SwiGLU, no biases but the patch embedding's and the pooling's output.
SMALL_AIMV2 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=48, image_size=32, patch_size=8)
# A BiT of two stages: the tiny BiT of the tests (`width_factor` 0.5, units 1, 2).
SMALL_BIT = dict(embedding_size=32, hidden_sizes=[128, 256], depths=[1, 2])


@needs_transformers
@pytest.mark.parametrize('config,model,fields,read', [
    ('ViTConfig', 'ViTForImageClassification', dict(SMALL_VIT, num_labels=5), 'logits'),
    ('ViTConfig', 'ViTForImageClassification',
     dict(SMALL_VIT, num_labels=3, hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6,
          qkv_bias=False), 'logits'),
    ('ViTConfig', 'ViTModel', SMALL_VIT, 'pooler_output'),
    # DINOv2's backbones: the class token after the last LayerNorm.
    ('Dinov2Config', 'Dinov2Model', SMALL_DINOV2, 'pooler_output'),
    ('Dinov2WithRegistersConfig', 'Dinov2WithRegistersModel',
     dict(SMALL_DINOV2, num_register_tokens=4), 'pooler_output'),
    # DINOv2 ViT-g's and Web-DINO's SwiGLU MLP, its first layer packed [gate | up].
    ('Dinov2Config', 'Dinov2Model', dict(SMALL_DINOV2, use_swiglu_ffn=True, mlp_ratio=4),
     'pooler_output'),
    ('Dinov2WithRegistersConfig', 'Dinov2WithRegistersModel',
     dict(SMALL_DINOV2, num_register_tokens=4, use_swiglu_ffn=True, mlp_ratio=3),
     'pooler_output'),
    # DINOv3's: the class token after the last LayerNorm; its gated MLP (S+, H+, 7B),
    # and without query and value biases or registers.
    ('DINOv3ViTConfig', 'DINOv3ViTModel', SMALL_DINOV3, 'pooler_output'),
    ('DINOv3ViTConfig', 'DINOv3ViTModel',
     dict(SMALL_DINOV3, use_gated_mlp=True, hidden_act='silu', rope_theta=1000.),
     'pooler_output'),
    ('DINOv3ViTConfig', 'DINOv3ViTModel',
     dict(SMALL_DINOV3, query_bias=False, value_bias=False, num_register_tokens=0),
     'pooler_output'),
    # CLIP's and SigLIP's image towers: the pooled output, CLIP's projected as a head.
    ('CLIPVisionConfig', 'CLIPVisionModel', SMALL_TOWER, 'pooler_output'),
    ('CLIPVisionConfig', 'CLIPVisionModelWithProjection', dict(SMALL_TOWER, projection_dim=16),
     'image_embeds'),
    ('SiglipVisionConfig', 'SiglipVisionModel', SMALL_TOWER, 'pooler_output'),
    # MetaCLIP 2's (Chuang et al. 2025), CLIP's architecture under its own classes.
    ('MetaClip2VisionConfig', 'MetaClip2VisionModel', SMALL_TOWER, 'pooler_output'),
    ('MetaClip2VisionConfig', 'MetaClip2VisionModelWithProjection',
     dict(SMALL_TOWER, projection_dim=16), 'image_embeds'),
    # SigLIP 2's (NaFlex): images at its grid of position embeddings, 4 x 4 patches.
    ('Siglip2VisionConfig', 'Siglip2VisionModel', SMALL_SIGLIP2, 'pooler_output'),
    # The image tower of a two-tower folder: its image features.
    ('CLIPConfig', 'CLIPModel.get_image_features',
     dict(vision_config=SMALL_TOWER, text_config=SMALL_TEXT, projection_dim=16), 'pooler_output'),
    ('MetaClip2Config', 'MetaClip2Model.get_image_features',
     dict(vision_config=SMALL_TOWER, text_config=SMALL_TEXT, projection_dim=16), 'pooler_output'),
    ('SiglipConfig', 'SiglipModel.get_image_features',
     dict(vision_config=SMALL_TOWER, text_config=SMALL_TEXT), 'pooler_output'),
    ('Siglip2Config', 'Siglip2Model.get_image_features',
     dict(vision_config=SMALL_SIGLIP2, text_config=SMALL_TEXT), 'pooler_output'),
    # AIMv2's, with its attention pooling head (use_head), with biases, and without the
    # head: the tokens, whose mean the model read here pools, as timm's AIMv2 does.
    ('Aimv2VisionConfig', 'Aimv2VisionModel', SMALL_AIMV2, 'pooler_output'),
    ('Aimv2VisionConfig', 'Aimv2VisionModel', dict(SMALL_AIMV2, qkv_bias=True, mlp_bias=True),
     'pooler_output'),
    ('Aimv2VisionConfig', 'Aimv2VisionModel', dict(SMALL_AIMV2, use_head=False),
     'last_hidden_state:mean'),
    ('Aimv2Config', 'Aimv2Model.get_image_features',
     dict(vision_config=SMALL_AIMV2, text_config=SMALL_TEXT, projection_dim=16),
     'pooler_output'),
    # ViT-MAE's encoder, alone and in the pre-training model (its decoder left out):
    # the class token after the last LayerNorm; with no masking its patches are
    # shuffled, which the class token does not see.
    ('ViTMAEConfig', 'ViTMAEModel', dict(SMALL_VIT, mask_ratio=0.), 'last_hidden_state:0'),
    ('ViTMAEConfig', 'ViTMAEForPreTraining.vit',
     dict(SMALL_VIT, mask_ratio=0., decoder_hidden_size=16, decoder_num_hidden_layers=1,
          decoder_num_attention_heads=2, decoder_intermediate_size=32), 'last_hidden_state:0'),
    # BiT, with its head and without (BitModel's pooled features are (B, C, 1, 1)).
    ('BitConfig', 'BitForImageClassification', dict(SMALL_BIT, num_labels=5), 'logits'),
    ('BitConfig', 'BitModel', dict(SMALL_BIT, drop_path_rate=0.1), 'pooler_output'),
])
def test_a_transformers_model_gives_transformers_outputs(config, model, fields, read, tmp_path,
                                                          torch_python):
  model, _, method = model.partition('.')
  tower = fields.get('vision_config', fields)
  folder, x, theirs = run_transformers(
      torch_python, tmp_path, config=config, model=model, fields=fields, read=read,
      **({'method': method} if method else {}),
      **({'patches': tower['patch_size']} if config.startswith('Siglip2') else {}))
  module, params = checkpoint.from_pretrained(folder)
  ours = np.asarray(jax.jit(module.apply)({'params': params}, x))
  np.testing.assert_allclose(ours, theirs.reshape(ours.shape), atol=1e-5 * np.abs(theirs).max())
  # The same parameters through the checkpoint reader.
  jax.tree_util.tree_map(np.testing.assert_array_equal, checkpoint.load(folder), params)


@pytest.mark.parametrize('change,says', [
    (dict(hidden_act='relu'), "hidden_act 'relu'"),
    (dict(pooler_act='relu'), "pooler_act 'relu'"),
    (dict(num_channels=1), 'num_channels 1'),
    (dict(model_type='swin'), "'swin' model"),
    (dict(hidden_size='32'), "hidden_size '32'"),
    (dict(num_hidden_layers=None), 'num_hidden_layers None'),
    (dict(patch_size=8.5), 'patch_size 8.5'),
    (dict(patch_size=[8, 4]), 'patch_size \\[8, 4\\]: these ViTs cut images into square'),
    (dict(model_type='deit'), 'distillation token'),
    (dict(model_type='dinov2_with_registers', mlp_ratio=1.1), 'mlp_ratio 1.1'),
    (dict(model_type='siglip_vision_model', vision_use_head=False), 'vision_use_head false'),
    (dict(model_type='clip', vision_config=dict(SMALL_VIT, hidden_act='relu')),
     "hidden_act 'relu'"),
    (dict(model_type='siglip', vision_config=['damaged']), "vision_config \\['damaged'\\]"),
    (dict(model_type='siglip2_vision_model', num_patches=12), 'num_patches 12'),
    (dict(model_type='siglip2', vision_config=dict(SMALL_VIT, vision_use_head=False)),
     'vision_use_head false'),
    (dict(model_type='dinov3_vit', key_bias=True), 'key_bias True'),
    (dict(model_type='dinov3_vit', query_bias=False), 'query_bias False, .*value_bias True'),
    (dict(model_type='dinov3_vit', mlp_bias=False), 'mlp_bias False'),
    (dict(model_type='dinov3_vit', use_gated_mlp=True, hidden_act='gelu'),
     "use_gated_mlp with hidden_act 'gelu'"),
    (dict(model_type='dinov3_vit', rope_theta=-1), 'rope_theta -1'),
    (dict(model_type='bit', layer_type='bottleneck'), 'post-activation unit'),
    (dict(model_type='bit', global_padding='SAME'), "TensorFlow's 'SAME' padding"),
    (dict(model_type='bit', embedding_dynamic_padding=True), 'embedding_dynamic_padding True'),
    (dict(model_type='bit', hidden_act='gelu'), "hidden_act 'gelu'"),
    (dict(model_type='bit', embedding_size=48), 'embedding_size 48'),
    (dict(model_type='bit', hidden_sizes=[128, 512]), 'hidden_sizes \\[128, 512\\]'),
    (dict(model_type='bit', depths=[1, 0]), 'depths \\[1, 0\\]'),
    (dict(model_type='bit', output_stride=4), 'output_stride 4'),
    (dict(model_type='aimv2_vision_model', hidden_act='gelu'), "hidden_act 'gelu'"),
    (dict(model_type='aimv2_vision_model', is_native=True), 'is_native True'),
    (dict(model_type='aimv2_vision_model', qkv_bias=True), 'qkv_bias True and mlp_bias False'),
    (dict(model_type='aimv2', vision_config=['damaged']), "vision_config \\['damaged'\\]"),
])
def test_a_field_the_model_cannot_express_is_refused_naming_it(change, says, tmp_path):
  folder = tmp_path / 'model'
  folder.mkdir()
  kind = str(change.get('model_type'))
  base = {'dinov3_vit': SMALL_DINOV3, 'bit': SMALL_BIT,
          'aimv2_vision_model': SMALL_AIMV2}.get(
              kind, SMALL_DINOV2 if kind.startswith('dinov2') else SMALL_VIT)
  config = {'model_type': 'vit', **base, **change}
  (folder / hf_files.CONFIG).write_text(json.dumps(config))
  (folder / 'model.safetensors').write_bytes(b'')  # refused before it is read
  with pytest.raises(CheckpointError, match=says):
    checkpoint.from_pretrained(str(folder))


def test_a_siglip2_patch_embedding_of_no_square_rgb_patch_is_refused(tmp_path):
  from safetensors.numpy import save_file
  folder = tmp_path / 'model'
  folder.mkdir()
  (folder / hf_files.CONFIG).write_text(json.dumps(
      {'model_type': 'siglip2_vision_model', **SMALL_SIGLIP2}))
  save_file({'vision_model.embeddings.patch_embedding.weight': np.zeros((32, 100), np.float32),
             'vision_model.encoder.layers.0.layer_norm1.weight': np.ones(32, np.float32)},
            str(folder / 'model.safetensors'))
  with pytest.raises(CheckpointError, match='takes 100 numbers per patch, not the RGB values'):
    checkpoint.from_pretrained(str(folder))


@pytest.mark.parametrize('weights,says', [
    # use_head (the default) and no head: transformers would start the pooling at random.
    ({'encoder.layers.0.rms_norm1.weight': np.ones(32, np.float32)},
     'lack head.cls_token, head.k_proj.weight'),
    ({'encoder.layers.0.rms_norm1.weight': np.ones(32, np.float32),
      'encoder.layers.0.attention.rotary.weight': np.ones(4, np.float32)},
     "'encoder.layers.0.attention.rotary.weight', which an AIMv2 image tower"),
])
def test_an_aimv2_folder_of_damaged_or_other_weights_is_refused_naming_them(weights, says,
                                                                            tmp_path):
  from safetensors.numpy import save_file
  folder = tmp_path / 'model'
  folder.mkdir()
  (folder / hf_files.CONFIG).write_text(json.dumps(
      {'model_type': 'aimv2_vision_model', **SMALL_AIMV2}))
  save_file({'embeddings.patch_embed.weight': np.zeros((32, 3, 8, 8), np.float32),
             'embeddings.position_embedding.weight': np.zeros((16, 32), np.float32),
             **weights}, str(folder / 'model.safetensors'))
  with pytest.raises(CheckpointError, match=says):
    checkpoint.from_pretrained(str(folder))


@needs_transformers
def test_a_dinov2_classifier_is_refused_naming_its_head(tmp_path, torch_python):
  """Dinov2ForImageClassification's head reads the class token and the patches' mean."""
  folder, _, _ = run_transformers(torch_python, tmp_path, config='Dinov2Config',
                                  model='Dinov2ForImageClassification',
                                  fields=dict(SMALL_DINOV2, num_labels=3), read='logits')
  with pytest.raises(CheckpointError, match="patches' mean"):
    checkpoint.from_pretrained(folder)


@pytest.mark.parametrize('name,text,says', [
    (hf_files.CONFIG, '{"model_type": "vit", ', 'is not readable JSON'),
    (hf_files.CONFIG, '["vit"]', 'holds no JSON object'),
    (hf_files.CONFIG, b'\xff\xfe{}', 'is not readable JSON'),
    (hf_files.PREPROCESSOR, '{"image_mean": [0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}',
     'image_mean \\[0.5, 0.5\\], where three numbers'),
])
def test_a_damaged_folder_is_refused_in_one_sentence(name, text, says, tmp_path):
  """A truncated or foreign config, or pixel statistics that are not one number per
  channel: one sentence, and nothing of the folder changed."""
  folder = tmp_path / 'model'
  folder.mkdir()
  (folder / hf_files.CONFIG).write_text(json.dumps({'model_type': 'vit', **SMALL_VIT}))
  (folder / 'model.safetensors').write_bytes(b'')
  (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
  before = {p.name: p.read_bytes() for p in folder.iterdir()}
  with pytest.raises(CheckpointError, match=says):
    checkpoint.from_pretrained(str(folder))
  assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_folder_without_a_model_type_is_not_a_transformers_folder(tmp_path):
  (tmp_path / hf_files.CONFIG).write_text('{}')
  assert not hf_files.is_folder(str(tmp_path))
  with pytest.raises(CheckpointError, match='not a transformers model folder'):
    checkpoint.from_pretrained(str(tmp_path))


@needs_transformers
def test_fine_tuning_from_a_folder_refuses_a_model_it_is_not_and_fits_one_it_is(tmp_path,
                                                                                torch_python):
  """The folder's exact GELU and LayerNorm epsilon against a recipe model's own: the
  weights would compute another function there, so the fit is refused naming the
  fields; with the folder's fields the head is replaced and the rest kept."""
  from helpers import init
  from vit_jax import models
  from vit_jax.files import fit
  folder, _, _ = run_transformers(torch_python, tmp_path, config='ViTConfig',
                                  model='ViTForImageClassification',
                                  fields={**SMALL_VIT, 'num_labels': 5}, read='logits')
  sizes = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64, patch_size=8)
  other = models.get_config('ViT-B_16', num_classes=3, **sizes)
  with pytest.raises(CheckpointError, match="activation 'gelu'.*layer_norm_eps 1e-12"):
    fit.load_pretrained(folder, init(models.build_model(other), 32)['params'], other)
  same = models.get_config('ViT-B_16', num_classes=3, activation='gelu', layer_norm_eps=1e-12,
                           **sizes)
  fitted = fit.load_pretrained(folder, init(models.build_model(same), 32)['params'], same)
  _, theirs = checkpoint.from_pretrained(folder)
  assert fitted['head']['kernel'].shape == (32, 3)
  np.testing.assert_array_equal(fitted['Transformer']['encoder_norm']['scale'],
                                theirs['Transformer']['encoder_norm']['scale'])


# A DINOv2 backbone with registers at the quick start's 28 px images (4 x 4 patches).
SMALL_DINOV2_28 = dict(SMALL_DINOV2, image_size=28, patch_size=7, num_register_tokens=4)


def _recipe(*args):
  """The quick-start recipe as the training command's flags make it."""
  from absl import flags
  from vit_jax import entry
  argv = ['prog', '--config', os.path.join(ROOT, 'configs', 'quickstart_vit.py'), *args]
  values = flags.FlagValues()
  entry.define_recipe_flag('config', '', flag_values=values, sys_argv=argv)
  values(argv)
  return values.config


@needs_transformers
def test_a_recipe_fine_tuning_from_a_folder_takes_the_folders_model(tmp_path, torch_python):
  """`--config.pretrained=<folder>` makes the recipe's model the folder's (name,
  sizes, registers, LayerScale, class token, epsilon), keeps the recipe's other model
  fields and the command line's, and the fit then keeps every weight of the folder's
  backbone; a field the command line sets otherwise than the folder is refused."""
  from vit_jax.training import finetune
  folder, _, _ = run_transformers(torch_python, tmp_path, config='Dinov2WithRegistersConfig',
                                  model='Dinov2WithRegistersModel', fields=SMALL_DINOV2_28,
                                  read='pooler_output')
  config = _recipe(f'--config.pretrained={folder}', '--config.model.dropout_rate=0.1')
  name, fields = hf_files.model_of(folder, checkpoint.weights_file(folder))
  assert config.model_name == name
  assert {k: config.model[k] for k in fields} == fields
  assert (config.model.hidden_size, config.model.num_registers, config.model.classifier,
          config.model.layer_norm_eps) == (32, 4, 'token', 1e-6)
  assert config.model.layer_scale_init > 0
  assert config.model.dtype == 'float32' and config.model.dropout_rate == 0.1  # the recipe's
  params = finetune.initial_params(config, 10)
  _, theirs = checkpoint.from_pretrained(folder)
  assert params['head']['kernel'].shape == (32, 10)
  for key in ('Transformer', 'cls', 'registers', 'embedding'):
    np.testing.assert_equal(jax.tree_util.tree_map(np.asarray, params[key]),
                            jax.tree_util.tree_map(np.asarray, theirs[key]))
  other = _recipe(f'--config.pretrained={folder}', '--config.model.layer_norm_eps=0.001')
  with pytest.raises(CheckpointError, match=r"layer_norm_eps 1e-06 \(the recipe's model has 0.001"):
    finetune.initial_params(other, 10)


@needs_transformers
def test_a_recipe_fine_tuning_from_a_dinov3_folder_runs_at_another_grid_with_every_weight(
    tmp_path, torch_python):
  """A DINOv3 folder's model has no position table: fine-tuned at another
  resolution (6 x 6 patches where the folder's image_size gives 4 x 4) it keeps its
  rotary embeddings, and every weight of the backbone as the folder holds it."""
  from vit_jax.training import finetune
  folder, _, _ = run_transformers(torch_python, tmp_path, config='DINOv3ViTConfig',
                                  model='DINOv3ViTModel',
                                  fields=dict(SMALL_DINOV3, patch_size=7, image_size=28),
                                  read='pooler_output')
  config = _recipe(f'--config.pretrained={folder}', '--config.image_size=42')
  assert (config.model.rope, config.model.posemb, config.model.attention_bias,
          config.model.num_registers) == ('dinov3', 'none', 'qv', 4)
  params = finetune.initial_params(config, 10)
  _, theirs = checkpoint.from_pretrained(folder)
  assert params['head']['kernel'].shape == (32, 10)
  for key in ('Transformer', 'cls', 'registers', 'embedding'):
    chex.assert_trees_all_equal(jax.device_get(params[key]), jax.device_get(theirs[key]))


@needs_transformers
def test_a_recipe_fine_tuning_from_an_aimv2_folder_keeps_its_norms_and_attention_pooling(
    tmp_path, torch_python):
  """An AIMv2 folder with its attention pooling head: the recipe's model is the
  folder's (RMSNorms, the patch embeddings' too, no projection biases, AIMv2's
  pooling), and fine-tuning starts from every weight of it but a new head."""
  from vit_jax.training import finetune
  folder, _, _ = run_transformers(torch_python, tmp_path, config='Aimv2VisionConfig',
                                  model='Aimv2VisionModel',
                                  fields=dict(SMALL_AIMV2, patch_size=7, image_size=28),
                                  read='pooler_output')
  config = _recipe(f'--config.pretrained={folder}')
  assert (config.model.normalization, config.model.patch_norm, config.model.projection_bias,
          config.model.attention_bias, config.model.classifier) == (
              'rms', True, False, 'none', 'attention_pool')
  params = finetune.initial_params(config, 10)
  _, theirs = checkpoint.from_pretrained(folder)
  assert params['head']['kernel'].shape == (32, 10)
  for key in ('Transformer', 'embedding', 'patch_norm', 'attention_pool'):
    chex.assert_trees_all_equal(jax.device_get(params[key]), jax.device_get(theirs[key]))


@needs_transformers
def test_a_recipe_with_another_pretrained_keeps_its_model(tmp_path):
  """A `pretrained` that is no transformers folder (an .npz, a folder without
  `model_type`) leaves the recipe's model as it is."""
  (tmp_path / hf_files.CONFIG).write_text('{}')
  for given in (str(tmp_path), str(tmp_path / 'ViT-Ti_16.npz')):
    config = _recipe(f'--config.pretrained={given}')
    assert config.model_name == 'ViT-Ti_16' and config.model.classifier == 'gap'


@pytest.mark.parametrize('weights', [
    b'\x07', b'\xff' * 8 + b'{}',  # truncated; a header length past the file's end
    len(b'{"a": 1}').to_bytes(8, 'little') + b'{"a": 1}',  # an entry that is no array's
    len(b'{"a": {"shape": [-1]}}').to_bytes(8, 'little') + b'{"a": {"shape": [-1]}}'])
def test_a_recipe_from_a_folder_with_damaged_weights_is_refused_in_one_sentence(weights,
                                                                               tmp_path,
                                                                               warm_python):
  """The folder's model is read from its weights' header alone; a damaged header is
  one sentence naming the file, and the folder is left as it was."""
  folder = tmp_path / 'model'
  folder.mkdir()
  (folder / hf_files.CONFIG).write_text(json.dumps({'model_type': 'vit', **SMALL_VIT}))
  (folder / 'model.safetensors').write_bytes(weights)
  before = sorted((p.name, p.read_bytes()) for p in folder.iterdir())
  recipe = os.path.join(ROOT, 'configs', 'quickstart_vit.py')
  with pytest.raises(CheckpointError, match='is not a readable .safetensors file'):
    entry.check_recipe_overrides(['prog', '--config', recipe, f'--config.pretrained={folder}'],
                                 ('config',))
  assert sorted((p.name, p.read_bytes()) for p in folder.iterdir()) == before
  if weights == b'\x07':  # the command says it in one line, before any work
    done = subprocess.run([warm_python, '-m', 'vit_jax.train', '--config', recipe,
                           f'--config.pretrained={folder}', f'--workdir={tmp_path / "run"}'],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1 and done.stderr.count('\n') == 1, done.stderr
    assert 'is not a readable .safetensors file' in done.stderr
    assert not (tmp_path / 'run').exists()


@pytest.mark.e2e
@needs_transformers
def test_the_training_command_fine_tunes_from_a_folder_and_records_its_model(
    tmp_path, torch_python, warm_python):
  """One command, no model named: two steps from a DINOv2 folder on Fashion-MNIST,
  the run's recorded recipe holding the folder's model; then an analysis of the run
  from the same recipe flags."""
  from vit_jax.files import run_folder
  folder, _, _ = run_transformers(torch_python, tmp_path, config='Dinov2WithRegistersConfig',
                                  model='Dinov2WithRegistersModel', fields=SMALL_DINOV2_28,
                                  read='pooler_output')
  run = tmp_path / 'run'
  train = [warm_python, '-m', 'vit_jax.train', '--config',
           os.path.join(ROOT, 'configs', 'quickstart_vit.py'), f'--config.pretrained={folder}',
           '--config.total_steps=2', '--config.batch_size=16', '--config.eval_split=test[:64]',
           f'--workdir={run}']
  done = subprocess.run(train, capture_output=True, text=True, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-3000:]
  recorded = json.loads((run / run_folder.RECORD).read_text())
  name, fields = hf_files.model_of(folder, checkpoint.weights_file(folder))
  assert recorded['model_name'] == name
  assert recorded['model']['num_registers'] == 4 and recorded['model']['hidden_size'] == 32
  assert (run / run_folder.RESULTS).exists()
  # The analysis, given the same recipe flags, builds the run's model and reads its weights.
  out = tmp_path / 'out'
  done = subprocess.run(
      [warm_python, '-m', 'analysis', 'attention_distance', '--config',
       os.path.join(ROOT, 'configs', 'quickstart_vit.py'), f'--config.pretrained={folder}',
       f'--workdir={run}', f'--out={out}', '--num_images=16', '--batch_size=8'],
      capture_output=True, text=True, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-3000:]
  assert (out / 'attention_distance.json').exists()
  assert json.loads((out / 'failures.json').read_text()) in ({}, [])
  # The folder gone (a cleaned Hub cache): the same command goes on from the run's checkpoint.
  params = (run / 'params.npz').read_bytes()
  shutil.rmtree(folder)
  done = subprocess.run(train, capture_output=True, text=True, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f'The pretrained checkpoint {folder} is gone' in done.stderr + done.stdout
  assert json.loads((run / run_folder.RECORD).read_text()) == recorded
  assert (run / 'params.npz').read_bytes() == params


# Loads a folder written here with transformers' Auto class and writes its logits.
# A small DINOv3 of the zoo's fields (`TINY_VIT`'s sizes).
DINOV3 = dict(posemb='none', rope='dinov3', num_registers=4, layer_scale_init=0.1,
              activation='gelu', layer_norm_eps=1e-5)

# A small AIMv2 of the zoo's fields.
AIMV2 = dict(normalization='rms', layer_norm_eps=1e-5, patch_norm=True, attention_bias='none',
             projection_bias=False, activation='swiglu', mlp_dim=48)

TRANSFORMERS_READS = INPUTS + r'''
model = getattr(transformers, spec['auto']).from_pretrained(spec['folder']).eval()
x = torch.from_numpy(np.load(spec['images']).transpose(0, 3, 1, 2))
with torch.no_grad():
  np.save(spec['output'], getattr(model(**inputs(x)), spec['read']).numpy())
'''


@needs_transformers
@pytest.mark.parametrize('fields,auto,read', [
    (dict(num_classes=3, activation='gelu_tanh'), 'AutoModelForImageClassification', 'logits'),
    (dict(num_classes=3, activation='gelu'), 'AutoModelForImageClassification', 'logits'),
    # Headless (as a ViT-MAE encoder reads here): the class token after the last LayerNorm.
    (dict(num_classes=0, activation='gelu'), 'AutoModelForImageClassification', 'logits'),
    # Headless, with a pre-logits layer of another width: ViTModel, the layer its pooler.
    (dict(num_classes=0, activation='gelu', representation_size=24), 'AutoModel',
     'pooler_output'),
    # Headless, with LayerScale: Dinov2Model, and with registers Dinov2WithRegistersModel.
    (dict(num_classes=0, activation='gelu', layer_scale_init=0.1, layer_norm_eps=1e-6),
     'AutoModel', 'pooler_output'),
    (dict(num_classes=0, activation='gelu', layer_scale_init=0.1, num_registers=2),
     'AutoModel', 'pooler_output'),
    # DINOv2 ViT-g's SwiGLU MLP (use_swiglu_ffn, its units from mlp_ratio).
    (dict(num_classes=0, activation='swiglu', mlp_dim=48, layer_scale_init=0.1), 'AutoModel',
     'pooler_output'),
    (dict(num_classes=0, activation='swiglu', mlp_dim=64, layer_scale_init=0.1,
          num_registers=2), 'AutoModel', 'pooler_output'),
    # DINOv3's (DINOv3ViTModel): rotary position embeddings, registers, query and value
    # biases or none, a GELU or SwiGLU MLP.
    (dict(DINOV3, num_classes=0, attention_bias='qv'), 'AutoModel', 'pooler_output'),
    (dict(DINOV3, num_classes=0, attention_bias='none', activation='swiglu', num_registers=0),
     'AutoModel', 'pooler_output'),
    # CLIP's image tower, without and with its projection (a head without bias), and
    # SigLIP's, pooled by its attention-pooling head.
    (dict(num_classes=0, pre_norm=True, patch_bias=False, activation='quick_gelu',
          layer_norm_eps=1e-5), 'CLIPVisionModel', 'pooler_output'),
    (dict(num_classes=16, pre_norm=True, patch_bias=False, activation='quick_gelu',
          layer_norm_eps=1e-5), 'CLIPVisionModelWithProjection', 'image_embeds'),
    (dict(num_classes=16, pre_norm=True, patch_bias=False, activation='quick_gelu',
          layer_norm_eps=1e-5), 'MetaClip2VisionModelWithProjection:metaclip_2_vision_model',
     'image_embeds'),
    (dict(num_classes=0, classifier='map', layer_norm_eps=1e-6), 'SiglipVisionModel',
     'pooler_output'),
    # The same as SigLIP 2's tower, on its processor's patches.
    (dict(num_classes=0, classifier='map', layer_norm_eps=1e-6),
     'Siglip2VisionModel:siglip2_vision_model', 'pooler_output'),
    # AIMv2's (Aimv2VisionModel): its tokens, and its attention pooling, with biases or none.
    (dict(AIMV2, num_classes=0, classifier='unpooled'), 'AutoModel', 'last_hidden_state'),
    (dict(AIMV2, num_classes=0, classifier='attention_pool'), 'AutoModel', 'pooler_output'),
    (dict(AIMV2, num_classes=0, classifier='attention_pool', attention_bias='qkv',
          projection_bias=True), 'AutoModel', 'pooler_output'),
])
def test_a_vit_written_here_gives_its_outputs_in_transformers(fields, auto, read, tmp_path,
                                                              torch_python):
  from helpers import TINY_VIT, init, perturbed
  from vit_jax import models
  config = models.get_config('ViT-Ti_16', **{**TINY_VIT, **fields})
  model = models.build_model(config)
  params = perturbed(init(model, 32), scale=0.02)['params']
  if config.pre_norm and config.num_classes:  # CLIP's projection has no bias
    params['head']['bias'] = np.zeros_like(params['head']['bias'])
  _written_gives_its_outputs(torch_python, tmp_path, model, params, config, auto, read)


@needs_transformers
def test_a_siglip2_tower_read_here_runs_at_any_aspect_ratio_as_siglip2_runs_it(
    tmp_path, torch_python):
  """SigLIP 2 (NaFlex) resizes its 4 x 4 position table to each image's grid with
  antialiasing: at 2 x 6, 5 x 3, 3 x 3 and 6 x 8 patches, Siglip2VisionModel on
  its processor's patches and the model read here give the same pooled output;
  written back, the folder's weights and table are the same."""
  folder, _, _ = run_transformers(torch_python, tmp_path, config='Siglip2VisionConfig',
                                  model='Siglip2VisionModel', fields=SMALL_SIGLIP2,
                                  read='pooler_output', patches=8)
  module, params = checkpoint.from_pretrained(folder)
  assert tuple(module.posemb_grid) == (4, 4)
  for shape in ((16, 48), (40, 24), (24, 24), (48, 64)):
    _same_pooled_output_at(torch_python, tmp_path, folder, module, params, shape, patches=8)
  config, _ = hf_files.read(folder, checkpoint.weights_file(folder))
  hf_files.write(str(tmp_path / 'back'), params, config, image_size=32)
  assert json.loads((tmp_path / 'back' / hf_files.CONFIG).read_text())['model_type'] == (
      'siglip2_vision_model')
  jax.tree_util.tree_map(np.testing.assert_array_equal,
                         checkpoint.from_pretrained(str(tmp_path / 'back'))[1], params)


# A SigLIP 2 folder's pooled output on a batch of images of mixed shapes, as its
# processor makes one: each image's patches, padded to the longest, with
# `pixel_attention_mask` and `spatial_shapes`.
MIXED_BATCH = r'''
import json, sys
import numpy as np
import torch
import transformers
from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

spec = json.loads(sys.argv[1])
model = transformers.AutoModel.from_pretrained(spec['folder']).eval()
shown = np.load(spec['images'])
patches = [convert_image_to_patches(torch.from_numpy(shown[k].transpose(2, 0, 1)), spec['patch'])
           for k in sorted(shown)]
longest = max(len(p) for p in patches)
pixels = torch.zeros(len(patches), longest, patches[0].shape[1])
mask = torch.zeros(len(patches), longest, dtype=torch.int32)
for i, p in enumerate(patches):
  pixels[i, :len(p)], mask[i, :len(p)] = p, 1
shapes = torch.tensor([[shown[k].shape[0] // spec['patch'], shown[k].shape[1] // spec['patch']]
                       for k in sorted(shown)])
with torch.no_grad():
  out = model(pixel_values=pixels, pixel_attention_mask=mask, spatial_shapes=shapes)
np.save(spec['output'], out.pooler_output.numpy())
'''


@needs_transformers
def test_a_siglip2_tower_runs_a_batch_of_mixed_shapes_as_siglip2_runs_it(tmp_path, torch_python):
  """Four images of 2 x 6, 5 x 3, 3 x 3 and 6 x 8 patches in one batch: padded
  here at their bottom and right with `grids` giving each its own, they pool as
  Siglip2VisionModel pools the same images padded to the longest with
  `pixel_attention_mask` and `spatial_shapes`, and as each image alone."""
  folder, _, _ = run_transformers(torch_python, tmp_path, config='Siglip2VisionConfig',
                                  model='Siglip2VisionModel', fields=SMALL_SIGLIP2,
                                  read='pooler_output', patches=8)
  module, params = checkpoint.from_pretrained(folder)
  shapes = ((16, 48), (40, 24), (24, 24), (48, 64))
  shown = [images(1, shape, seed=i)[0] for i, shape in enumerate(shapes)]
  np.savez(tmp_path / 'mixed.npz', **{f'{i:02d}': x for i, x in enumerate(shown)})
  spec = {'folder': folder, 'images': str(tmp_path / 'mixed.npz'), 'patch': 8,
          'output': str(tmp_path / 'output.npy')}
  subprocess.run([torch_python, '-c', MIXED_BATCH, json.dumps(spec)], check=True,
                 capture_output=True)
  theirs = np.load(spec['output'])
  padded = np.zeros((len(shapes), 48, 64, 3), np.float32)
  for i, x in enumerate(shown):
    padded[i, :x.shape[0], :x.shape[1]] = x
  ours = np.asarray(module.apply({'params': params}, padded,
                                 grids=[(h // 8, w // 8) for h, w in shapes]))
  np.testing.assert_allclose(ours, theirs, atol=1e-5 * np.abs(theirs).max())
  for i, x in enumerate(shown):
    np.testing.assert_allclose(module.apply({'params': params}, x[None])[0], ours[i],
                               atol=1e-5 * np.abs(ours).max(), err_msg=str(shapes[i]))


@needs_transformers
def test_a_dinov3_read_here_runs_at_any_grid_as_transformers_runs_it(tmp_path, torch_python):
  """Its rotary embeddings have no table: at a grid of another shape than the
  folder's image_size (3 x 6 and 5 x 2 patches), DINOv3ViTModel and the model read here
  give the same class token."""
  folder, _, _ = run_transformers(torch_python, tmp_path, config='DINOv3ViTConfig',
                                  model='DINOv3ViTModel', fields=SMALL_DINOV3,
                                  read='pooler_output')
  module, params = checkpoint.from_pretrained(folder)
  for shape in ((24, 48), (40, 16)):
    _same_pooled_output_at(torch_python, tmp_path, folder, module, params, shape)


def _same_pooled_output_at(python, tmp_path, folder, module, params, shape, **spec):
  """The folder's `AutoModel` and the model read here give the same `pooler_output`,
  within 1e-5 of its scale, on images of `shape` (height, width)."""
  x = images(2, shape)
  np.save(tmp_path / 'images.npy', x)
  spec = {**spec, 'folder': folder, 'images': str(tmp_path / 'images.npy'),
          'output': str(tmp_path / 'output.npy'), 'auto': 'AutoModel', 'read': 'pooler_output'}
  subprocess.run([python, '-c', TRANSFORMERS_READS, json.dumps(spec)], check=True,
                 capture_output=True)
  theirs = np.load(spec['output'])
  ours = np.asarray(module.apply({'params': params}, x))
  np.testing.assert_allclose(ours, theirs, atol=1e-5 * np.abs(theirs).max(), err_msg=str(shape))


def _written_gives_its_outputs(python, tmp_path, model, params, config, auto, read):
  """Writes the model for transformers (`auto`: the class that loads it, with
  ':<model_type>' to write where it is not the one the fields make), which loads it
  and gives its outputs (`read`) within 1e-5 of their scale; read back here, the
  same parameters. Returns the folder."""
  folder = str(tmp_path / 'model')
  auto, _, model_type = auto.partition(':')
  checkpoint.save(folder, {'params': params}, format='transformers', config=config, image_size=32,
                  model_type=model_type or None)
  x = images(2, 32)
  ours = np.asarray(jax.jit(model.apply)({'params': params}, x))
  np.save(tmp_path / 'images.npy', x)
  spec = {'folder': folder, 'images': str(tmp_path / 'images.npy'),
          'output': str(tmp_path / 'output.npy'), 'auto': auto, 'read': read,
          **({'patches': config.patch_size} if model_type.startswith('siglip2') else {})}
  subprocess.run([python, '-c', TRANSFORMERS_READS, json.dumps(spec)], check=True,
                 capture_output=True)
  theirs = np.load(spec['output']).reshape(ours.shape)  # BitModel's pooled: (B, C, 1, 1)
  np.testing.assert_allclose(theirs, ours, atol=1e-5 * np.abs(ours).max())
  _, back = checkpoint.from_pretrained(folder)
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, jax.device_get(params))
  return folder


@needs_transformers
@pytest.mark.parametrize('classes,auto,read', [(3, 'AutoModelForImageClassification', 'logits'),
                                               (0, 'AutoModel', 'pooler_output')])
def test_a_bit_written_here_gives_its_outputs_in_transformers(classes, auto, read, tmp_path,
                                                              torch_python):
  from helpers import init, perturbed, tiny_family_config
  from vit_jax import models
  config = tiny_family_config('bit', num_classes=classes)
  model = models.build_model(config)
  params = perturbed(init(model, 32), scale=0.02)['params']
  folder = _written_gives_its_outputs(torch_python, tmp_path, model, params, config, auto, read)
  assert json.loads(open(os.path.join(folder, hf_files.CONFIG)).read())['architectures'] == [
      'BitForImageClassification' if classes else 'BitModel']


def test_saving_for_transformers_needs_the_models_config_and_a_known_format(tmp_path):
  from helpers import init, tiny_family_config
  from vit_jax import models
  config = tiny_family_config('bit')
  params = init(models.build_model(config), 32)['params']
  with pytest.raises(ValueError, match='give config='):
    checkpoint.save(str(tmp_path / 'model'), params, format='transformers')
  with pytest.raises(ValueError, match="Unknown checkpoint format 'onnx'; use one of npz, "):
    checkpoint.save(str(tmp_path / 'model'), params, format='onnx')
  assert not (tmp_path / 'model').exists()


def test_a_bit_folder_normalising_otherwise_than_to_minus_one_one_is_refused(tmp_path):
  """BiT reads images in [-1, 1]: ImageNet statistics in the folder's
  preprocessor would make another function of the same weights."""
  folder = tmp_path / 'model'
  folder.mkdir()
  (folder / hf_files.CONFIG).write_text(json.dumps({'model_type': 'bit', **SMALL_BIT}))
  (folder / hf_files.PREPROCESSOR).write_text(json.dumps(
      {'image_mean': [0.485, 0.456, 0.406], 'image_std': [0.229, 0.224, 0.225]}))
  (folder / 'model.safetensors').write_bytes(b'')  # refused before it is read
  with pytest.raises(CheckpointError, match=r'mean \[0.485, 0.456, 0.406\].*\[-1, 1\]'):
    checkpoint.from_pretrained(str(folder))


def test_a_model_transformers_vit_cannot_express_is_not_written(tmp_path):
  from helpers import TINY_VIT, init, perturbed
  from vit_jax import models
  config = models.get_config('ViT-Ti_16', num_classes=3, classifier='gap', **TINY_VIT)
  params = init(models.build_model(config), 32)['params']
  with pytest.raises(CheckpointError, match="classifier 'gap'"):
    hf_files.write(str(tmp_path / 'model'), params, config, image_size=32)
  assert not (tmp_path / 'model').exists()
  # LayerScale with a head: Dinov2ForImageClassification's head reads other tokens.
  config = models.get_config('ViT-Ti_16', num_classes=3, layer_scale_init=0.1, **TINY_VIT)
  params = init(models.build_model(config), 32)['params']
  with pytest.raises(CheckpointError, match='num_classes 3'):
    hf_files.write(str(tmp_path / 'model'), params, config, image_size=32)
  assert not (tmp_path / 'model').exists()
  # SwiGLU without LayerScale: only Dinov2Model has it; and units it cannot make.
  config = models.get_config('ViT-Ti_16', num_classes=3, activation='swiglu', **TINY_VIT)
  params = init(models.build_model(config), 32)['params']
  with pytest.raises(CheckpointError, match="activation 'swiglu'"):
    hf_files.write(str(tmp_path / 'model'), params, config, image_size=32)
  config = models.get_config('ViT-Ti_16', **{**TINY_VIT, 'num_classes': 0, 'mlp_dim': 40,
                                             'activation': 'swiglu', 'layer_scale_init': 0.1})
  params = init(models.build_model(config), 32)['params']
  with pytest.raises(CheckpointError, match='SwiGLU MLP has 40 units.*48, 64, 88 are'):
    hf_files.write(str(tmp_path / 'model'), params, config, image_size=32)
  assert not (tmp_path / 'model').exists()
  # CLIP's projection with a bias.
  config = models.get_config('ViT-Ti_16', num_classes=3, pre_norm=True, patch_bias=False,
                             **TINY_VIT)
  params = perturbed(init(models.build_model(config), 32))['params']
  with pytest.raises(CheckpointError, match='nonzero bias'):
    hf_files.write(str(tmp_path / 'model'), params, config, image_size=32)
  assert not (tmp_path / 'model').exists()
  # A pre-logits layer under a head: ViTForImageClassification's head reads the class token.
  config = models.get_config('ViT-Ti_16', num_classes=3, representation_size=16, **TINY_VIT)
  params = init(models.build_model(config), 32)['params']
  with pytest.raises(CheckpointError, match='representation_size 16'):
    hf_files.write(str(tmp_path / 'model'), params, config, image_size=32)
  assert not (tmp_path / 'model').exists()
  # A model_type the model is not written as: a class-token ViT as SigLIP 2's tower.
  config = models.get_config('ViT-Ti_16', num_classes=3, **TINY_VIT)
  params = init(models.build_model(config), 32)['params']
  with pytest.raises(CheckpointError, match="'vit', not 'siglip2_vision_model'"):
    hf_files.write(str(tmp_path / 'model'), params, config, image_size=32,
                   model_type='siglip2_vision_model')
  assert not (tmp_path / 'model').exists()
  # DINOv3 with a head, or with the key bias DINOv3ViTModel and timm's Eva do not have.
  for fields, says in ((dict(num_classes=3), 'num_classes 3'),
                       (dict(num_classes=0, attention_bias='qkv'), "attention_bias 'qkv'")):
    config = models.get_config('ViT-Ti_16', **{**TINY_VIT, **DINOV3, **fields})
    params = init(models.build_model(config), 32)['params']
    with pytest.raises(CheckpointError, match=says):
      hf_files.write(str(tmp_path / 'model'), params, config, image_size=32)
    assert not (tmp_path / 'model').exists()
  with pytest.raises(ValueError, match='no key bias'):
    timm_files.to_timm(params, config)


def finished_run(tmp_path, **model):
  """A workdir as a finished quick-start ViT run leaves it: its recipe, data,
  parameters and results."""
  from configs import quickstart_vit
  from helpers import init, perturbed
  from vit_jax import models
  from vit_jax.files import run_folder
  from vit_jax.training import steps
  recipe = quickstart_vit.get_config()
  recipe.model.update(model)
  run = tmp_path / 'run'
  run.mkdir()
  (run / run_folder.RECORD).write_text(json.dumps(recipe.to_dict()))
  classes = [f'class {i}' for i in range(10)]
  (run / run_folder.DATA).write_text(json.dumps({'splits': {
      'train': {'name': 'fashion_mnist', 'split': 'train', 'examples': 60000, 'classes': classes},
      'eval': {'name': 'fashion_mnist', 'split': 'test', 'examples': 10000, 'classes': classes}},
      'accepted': []}))
  (run / run_folder.RESULTS).write_text(json.dumps({
      'step': 2, 'total_steps': 2, 'eval_accuracy': 0.8125, 'eval_loss': 0.5, 'eval_examples': 10000}))
  model = models.build_model(steps.model_config(recipe, 10))
  params = perturbed(init(model, recipe.image_size), scale=0.02)['params']
  checkpoint.save(str(run / 'params.npz'), params)
  return str(run), recipe, model, params


@needs_transformers
def test_a_finished_run_exports_a_folder_transformers_loads_with_its_card(tmp_path,
                                                                         torch_python):
  from vit_jax import export
  run, recipe, model, params = finished_run(tmp_path, classifier='token')
  folder = tmp_path / 'hf'
  card = export.transformers_folder(run, str(folder))
  text = open(card).read()
  assert '81.25% on 10000 images' in text and '2 of 2 steps' in text
  assert 'fashion_mnist train, 60000 images, 10 classes' in text
  assert 'ViTForImageClassification.from_pretrained' in text
  hf_config = json.loads((folder / hf_files.CONFIG).read_text())
  assert hf_config['id2label']['3'] == 'class 3'
  x = images(2, recipe.image_size)
  ours = np.asarray(jax.jit(model.apply)({'params': params}, x))
  np.save(tmp_path / 'images.npy', x)
  spec = {'folder': str(folder), 'images': str(tmp_path / 'images.npy'),
          'output': str(tmp_path / 'output.npy'), 'auto': 'AutoModelForImageClassification',
          'read': 'logits'}
  subprocess.run([torch_python, '-c', TRANSFORMERS_READS, json.dumps(spec)], check=True,
                 capture_output=True)
  np.testing.assert_allclose(np.load(spec['output']), ours, atol=1e-5 * np.abs(ours).max())


def test_an_unfinished_run_or_a_model_transformers_cannot_hold_is_not_exported(
    tmp_path, warm_python):
  """No results.json: refused, nothing written. A pooled quick-start ViT: the
  training command refuses it before training, its workdir left as it was."""
  from vit_jax import export
  from vit_jax.files import run_folder
  run, _, _, _ = finished_run(tmp_path, classifier='token')
  os.remove(os.path.join(run, run_folder.RESULTS))
  with pytest.raises(UserError, match='has not finished'):
    export.transformers_folder(run, str(tmp_path / 'hf'))
  assert not (tmp_path / 'hf').exists()
  with open(os.path.join(run, run_folder.RESULTS), 'w') as f:
    f.write('{"step": 2, ')  # cut short
  with pytest.raises(UserError, match='is not readable JSON'):
    export.transformers_folder(run, str(tmp_path / 'hf'))
  assert not (tmp_path / 'hf').exists()
  done = subprocess.run(
      [warm_python, '-m', 'vit_jax.train', '--config', 'configs/quickstart_vit.py',
       '--workdir', str(tmp_path / 'gap'), '--export_transformers', str(tmp_path / 'hf')],
      cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 1 and "classifier 'gap'" in done.stderr, done.stderr[-2000:]
  assert not (tmp_path / 'gap').exists() and not (tmp_path / 'hf').exists()


def _contents(folder):
  """Every file under `folder` with its bytes."""
  return {os.path.relpath(os.path.join(root, n), folder): open(os.path.join(root, n), 'rb').read()
          for root, _, names in os.walk(folder) for n in names}


def test_an_export_never_writes_over_what_it_did_not_make(tmp_path):
  """The run's own workdir, the folder it was fine-tuned from, a folder of other
  files and a transformers model written elsewhere are refused, their bytes as
  they were; a folder an export wrote is written again."""
  from safetensors.numpy import save_file
  from vit_jax import export
  run, _, _, _ = finished_run(tmp_path, classifier='token')
  before = _contents(run)
  with pytest.raises(CheckpointError, match='which this writing reads'):
    export.transformers_folder(run, run)
  with pytest.raises(CheckpointError, match='which this writing reads'):
    export.transformers_folder(run, os.path.join(run, '.'))
  assert _contents(run) == before
  pretrained = tmp_path / 'pretrained'
  pretrained.mkdir()
  save_file({'w': np.zeros(2, np.float32)}, str(pretrained / 'model.safetensors'))
  (pretrained / hf_files.CONFIG).write_text('{"model_type": "vit"}')
  record = json.loads(open(os.path.join(run, 'config.json')).read())
  with open(os.path.join(run, 'config.json'), 'w') as f:
    json.dump({**record, 'pretrained': str(pretrained / 'model.safetensors')}, f)
  theirs = _contents(pretrained)
  with pytest.raises(CheckpointError, match='which this writing reads'):
    export.transformers_folder(run, str(pretrained))
  assert _contents(pretrained) == theirs
  with open(os.path.join(run, 'config.json'), 'w') as f:
    json.dump(record, f)
  with pytest.raises(CheckpointError, match='a transformers model this project did not write'):
    export.transformers_folder(run, str(pretrained))
  assert _contents(pretrained) == theirs
  other = tmp_path / 'notes'
  other.mkdir()
  (other / 'notes.txt').write_text('mine')
  with pytest.raises(CheckpointError, match=r'holds files .* \(notes.txt\)'):
    export.transformers_folder(run, str(other))
  assert _contents(other) == {'notes.txt': b'mine'}
  second_run = tmp_path / 'second'
  os.makedirs(second_run / 'checkpoints' / '2')
  (second_run / 'lock.json').write_text('{}')
  with pytest.raises(CheckpointError, match='holds a training run'):
    export.transformers_folder(run, str(second_run))
  folder = tmp_path / 'hf'
  export.transformers_folder(run, str(folder))
  first = _contents(folder)
  export.transformers_folder(run, str(folder))  # its own files, written again
  again = _contents(folder)
  assert set(again) == set(first) and all(again[n] == first[n] for n in first
                                          if n != hf_files.WEIGHTS)
  from safetensors.numpy import load
  chex.assert_trees_all_equal(load(again[hf_files.WEIGHTS]), load(first[hf_files.WEIGHTS]))
  assert _contents(run) == before


def test_a_folder_transformers_would_read_otherwise_is_not_written(tmp_path):
  """Position embeddings of another image size, or classes' names of another
  number than the head's outputs: refused before anything is written."""
  from helpers import TINY_VIT, init
  from vit_jax import models
  config = models.get_config('ViT-Ti_16', num_classes=3, **TINY_VIT)
  params = init(models.build_model(config), 32)['params']
  folder = str(tmp_path / 'model')
  with pytest.raises(CheckpointError, match=r'not those of a ViT-Ti_16 on 64 px images: '
                                            r'Transformer/posembed_input/pos_embedding'):
    checkpoint.save(folder, params, format='transformers', config=config, image_size=64)
  with pytest.raises(CheckpointError, match="2 classes' names were given for a head of 3"):
    checkpoint.save(folder, params, format='transformers', config=config, image_size=32,
                    labels=['a', 'b'])
  assert not os.path.exists(folder)
  with pytest.raises(CheckpointError, match='is a folder: give the .npz file'):
    checkpoint.save(str(tmp_path), params)


@pytest.mark.e2e
@needs_transformers
def test_the_documented_export_runs_as_users_run_it(tmp_path, warm_python, torch_python):
  """`--export_transformers` with the CPU split into devices as on a user's machine
  (no device count forced in XLA_FLAGS): the run trains and exports a folder
  transformers loads; given the workdir itself, it is refused before training."""
  env = dict(os.environ, XLA_FLAGS=' '.join(
      f for f in os.environ.get('XLA_FLAGS', '').split()
      if not f.startswith('--xla_force_host_platform_device_count')))
  run, folder = tmp_path / 'run', tmp_path / 'hf'
  command = [warm_python, '-m', 'vit_jax.train', '--config', 'configs/quickstart_vit.py',
             '--config.model.classifier=token', '--config.total_steps=2',
             '--config.batch_size=16', '--config.eval_batch_size=16',
             '--config.eval_split=test[:32]', '--workdir', str(run)]
  done = subprocess.run(command + ['--export_transformers', str(run)], cwd=ROOT, env=env,
                        capture_output=True, text=True)
  assert done.returncode == 1 and 'which this writing reads' in done.stderr, done.stderr[-2000:]
  assert not run.exists()
  done = subprocess.run(command + ['--export_transformers', str(folder)], cwd=ROOT, env=env,
                        capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'devices in all' in done.stdout and 'Exported for transformers' in done.stdout
  spec = {'folder': str(folder), 'images': str(tmp_path / 'images.npy'),
          'output': str(tmp_path / 'output.npy'), 'auto': 'AutoModelForImageClassification',
          'read': 'logits'}
  np.save(spec['images'], images(2, 28))
  subprocess.run([torch_python, '-c', TRANSFORMERS_READS, json.dumps(spec)], check=True,
                 capture_output=True)
  model, params = checkpoint.from_pretrained(str(folder))
  ours = np.asarray(model.apply({'params': params}, np.load(spec['images'])))
  np.testing.assert_allclose(np.load(spec['output']), ours, atol=1e-5 * np.abs(ours).max())


def _edited(folder, config=None, drop=(), preprocessor=None):
  """The folder with config.json fields set, tensors whose names match `drop` taken
  out of its weights, and preprocessor_config.json fields set."""
  from safetensors.numpy import load_file, save_file
  if config:
    path = os.path.join(folder, hf_files.CONFIG)
    fields = json.loads(open(path).read())
    with open(path, 'w') as f:
      json.dump({**fields, **config}, f)
  if drop:
    weights = os.path.join(folder, hf_files.WEIGHTS)
    state = load_file(weights)
    save_file({k: v for k, v in state.items() if not any(d in k for d in drop)}, weights,
              metadata={'format': 'pt'})
  if preprocessor is not None:
    with open(os.path.join(folder, hf_files.PREPROCESSOR), 'w') as f:
      json.dump(preprocessor, f)


@needs_transformers
@pytest.mark.parametrize('edit', [
    # transformers builds the query, key and value without biases, the file's unused.
    dict(config={'qkv_bias': False}),
    # transformers starts the missing key biases at zero (and warns).
    dict(drop=('attention.attention.key.bias',)),
])
def test_a_folder_edited_away_from_its_save_is_read_as_from_pretrained_reads_it(
    edit, tmp_path, torch_python):
  folder, x, _ = run_transformers(torch_python, tmp_path, config='ViTConfig',
                                  model='ViTForImageClassification',
                                  fields=dict(SMALL_VIT, num_labels=3), read='logits')
  _edited(folder, **edit)
  spec = {'folder': folder, 'images': str(tmp_path / 'images.npy'),
          'output': str(tmp_path / 'theirs.npy'), 'auto': 'AutoModelForImageClassification',
          'read': 'logits'}
  subprocess.run([torch_python, '-c', TRANSFORMERS_READS, json.dumps(spec)], check=True,
                 capture_output=True)
  theirs = np.load(spec['output'])
  module, params = checkpoint.from_pretrained(folder)
  ours = np.asarray(jax.jit(module.apply)({'params': params}, x))
  np.testing.assert_allclose(ours, theirs, atol=1e-5 * np.abs(theirs).max())


@needs_transformers
def test_a_patch_size_written_as_height_and_width_is_read(tmp_path, torch_python):
  folder, x, theirs = run_transformers(torch_python, tmp_path, config='ViTConfig',
                                       model='ViTForImageClassification',
                                       fields=dict(SMALL_VIT, num_labels=3), read='logits')
  _edited(folder, config={'patch_size': [8, 8]})
  module, params = checkpoint.from_pretrained(folder)
  ours = np.asarray(jax.jit(module.apply)({'params': params}, x))
  np.testing.assert_allclose(ours, theirs, atol=1e-5 * np.abs(theirs).max())


@needs_transformers
def test_what_from_pretrained_would_start_at_random_or_read_otherwise_is_refused(
    tmp_path, torch_python):
  """A classifier without its head's tensors, a query without its weight; the
  processor's do_normalize false honoured, a mean without its std and another
  rescaling refused by name."""
  folder, _, _ = run_transformers(torch_python, tmp_path, config='ViTConfig',
                                  model='ViTForImageClassification',
                                  fields=dict(SMALL_VIT, num_labels=3), read='logits')
  kept = tmp_path / 'kept'
  shutil.copytree(folder, kept)
  _edited(folder, drop=('classifier.',))
  with pytest.raises(CheckpointError, match='names ViTForImageClassification, and the weights '
                                            'hold no classifier'):
    checkpoint.from_pretrained(folder)
  shutil.rmtree(folder)
  shutil.copytree(kept, folder)
  _edited(folder, drop=('layer.1.attention.attention.query.weight',))
  with pytest.raises(CheckpointError, match='layer 1 hold no query projection weight'):
    checkpoint.from_pretrained(folder)
  shutil.rmtree(folder)
  shutil.copytree(kept, folder)
  _edited(folder, preprocessor={'do_normalize': False, 'image_mean': [0.5] * 3,
                                'image_std': [0.5] * 3})
  module, _ = checkpoint.from_pretrained(folder)
  assert tuple(module.pixel_mean) == (0.,) * 3 and tuple(module.pixel_std) == (1.,) * 3
  for preprocessor, says in (({'image_mean': [0.5] * 3}, 'gives image_mean without image_std'),
                             ({'rescale_factor': 1.}, 'rescale_factor 1.0')):
    _edited(folder, preprocessor=preprocessor)
    with pytest.raises(CheckpointError, match=says):
      checkpoint.from_pretrained(folder)


RESHARD = r'''
import sys
import transformers
model = transformers.AutoModelForImageClassification.from_pretrained(sys.argv[1])
model.save_pretrained(sys.argv[2], max_shard_size='20KB')
'''


@needs_transformers
def test_a_sharded_folder_is_read_through_its_index_and_the_hubs_folders_are_pointed_to(
    tmp_path, torch_python):
  """`save_pretrained(max_shard_size=...)`'s shards read as the whole file; a shard
  missing named; a Trainer's checkpoint folder read for its model; the Hub cache's
  `models--org--name` folder refused naming its snapshot."""
  folder, x, _ = run_transformers(torch_python, tmp_path, config='ViTConfig',
                                  model='ViTForImageClassification',
                                  fields=dict(SMALL_VIT, num_labels=3), read='logits')
  sharded = tmp_path / 'sharded'
  subprocess.run([torch_python, '-c', RESHARD, folder, str(sharded)], check=True,
                 capture_output=True)
  shards = sorted(n for n in os.listdir(sharded) if n.startswith('model-'))
  assert len(shards) > 1 and (sharded / 'model.safetensors.index.json').exists()
  whole = checkpoint.load(folder)
  jax.tree_util.tree_map(np.testing.assert_array_equal, checkpoint.load(str(sharded)), whole)
  module, params = checkpoint.from_pretrained(str(sharded))
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, whole)
  # The analysis reads a folder as checkpoint.load does.
  from analysis.runtime import features
  name, fields = hf_files.model_of(str(sharded), checkpoint.weights_file(str(sharded)))
  subject = features.load_subject(name, str(sharded), 32, overrides=fields)
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(subject.params), whole)
  os.remove(sharded / shards[-1])
  with pytest.raises(CheckpointError, match=f'names 1 shard that is not in .*{shards[-1]}'):
    checkpoint.from_pretrained(str(sharded))
  trainer = tmp_path / 'checkpoint-500'
  shutil.copytree(folder, trainer)
  for name in ('optimizer.pt', 'scheduler.pt', 'rng_state.pth', 'training_args.bin'):
    (trainer / name).write_bytes(b'not read')
  (trainer / 'trainer_state.json').write_text('{}')
  jax.tree_util.tree_map(np.testing.assert_array_equal, checkpoint.load(str(trainer)), whole)
  cache = tmp_path / 'models--org--vit'
  os.makedirs(cache / 'refs')
  os.makedirs(cache / 'blobs')
  shutil.copytree(folder, cache / 'snapshots' / 'abc123')
  (cache / 'refs' / 'main').write_text('abc123')
  for read in (checkpoint.from_pretrained, checkpoint.load):
    with pytest.raises(CheckpointError, match=r"Hub cache's folder of a model: give its "
                                              r'snapshot, .*snapshots/abc123\.'):
      read(str(cache))


# Reads each folder with `from_pretrained` twice, under two seeds: the logits, or the
# refusal, and whether they depend on the seed (a tensor the folder lacks started
# at random).
TRANSFORMERS_READS_EACH = INPUTS + r'''
x = torch.from_numpy(np.load(spec['images']).transpose(0, 3, 1, 2))
found = {}
for folder in spec['folders']:
  outputs = []
  try:
    for seed in (0, 1):
      torch.manual_seed(seed)
      model = transformers.AutoModelForImageClassification.from_pretrained(folder).eval()
      with torch.no_grad():
        outputs.append(model(**inputs(x)).logits.numpy())
  except Exception as error:
    found[folder] = {'refused': f'{type(error).__name__}: {error}'[:300]}
    continue
  np.save(folder + '.npy', outputs[0])
  found[folder] = {'random': bool(np.abs(outputs[0] - outputs[1]).max() > 0)}
print(json.dumps(found))
'''

# What a hand or a tool may change in a saved ViT classifier's folder.
_TENSORS = ('vit.encoder.layer.0.attention.attention.key.bias',
            'vit.encoder.layer.1.attention.attention.query.weight',
            'vit.encoder.layer.0.output.dense.bias', 'vit.layernorm.bias', 'classifier.bias',
            'vit.embeddings.position_embeddings', 'vit.embeddings.cls_token')
FOLDER_EDITS = st.fixed_dictionaries({}, optional={
    'qkv_bias': st.booleans(), 'layer_norm_eps': st.sampled_from([1e-12, 1e-6]),
    'hidden_act': st.sampled_from(['gelu', 'gelu_new', 'relu', 'gelu_pytorch_tanh', 'silu']),
    'patch_size': st.sampled_from([8, [8, 8], 16]), 'image_size': st.sampled_from([32, 64]),
    'id2label': st.sampled_from([{'0': 'a', '1': 'b'}, {'0': 'a', '1': 'b', '2': 'c'}]),
    'num_channels': st.sampled_from([1, 3]),
}).flatmap(lambda config: st.tuples(
    st.just(config), st.sets(st.sampled_from(_TENSORS), max_size=2), st.booleans()))


@needs_transformers
@pytest.mark.slow
# Not shrunk: each example is a batch of folders, read in one process of each side.
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(edits=st.lists(FOLDER_EDITS, min_size=8, max_size=8))
def test_an_edited_folder_is_read_as_from_pretrained_reads_it_or_refused(
    edits, tmp_path_factory, torch_python):
  """Drawn edits of a saved ViT classifier's folder (config fields, tensors taken out,
  one added) read here give `transformers`' logits; a folder `transformers` refuses,
  or reads with a tensor started at random, is refused here (a `UserError`, the
  project's sentence, not a traceback)."""
  from safetensors.numpy import load_file, save_file
  tmp_path = tmp_path_factory.mktemp('edits')
  base, x, _ = run_transformers(torch_python, tmp_path, config='ViTConfig',
                                model='ViTForImageClassification',
                                fields=dict(SMALL_VIT, num_labels=3), read='logits')
  folders = []
  for i, (config, drop, extra) in enumerate([({}, set(), False)] + edits):
    folder = str(tmp_path / f'edit{i}')
    shutil.copytree(base, folder)
    _edited(folder, config={**config, **({'label2id': {v: int(k) for k, v in
                                                       config['id2label'].items()}}
                                         if 'id2label' in config else {})},
            drop=tuple(drop))
    if extra:
      weights = os.path.join(folder, hf_files.WEIGHTS)
      state = load_file(weights)
      save_file({**state, 'vit.pooler.extra.weight': np.ones((2, 2), np.float32)}, weights,
                metadata={'format': 'pt'})
    folders.append(folder)
  spec = {'folders': folders, 'images': str(tmp_path / 'images.npy')}
  done = subprocess.run([torch_python, '-c', TRANSFORMERS_READS_EACH, json.dumps(spec)],
                        check=True, capture_output=True, text=True)
  theirs = json.loads(done.stdout.strip().splitlines()[-1])
  read_here = 0
  for folder, (config, drop, extra) in zip(folders, [({}, set(), False)] + edits):
    edit = f'{config}, without {sorted(drop)}, {"an extra tensor" if extra else ""}'
    try:
      module, params = checkpoint.from_pretrained(folder)
    except UserError:  # a CheckpointError among them: a sentence, not a traceback
      continue
    read_here += 1
    assert 'refused' not in theirs[folder], (edit, theirs[folder])
    assert not theirs[folder]['random'], (edit, 'transformers starts a tensor at random')
    ours = np.asarray(jax.jit(module.apply)({'params': params}, x))
    reference = np.load(folder + '.npy')
    np.testing.assert_allclose(ours, reference, atol=1e-5 * np.abs(reference).max(),
                               err_msg=edit)
  assert read_here >= 1  # the folder as saved is read
