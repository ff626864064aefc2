"""ResNets: the post-activation ResNet v1 of the hybrid ViTs and the BiT ResNetV2.

Module and parameter names are those of the published checkpoints, so a `.npz`
loads into these trees unchanged. Both families sow the stem output (`root`) and
each unit's `shortcut`, `residual` branch and `output` into the `intermediates`
collection; without `mutable=['intermediates']` the sows are no-ops.
"""
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from jax import lax

from vit_jax.models import conv, resnet_layouts
from vit_jax.models.family import CONVNET, Branch, Family, Layers, sow_edited, stage_starts

Dtype = Any


STANDARDISED = 'standardised'  # the collection of kernels standardised once


def weight_standardize(w: jax.Array, axis: Any, eps: float, eps_inside_sqrt: bool = False
                       ) -> jax.Array:
  """`w` with zero mean and unit standard deviation over `axis`: (w - mean) /
  (std + eps), or / sqrt(var + eps) with `eps_inside_sqrt` (BiT's form).

  Args:
    w: the kernel.
    axis: the axes reduced over.
    eps: added to the std (or variance).
    eps_inside_sqrt: add `eps` to the variance instead.

  Returns:
    The standardised kernel.
  """
  centred = w - jnp.mean(w, axis=axis, keepdims=True)
  var = jnp.mean(jnp.square(centred), axis=axis, keepdims=True)
  return centred / (jnp.sqrt(var + eps) if eps_inside_sqrt else jnp.sqrt(var) + eps)


class StdConv(nn.Conv):
  """Convolution with a weight-standardised kernel (zero mean, unit std over HWI).

  The two families standardise slightly differently: ResNet v1 divides by
  `std + eps`, BiT by `sqrt(var + eps)`; `eps_inside_sqrt` picks the BiT form.
  Applied with a `standardised` collection (`models.fixed_variables`), the
  kernel is read from it instead of standardised on every call; with the
  collection mutable, the standardised kernel is put there.
  """
  ws_eps: float = 1e-5
  eps_inside_sqrt: bool = False
  conv_general_dilated: Any = conv.conv_general_dilated

  def param(self, name: str, *args: Any, **kwargs: Any) -> Any:
    """The parameter `name`, a kernel standardised over its input axes.

    Args:
      name: the parameter's name.
      *args: as for `nn.Module.param`.
      **kwargs: as for `nn.Module.param`.

    Returns:
      The parameter.
    """
    param = super().param(name, *args, **kwargs)
    if name != 'kernel':
      return param
    if self.has_variable(STANDARDISED, name):
      return self.get_variable(STANDARDISED, name)
    # The statistics are over the input axes (H, W, I), reduced without the unit
    # ones: with a 1x1 kernel's two unit axes in the reduction XLA:CPU runs the
    # gradient of the standardisation 20x slower (39 against 1.7 ms for a
    # 1x1x1024x2048 kernel, docs/benchmarks.md).
    inputs = param.reshape(tuple(d for d in param.shape[:-1] if d > 1) + param.shape[-1:])
    kernel = weight_standardize(inputs, tuple(range(inputs.ndim - 1)), self.ws_eps,
                                self.eps_inside_sqrt).reshape(param.shape)
    # Only when asked for: `init` makes every collection mutable, and kernels it
    # kept would go stale as the parameters train.
    if self.is_mutable_collection(STANDARDISED) and not self.is_initializing():
      self.put_variable(STANDARDISED, name, kernel)
    return kernel


class GroupNorm(nn.Module):
  """GroupNorm over channels-last maps, folded into one multiply-add per element.

  Statistics are at least float32, over the spatial axes and each group's channels, the
  variance as E[x^2] - E[x]^2 as in `nn.GroupNorm`; the normalisation and the
  affine map then fold into a per-(example, channel) scale and shift, whose
  backward pass XLA:CPU runs about three times faster than `nn.GroupNorm`'s.
  Every per-element operation keeps the maps' (..., C) layout: the channels'
  spatial means are reduced to groups on the small (B, C) arrays, since
  elementwise work on a (..., groups, C/groups) view runs 2-3x slower on
  XLA:CPU (few channels per group leave its vector units idle). The affine
  parameters are named `gamma`/`beta` as in BiT's checkpoints, or
  `scale`/`bias` as in the hybrid ones.
  """
  num_groups: int = 32
  epsilon: float = 1e-5
  dtype: Dtype = jnp.float32
  scale_name: str = 'gamma'
  bias_name: str = 'beta'
  scale_init: Any = nn.initializers.ones

  @nn.compact
  def __call__(self, x):
    batch, channels = x.shape[0], x.shape[-1]
    scale = self.param(self.scale_name, self.scale_init, (channels,))
    bias = self.param(self.bias_name, nn.initializers.zeros, (channels,))
    xs = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    spatial = tuple(range(1, x.ndim - 1))
    to_groups = lambda a: a.reshape(batch, self.num_groups, -1).mean(-1, keepdims=True)
    mean = to_groups(xs.mean(spatial))  # (B, groups, 1)
    var = jnp.maximum(to_groups(jnp.square(xs).mean(spatial)) - jnp.square(mean), 0.)
    mul = lax.rsqrt(var + self.epsilon) * scale.reshape(self.num_groups, -1)
    shift = bias.reshape(self.num_groups, -1) - mean * mul
    per_channel = (batch,) + (1,) * len(spatial) + (channels,)
    return (xs * mul.reshape(per_channel) + shift.reshape(per_channel)).astype(self.dtype)


# ---------------------------------------------------------------------------
# ResNet v1 (hybrid ViT backbone): conv -> GroupNorm -> relu, residual added last.


class BottleneckV1(nn.Module):
  """Post-activation bottleneck unit: 1x1, 3x3 (strided), 1x1 to 4x width."""
  features: int
  strides: int = 1
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    std_conv = lambda *a, **k: StdConv(*a, use_bias=False, dtype=self.dtype, **k)
    norm = lambda **k: GroupNorm(32, 1e-6, self.dtype, 'scale', 'bias', **k)
    residual = x
    if x.shape[-1] != 4 * self.features or self.strides != 1:
      residual = std_conv(4 * self.features, (1, 1), self.strides, name='conv_proj')(x)
      residual = norm(name='gn_proj')(residual)
    y = nn.relu(norm(name='gn1')(std_conv(self.features, (1, 1), name='conv1')(x)))
    y = std_conv(self.features, (3, 3), self.strides, name='conv2')(y)
    y = nn.relu(norm(name='gn2')(y))
    y = std_conv(4 * self.features, (1, 1), name='conv3')(y)
    # Zero-init of the last scale makes every unit start as the identity map.
    y = norm(name='gn3', scale_init=nn.initializers.zeros)(y)
    self.sow('intermediates', 'shortcut', residual)
    y = sow_edited(self, 'residual', y)
    out = sow_edited(self, 'output', nn.relu(residual + y))
    return out


class Stage(nn.Module):
  """`depth` bottleneck units of type `unit`; the first one strides.

  Units are named `unit_name.format(u)` for u = 1, 2, ...: `unit{}` in the
  hybrid checkpoints, `unit{:02d}` in BiT's.
  """
  unit: Any
  unit_name: str
  depth: int
  features: int
  first_stride: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    for u in range(self.depth):
      stride = self.first_stride if u == 0 else 1
      x = self.unit(self.features, stride, self.dtype, name=self.unit_name.format(u + 1))(x)
    self.sow('intermediates', 'output', x)
    return x


class ResNetV1(nn.Module):
  """Root (7x7/2 conv, GroupNorm, relu, 3x3/2 max-pool) and bottleneck stages.

  The hybrid ViT calls it through `nn.share_scope`, so its parameters sit at the
  top level of the ViT tree (`conv_root`, `gn_root`, `block1/unit1/...`) as in
  the published hybrid checkpoints.
  """
  num_layers: Sequence[int]
  width_factor: float = 1
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    width = int(64 * self.width_factor)
    x = StdConv(width, (7, 7), 2, use_bias=False, dtype=self.dtype, name='conv_root')(x)
    x = GroupNorm(32, 1e-6, self.dtype, 'scale', 'bias', name='gn_root')(x)
    x = nn.max_pool(nn.relu(x), (3, 3), strides=(2, 2), padding='SAME')
    x = sow_edited(self, 'root', x)
    for s, depth in enumerate(self.num_layers):
      x = Stage(BottleneckV1, 'unit{}', depth, width * 2**s, 1 if s == 0 else 2, self.dtype,
                name=f'block{s + 1}')(x)
    return x


# ---------------------------------------------------------------------------
# BiT ResNetV2: GroupNorm -> relu -> conv, the shortcut taken from the
# pre-activated input when the shape changes.


def _bit_conv(features, kernel, strides=1, dtype=jnp.float32, name='standardized_conv2d'):
  """BiT's conv, zero-padded by kernel // 2 on each side (for stride 2 not 'SAME')."""
  pad = kernel // 2
  return StdConv(features, (kernel, kernel), strides, padding=((pad, pad), (pad, pad)),
                 use_bias=False, ws_eps=1e-10, eps_inside_sqrt=True, dtype=dtype, name=name)


def _pad(x, p):
  return jnp.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))


class Projection(nn.Module):
  """The 1x1 shortcut conv of a unit's first layer (`a/proj`)."""
  features: int
  strides: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    return _bit_conv(self.features, 1, self.strides, self.dtype)(x)


class NormActConv(nn.Module):
  """GroupNorm -> relu -> conv; layer `a`, `b` or `c` of a BiT unit.

  With `projection` set (layer `a` of a unit that changes shape) it also returns
  the shortcut: a 1x1 conv with `projection_strides` of the same pre-activated
  input.
  """
  features: int
  kernel: int
  strides: int = 1
  projection: Optional[int] = None
  projection_strides: int = 1
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = nn.relu(GroupNorm(dtype=self.dtype, name='group_norm')(x))
    # In memory once for every consumer (this conv, the projection, the backward
    # pass's ReLU mask and kernel gradient), where XLA:CPU would recompute it in
    # each; the barrier has JVP and transpose rules, so jvp of grad still runs.
    x = lax.optimization_barrier(x)
    shortcut = None
    if self.projection is not None:
      shortcut = Projection(self.projection, self.projection_strides, self.dtype, name='proj')(x)
    y = _bit_conv(self.features, self.kernel, self.strides, self.dtype)(x)
    return y, shortcut


class BottleneckV2(nn.Module):
  """Pre-activation bottleneck: a (1x1), b (3x3, strided), c (1x1 to 4x width)."""
  features: int
  strides: int = 1
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    out = 4 * self.features
    projection = out if (x.shape[-1] != out or self.strides != 1) else None
    y, shortcut = NormActConv(self.features, 1, projection=projection,
                              projection_strides=self.strides, dtype=self.dtype, name='a')(x)
    y, _ = NormActConv(self.features, 3, self.strides, dtype=self.dtype, name='b')(y)
    y, _ = NormActConv(out, 1, dtype=self.dtype, name='c')(y)
    shortcut = x if shortcut is None else shortcut
    self.sow('intermediates', 'shortcut', shortcut)
    y = sow_edited(self, 'residual', y)
    out = sow_edited(self, 'output', y + shortcut)
    return out


class RootBlock(nn.Module):
  """7x7/2 conv after zero padding 3, then zero padding 1 and a 3x3/2 max-pool.

  The pool pads with zeros, not -inf, as BiT does; after the conv (no norm yet)
  the two differ where activations are negative. Without the pool (`pool`
  False) the root halves the resolution instead of quartering it, which keeps
  small images (28-32 px) from shrinking to 2x2 maps by the third stage.
  """
  width: int
  dtype: Dtype = jnp.float32
  pool: bool = True

  @nn.compact
  def __call__(self, x):
    x = _bit_conv(self.width, 7, 2, self.dtype)(x)
    if not self.pool:
      return x
    return nn.max_pool(_pad(x, 1), (3, 3), strides=(2, 2), padding='VALID')


class ResNetV2Body(nn.Module):
  """Everything under the `resnet/` prefix of a BiT checkpoint."""
  num_layers: Sequence[int]
  width_factor: float
  num_classes: Optional[int]
  dtype: Dtype = jnp.float32
  root_pool: bool = True

  @nn.compact
  def __call__(self, x):
    width = int(64 * self.width_factor)
    x = RootBlock(width, self.dtype, self.root_pool, name='root_block')(x)
    x = sow_edited(self, 'root', x)
    for s, depth in enumerate(self.num_layers):
      x = Stage(BottleneckV2, 'unit{:02d}', depth, width * 2**s, 1 if s == 0 else 2, self.dtype,
                name=f'block{s + 1}')(x)
    x = nn.relu(GroupNorm(dtype=self.dtype, name='group_norm')(x))
    x = jnp.mean(x, axis=(1, 2), keepdims=True)
    self.sow('intermediates', 'pre_logits', x[:, 0, 0])
    if not self.num_classes:
      return x[:, 0, 0]
    head = HeadConv(self.num_classes, self.dtype, name='head')
    return head(x)[:, 0, 0]


class HeadConv(nn.Module):
  """The zero-initialised 1x1 classifier conv (`resnet/head/conv2d`)."""
  num_classes: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    return nn.Conv(self.num_classes, (1, 1), kernel_init=nn.initializers.zeros,
                   dtype=self.dtype, name='conv2d')(x)


class ResNetV2(nn.Module):
  """BiT ResNetV2 classifier: images (B, H, W, 3) in [-1, 1] -> logits (B, C).

  With `num_classes` 0 or None it returns the pre-logits (B, 2048 * width).
  The published models have integer widths and the pooled root; a fractional
  `width_factor` (a multiple of 0.5, so every GroupNorm has 32 whole groups)
  and `root_pool=False` make small models for small images.
  """
  num_layers: Sequence[int]
  width_factor: float = 1
  num_classes: Optional[int] = 1000
  dtype: Dtype = jnp.float32
  root_pool: bool = True

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    del train  # No dropout in BiT; the flag keeps one calling convention for the zoo.
    if (64 * self.width_factor) % 32:
      raise ValueError(f'width_factor {self.width_factor} gives {64 * self.width_factor} root '
                       'channels; use a multiple of 0.5 so GroupNorm has 32 whole groups.')
    body = ResNetV2Body(self.num_layers, self.width_factor, self.num_classes, self.dtype,
                        self.root_pool, name='resnet')
    return body(images).astype(jnp.float32)


# ---------------------------------------------------------------------------
# The BiT family: published variants and sown layers.

DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
PUBLISHED = ((50, 1), (50, 3), (101, 1), (101, 3), (152, 2), (152, 4))


def unit_names(stage_depths: Sequence[int], prefix: str = '') -> list:
  """'{prefix}block{s}/unit{u:02d}' of every BiT unit, in depth order.

  Args:
    stage_depths: the units of each stage.
    prefix: put before each name.

  Returns:
    The names.
  """
  return [f'{prefix}block{s + 1}/unit{u + 1:02d}'
          for s, depth in enumerate(stage_depths) for u in range(depth)]


def layers(config: ml_collections.ConfigDict) -> Layers:
  """The stem output, then each unit's output; every unit is one residual branch.

  Args:
    config: a zoo config of the family.

  Returns:
    Its `Layers`.
  """
  units = unit_names(config.num_layers)
  stage_of = [u.split('/')[0] for u in units]
  return Layers(
      stream=('resnet/root',) + tuple(f'resnet/{u}/output' for u in units),
      labels=('root',) + tuple(units), attention=(),
      branches=tuple(Branch(u, 'conv', f'resnet/{u}/shortcut', f'resnet/{u}/residual')
                     for u in units),
      attention_weights=(), pre_logits='resnet/pre_logits', class_token=False,
      stages=stage_starts(['root'] + stage_of), branch_stages=stage_starts(stage_of),
      architecture=CONVNET)


def describe(config: ml_collections.ConfigDict) -> str:
  """The model's shape in words, for the report.

  Args:
    config: a zoo config of the family.

  Returns:
    The words.
  """
  return (f'units {"-".join(map(str, config.num_layers))} per stage, '
          f'width x{config.width_factor:g}')


FAMILY = Family(
    name='bit', title='BiT',
    variants={f'BiT-{upstream}-R{depth}x{width}': dict(num_layers=DEPTHS[depth],
                                                      width_factor=width, root_pool=True)
              for depth, width in PUBLISHED for upstream in ('S', 'M')},
    module=ResNetV2, layers=layers, describe=describe, head='resnet/head/',
    tiny=('BiT-M-R50x1', dict(num_layers=(1, 1))),
    to_timm=lambda flat, config: resnet_layouts.to_timm(flat),
    timm_fields=resnet_layouts.timm_fields,
    transformers_types=resnet_layouts.TRANSFORMERS_TYPES,
    transformers_fields=resnet_layouts.transformers_fields,
    from_transformers=resnet_layouts.from_transformers,
    to_transformers=resnet_layouts.to_transformers,
    sequence_fields=('num_layers',))
