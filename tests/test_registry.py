"""Every published model builds with the published tree and parameter count."""
import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import TINY_VIT, param_shapes, tiny_family_config
from vit_jax import models

# At 224 px with 1000 classes; independently published figures: ViT-B/16
# 86,567,656 (design.md), BiT-R50x1 25.5M, ViT-L/16 304M, ViT-H/14 632M.
PARAM_COUNTS = {
    'BiT-M-R101x1': 44_541_480, 'BiT-M-R101x3': 387_934_888, 'BiT-M-R152x2': 236_335_208,
    'BiT-M-R152x4': 936_533_224, 'BiT-M-R50x1': 25_549_352, 'BiT-M-R50x3': 217_319_080,
    'BiT-S-R101x1': 44_541_480, 'BiT-S-R101x3': 387_934_888, 'BiT-S-R152x2': 236_335_208,
    'BiT-S-R152x4': 936_533_224, 'BiT-S-R50x1': 25_549_352, 'BiT-S-R50x3': 217_319_080,
    'R+ViT-Ti_16': 6_337_704, 'R26+ViT-B_32': 101_383_976, 'R26+ViT-S_32': 36_431_912,
    'R50+ViT-B_16': 98_659_112, 'R50+ViT-L_32': 328_994_856,
    'ViT-B_16': 86_567_656, 'ViT-B_32': 88_224_232, 'ViT-B_8': 86_576_872,
    'ViT-H_14': 632_045_800, 'ViT-L_16': 304_326_632, 'ViT-L_32': 306_535_400,
    'ViT-S_16': 22_050_664, 'ViT-S_32': 22_878_952, 'ViT-Ti_16': 5_717_416,
    'Mixer-B_16': 59_880_472, 'Mixer-L_16': 208_196_168,
    'ViT-So400m_14': 413_597_656, 'ViT-g_14': 1_012_611_432, 'ViT-G_14': 1_844_440_680,
    # The original code's models_test.py.
    'ViT-S_16-gap-norep': 22_049_896, 'ViT-B_16-gap-norep': 86_566_120,
    'ViT-S_32-gap-norep': 22_878_184, 'ViT-B_32-gap-norep': 88_222_696,
    'testing': 21_390, 'testing-unpooled': 21_370,
    # Today's ViTs, as timm 1.0.31 counts its models of these names (224 px, 1000 classes).
    'DINOv2-S_14': 22_013_800, 'DINOv2-B_14': 86_493_928, 'DINOv2-L_14': 304_252_904,
    'DINOv2-S_14-reg4': 22_014_952, 'DINOv2-B_14-reg4': 86_496_232,
    'DINOv2-L_14-reg4': 304_255_976, 'DINOv2-g_14': 1_136_306_664,
    'DINOv2-g_14-reg4': 1_136_311_272, 'SigLIP-B_16': 93_653_224, 'CLIP-B_16': 86_568_424,
    'DeiT-Ti_16': 5_717_416, 'DeiT-S_16': 22_050_664, 'DeiT-B_16': 86_567_656,
    # timm's DINOv3 built with global_pool='token' (the class token, as DINOv3 pools).
    'DINOv3-S_16': 21_971_944, 'DINOv3-S_16-qkvb': 21_981_160, 'DINOv3-S+_16': 29_068_264,
    'DINOv3-S+_16-qkvb': 29_077_480, 'DINOv3-B_16': 86_410_216, 'DINOv3-B_16-qkvb': 86_428_648,
    'DINOv3-L_16': 304_104_424, 'DINOv3-L_16-qkvb': 304_153_576, 'DINOv3-H+_16': 841_790_440,
    'DINOv3-H+_16-qkvb': 841_872_360, 'DINOv3-7B_16': 6_720_127_976,
    'TIPSv2-B_14': 86_493_928, 'TIPSv2-L_14': 304_252_904, 'TIPSv2-So400m_14': 413_659_864,
    'TIPSv2-g_14': 1_136_306_664,
    'EVA02-Ti_14': 5_695_144, 'EVA02-S_14': 22_006_120, 'EVA02-B_14': 86_527_720,
    'EVA02-L_14': 304_293_800, 'EVA02-L_14-m38m': 304_293_800, 'EVA02-Ti_14-in1k': 5_695_144,
    'EVA02-S_14-in1k': 22_006_120, 'EVA02-B_14-in22k-in1k': 86_527_720,
    'EVA02-L_14-in22k-in1k': 304_293_800, 'EVA02-L_14-m38m-in22k-in1k': 304_293_800,
    'PE-Core-T_16': 6_162_280, 'PE-Core-S_16': 23_825_128, 'PE-Core-B_16': 93_655_528,
    'PE-Core-L_14': 316_799_976, 'PE-Core-G_14': 1_880_423_912,
    'AIMv2-L_14': 310_222_824, 'AIMv2-L_14-336': 310_222_824, 'AIMv2-L_14-448': 310_222_824,
    'AIMv2-L_14-dist': 310_222_824, 'AIMv2-L_14-336-dist': 310_222_824,
    'AIMv2-H_14': 682_388_968, 'AIMv2-H_14-336': 682_388_968, 'AIMv2-H_14-448': 682_388_968,
    'AIMv2-1B_14': 1_237_007_336, 'AIMv2-1B_14-336': 1_237_007_336,
    'AIMv2-1B_14-448': 1_237_007_336, 'AIMv2-3B_14': 2_723_731_432,
    'AIMv2-3B_14-336': 2_723_731_432, 'AIMv2-3B_14-448': 2_723_731_432,
}
# Counted against closed forms in test_mixer_alternet.py; the LiT models in test_lit.py.
OTHER_MODELS = ['Mixer-B_32', 'Mixer-L_32', 'Mixer-S_16', 'Mixer-S_32', 'AlterNet-18',
                'AlterNet-34', 'AlterNet-50', 'AlterNet-101', 'AlterNet-152',
                'LiT-B16B', 'LiT-B16B_2', 'LiT-L16L', 'LiT-L16S', 'LiT-L16Ti', 'LiT-testing']


def test_every_published_model_is_listed():
  assert models.list_models() == sorted(list(PARAM_COUNTS) + OTHER_MODELS)


def test_family_layers_are_what_the_model_sows(family_name):
  _check_layers(tiny_family_config(family_name))


@pytest.mark.parametrize('name,overrides', [
    ('ViT-Ti_16', {**TINY_VIT, 'classifier': 'gap'}), ('R+ViT-Ti_16', {'num_layers': 1}),
    ('BiT-M-R50x1', {'num_layers': (1, 2)})])
def test_variants_layers_are_what_the_model_sows(name, overrides):
  _check_layers(models.get_config(name, num_classes=3, **overrides))


def _check_layers(config):
  """The family's `Layers` of `config` name what its model sows, in depth order."""
  model = models.build_model(config)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))
  _, inter = jax.eval_shape(lambda v, x: models.apply_with_intermediates(model, v, x),
                            variables, jnp.zeros((2, 32, 32, 3)))
  layers = models.family_of(config).layers(config)
  named = (list(layers.stream) + list(layers.attention_weights) + [layers.pre_logits]
           + [n for b in layers.branches for n in (b.skip, b.output)])
  assert set(named) <= set(inter)
  assert len(layers.labels) == len(layers.stream) and len(set(layers.labels)) == len(layers.labels)
  # The stream is in depth order: each branch's output is added into the next entry.
  for branch in layers.branches:
    assert inter[branch.skip].shape[0] == inter[branch.output].shape[0] == 2
  assert all(0 < i < len(layers.stream) for i in layers.attention)
  assert layers.class_token == (config.get('classifier') == 'token')
  head = models.family_of(config).head
  assert any(k.startswith(head) for k in flax.traverse_util.flatten_dict(
      variables['params'], sep='/'))


@pytest.mark.parametrize('name', [
    pytest.param(name, marks=pytest.mark.slow) if count > 200_000_000 else name
    for name, count in sorted(PARAM_COUNTS.items())])
def test_parameter_count(name):
  assert sum(np.prod(s) for s in param_shapes(name).values()) == PARAM_COUNTS[name]


@pytest.mark.parametrize('name, classifier, millions', [
    ('ViT-g_14', 'token', 1011), ('ViT-G_14', 'token', 1843), ('ViT-So400m_14', 'map', 428),
    ('DINOv3-H+_16', 'token', 840), ('DINOv3-7B_16', 'token', 6716)])
def test_the_giant_vits_have_their_published_size(name, classifier, millions):
  """Without a head, in millions: "Scaling Vision Transformers" Table 2 (g/14 1,011M,
  G/14 1,843M), SigLIP's So400m/14 image tower (428M, attention-pooled) and DINOv3's
  ViT-H+ and ViT-7B (840M and 6,716M in facebookresearch/dinov3's README), each
  within a million of the figure as published (rounded or cut); shapes
  only (`jax.eval_shape`), nothing is allocated."""
  shapes = param_shapes(name, num_classes=0, classifier=classifier)
  assert abs(sum(np.prod(s) for s in shapes.values()) / 1e6 - millions) < 1


@pytest.mark.parametrize('name, millions', [
    ('EVA02-Ti_14-in1k', 5.8), ('EVA02-S_14-in1k', 22.1), ('EVA02-B_14-in22k-in1k', 87.1),
    ('EVA02-L_14-in22k-in1k', 305.1)])
def test_eva02_fine_tunes_have_their_published_size(name, millions):
  """At the resolution they were fine-tuned at (336 or 448 px), with their 1000
  classes: the millions timm's model cards of these files give, to a
  tenth; the position table grows with the grid, the rotary embeddings have no
  parameters. Shapes only."""
  from vit_jax.models.vit import TIMM_VARIANTS
  shapes = param_shapes(name, image_size=TIMM_VARIANTS[name].resolution)
  assert round(sum(np.prod(s) for s in shapes.values()) / 1e6, 1) == millions


def test_vit_b16_tree_is_the_published_one():
  shapes = param_shapes('ViT-B_16')
  block = {k.split('/', 2)[2]: v for k, v in shapes.items()
           if k.startswith('Transformer/encoderblock_0/')}
  assert block == {
      'LayerNorm_0/scale': (768,), 'LayerNorm_0/bias': (768,),
      'MultiHeadDotProductAttention_1/query/kernel': (768, 12, 64),
      'MultiHeadDotProductAttention_1/query/bias': (12, 64),
      'MultiHeadDotProductAttention_1/key/kernel': (768, 12, 64),
      'MultiHeadDotProductAttention_1/key/bias': (12, 64),
      'MultiHeadDotProductAttention_1/value/kernel': (768, 12, 64),
      'MultiHeadDotProductAttention_1/value/bias': (12, 64),
      'MultiHeadDotProductAttention_1/out/kernel': (12, 64, 768),
      'MultiHeadDotProductAttention_1/out/bias': (768,),
      'LayerNorm_2/scale': (768,), 'LayerNorm_2/bias': (768,),
      'MlpBlock_3/Dense_0/kernel': (768, 3072), 'MlpBlock_3/Dense_0/bias': (3072,),
      'MlpBlock_3/Dense_1/kernel': (3072, 768), 'MlpBlock_3/Dense_1/bias': (768,),
  }
  rest = {k: v for k, v in shapes.items() if 'encoderblock_' not in k}
  assert rest == {
      'embedding/kernel': (16, 16, 3, 768), 'embedding/bias': (768,), 'cls': (1, 1, 768),
      'Transformer/posembed_input/pos_embedding': (1, 197, 768),
      'Transformer/encoder_norm/scale': (768,), 'Transformer/encoder_norm/bias': (768,),
      'head/kernel': (768, 1000), 'head/bias': (1000,),
  }
  assert {k.split('/')[1] for k in shapes if 'encoderblock_' in k} == {
      f'encoderblock_{i}' for i in range(12)}


def test_vit_options_change_the_tree_as_published():
  gap = param_shapes('ViT-S_16', classifier='gap')
  assert 'cls' not in gap and gap['Transformer/posembed_input/pos_embedding'] == (1, 196, 384)
  rep = param_shapes('ViT-S_16', representation_size=384)
  assert rep['pre_logits/kernel'] == (384, 384) and rep['pre_logits/bias'] == (384,)
  for posemb in ('sincos2d', 'none'):
    assert not any('posembed' in k for k in param_shapes('ViT-S_16', posemb=posemb))


def test_hybrid_tree():
  shapes = param_shapes('R50+ViT-B_16')
  assert shapes['conv_root/kernel'] == (7, 7, 3, 64)
  assert shapes['gn_root/scale'] == (64,)
  assert shapes['block1/unit1/conv_proj/kernel'] == (1, 1, 64, 256)
  assert shapes['block1/unit1/gn_proj/bias'] == (256,)
  assert shapes['block3/unit9/conv2/kernel'] == (3, 3, 256, 256)
  assert shapes['block3/unit9/gn3/scale'] == (1024,)
  assert 'block4/unit1/conv1/kernel' not in shapes
  assert shapes['embedding/kernel'] == (1, 1, 1024, 768)
  assert shapes['Transformer/posembed_input/pos_embedding'] == (1, 197, 768)
  stem_only = param_shapes('R+ViT-Ti_16')
  assert stem_only['embedding/kernel'] == (8, 8, 64, 192)
  assert not any(k.startswith('block') for k in stem_only)


def test_bit_tree():
  shapes = param_shapes('BiT-M-R50x1')
  assert all(k.startswith('resnet/') for k in shapes)
  s = {k[len('resnet/'):]: v for k, v in shapes.items()}
  assert s['root_block/standardized_conv2d/kernel'] == (7, 7, 3, 64)
  assert s['block1/unit01/a/group_norm/gamma'] == (64,)
  assert s['block1/unit01/a/proj/standardized_conv2d/kernel'] == (1, 1, 64, 256)
  assert s['block2/unit01/a/proj/standardized_conv2d/kernel'] == (1, 1, 256, 512)
  assert s['block2/unit01/b/standardized_conv2d/kernel'] == (3, 3, 128, 128)
  assert s['block4/unit03/c/standardized_conv2d/kernel'] == (1, 1, 512, 2048)
  assert 'block1/unit02/a/proj/standardized_conv2d/kernel' not in s
  assert s['group_norm/beta'] == (2048,)
  assert s['head/conv2d/kernel'] == (1, 1, 2048, 1000) and s['head/conv2d/bias'] == (1000,)
  units = {k.split('/')[1] for k in s if k.startswith('block3/')}
  assert units == {f'unit{i:02d}' for i in range(1, 7)}


def test_unknown_model_and_field_are_named():
  with pytest.raises(ValueError, match=r"Unknown model 'ViT-X_16'.*ViT-B_16"):
    models.get_model('ViT-X_16')
  with pytest.raises(ValueError, match=r"no field\(s\) \['hiden_size'\].*hidden_size"):
    models.get_model('ViT-B_16', hiden_size=10)


def test_slash_names_and_overrides():
  config = models.get_config('ViT-B/16', num_classes=10, classifier='gap')
  assert config.name == 'ViT-B_16' and config.num_classes == 10 and config.classifier == 'gap'
  chex.assert_equal(models.get_model('ViT-B/16').patch_size, 16)


def test_a_config_takes_fields_as_its_name_does(any_family_name):
  """`with_fields` sets fields on a config as `get_config` sets them on its name,
  leaving the config given as it was; `config_of` takes either."""
  name, fields = models.FAMILIES[any_family_name].tiny
  config = models.get_config(name)
  made = models.get_config(name, **fields).to_dict()
  assert models.with_fields(config, **fields).to_dict() == made
  assert models.config_of(name, **fields).to_dict() == made
  assert config.to_dict() == models.get_config(name).to_dict()
  assert models.config_of(config) is config
  with pytest.raises(ValueError, match=r"no field\(s\) \['hiden_size'\]"):
    models.with_fields(config, hiden_size=10)
  with pytest.raises(ValueError, match='dtype'):
    models.with_fields(config, dtype='int8')


def test_a_lit_config_keeps_its_towers_fields():
  config = models.get_config('LiT-testing', image={'num_classes': 5})
  assert models.with_fields(config, image={'hidden_size': 8}).image.to_dict() == (
      models.get_config('LiT-testing', image={'num_classes': 5, 'hidden_size': 8}).image.to_dict())
