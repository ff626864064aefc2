"""The zoo's convolution: tiling kernels as a matmul, equal to XLA's convolution."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from vit_jax.models import conv

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI

CASES = [  # (input spatial, kernel, stride, padding, takes the matmul path)
    ((6, 6), 1, 1, 'VALID', True),
    ((7, 7), 1, 2, 'VALID', True),
    ((7, 6), 1, 2, 'SAME', True),  # a 1x1 kernel never pads
    ((8, 8), 4, 4, 'VALID', True),  # ViT patch embedding
    ((10, 9), 4, 4, 'VALID', True),  # the remainder rows and columns are dropped
    ((9, 9), 4, 4, 'SAME', False),  # pads: XLA's convolution
    ((8, 8), 3, 1, 'SAME', False),
    ((12, 12), 7, 2, ((3, 3), (3, 3)), False),
    ((6, 6), 1, 1, ((1, 0), (0, 0)), False),
]


@pytest.mark.parametrize('spatial,kernel,stride,padding,as_matmul', CASES)
def test_equals_xla_convolution_and_its_gradient(spatial, kernel, stride, padding, as_matmul):
  rng = np.random.RandomState(0)
  with jax.enable_x64(True):
    x = jnp.asarray(rng.randn(2, *spatial, 3))
    w = jnp.asarray(rng.randn(kernel, kernel, 3, 5))
    dn = lax.conv_dimension_numbers(x.shape, w.shape, ('NHWC', 'HWIO', 'NHWC'))

    def ours(x, w):
      return conv.conv_general_dilated(x, w, (stride, stride), padding, dimension_numbers=dn)

    def xla(x, w):
      return lax.conv_general_dilated(x, w, (stride, stride), padding, dimension_numbers=dn)

    primitives = {e.primitive.name for e in jax.make_jaxpr(ours)(x, w).eqns}
    assert ('conv_general_dilated' not in primitives) == as_matmul
    out, expected = ours(x, w), xla(x, w)
    assert out.shape == expected.shape
    # float64 sums of at most 147 products (7x7x3) in another order.
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    cotangent = jnp.asarray(rng.randn(*expected.shape))
    grads = jax.vjp(ours, x, w)[1](cotangent)
    expected_grads = jax.vjp(xla, x, w)[1](cotangent)
    for g, e in zip(grads, expected_grads):
      np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


def test_grouped_and_dilated_convolutions_go_to_xla():
  x = jnp.ones((1, 6, 6, 4))
  dn = lax.conv_dimension_numbers(x.shape, (1, 1, 2, 4), ('NHWC', 'HWIO', 'NHWC'))
  grouped = jax.make_jaxpr(lambda x, w: conv.conv_general_dilated(
      x, w, (1, 1), 'VALID', dimension_numbers=dn, feature_group_count=2))(x, jnp.ones((1, 1, 2, 4)))
  dilated = jax.make_jaxpr(lambda x, w: conv.conv_general_dilated(
      x, w, (1, 1), ((0, 0), (0, 0)), lhs_dilation=(2, 2), dimension_numbers=dn))(x, jnp.ones((1, 1, 4, 4)))
  for jaxpr in (grouped, dilated):
    assert 'conv_general_dilated' in {e.primitive.name for e in jaxpr.eqns}
