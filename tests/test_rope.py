"""Rotary position embeddings (`vit_jax.models.rope`): the invariances that make
them position embeddings and their closed forms; their agreement with DINOv3's and
EVA-02's own code is tested against timm (tests/test_timm.py: EVA-02's rotation
itself, and whole models) and transformers (tests/test_transformers_files.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_vit
from vit_jax.models import rope


# (kind, theta, the grid EVA-02's and PE's coordinates are scaled to, their offset)
KINDS = [('dinov3', 100., None, 0.), ('eva02', 10000., None, 0.),
         ('eva02', 10000., (16, 16), 0.), ('pe', 10000., (24, 24), 1.)]


@pytest.mark.parametrize('kind, theta, reference, offset', KINDS)
@pytest.mark.parametrize('grid', [(3, 5), (4, 4)])
def test_rotated_queries_and_keys_meet_by_their_patches_offset_alone(grid, kind, theta,
                                                                     reference, offset):
  """q_i . k_j after rotation depends on the offset between patches i and j only,
  the norms are kept, and the class token and registers in front are not rotated."""
  head_dim, extra = 16, 2
  angles = rope.angles(kind, grid, head_dim, theta, reference, offset)
  assert angles.shape == (grid[0] * grid[1], head_dim)
  rng = np.random.RandomState(0)
  q, k = (np.tile(rng.randn(1, 1, 1, head_dim), (1, extra + len(angles), 1, 1)).astype(
      np.float32) for _ in range(2))
  interleaved = kind in rope.INTERLEAVED
  rq, rk = (np.asarray(rope.rotate(x, angles, interleaved))[0, :, 0] for x in (q, k))
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


@pytest.mark.parametrize('kind, offset', [('eva02', 0.), ('pe', 1.)])
def test_eva02_and_pe_angles_are_the_closed_form_of_a_scaled_patch(kind, offset):
  """Patch (r, c) of a grid (gh, gw) scaled to (Rh, Rw) sits at ((r + o) Rh / gh,
  (c + o) Rw / gw) for offset o; its angle for band j is that coordinate times
  theta ** (-j / (head_dim / 4)), the row's bands then the column's (Perception
  Encoder: the column's first), each twice (the channel pair it rotates)."""
  grid, reference, head_dim, theta = (2, 4), (4, 8), 8, 10000.
  angles = rope.angles(kind, grid, head_dim, theta, reference, offset)
  frequencies = theta ** (-np.arange(head_dim // 4) / (head_dim // 4))
  patch = 1 * grid[1] + 2  # row 1, column 2
  row, col = (1 + offset) * 4 / 2 * frequencies, (2 + offset) * 8 / 4 * frequencies
  expected = np.concatenate([col, row] if kind == 'pe' else [row, col])
  np.testing.assert_allclose(angles[patch], np.repeat(expected, 2), rtol=1e-6)


def test_interleaved_rotation_turns_each_channel_pair_by_its_angle():
  """Channels (2i, 2i + 1) of a patch are the 2-D vector turned by angle i:
  (x cos - y sin, x sin + y cos)."""
  rng = np.random.RandomState(1)
  x = rng.randn(1, 3, 1, 8).astype(np.float32)
  angles = np.repeat(rng.uniform(-3, 3, (3, 4)), 2, axis=-1).astype(np.float32)
  out = np.asarray(rope.rotate(x, angles, interleaved=True))[0, :, 0]
  a, even, odd = angles[:, ::2], x[0, :, 0, ::2], x[0, :, 0, 1::2]
  np.testing.assert_allclose(out[:, ::2], even * np.cos(a) - odd * np.sin(a), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(out[:, 1::2], even * np.sin(a) + odd * np.cos(a), rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize('make', [lambda: rope.dinov3_angles((2, 2), 6, 100.),
                                  lambda: rope.eva02_angles((2, 2), 6, 10000.)])
def test_a_head_width_rope_cannot_split_is_refused(make):
  with pytest.raises(ValueError, match='divisible by 4, got 6'):
    make()


def test_dinov3_takes_no_reference_grid():
  with pytest.raises(ValueError, match='give no rope_grid and no rope_offset with rope dinov3'):
    rope.angles('dinov3', (2, 2), 8, 100., (16, 16))


@pytest.mark.parametrize('fields, message', [
    (dict(rope='dinov3', rope_grid=(16, 16)), "rope_grid .* this model's rope is 'dinov3'"),
    (dict(rope_offset=1.), "rope_offset 1.0 .* this model's rope is 'none'")])
def test_a_rotary_field_without_its_rotation_is_refused_in_one_sentence(fields, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(tiny_vit(**fields).init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))
