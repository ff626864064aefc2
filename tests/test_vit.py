"""ViT forward pass: shapes, heads, numerics against numpy, intermediates."""
import dataclasses

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from helpers import TINY_VIT, apply, apply_with_intermediates, images, init, perturbed, tiny_vit
from vit_jax import models
from vit_jax.data import augment
from vit_jax.models import vit
from vit_jax.models.vit import sincos2d_posembed

pytestmark = pytest.mark.numerics  # run again on XLA:CPU limited to AVX2 in CI


@pytest.mark.parametrize('size', [(32, 32), (48, 64), (16, 8)])
@pytest.mark.parametrize('classifier', ['token', 'gap', 'unpooled', 'token_unpooled'])
def test_output_shapes(size, classifier):
  model = tiny_vit(classifier=classifier)
  out = apply(model, init(model, size), images(3, size))
  n = (size[0] // 8) * (size[1] // 8)
  expected = {'token': (3, 10), 'gap': (3, 10), 'unpooled': (3, n, 10),
              'token_unpooled': (3, n + 1, 10)}[classifier]
  chex.assert_shape(out, expected)
  chex.assert_tree_all_finite(out)


def test_feature_outputs_without_head():
  model = tiny_vit(num_classes=0, representation_size=24)
  out = apply(model, init(model), images())
  chex.assert_shape(out, (2, 24))
  assert np.all(np.abs(out) <= 1)  # tanh pre-logits


def test_block_matches_numpy_reference():
  model = tiny_vit()
  variables = perturbed(init(model))
  x = images(2)
  out, inter = apply_with_intermediates(model, variables, x)
  block = flax.traverse_util.flatten_dict(
      variables['params']['Transformer']['encoderblock_1'], sep='/')
  block_in = np.asarray(inter['Transformer/encoderblock_1/input'], np.float64)
  expected, weights = reference.vit_block(block_in, block)
  # float32 against float64 over one block of width 32: errors ~1e-6.
  np.testing.assert_allclose(inter['Transformer/encoderblock_1/+mlp'], expected, atol=2e-5)
  np.testing.assert_allclose(
      inter['Transformer/encoderblock_1/MultiHeadDotProductAttention_1/attention_weights'],
      weights, atol=2e-6)


def test_layer_scale_is_the_branch_outputs_last_layer_scaled_per_channel():
  """LayerScale's gamma (random here) times a branch equals the branch whose last
  linear layer (attention's output projection, the MLP's second Dense) has its
  output channels scaled by gamma: an invariance, and nothing else changes."""
  scaled = tiny_vit(layer_scale_init=1e-5)
  variables = perturbed(init(scaled), scale=0.5)
  params = flax.traverse_util.flatten_dict(flax.core.unfreeze(variables['params']), sep='/')
  plain = {}
  for path, value in params.items():
    block, _, name = path.rpartition('/')
    if name in ('ls1', 'ls2'):
      continue
    last = {'MultiHeadDotProductAttention_1/out': 'ls1', 'MlpBlock_3/Dense_1': 'ls2'}
    owner = next((block[:-len(layer)] + ls for layer, ls in last.items()
                  if block.endswith(layer)), None)
    plain[path] = value * params[owner] if owner else value
  assert {p.rsplit('/', 1)[-1] for p in params} - {p.rsplit('/', 1)[-1] for p in plain} == {
      'ls1', 'ls2'}
  x = images(2)
  np.testing.assert_allclose(
      apply(scaled, variables, x),
      apply(tiny_vit(), {'params': flax.traverse_util.unflatten_dict(plain, sep='/')}, x),
      rtol=1e-5, atol=1e-6)
  # Starting at layer_scale_init, the scales cut every branch to that share at first.
  fresh = flax.traverse_util.flatten_dict(flax.core.unfreeze(init(scaled)['params']), sep='/')
  assert all(np.all(v == 1e-5) for k, v in fresh.items() if k.endswith(('ls1', 'ls2')))


@pytest.mark.parametrize('classifier', ['token', 'gap', 'token_unpooled', 'unpooled'])
def test_registers_join_after_the_position_embedding_and_never_reach_the_head(classifier):
  """The first block's input is the class token and the registers as learned,
  then the patches with their position embeddings (blank images: the patch
  embedding's bias); the head reads the encoder's output without the registers,
  computed here in numpy from the last block's output."""
  registers = 3
  model = tiny_vit(classifier=classifier, num_registers=registers)
  variables = perturbed(init(model))
  params = variables['params']
  chex.assert_shape(params['registers'], (1, registers, 32))
  chex.assert_shape(params['Transformer']['posembed_input']['pos_embedding'], (1, 16, 32))
  cls = int(classifier.startswith('token'))
  first = apply_with_intermediates(model, variables, np.zeros((2, 32, 32, 3), np.float32))[1][
      'Transformer/encoderblock_0/input']
  chex.assert_shape(first, (2, cls + registers + 16, 32))
  if cls:
    np.testing.assert_array_equal(first[:, 0], np.broadcast_to(params['cls'][0], (2, 32)))
  np.testing.assert_array_equal(first[:, cls:cls + registers],
                                np.broadcast_to(params['registers'][0], (2, registers, 32)))
  np.testing.assert_allclose(first[:, cls + registers:], np.broadcast_to(
      params['embedding']['bias'] + params['Transformer']['posembed_input']['pos_embedding'][0],
      (2, 16, 32)), rtol=1e-6, atol=1e-6)

  x = images(2)
  out, inter = apply_with_intermediates(model, variables, x)
  last = np.asarray(inter['Transformer/encoderblock_1/+mlp'], np.float64)
  norm = params['Transformer']['encoder_norm']
  normed = ((last - last.mean(-1, keepdims=True)) / np.sqrt(last.var(-1, keepdims=True) + 1e-6)
            * norm['scale'] + norm['bias'])
  tokens = np.concatenate([normed[:, :cls], normed[:, cls + registers:]], axis=1)
  features = {'token': tokens[:, 0], 'gap': tokens.mean(1)}.get(classifier, tokens)
  expected = features @ params['head']['kernel'] + params['head']['bias']
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_registers_refuse_position_embeddings_before_every_block():
  model = tiny_vit(num_registers=2, posemb_where='every_layer')
  with pytest.raises(ValueError, match="posemb_where='input' with registers"):
    init(model)


def test_intermediates_are_named_and_consistent():
  model = tiny_vit()
  variables = perturbed(init(model))
  out, inter = apply_with_intermediates(model, variables, images(3))
  n = 1 + 16
  for i in range(2):
    p = f'Transformer/encoderblock_{i}/'
    for name in ('input', 'sa', '+sa', 'mlp', '+mlp'):
      chex.assert_shape(inter[p + name], (3, n, 32))
    attention = inter[p + 'MultiHeadDotProductAttention_1/attention_weights']
    chex.assert_shape(attention, (3, 4, n, n))
    np.testing.assert_allclose(attention.sum(-1), 1, rtol=1e-5)
    np.testing.assert_allclose(inter[p + '+sa'], inter[p + 'input'] + inter[p + 'sa'], atol=1e-6)
    np.testing.assert_allclose(inter[p + '+mlp'], inter[p + '+sa'] + inter[p + 'mlp'], atol=1e-6)
    # The heads' outputs, through the output projection, sum to the attention branch.
    heads = inter[p + 'MultiHeadDotProductAttention_1/head_outputs']
    chex.assert_shape(heads, (3, n, 4, 8))
    out_projection = variables['params']['Transformer'][f'encoderblock_{i}'][
        'MultiHeadDotProductAttention_1']['out']
    np.testing.assert_allclose(
        np.einsum('bnhd,hdo->bno', heads, out_projection['kernel']) + out_projection['bias'],
        inter[p + 'sa'], atol=1e-5)
  # apply runs the fused attention path: the same function up to float32 rounding.
  chex.assert_trees_all_close(out, apply(model, variables, images(3)), atol=1e-5)
  chex.assert_shape(inter['pre_logits'], (3, 32))


def test_intermediates_cost_nothing_unless_asked():
  model = tiny_vit()
  variables = init(model)
  plain = jax.make_jaxpr(model.apply)(variables, images())
  assert len(plain.out_avals) == 1  # the logits alone: nothing sown, nothing kept
  name = 'Transformer/encoderblock_0/sa'
  selected = jax.make_jaxpr(lambda v, x: models.apply_with_intermediates(
      model, v, x, names=[name]))(variables, images())
  assert len(selected.out_avals) == 2
  _, inter = apply_with_intermediates(model, variables, images(), names=[name])
  assert list(inter) == [name]
  with pytest.raises(KeyError, match='sows no'):
    apply_with_intermediates(model, variables, images(), names=['nope'])


def test_bfloat16_compute_is_close_to_float32():
  variables = perturbed(init(tiny_vit(num_classes=0)))
  x = images(4)
  f32 = apply(tiny_vit(num_classes=0), variables, x)
  bf16 = apply(tiny_vit(num_classes=0, dtype='bfloat16'), variables, x)
  assert bf16.dtype == jnp.float32
  # bfloat16 keeps 8 significant bits (relative step 2**-8 = 0.4%); two
  # blocks of matmuls accumulate a few of those steps.
  rel = np.linalg.norm(bf16 - f32) / np.linalg.norm(f32)
  assert rel < 3e-2, rel


def test_dropout_and_stochastic_depth_only_in_training():
  model = tiny_vit(dropout_rate=0.1, attention_dropout_rate=0.1, stochastic_depth=0.5)
  variables = perturbed(init(model))
  x = images(16)
  rngs = {'dropout': jax.random.PRNGKey(3)}
  chex.assert_trees_all_close(apply(model, variables, x), apply(model, variables, x, rngs=rngs))
  assert not np.allclose(apply(model, variables, x, train=True, rngs=rngs),
                         apply(model, variables, x))


def test_stochastic_depth_drops_whole_examples():
  model = tiny_vit(stochastic_depth=0.5)  # the last block drops each branch with p = 0.5
  variables = perturbed(init(model))
  _, inter = apply_with_intermediates(
      model, variables, images(32), train=True, rngs={'dropout': jax.random.PRNGKey(0)})
  p = 'Transformer/encoderblock_1/'
  delta = np.asarray(inter[p + '+sa'] - inter[p + 'input'])
  kept = np.abs(delta).reshape(32, -1).max(axis=1) > 0
  assert 0 < kept.sum() < 32
  # Kept examples carry the branch scaled by 1 / (1 - p), dropped ones nothing.
  np.testing.assert_allclose(delta[kept], 2 * inter[p + 'sa'][kept], atol=1e-5)


def test_sincos_posembed():
  pe = sincos2d_posembed((3, 4), 16)
  chex.assert_shape(pe, (12, 16))
  np.testing.assert_allclose(pe[0], [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4)
  np.testing.assert_allclose(pe[:, :4]**2 + pe[:, 4:8]**2, 1, rtol=1e-6)
  # Position (row 1, column 2) is index 6: x-frequencies see 2, y-frequencies 1.
  np.testing.assert_allclose(pe[6, 0], np.sin(2.0), rtol=1e-6)
  np.testing.assert_allclose(pe[6, 8], np.sin(1.0), rtol=1e-6)
  model = tiny_vit(posemb='sincos2d')
  chex.assert_shape(apply(model, init(model), images()), (2, 10))


def test_image_size_not_divisible_by_patch_is_named():
  model = tiny_vit()
  with pytest.raises(ValueError, match=r'not divisible by the patch size 8'):
    init(model, 36)


@pytest.mark.slow
def test_hybrid_forward():
  model = models.get_model('R+ViT-Ti_16', 5, num_layers=1)
  variables = init(model, 64)
  out, inter = apply_with_intermediates(model, perturbed(variables), images(2, 64))
  chex.assert_shape(out, (2, 5))
  chex.assert_shape(inter['root'], (2, 16, 16, 64))
  chex.assert_shape(inter['Transformer/encoderblock_0/input'], (2, 5, 192))
  model = models.get_model('R26+ViT-S_32', 5, num_layers=1, resnet_layers=(1, 1))
  _, inter = apply_with_intermediates(model, init(model, 32), images(2, 32))
  chex.assert_shape(inter['block2/output'], (2, 4, 4, 512))
  chex.assert_shape(inter['block2/unit1/output'], (2, 4, 4, 512))
  with pytest.raises(ValueError, match='multiple of 32'):
    init(models.get_model('R+ViT-Ti_16', 5, num_layers=1), 36)


def _pipeline_resize(x, size):
  """Patches (B, h, w, C) resized bilinearly as the input pipeline resizes images."""
  return np.stack([augment.resize(image, size) for image in np.asarray(x)])


@pytest.mark.parametrize('old,new', [(4, 8), (4, 6), (8, 4)])
def test_a_resized_patch_kernel_gives_the_original_tokens_on_resized_patches(old, new):
  """FlexiViT's defining property, against TensorFlow's resize: exact when the
  patch grows; when it shrinks, the kernel is the least-squares solution (the
  normal equations hold)."""
  from vit_jax.models.vit import resize_patch_kernel
  rng = np.random.RandomState(0)
  kernel = rng.normal(size=(old, old, 3, 5)).astype(np.float32)
  resized = resize_patch_kernel(kernel, (new, new))
  chex.assert_shape(resized, (new, new, 3, 5))
  patches = rng.uniform(-1, 1, size=(6, old, old, 3)).astype(np.float32)
  tokens = np.einsum('bhwc,hwcd->bd', patches, kernel)
  if new >= old:
    np.testing.assert_allclose(
        np.einsum('bhwc,hwcd->bd', _pipeline_resize(patches, (new, new)), resized), tokens,
        rtol=1e-4, atol=1e-4)
  else:
    basis = np.eye(old * old, dtype=np.float32).reshape(-1, old, old, 1)
    b_t = _pipeline_resize(basis, (new, new)).reshape(old * old, -1).astype(np.float64)  # B^T
    flat = lambda k: k.reshape(k.shape[0] * k.shape[1], -1).astype(np.float64)
    np.testing.assert_allclose(b_t.T @ (b_t @ flat(resized) - flat(kernel)), 0, atol=1e-4)


def test_fine_tuning_at_twice_the_patch_size_on_twice_the_image_gives_the_same_logits(tmp_path):
  """A checkpoint of 4 px patches loaded into a model of 8 px patches classifies
  16 px images whose every patch is enlarged to 8 px as the original classifies
  them (the same 4x4 grid, position embeddings unchanged). Enlarging the whole
  image instead blends neighbouring patches at their borders, so big_vision's
  "on 2x larger input image, the result will match" holds only roughly."""
  from vit_jax import checkpoint
  from vit_jax.files import fit
  small = tiny_vit(patch_size=4)
  params = perturbed(init(small, 16))['params']
  checkpoint.save(str(tmp_path / 'p4.npz'), params)
  large = tiny_vit(patch_size=8)
  config = models.get_config('ViT-Ti_16', num_classes=10, **{**TINY_VIT, 'patch_size': 8})
  fitted = fit.load_pretrained(str(tmp_path / 'p4.npz'), init(large, 32)['params'], config,
                               keep_head=True)
  x = images(2, 16)
  patches = x.reshape(2, 4, 4, 4, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(-1, 4, 4, 3)
  enlarged = _pipeline_resize(patches, (8, 8)).reshape(2, 4, 4, 8, 8, 3).transpose(
      0, 1, 3, 2, 4, 5).reshape(2, 32, 32, 3)
  np.testing.assert_allclose(apply(large, {'params': fitted}, enlarged),
                             apply(small, {'params': params}, x), rtol=1e-4, atol=1e-4)


def test_the_encoder_spec_is_the_vits_fields_of_its_names():
  """Every `EncoderSpec` field is a `VisionTransformer` field with its default, and
  the ViT hands its own values over: a field added to one and not the other fails."""
  spec_fields = {f.name: f.default for f in dataclasses.fields(vit.EncoderSpec)}
  vit_fields = {f.name: f.default for f in dataclasses.fields(vit.VisionTransformer)}
  assert spec_fields.items() <= vit_fields.items()
  model = tiny_vit(stochastic_depth=0.1, skip_removed=((0, 'mlp'),), attention_impl='xla')
  spec = model.encoder_spec()
  assert (spec.num_layers, spec.stochastic_depth, spec.skip_removed, spec.attention_impl) == (
      model.num_layers, 0.1, ((0, 'mlp'),), 'xla')


@pytest.mark.numerics
def test_the_swiglu_mlp_is_silu_of_the_first_half_times_the_second():
  """DINOv2 ViT-g's MLP in numpy, float64: the first layer's 2 * mlp_dim outputs
  [a | b], silu(a) * b, then the second layer (timm's SwiGLUPacked, gate first)."""
  block = vit.MlpBlock(mlp_dim=6, activation='swiglu')
  x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
  params = perturbed(block.init(jax.random.PRNGKey(0), x, train=False), scale=0.5)['params']
  assert params['Dense_0']['kernel'].shape == (4, 12)
  assert params['Dense_1']['kernel'].shape == (6, 4)
  w = {k: {n: np.asarray(v, np.float64) for n, v in p.items()} for k, p in params.items()}
  h = x.astype(np.float64) @ w['Dense_0']['kernel'] + w['Dense_0']['bias']
  a, b = h[..., :6], h[..., 6:]
  expected = (a / (1 + np.exp(-a)) * b) @ w['Dense_1']['kernel'] + w['Dense_1']['bias']
  np.testing.assert_allclose(block.apply({'params': params}, x, train=False), expected,
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('classifier', ['token', 'gap', 'map'])
@pytest.mark.parametrize('scan_layers', [False, True])
def test_a_batch_of_mixed_shapes_gives_each_image_what_it_gives_alone(classifier, scan_layers):
  """Images of 2 x 4, 3 x 2 and 3 x 4 patches padded to 3 x 4 with `grids`: each
  image's output is the one it gives in a batch of its own shape (its table
  resized to its grid, the padding kept from attention and pooling)."""
  model = tiny_vit(num_classes=0, classifier=classifier, posemb_grid=(4, 4),
                   scan_layers=scan_layers)
  params = perturbed(init(model, 32))['params']
  x, grids = images(3, (24, 32)), ((2, 4), (3, 2), (3, 4))
  # Python ints, static under jit: a tuple of tuples.
  mixed = jax.jit(model.apply, static_argnames='grids')({'params': params}, x, grids=grids)
  for i, (rows, cols) in enumerate(grids):
    alone = apply(model, {'params': params}, x[i:i + 1, :rows * 8, :cols * 8])[0]
    np.testing.assert_allclose(mixed[i], alone, atol=1e-5 * np.abs(alone).max(), err_msg=i)


@pytest.mark.parametrize('fields,grids,says', [
    (dict(posemb_grid=(4, 4)), [(2, 4)], 'each of the 2 images'),
    (dict(posemb_grid=(4, 4)), [(2, 4), (4, 4)], 'within the padded 3 x 4'),
    (dict(posemb_grid=(4, 4)), [(2, 4), (0, 1)], 'positive integers'),
    (dict(), [(2, 4), (3, 4)], "posemb 'learn' without posemb_grid"),
    (dict(posemb='none', rope='dinov3'), [(2, 4), (3, 4)], "rope 'dinov3'"),
    (dict(posemb_grid=(4, 4), classifier='unpooled'), [(2, 4), (3, 4)],
     "classifier 'unpooled'"),
])
def test_a_batch_of_mixed_shapes_the_model_cannot_run_is_refused(fields, grids, says):
  model = tiny_vit(num_classes=0, **fields)
  params = init(model, 32)['params']
  with pytest.raises(ValueError, match=says):
    model.apply({'params': params}, images(2, (24, 32)), grids=grids)
