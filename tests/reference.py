"""Plain-numpy float64 references for one ViT block and one BiT unit."""
import numpy as np


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
