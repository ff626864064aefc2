"""The original vit_jax's model configs: every published architecture as the
ConfigDict its `models.VisionTransformer(num_classes=..., **config)`,
`models.MlpMixer` and `models.LitModel` take, by name in `MODEL_CONFIGS`, and the
AugReg paper's subset by its file prefix in `AUGREG_CONFIGS` ('B_16', 'R26_S_32').

The sizes are the project's own tables (`vit_jax.models.vit.SIZES`,
`vit_jax.models.mixer.SIZES`); the same models as `vit_jax.models.get_config`
builds, with the original's nested fields (`patches.size`, `transformer.*`,
`resnet.*`).
"""
from typing import Callable, Dict, Optional, Sequence

import ml_collections

from vit_jax.models import mixer as _mixer
from vit_jax.models import vit as _vit

MODEL_CONFIGS: Dict[str, ml_collections.ConfigDict] = {}
AUGREG_CONFIGS: Dict[str, ml_collections.ConfigDict] = {}
# Published before the AugReg paper, or not among its models.
_NOT_AUGREG = ('testing', 'testing-unpooled', 'ViT-L_32', 'R50+ViT-B_16', 'ViT-H_14')


def _register(get_config: Callable[[], ml_collections.ConfigDict]
              ) -> Callable[[], ml_collections.ConfigDict]:
  """Adds the (locked) config of `get_config` to `MODEL_CONFIGS`, and ViTs of the
  AugReg paper to `AUGREG_CONFIGS` under their file prefix."""
  config = get_config().lock()
  MODEL_CONFIGS[config.model_name] = config
  if not config.model_name.startswith(('Mixer', 'LiT')) and config.model_name not in _NOT_AUGREG:
    AUGREG_CONFIGS[config.model_name.replace('ViT-', '').replace('+', '_')] = config
  return get_config


def _vit_config(model_name: str, size: str, patch: int, dropout_rate: float = 0.,
                resnet_layers: Optional[Sequence[int]] = None) -> ml_collections.ConfigDict:
  hidden, mlp, heads, layers = _vit.SIZES[size]
  config = ml_collections.ConfigDict()
  config.model_name = model_name
  config.patches = ml_collections.ConfigDict({'size': (patch, patch)})
  config.hidden_size = hidden
  config.transformer = ml_collections.ConfigDict(dict(
      mlp_dim=mlp, num_heads=heads, num_layers=layers, attention_dropout_rate=0.,
      dropout_rate=dropout_rate))
  config.classifier = 'token'
  config.representation_size = None
  if resnet_layers is not None:
    config.resnet = ml_collections.ConfigDict(dict(num_layers=tuple(resnet_layers),
                                                   width_factor=1))
  return config


def _gap(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  config.model_name += '-gap-norep'
  config.classifier = 'gap'
  return config


@_register
def get_testing_config() -> ml_collections.ConfigDict:
  """A one-block ViT of width 10, for tests."""
  config = _vit_config('testing', 'Ti', 16, dropout_rate=0.1)
  config.hidden_size = 10
  config.transformer.update(mlp_dim=10, num_heads=2, num_layers=1)
  return config


@_register
def get_testing_unpooled_config() -> ml_collections.ConfigDict:
  """The testing ViT with per-token logits."""
  config = get_testing_config()
  config.model_name = 'testing-unpooled'
  config.classifier = 'unpooled'
  return config


@_register
def get_ti16_config() -> ml_collections.ConfigDict:
  """ViT-Ti/16."""
  return _vit_config('ViT-Ti_16', 'Ti', 16)


@_register
def get_s16_config() -> ml_collections.ConfigDict:
  """ViT-S/16."""
  return _vit_config('ViT-S_16', 'S', 16)


@_register
def get_b16_config() -> ml_collections.ConfigDict:
  """ViT-B/16."""
  return _vit_config('ViT-B_16', 'B', 16)


@_register
def get_l16_config() -> ml_collections.ConfigDict:
  """ViT-L/16 (dropout 0.1)."""
  return _vit_config('ViT-L_16', 'L', 16, dropout_rate=0.1)


@_register
def get_h14_config() -> ml_collections.ConfigDict:
  """ViT-H/14 (dropout 0.1)."""
  return _vit_config('ViT-H_14', 'H', 14, dropout_rate=0.1)


@_register
def get_s16_gap_norep_config() -> ml_collections.ConfigDict:
  """ViT-S/16, global average pooling, no pre-logits layer."""
  return _gap(get_s16_config())


@_register
def get_b16_gap_norep_config() -> ml_collections.ConfigDict:
  """ViT-B/16, global average pooling, no pre-logits layer."""
  return _gap(get_b16_config())


@_register
def get_b8_config() -> ml_collections.ConfigDict:
  """ViT-B/8."""
  return _vit_config('ViT-B_8', 'B', 8)


@_register
def get_s32_config() -> ml_collections.ConfigDict:
  """ViT-S/32."""
  return _vit_config('ViT-S_32', 'S', 32)


@_register
def get_b32_config() -> ml_collections.ConfigDict:
  """ViT-B/32."""
  return _vit_config('ViT-B_32', 'B', 32)


@_register
def get_l32_config() -> ml_collections.ConfigDict:
  """ViT-L/32 (no dropout)."""
  return _vit_config('ViT-L_32', 'L', 32)


@_register
def get_s32_gap_norep_config() -> ml_collections.ConfigDict:
  """ViT-S/32, global average pooling, no pre-logits layer."""
  return _gap(get_s32_config())


@_register
def get_b32_gap_norep_config() -> ml_collections.ConfigDict:
  """ViT-B/32, global average pooling, no pre-logits layer."""
  return _gap(get_b32_config())


@_register
def get_r_ti16_config() -> ml_collections.ConfigDict:
  """The ResNet root block + ViT-Ti/16 (8 x 8 patches of the 4x-downsampled image)."""
  return _vit_config('R+ViT-Ti_16', 'Ti', 8, resnet_layers=())


@_register
def get_r50_b16_config() -> ml_collections.ConfigDict:
  """ResNet-50 (three stages) + ViT-B/16 (dropout 0.1)."""
  return _vit_config('R50+ViT-B_16', 'B', 1, dropout_rate=0.1, resnet_layers=(3, 4, 9))


@_register
def get_r26_b32_config() -> ml_collections.ConfigDict:
  """ResNet-26 + ViT-B/32."""
  return _vit_config('R26+ViT-B_32', 'B', 1, resnet_layers=(2, 2, 2, 2))


@_register
def get_r26_s32_config() -> ml_collections.ConfigDict:
  """ResNet-26 + ViT-S/32."""
  return _vit_config('R26+ViT-S_32', 'S', 1, resnet_layers=(2, 2, 2, 2))


@_register
def get_r50_l32_config() -> ml_collections.ConfigDict:
  """ResNet-50 + ViT-L/32 (dropout 0.1)."""
  return _vit_config('R50+ViT-L_32', 'L', 1, dropout_rate=0.1, resnet_layers=(3, 4, 6, 3))


def _mixer_config(model_name: str, size: str, patch: int) -> ml_collections.ConfigDict:
  hidden, blocks, tokens_mlp, channels_mlp = _mixer.SIZES[size]
  return ml_collections.ConfigDict(dict(
      model_name=model_name, patches=ml_collections.ConfigDict({'size': (patch, patch)}),
      hidden_dim=hidden, num_blocks=blocks, tokens_mlp_dim=tokens_mlp,
      channels_mlp_dim=channels_mlp))


@_register
def get_mixer_b16_config() -> ml_collections.ConfigDict:
  """Mixer-B/16."""
  return _mixer_config('Mixer-B_16', 'B', 16)


@_register
def get_mixer_b32_config() -> ml_collections.ConfigDict:
  """Mixer-B/32."""
  return _mixer_config('Mixer-B_32', 'B', 32)


@_register
def get_mixer_l16_config() -> ml_collections.ConfigDict:
  """Mixer-L/16."""
  return _mixer_config('Mixer-L_16', 'L', 16)


def _lit_config(model_name: str, out_dim, image: ml_collections.ConfigDict, text_model: str,
                text: dict, tokenizer_name: str) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model_name = model_name
  config.out_dim = out_dim
  config.image = image
  config.text_model = text_model
  config.text = text
  config.pp = dict(tokenizer_name=tokenizer_name, size=224, max_len=16)
  return config


@_register
def get_lit_b16b_config() -> ml_collections.ConfigDict:
  """LiT: ViT-B/16 image tower, BERT-Base text tower, both with a 768-d head."""
  return _lit_config('LiT-B16B', (768, 768), get_b16_config(), 'bert', dict(config='base'),
                     'bert')


@_register
def get_lit_b16b_2_config() -> ml_collections.ConfigDict:
  """LiT-B16B_2: the image tower without a head."""
  config = get_lit_b16b_config()
  config.model_name = 'LiT-B16B_2'
  config.out_dim = (None, 768)
  return config


@_register
def get_lit_l16l_config() -> ml_collections.ConfigDict:
  """LiT: ViT-L/16 image tower, BERT-Large text tower."""
  return _lit_config('LiT-L16L', (None, 1024), get_l16_config(), 'bert', dict(config='large'),
                     'bert')


def _small_text(width: int, heads: int) -> dict:
  return dict(width=width, num_layers=12, mlp_dim=4 * width, num_heads=heads,
              vocab_size=16_000)


@_register
def get_lit_l16s_config() -> ml_collections.ConfigDict:
  """LiT: ViT-L/16 image tower, a small (384-wide) text transformer."""
  return _lit_config('LiT-L16S', (None, 1024), get_l16_config(), 'text_transformer',
                     _small_text(384, 6), 'sentencepiece')


@_register
def get_lit_l16ti_config() -> ml_collections.ConfigDict:
  """LiT: ViT-L/16 image tower, a tiny (192-wide) text transformer."""
  return _lit_config('LiT-L16Ti', (None, 1024), get_l16_config(), 'text_transformer',
                     _small_text(192, 3), 'sentencepiece')
