"""Plain-numpy float64 references for blocks of each family."""
import numpy as np
from scipy.special import erf


def layer_norm(x, scale, bias, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean)**2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def vit_block(x, p):
  """One pre-LN encoder block; `p` is its published-layout parameter dict."""
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  att = 'MultiHeadDotProductAttention_1'
  y = layer_norm(x, p['LayerNorm_0/scale'], p['LayerNorm_0/bias'])
  q, k, v = (np.einsum('bnd,dhc->bnhc', y, p[f'{att}/{n}/kernel']) + p[f'{att}/{n}/bias']
             for n in ('query', 'key', 'value'))
  weights = softmax(np.einsum('bqhc,bkhc->bhqk', q, k) / np.sqrt(q.shape[-1]))
  heads = np.einsum('bhqk,bkhc->bqhc', weights, v)
  x = x + np.einsum('bqhc,hcd->bqd', heads, p[f'{att}/out/kernel']) + p[f'{att}/out/bias']
  y = layer_norm(x, p['LayerNorm_2/scale'], p['LayerNorm_2/bias'])
  y = gelu_tanh(y @ p['MlpBlock_3/Dense_0/kernel'] + p['MlpBlock_3/Dense_0/bias'])
  return x + y @ p['MlpBlock_3/Dense_1/kernel'] + p['MlpBlock_3/Dense_1/bias'], weights


def group_norm(x, gamma, beta, groups=32, eps=1e-5):
  b, h, w, c = x.shape
  g = x.reshape(b, h, w, groups, c // groups)
  mean = g.mean(axis=(1, 2, 4), keepdims=True)
  var = g.var(axis=(1, 2, 4), keepdims=True)
  return ((g - mean) / np.sqrt(var + eps)).reshape(x.shape) * gamma + beta


def standardize(w, eps=1e-10):
  mean = w.mean(axis=(0, 1, 2), keepdims=True)
  var = w.var(axis=(0, 1, 2), keepdims=True)
  return (w - mean) / np.sqrt(var + eps)


def conv2d(x, w, stride=1, pad=0):
  """Cross-correlation of NHWC `x` with HWIO `w`, zero padding `pad` each side."""
  x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  kh, kw = w.shape[:2]
  windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
  windows = windows[:, ::stride, ::stride]  # (B, H', W', C, kh, kw)
  return np.einsum('bhwcij,ijco->bhwo', windows, w)


def bit_unit(x, p, stride):
  """One BiT pre-activation bottleneck unit; `p` is its published-layout dict."""
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}

  def pre(name, z):
    return np.maximum(group_norm(z, p[f'{name}/group_norm/gamma'],
                                 p[f'{name}/group_norm/beta']), 0)

  a = pre('a', x)
  shortcut = x
  if 'a/proj/standardized_conv2d/kernel' in p:
    shortcut = conv2d(a, standardize(p['a/proj/standardized_conv2d/kernel']), stride)
  y = conv2d(a, standardize(p['a/standardized_conv2d/kernel']))
  y = conv2d(pre('b', y), standardize(p['b/standardized_conv2d/kernel']), stride, pad=1)
  y = conv2d(pre('c', y), standardize(p['c/standardized_conv2d/kernel']))
  return y + shortcut


def mixer_block(x, p):
  """One Mixer block on (B, N, C) tokens; `p` is its published-layout dict."""
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}

  def mlp(y, name):
    y = gelu_tanh(y @ p[f'{name}/Dense_0/kernel'] + p[f'{name}/Dense_0/bias'])
    return y @ p[f'{name}/Dense_1/kernel'] + p[f'{name}/Dense_1/bias']

  y = layer_norm(x, p['LayerNorm_0/scale'], p['LayerNorm_0/bias'])
  x = x + mlp(y.transpose(0, 2, 1), 'token_mixing').transpose(0, 2, 1)
  y = layer_norm(x, p['LayerNorm_1/scale'], p['LayerNorm_1/bias'])
  return x + mlp(y, 'channel_mixing')


def window_attention(x, p, window):
  """AlterNet's window attention on a (B, H, W, C) map as one masked global
  attention: position (i, j) attends to the positions of its own window (grid
  cell (i // s, j // s), s = min(window, H, W)), with the bias-table entry of
  their (row, column) offset; partial windows at the edges are just smaller."""
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  b, h, w, _ = x.shape
  size = min(window, h, w)
  cells = [(i, j) for i in range(h) for j in range(w)]
  tokens = x.reshape(b, h * w, -1)
  q, k, v = (np.einsum('bnc,chd->bnhd', tokens, p[f'{n}/kernel'])
             for n in ('query', 'key', 'value'))
  table, centre = p['relative_position_bias'], window - 1
  same = np.array([[(qi // size, qj // size) == (ki // size, kj // size) for ki, kj in cells]
                   for qi, qj in cells])
  bias = np.array([[table[centre + ki - qi, centre + kj - qj] if ok else 0.
                    for (ki, kj), ok in zip(cells, row)] for (qi, qj), row in zip(cells, same)])
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(q.shape[-1]) + bias
  mixed = np.einsum('bhqk,bkhd->bqhd', softmax(np.where(same, logits, -np.inf)), v)
  out = np.einsum('bqhd,hdo->bqo', mixed, p['out/kernel']) + p['out/bias']
  return out.reshape(b, h, w, -1)


def alternet_msa_block(x, p, window):
  """AlterNet's pre-activation MSA block with an identity shortcut: x +
  attention(GN(conv1x1(GELU(GN(x)))))."""
  q = {k: np.asarray(v, np.float64) for k, v in p.items()}
  y = group_norm(x, q['norm1/scale'], q['norm1/bias'])
  y = 0.5 * y * (1 + erf(y / np.sqrt(2)))  # exact GELU
  y = np.einsum('bhwc,co->bhwo', y, q['conv1/kernel'][0, 0])
  y = group_norm(y, q['norm2/scale'], q['norm2/bias'])
  attention = {k[len('attention/'):]: v for k, v in p.items() if k.startswith('attention/')}
  return x + window_attention(y, attention, window)
