"""How strongly the residual stream dominates each branch: the norm ratio
||z|| / ||f(z)|| of Raghu et al. 2021 (Fig. 7), z the branch input carried by
the skip connection and f(z) the branch output added to it."""
import jax
import jax.numpy as jnp


def norm_ratio(z: jax.Array, fz: jax.Array) -> jax.Array:
  """Per-token ||z|| / ||f(z)|| over the channel (last) axis; leading axes kept.

  Args:
    z: a residual branch's input.
    fz: its output, the same shape.

  Returns:
    The ratios, without the channel axis.
  """
  return jnp.linalg.norm(z, axis=-1) / jnp.linalg.norm(fz, axis=-1)


def token_norm_ratios(z: jax.Array, fz: jax.Array, has_cls: bool, registers: int = 0) -> dict:
  """Mean norm ratio of the class token and of the spatial tokens (or positions).

  Raghu et al. plot "the ratio of norms ||z|| / ||f(z)||" per block without saying
  how tokens are pooled; this is the mean over tokens and images of each
  token's own ratio, not the ratio of mean (or total) norms.

  `z` and `fz` are (B, N, D) token sequences or (B, h, w, C) maps; the class
  token, when there is one, is the first token and is reported apart; registers
  (after it) are left out of the spatial tokens.

  Args:
    z: a residual branch's input.
    fz: its output, the same shape.
    has_cls: the first token is a class token.
    registers: the number of registers after the class token.

  Returns:
    {'cls': ..., 'spatial': ...} with a class token, else {'spatial': ...}.
  """
  ratios = norm_ratio(z, fz).reshape(z.shape[0], -1)
  spatial = {'spatial': jnp.mean(ratios[:, int(has_cls) + registers:])}
  return {'cls': jnp.mean(ratios[:, 0]), **spatial} if has_cls else spatial
