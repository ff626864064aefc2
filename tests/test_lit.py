"""LiT: the original code's parameter counts, flaxformer's BERT written out in numpy,
the published file layout, the tokenizers and zero-shot classification end to end."""
import json
import os
import subprocess
import sys

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest
import sentencepiece

from helpers import VOCAB, make_folder, perturbed
from vit_jax import checkpoint, models, zeroshot
from vit_jax.data import tokenizers
from vit_jax.errors import ConfigError, UserError
from vit_jax.models.family import CheckpointError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The original code's models_test.py (at 224 px, tokens of length 16).
LIT_COUNTS = {'LiT-B16B': 195_871_489, 'LiT-B16B_2': 195_280_897, 'LiT-L16L': 638_443_521,
              'LiT-L16S': 331_140_353, 'LiT-L16Ti': 311_913_089}
def flat(tree):
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(tree), sep='/')


def lit_init(name='LiT-testing', seed=0, **overrides):
  model = models.get_model(name, **overrides)
  config = models.get_config(name, **overrides)
  images = jnp.zeros((1, config.image_size, config.image_size, 3))
  variables = model.init(jax.random.PRNGKey(seed), images=images,
                         tokens=jnp.ones((1, config.max_len), jnp.int32))
  return model, config, perturbed(variables)


@pytest.mark.parametrize('name', sorted(LIT_COUNTS))
def test_lit_models_have_the_original_parameter_counts(name):
  model = models.get_model(name)
  images, tokens = jnp.ones((2, 224, 224, 3)), jnp.ones((2, 16), jnp.int32)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images=images,
                                                tokens=tokens))
  assert sum(x.size for x in jax.tree.leaves(variables)) == LIT_COUNTS[name]
  zimg, ztxt, out = jax.eval_shape(lambda v: model.apply(v, images=images, tokens=tokens),
                                   variables)
  chex.assert_equal_shape([zimg, ztxt])
  assert zimg.shape[0] == 2 and out['t'].shape == (1,)


def test_bert_tree_is_flaxformers():
  """The paths of flaxformer's BertEncoder (its testdata/model_param_shapes.json),
  with 2-D attention kernels (D, heads * D/heads) and (heads * D/heads, D)."""
  _, _, variables = lit_init()
  shapes = {k: v.shape for k, v in flat(variables['params']).items()
            if k.startswith('txt/BertEncoder_0/')}
  d, i = 16, 32
  expected = {'embedder/embedders_token_ids/embedding': (30522, d),
              'embedder/embedders_position_ids/embedding': (512, d),
              'embedder/embedders_segment_ids/embedding': (2, d),
              'layer_norm/scale': (d,), 'layer_norm/bias': (d,)}
  for layer in range(2):
    prefix = f'encoder_block/layer_sequence/layers_{layer}/'
    for name in ('query', 'key', 'value'):
      expected[f'{prefix}attention_block/attention_layer/{name}/kernel'] = (d, d)
      expected[f'{prefix}attention_block/attention_layer/{name}/bias'] = (d,)
    for block in ('attention_block', 'mlp_block'):
      expected[f'{prefix}{block}/layer_norm/scale'] = (d,)
      expected[f'{prefix}{block}/layer_norm/bias'] = (d,)
    expected[f'{prefix}attention_block/dense_layer/kernel'] = (d, d)
    expected[f'{prefix}attention_block/dense_layer/bias'] = (d,)
    expected[f'{prefix}mlp_block/mlp/dense_layer/kernel'] = (d, i)
    expected[f'{prefix}mlp_block/mlp/dense_layer/bias'] = (i,)
    expected[f'{prefix}mlp_block/dense_layer/kernel'] = (i, d)
    expected[f'{prefix}mlp_block/dense_layer/bias'] = (d,)
  assert shapes == {f'txt/BertEncoder_0/{k}': v for k, v in expected.items()}


def _layer_norm(x, p, eps=1e-12):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p['scale'] + p['bias']


def _dense(x, p):
  return x @ p['kernel'] + p['bias']


def bert_reference(params, tokens, heads):
  """flaxformer's BertEncoder in float64 numpy: summed embeddings, LayerNorm, then
  per layer LN(x + W_o attention(x)) with q scaled by 1/sqrt(d_head) and masked
  pairs at -1e10, and LN(x + W_2 gelu_tanh(W_1 x))."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  b, length = tokens.shape
  emb = p['embedder']
  x = (emb['embedders_token_ids']['embedding'][tokens]
       + emb['embedders_position_ids']['embedding'][np.arange(length)][None]
       + emb['embedders_segment_ids']['embedding'][np.zeros_like(tokens)])
  x = _layer_norm(x, p['layer_norm'])
  keep = tokens != 0
  bias = np.where(keep[:, None, :, None] * keep[:, None, None, :], 0., -1e10)
  for name in sorted(p['encoder_block']['layer_sequence'], key=lambda n: int(n.split('_')[1])):
    layer = p['encoder_block']['layer_sequence'][name]
    att = layer['attention_block']
    d = x.shape[-1]
    q, k, v = (_dense(x, att['attention_layer'][n]).reshape(b, length, heads, d // heads)
               for n in ('query', 'key', 'value'))
    logits = np.einsum('bqhd,bkhd->bhqk', q / np.sqrt(d // heads), k) + bias
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = np.einsum('bhqk,bkhd->bqhd', weights, v).reshape(b, length, d)
    x = _layer_norm(x + _dense(y, att['dense_layer']), att['layer_norm'])
    mlp = layer['mlp_block']
    h = _dense(x, mlp['mlp']['dense_layer'])
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    x = _layer_norm(x + _dense(h, mlp['dense_layer']), mlp['layer_norm'])
  return x


@pytest.mark.numerics
def test_bert_tower_is_flaxformers_formula():
  model, _, variables = lit_init()
  tokens = np.array([[2, 4, 5, 6, 8, 0, 0, 0], [2, 9, 10, 11, 7, 5, 4, 12]], np.int32)
  _, ztxt, out = jax.jit(lambda v, t: model.apply(v, tokens=t))(variables, tokens)
  params = variables['params']['txt']
  sequence = bert_reference(params['BertEncoder_0'], tokens, heads=2)
  head = jax.tree.map(lambda a: np.asarray(a, np.float64), params['head'])
  expected = _dense(sequence[:, 0], head)
  norm = np.linalg.norm(expected, axis=1, keepdims=True)
  # float32 through two post-LN layers of width 16: errors of a few 1e-7 relative.
  np.testing.assert_allclose(out['txt/norm'], norm, rtol=1e-5)
  np.testing.assert_allclose(ztxt, expected / (norm + 1e-8), rtol=1e-5, atol=1e-6)


@pytest.mark.numerics
def test_padding_does_not_change_the_cls_embedding():
  """Padded positions are masked: a text padded to 8 or to 16 embeds alike."""
  model, _, variables = lit_init()
  short = np.array([[2, 4, 5, 8, 0, 0, 0, 0]], np.int32)
  long = np.pad(short, ((0, 0), (0, 8)))
  embed = jax.jit(lambda v, t: model.apply(v, tokens=t)[1])
  # float32: the sums over keys differ only by zero-weight terms.
  np.testing.assert_allclose(embed(variables, short), embed(variables, long), atol=1e-6)


def test_towers_alone_and_the_temperature():
  model, config, variables = lit_init()
  images = np.random.RandomState(0).uniform(-1, 1, (3, 32, 32, 3)).astype(np.float32)
  zimg, ztxt, out = model.apply(variables, images=images)
  assert ztxt is None and zimg.shape == (3, 8)
  np.testing.assert_allclose(np.linalg.norm(zimg, axis=1), 1, rtol=1e-6)
  np.testing.assert_allclose(out['t'], np.exp(variables['params']['t']), rtol=1e-6)
  zimg, ztxt, _ = model.apply(variables, tokens=np.ones((2, config.max_len), np.int32))
  assert zimg is None and ztxt.shape == (2, 8)


def test_small_text_tower_reads_the_last_token():
  """The small tower's output depends on the last token through the head: with
  attention's value projections zeroed, each position keeps only its own
  embedding, so only the last token's id matters."""
  model, config, variables = lit_init(
      'LiT-L16Ti', image={'num_layers': 1, 'hidden_size': 8, 'mlp_dim': 8, 'num_heads': 1},
      text={'num_layers': 1, 'width': 8, 'mlp_dim': 8, 'num_heads': 1, 'vocab_size': 50})
  params = flax.core.unfreeze(variables['params'])
  attention = params['txt']['Encoder_0']['encoderblock_0']['MultiHeadDotProductAttention_1']
  attention['value'] = jax.tree.map(jnp.zeros_like, attention['value'])
  attention['out'] = jax.tree.map(jnp.zeros_like, attention['out'])
  embed = jax.jit(lambda p, t: model.apply({'params': p}, tokens=t)[1])
  tokens = np.full((1, config.max_len), 7, np.int32)
  other_first = tokens.copy()
  other_first[0, 0] = 3
  other_last = tokens.copy()
  other_last[0, -1] = 3
  np.testing.assert_allclose(embed(params, tokens), embed(params, other_first), atol=1e-6)
  assert np.abs(embed(params, tokens) - embed(params, other_last)).max() > 1e-3


def test_lit_file_round_trips_in_the_published_layout(tmp_path):
  model, config, variables = lit_init()
  path = str(tmp_path / 'LiT-testing.npz')
  checkpoint.save(path, variables)
  with np.load(path) as data:
    assert set(data.files) == set(flat(variables['params']))
    assert 't' in data.files and any(k.startswith('txt/BertEncoder_0/') for k in data.files)
  loaded = zeroshot.load_params(path, model, config)
  chex.assert_trees_all_equal(loaded, jax.tree.map(np.asarray, flax.core.unfreeze(
      variables['params'])))
  # Without a LiT name, its image tower loads as the ViT it is.
  tower = checkpoint.load(path, 'testing', num_classes=8)
  chex.assert_trees_all_equal(tower, loaded['img'])


def test_a_lit_file_missing_a_tensor_is_refused_by_name(tmp_path):
  model, config, variables = lit_init()
  arrays = {k: np.asarray(v) for k, v in flat(variables['params']).items() if k != 't'}
  np.savez(tmp_path / 'bad.npz', **arrays)
  with pytest.raises(CheckpointError, match="missing.*'t'|missing[^\n]*\n[^\n]*\\bt\\b"):
    zeroshot.load_params(str(tmp_path / 'bad.npz'), model, config)


def test_lit_is_a_peer_family_that_classifies_zero_shot():
  config = models.get_config('LiT-B16B')
  assert models.family_of(config) is models.FAMILIES['lit']
  assert models.families(models.ZERO_SHOT) == ['lit']
  assert 'lit' not in models.families(models.CLASSIFY)
  with pytest.raises(ValueError, match=r'LiT-B16B \(LiT\) cannot classify images.*it can '
                     r'classify images zero-shot.*vit_jax.zeroshot.*Models that can: ViT'):
    models.require(config, models.CLASSIFY)
  assert models.require(config, models.ZERO_SHOT) is models.FAMILIES['lit']
  config = models.get_config('LiT-B16B', text={'config': 'large'}, out_dim=(None, 16))
  assert config.text.config == 'large' and config.image.hidden_size == 768
  with pytest.raises(ValueError, match='no field'):
    models.get_config('LiT-B16B', num_classes=3)


@pytest.fixture
def bert_vocab(tmp_path):
  path = tmp_path / 'vocab.txt'
  path.write_text('\n'.join(VOCAB) + '\n')
  return str(path)


def test_bert_tokenizer_is_lowercased_wordpiece_with_cls_first(bert_vocab):
  tokenizer = tokenizers.get_tokenizer('bert', bert_vocab, 6)
  ids = {w: i for i, w in enumerate(VOCAB)}
  got = tokenizer(['A Photo of CATS.', 'a dog', 'a photo of a photo of a dog', 'zebra'])
  np.testing.assert_array_equal(got, [
      [ids['[CLS]'], ids['a'], ids['photo'], ids['of'], ids['cat'], ids['##s']],  # cut to 5
      [ids['[CLS]'], ids['a'], ids['dog'], 0, 0, 0],
      [ids['[CLS]'], ids['a'], ids['photo'], ids['of'], ids['a'], ids['photo']],
      [ids['[CLS]'], ids['[UNK]'], 0, 0, 0, 0]])
  assert tokenizer.vocab_size == len(VOCAB)


# TensorFlow Text's BasicTokenizer(lower_case=True) on these texts (tensorflow-text
# 2.21.1): the words BERT's WordPiece then pieces.
BERT_WORDS = {
    'A Photo of CATS.': ['a', 'photo', 'of', 'cats', '.'],
    'Café, STRASSE! Straße': ['cafe', ',', 'strasse', '!', 'strasse'],
    "don't stop-running…": ['don', "'", 't', 'stop', '-', 'running', '.', '.', '.'],
    '中国的cat': ['中', '国', '的', 'cat'],
    'x\u00a0y\u2003z\u200bw': ['x', 'y', 'zw'],
    'ﬁne Ⅻ ½': ['fine', 'xii', '1⁄2'],
    'tab\tx\ny\vz\x00q': ['tab', 'x', 'y', 'z', 'q'],
    'İstanbul ÉCOLE': ['istanbul', 'ecole'],
    '$5+3^2=14?': ['$', '5', '+', '3', '^', '2', '=', '14', '?'],
    '¿qué? «sí» “yes”': ['¿', 'que', '?', '«', 'si', '»', '“', 'yes', '”'],
    'Ωmega ΣΊΣΥΦΟΣ': ['ωmega', 'σισυφοσ'],
    'ｆｕｌｌ\u3000ｗｉｄｔｈ': ['full', 'width'],
}


@pytest.mark.parametrize('text', list(BERT_WORDS))
def test_bert_words_are_tensorflow_texts(text):
  assert tokenizers.bert_words(text) == BERT_WORDS[text]


def test_preprocess_tf_tokenizes_inside_a_graph(bert_vocab):
  tf = pytest.importorskip('tensorflow')
  tokenizer = tokenizers.get_tokenizer('bert', bert_vocab, 6)
  dataset = tf.data.Dataset.from_tensor_slices(['a dog', 'A Photo of CATS.'])
  got = [ids for ids in dataset.map(tokenizer.preprocess_tf).as_numpy_iterator()]
  np.testing.assert_array_equal(np.stack(got), tokenizer(['a dog', 'A Photo of CATS.']))


def test_sentencepiece_tokenizer_keeps_eos_last(tmp_path):
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('\n'.join(['a photo of a cat', 'a photo of a dog', 'the bird flies',
                               'an airplane in the sky'] * 50))
  sentencepiece.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(tmp_path / 'sp'), vocab_size=24, pad_id=0,
      eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
  path = str(tmp_path / 'sp.model')
  tokenizer = tokenizers.get_tokenizer('sentencepiece', path, 6)
  reference = sentencepiece.SentencePieceProcessor(model_file=path)
  texts = ['a photo of a cat', 'dog', 'sky']
  expected = []
  for ids in reference.encode(texts, add_eos=True):
    ids = ids[:5]
    expected.append(ids + [1] * (6 - len(ids)))
  np.testing.assert_array_equal(tokenizer(texts), expected)
  assert tokenizer.eos_token == 1 and tokenizer.vocab_size == 24


def test_a_missing_vocabulary_names_the_file_to_get(tmp_path):
  with pytest.raises(CheckpointError, match=r'gs://vit_models/lit/LiT-B16B\.txt'):
    tokenizers.get_tokenizer('bert', str(tmp_path / 'LiT-B16B.txt'), 16, 'LiT-B16B')


def test_preprocessing_is_the_authors(tmp_path):
  rng = np.random.RandomState(0)
  image = rng.randint(0, 256, (32, 32, 3), np.uint8)
  # At the model's size the resize is the identity: only the value range changes.
  np.testing.assert_allclose(zeroshot.preprocess_image(image, 32), image / 255. * 2 - 1,
                             atol=1e-6)
  grey = rng.randint(0, 256, (40, 20, 1), np.uint8)
  cropped = zeroshot.preprocess_image(grey, 10, crop=True)
  # The short side resized to 10 (a 20 x 10 image: pixel (i, j) the mean of the 2 x 2
  # block at (2i, 2j)), truncated to uint8, then the centre 10 x 10.
  blocks = grey.astype(np.float64).reshape(20, 2, 10, 2, 1).mean(axis=(1, 3))
  resized = np.floor(blocks) / 255 * 2 - 1
  np.testing.assert_allclose(cropped, np.repeat(resized[5:15], 3, axis=-1), atol=1e-6)


def _setup_zero_shot(tmp_path, bert_vocab):
  """A LiT-testing checkpoint with its vocabulary beside it, and a two-class folder."""
  model, config, variables = lit_init(seed=3)
  checkpoint.save(str(tmp_path / 'LiT-testing.npz'), variables)
  os.rename(bert_vocab, tmp_path / 'LiT-testing.txt')
  dataset = make_folder(str(tmp_path / 'data'), {'test': [5, 4]}, size=(32, 32))
  for i, name in enumerate(('cat', 'dog')):
    os.rename(tmp_path / 'data' / 'test' / f'class_{i}', tmp_path / 'data' / 'test' / name)
  return model, config, variables, dataset


@pytest.mark.slow
def test_zero_shot_command_end_to_end(tmp_path, bert_vocab, warm_python):
  """The command's predictions are the authors' rule recomputed here: prompts of
  each class embedded, averaged per class, and each image given the class of
  highest dot product."""
  model, config, variables, dataset = _setup_zero_shot(tmp_path, bert_vocab)
  results = tmp_path / 'zeroshot.json'
  command = [warm_python, '-m', 'vit_jax.zeroshot', '--model', 'LiT-testing', '--checkpoint',
             str(tmp_path / 'LiT-testing.npz'), '--dataset', dataset, '--prompt', 'a photo of a {}.',
             '--prompt', '{}', '--results', str(results)]
  run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr
  assert 'LiT-testing zero-shot on folder:' in run.stdout
  summary = json.loads(results.read_text())

  tokenizer = tokenizers.get_tokenizer('bert', str(tmp_path / 'LiT-testing.txt'), config.max_len)
  tokens = tokenizer(['a photo of a cat.', 'cat', 'a photo of a dog.', 'dog'])
  _, ztxt, _ = model.apply(variables, tokens=tokens)
  zclass = np.asarray(ztxt).reshape(2, 2, -1).mean(axis=1)
  correct = []
  for label, name in enumerate(('cat', 'dog')):
    folder = tmp_path / 'data' / 'test' / name
    for file in sorted(os.listdir(folder)):
      image = np.asarray(PIL.Image.open(folder / file).convert('RGB'))
      zimg, _, _ = model.apply(variables, images=(image[None] / 255. * 2 - 1).astype(np.float32))
      correct.append(int((np.asarray(zimg) @ zclass.T).argmax()) == label)
  assert summary['num_examples'] == 9 and summary['num_classes'] == 2
  assert summary['accuracy'] == pytest.approx(np.mean(correct))
  assert summary['prompts'] == ['a photo of a {}.', '{}']


def test_a_vocabulary_larger_than_the_text_tower_is_refused(tmp_path, bert_vocab):
  model, config, variables, dataset = _setup_zero_shot(tmp_path, bert_vocab)
  vocab = tmp_path / 'big.txt'
  vocab.write_text('\n'.join(VOCAB + [f'w{i}' for i in range(31_000)]))
  with pytest.raises(CheckpointError, match="another model's vocabulary"):
    zeroshot.zero_shot('LiT-testing', str(tmp_path / 'LiT-testing.npz'), dataset,
                       vocab=str(vocab))


def test_without_sentencepiece_the_error_says_how_to_install_it(tmp_path, monkeypatch):
  path = tmp_path / 'LiT-testing.model'
  path.write_bytes(b'not read')
  monkeypatch.setitem(sys.modules, 'sentencepiece', None)  # import fails
  with pytest.raises(UserError, match='pip install sentencepiece'):
    tokenizers.get_tokenizer('sentencepiece', str(path), 16)


def test_zero_shot_refuses_what_it_cannot_classify(tmp_path, bert_vocab):
  _, _, _, dataset = _setup_zero_shot(tmp_path, bert_vocab)
  checkpoint_path = str(tmp_path / 'LiT-testing.npz')
  with pytest.raises(ConfigError, match="Unknown model 'LiT-Q'"):
    zeroshot.zero_shot('LiT-Q', checkpoint_path, dataset)
  with pytest.raises(ConfigError, match=r'ViT-B_16 \(ViT, hybrid\) cannot classify images '
                     r'zero-shot.*Models that can: LiT\.'):
    zeroshot.zero_shot('ViT-B_16', checkpoint_path, dataset)
  with pytest.raises(ConfigError, match='needs a {} for the class name'):
    zeroshot.zero_shot('LiT-testing', checkpoint_path, dataset, prompts=('a photo',))
  with pytest.raises(ConfigError, match='3 class names for the 2 classes'):
    zeroshot.zero_shot('LiT-testing', checkpoint_path, dataset, class_names=['a', 'b', 'c'])
  with pytest.raises(ConfigError, match='--batch_size is 0; it must be at least 1'):
    zeroshot.zero_shot('LiT-testing', checkpoint_path, dataset, batch_size=0)
  with pytest.raises(ConfigError, match="--classnames names 'Cat' twice \\(classes 0 and 1\\)"):
    zeroshot.zero_shot('LiT-testing', checkpoint_path, dataset, class_names=['cat', 'Cat'])
  with pytest.raises(ConfigError, match='--classnames gives 1 class name'):
    zeroshot.zero_shot('LiT-testing', checkpoint_path, dataset, class_names=['cat'])
