"""Rotary position embeddings (`vit_jax.models.rope`): the invariances that make
them position embeddings; their agreement with DINOv3's own code is tested on whole
models against timm (tests/test_timm.py) and transformers
(tests/test_transformers_files.py)."""
import numpy as np
import pytest

from vit_jax.models import rope


@pytest.mark.parametrize('grid', [(3, 5), (4, 4)])
def test_rotated_queries_and_keys_meet_by_their_patches_offset_alone(grid):
  """q_i . k_j after rotation depends on the offset between patches i and j only,
  the norms are kept, and the class token and registers in front are not rotated."""
  head_dim, extra = 16, 2
  angles = rope.dinov3_angles(grid, head_dim, theta=100.)
  assert angles.shape == (grid[0] * grid[1], head_dim)
  rng = np.random.RandomState(0)
  q, k = (np.tile(rng.randn(1, 1, 1, head_dim), (1, extra + len(angles), 1, 1)).astype(
      np.float32) for _ in range(2))
  rq, rk = (np.asarray(rope.rotate(x, angles))[0, :, 0] for x in (q, k))
  np.testing.assert_array_equal(rq[:extra], q[0, :extra, 0])
  np.testing.assert_allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(q[0, :, 0], axis=-1),
                             rtol=1e-5)
  rows, cols = np.divmod(np.arange(len(angles)), grid[1])
  dots = rq[extra:] @ rk[extra:].T
  by_offset = {}
  for i in range(len(angles)):
    for j in range(len(angles)):
      by_offset.setdefault((rows[i] - rows[j], cols[i] - cols[j]), []).append(dots[i, j])
  for offset, values in by_offset.items():
    np.testing.assert_allclose(values, values[0], rtol=1e-4, atol=1e-4, err_msg=str(offset))
  assert len({round(v[0], 3) for v in by_offset.values()}) > len(by_offset) // 2


def test_dinov3_angles_are_the_closed_form_at_the_grids_corner():
  """The first patch's centre is at (-1 + 1/gh, -1 + 1/gw); its angle for band j of
  the rows is 2 pi (-1 + 1/gh) / theta ** (4 j / head_dim), the columns' follow."""
  grid, head_dim, theta = (2, 4), 8, 100.
  angles = rope.dinov3_angles(grid, head_dim, theta)
  periods = theta ** (4 * np.arange(head_dim // 4) / head_dim)
  first = np.concatenate([2 * np.pi * (-1 + 1 / grid[0]) / periods,
                          2 * np.pi * (-1 + 1 / grid[1]) / periods])
  np.testing.assert_allclose(angles[0], np.tile(first, 2), rtol=1e-6)


def test_a_head_width_rope_cannot_split_is_refused():
  with pytest.raises(ValueError, match='divisible by 4, got 6'):
    rope.dinov3_angles((2, 2), 6, 100.)
