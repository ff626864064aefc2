"""The zoo's convolution: kernels whose windows do not overlap run as one matmul.

A 1x1 conv, or a patch embedding whose stride equals its kernel, is a matmul over
the channels of the strided or patched input. XLA:CPU computes the kernel gradient
of such convolutions several times slower than the same matmul, so they go to
`jnp.matmul` on 2-D operands; results agree up to float summation order. Every
other convolution goes to `lax.conv_general_dilated` unchanged.
"""
import math
from typing import Any, Optional, Sequence, Union

import jax.numpy as jnp
from jax import lax

Padding = Union[str, Sequence[tuple[int, int]]]


def _channels_last(ndim: int) -> lax.ConvDimensionNumbers:
  """Flax's layout: channels-last inputs and outputs, spatial-first kernels."""
  spatial = tuple(range(1, ndim - 1))
  return lax.ConvDimensionNumbers(lhs_spec=(0, ndim - 1) + spatial,
                                  rhs_spec=(ndim - 1, ndim - 2) + tuple(range(ndim - 2)),
                                  out_spec=(0, ndim - 1) + spatial)


def _windows_tile(lhs_shape, kernel, strides, padding, lhs_dilation, rhs_dilation,
                  dimension_numbers, feature_group_count) -> bool:
  """Whether the conv is a matmul: channels last, no padding or dilation, one group,
  and a 1x1 kernel or one equal to the stride."""
  if dimension_numbers != _channels_last(len(lhs_shape)) or feature_group_count != 1:
    return False
  if any(d != 1 for d in tuple(lhs_dilation or ()) + tuple(rhs_dilation or ())):
    return False
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(lhs_shape[1:-1], kernel, strides, padding)
  if any(tuple(p) != (0, 0) for p in padding):
    return False
  return all(k == 1 for k in kernel) or tuple(kernel) == tuple(strides)


def _patches(lhs: jnp.ndarray, kernel: Sequence[int], strides: Sequence[int]) -> jnp.ndarray:
  """The input under each output position, (batch, *out_spatial, *kernel, channels)."""
  if all(k == 1 for k in kernel):
    return lhs[(slice(None),) + tuple(slice(None, None, s) for s in strides)]
  out = tuple(n // k for n, k in zip(lhs.shape[1:-1], kernel))
  cropped = lhs[(slice(None),) + tuple(slice(0, o * k) for o, k in zip(out, kernel))]
  split = cropped.reshape((lhs.shape[0],) + sum(((o, k) for o, k in zip(out, kernel)), ())
                          + lhs.shape[-1:])
  n = len(kernel)
  return split.transpose((0,) + tuple(range(1, 2 * n, 2)) + tuple(range(2, 2 * n + 1, 2))
                         + (2 * n + 1,))


def conv_general_dilated(lhs: jnp.ndarray, rhs: jnp.ndarray, window_strides: Sequence[int],
                         padding: Padding, lhs_dilation: Optional[Sequence[int]] = None,
                         rhs_dilation: Optional[Sequence[int]] = None,
                         dimension_numbers: Any = None, feature_group_count: int = 1,
                         precision: Any = None) -> jnp.ndarray:
  """`lax.conv_general_dilated`'s signature and result; tiling kernels as a matmul.

  Args:
    lhs: the input.
    rhs: the kernel.
    window_strides: as for `lax.conv_general_dilated`.
    padding: as for `lax.conv_general_dilated`.
    lhs_dilation: as for `lax.conv_general_dilated`.
    rhs_dilation: as for `lax.conv_general_dilated`.
    dimension_numbers: as for `lax.conv_general_dilated`.
    feature_group_count: as for `lax.conv_general_dilated`.
    precision: as for `lax.conv_general_dilated`.

  Returns:
    The convolution.
  """
  kernel = rhs.shape[:-2]
  if not _windows_tile(lhs.shape, kernel, window_strides, padding, lhs_dilation, rhs_dilation,
                       dimension_numbers, feature_group_count):
    return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                    dimension_numbers, feature_group_count,
                                    precision=precision)
  patches = _patches(lhs, kernel, window_strides)
  out_spatial = patches.shape[1:1 + len(kernel)]
  rows = patches.reshape(-1, math.prod(rhs.shape[:-1]))
  out = jnp.matmul(rows, rhs.reshape(rows.shape[1], rhs.shape[-1]), precision=precision)
  return out.reshape(lhs.shape[:1] + out_spatial + rhs.shape[-1:])


def oihw(kernel: Any) -> Any:
  """A Flax conv kernel (HWIO) in PyTorch's layout (OIHW), for exports to timm.

  Args:
    kernel: an (H, W, I, O) kernel.

  Returns:
    The (O, I, H, W) kernel.
  """
  return kernel.transpose(3, 2, 0, 1)
