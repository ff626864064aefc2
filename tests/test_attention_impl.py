"""The fused and explicit attention paths, and rematerialised blocks, compute one function
(the explicit path against numpy: tests/test_vit.py)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close_at_scale, images, init, perturbed, tiny_vit
from vit_jax import models
from vit_jax.models import attention

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


def loss_and_grads(model, variables, x):
  def loss(params):
    return jnp.sum(model.apply({'params': params}, x) ** 2)
  return jax.jit(jax.value_and_grad(loss))(variables['params'])


def random_qkv(n, seed=0, shape=(2, 3, 8)):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  b, h, d = shape
  return [jax.random.normal(k, (b, n, h, d)) for k in keys]


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_fused_equals_explicit_outputs_and_gradients(classifier):
  fused = tiny_vit(classifier=classifier, attention_impl='xla')
  explicit = tiny_vit(classifier=classifier, attention_impl='explicit')
  variables = perturbed(init(fused))
  x = images(3)
  # float32, two blocks of width 32: the paths differ in summation order only.
  assert_close_at_scale(loss_and_grads(fused, variables, x), loss_and_grads(explicit, variables, x),
                        rtol=1e-4)


@pytest.mark.parametrize('n', [1, 5, 17, 64])
def test_padded_attention_equals_unpadded(n):
  q, k, v = random_qkv(n, seed=n)
  expected = jax.nn.dot_product_attention(q, k, v, implementation='xla')
  padded = attention.padded_attention(q, k, v, 16, 'xla')
  chex.assert_shape(padded, q.shape)
  np.testing.assert_allclose(padded, expected, atol=1e-5)
  grads = jax.grad(lambda *t: jnp.sum(attention.padded_attention(*t, 16, 'xla') ** 2),
                   argnums=(0, 1, 2))(q, k, v)
  expected_grads = jax.grad(lambda *t: jnp.sum(jax.nn.dot_product_attention(*t) ** 2),
                            argnums=(0, 1, 2))(q, k, v)
  chex.assert_trees_all_close(grads, expected_grads, atol=1e-5)


@pytest.mark.parametrize('backend,dtype,expected', [
    ('gpu', jnp.bfloat16, 'cudnn'), ('gpu', jnp.float16, 'cudnn'), ('gpu', jnp.float32, 'xla'),
    ('tpu', jnp.bfloat16, 'xla'), ('cpu', jnp.bfloat16, 'explicit'),
    ('cpu', jnp.float32, 'explicit')])
def test_auto_picks_per_backend_and_dtype(monkeypatch, backend, dtype, expected):
  monkeypatch.setattr(attention.jax, 'default_backend', lambda: backend)
  assert attention.resolve_impl('auto', dtype) == expected
  assert attention.resolve_impl('xla', dtype) == 'xla'  # named ones are kept


def test_weights_are_formed_only_when_asked(monkeypatch):
  model = tiny_vit(attention_impl='xla')
  variables = init(model)
  x = images(2)
  names = ['Transformer/encoderblock_1/+sa', 'pre_logits']
  calls = []
  original = attention.MultiHeadAttention.explicit
  def counting(self, *args, **kwargs):
    calls.append(self.name)
    return original(self, *args, **kwargs)
  monkeypatch.setattr(attention.MultiHeadAttention, 'explicit', counting)
  model.apply(variables, x)
  models.apply_with_intermediates(model, variables, x, names=names)
  assert calls == []
  _, inter = models.apply_with_intermediates(
      model, variables, x,
      names=['Transformer/encoderblock_0/MultiHeadDotProductAttention_1/attention_weights'])
  assert calls == ['MultiHeadDotProductAttention_1'] * 2
  chex.assert_shape(list(inter.values())[0], (2, 4, 17, 17))  # 16 patches + class token


def test_attention_dropout_in_training_takes_the_explicit_path():
  model = tiny_vit(attention_dropout_rate=0.5)
  variables = perturbed(init(model))
  x = images(2)
  rngs = {'dropout': jax.random.PRNGKey(0)}
  a = model.apply(variables, x, train=True, rngs=rngs)
  b = model.apply(variables, x, train=True, rngs={'dropout': jax.random.PRNGKey(1)})
  assert not np.allclose(a, b)
  chex.assert_trees_all_close(model.apply(variables, x),
                              tiny_vit(attention_impl='explicit').apply(variables, x), atol=1e-5)


@pytest.mark.parametrize('policy', ['full', 'dots'])
def test_remat_keeps_names_values_gradients_and_intermediates(policy):
  plain, remat = tiny_vit(), tiny_vit(remat=policy)
  variables = perturbed(init(plain))
  chex.assert_trees_all_equal_shapes(init(remat), variables)
  x = images(3)
  assert_close_at_scale(loss_and_grads(remat, variables, x), loss_and_grads(plain, variables, x),
                        rtol=1e-5, ulps=16)
  _, inter = models.apply_with_intermediates(remat, variables, x)
  _, expected = models.apply_with_intermediates(plain, variables, x)
  assert sorted(inter) == sorted(expected)
  chex.assert_trees_all_close(inter, expected, atol=1e-6)


def test_remat_trains_with_dropout():
  model = tiny_vit(remat='full', dropout_rate=0.1, stochastic_depth=0.2)
  variables = init(model)
  grads = jax.grad(lambda p: jnp.sum(model.apply(
      {'params': p}, images(2), train=True, rngs={'dropout': jax.random.PRNGKey(0)})))(
          variables['params'])
  assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize('field,value', [('attention_impl', 'flash'), ('remat', 'some')])
def test_unknown_options_are_named(field, value):
  model = tiny_vit(**{field: value})
  with pytest.raises(ValueError, match=f'Unknown {field} {value!r}'):
    init(model)


def test_remat_recomputes_the_forward_in_the_backward_pass():
  """The compiled gradient holds more matmuls with remat: the recomputed forward.
  (XLA:CPU's buffer sizes do not show the saving; the GPU benchmark prints it.)"""
  x = jnp.asarray(images(8, 32))
  dots = {}
  for policy in ('none', 'dots', 'full'):
    model = tiny_vit(remat=policy, num_layers=3, patch_size=4)
    params = init(model)['params']
    grad = jax.jit(jax.grad(lambda p, x: jnp.sum(model.apply({'params': p}, x) ** 2)))
    dots[policy] = grad.lower(params, x).compile().as_text().count(' dot(')
  assert dots['none'] < dots['full'] and dots['dots'] < dots['full'], dots
