"""Sparse autoencoders (SAEs): an overcomplete dictionary of directions, trained on
one layer's activations so that each activation is a sparse sum of them.

Three architectures, each as its authors' code defines its forward pass, loss and
constraints (`ARCHITECTURES`):

- 'topk' (Gao et al. 2024, "Scaling and evaluating sparse autoencoders";
  openai/sparse_autoencoder, sparse_autoencoder/train.py: `FastAutoencoder`,
  `main`'s loss and `training_loop_`): latents = ReLU of the k largest of
  (x - b_dec) W_enc + b_enc, the rest 0; the loss is the MSE scaled by the
  inverse variance of the activations (`mse_scale`) plus `aux_coef` times the
  AuxK loss: the `aux_k` largest pre-activations of the dead latents, ReLU'd and
  decoded (with b_dec), against the residual x - x_hat + b_dec (both held fixed),
  as a normalised MSE (`kernels.normalized_mse`). Adam at lr 1e-4, eps 6.25e-10.
- 'batch_topk' (Bussmann et al. 2024, "BatchTopK Sparse Autoencoders";
  bartbussmann/BatchTopK, sae.py: `BatchTopKSAE`): a = ReLU((x - b_dec) W_enc)
  (no encoder bias), the k * batch largest of the whole batch kept; loss = MSE +
  `aux_coef` times the MSE of the dead latents' top `aux_k` activations decoded
  (without b_dec) against the residual x - x_hat. Adam at lr 3e-4, betas (0.9, 0.99).
- 'relu_l1' (SAELens' `StandardTrainingSAE`, sae_lens/saes/standard_sae.py and
  sae_base.py): f = ReLU((x - b_dec) W_enc + b_enc); loss = the squared error
  summed over features, averaged over the batch, plus `l1` times the L1 norm of
  f weighted by each latent's decoder norm (`scale_sparsity_penalty_by_decoder_norm`).

The TopK architectures keep the decoder's rows at unit norm: before each step the
rows are renormalised and the gradient's component along each row removed
(`unit_norm_decoder_` and `unit_norm_decoder_grad_adjustment_` in train.py;
`make_decoder_weights_and_grad_unit_norm` in sae.py). A latent is dead when it
has not fired (above `FIRING`) for `dead_steps` steps.

Arrays are (n, d) activations; the parameters are W_enc (d, m), b_enc (m,),
W_dec (m, d), b_dec (d,) for a dictionary of m latents.

Dictionaries are read and written by `analysis.runtime.sae_files`; those trained
elsewhere are read with the
forward pass their code runs, named by two fields of `Spec` (`ENCODERS`,
`NORMALISATIONS`):

- `encoder='saev'` (OSU-NLP-Group/saev, src/saev/nn/modeling.py:
  `SparseAutoencoder.encode`, `TopKActivation`, `BatchTopKActivation`): the
  pre-activations are x W_enc + b_enc, b_dec not subtracted; 'topk' keeps the k
  largest as they are (no ReLU); 'batch_topk' at inference is a JumpReLU at the
  file's running `threshold` (a ReLU where it is not above 0), each input alone;
  'relu_l1' is their `Relu`.
- `encoder='saev_pre_bias'`: saev before its commit e7ca004 (2025-07-31, "don't
  remove decoder bias"), whose `SparseAutoencoder.forward` (src/saev/nn/modeling.py,
  lines 87-93 at 4f87ac7) encodes (x - b_dec) W_enc + b_enc, otherwise as 'saev'.
  `sae_files.read_saev` tells the two apart by the file's schema and commit.
- `normalisation` (ViT-Prisma, src/vit_prisma/sae/sae.py: `SparseAutoencoder.__init__`'s
  run-time activation normalisation): 'layer_norm' encodes (x - mean) / (std + 1e-5)
  (the features' mean and unbiased standard deviation of each token) and maps the
  reconstruction back as y std + mean; 'constant_norm_rescale' encodes x sqrt(d) /
  |x| and maps back by its inverse.
"""
import dataclasses
from typing import Any, Dict, Iterable, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

Params = Dict[str, jax.Array]
ARCHITECTURES = ('topk', 'batch_topk', 'relu_l1')
ENCODERS = ('authors', 'saev', 'saev_pre_bias')
NORMALISATIONS = ('none', 'layer_norm', 'constant_norm_rescale')
LAYER_NORM_EPS = 1e-5  # ViT-Prisma's `run_time_activation_ln_in`
# A latent fires above this (OpenAI's `stats_last_nonzero`: vals > 1e-3).
FIRING = 1e-3


@dataclasses.dataclass(frozen=True)
class Spec:
  """What an SAE is and how it trains: the architecture and its authors' settings."""
  architecture: str = 'topk'
  width: int = 1024  # latents m
  k: int = 32  # latents kept per input (topk), on average (batch_topk)
  aux_k: int = 256  # dead latents' pre-activations the AuxK loss keeps
  aux_coef: float = 1 / 32  # weight of the AuxK loss
  l1: float = 5.  # relu_l1's sparsity coefficient
  dead_steps: int = 100  # steps without firing after which a latent is dead
  lr: float = 1e-4
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 6.25e-10
  encoder: str = 'authors'  # the architecture's authors' forward pass, or saev's
  threshold: float = 0.  # encoder 'saev', 'batch_topk': the JumpReLU's threshold
  normalisation: str = 'none'  # of each input before encoding (ViT-Prisma's)

  def __post_init__(self):
    for field, value, allowed in (('architecture', self.architecture, ARCHITECTURES),
                                  ('encoder', self.encoder, ENCODERS),
                                  ('normalisation', self.normalisation, NORMALISATIONS)):
      if value not in allowed:
        raise ValueError(f'Unknown SAE {field} {value!r}; use one of {allowed}.')


def authors_spec(architecture: str, width: int, **changes: Any) -> Spec:
  """The `Spec` of an architecture with its authors' optimiser settings.

  Args:
    architecture: one of `ARCHITECTURES`.
    width: the number of latents.
    **changes: other fields.

  Returns:
    The spec.
  """
  authors = {'topk': dict(lr=1e-4, b1=0.9, b2=0.999, eps=6.25e-10),
             'batch_topk': dict(lr=3e-4, b1=0.9, b2=0.99, eps=1e-8, aux_k=512),
             'relu_l1': dict(lr=3e-4, b1=0.9, b2=0.999, eps=1e-8)}[architecture]
  return Spec(architecture=architecture, width=width, **{**authors, **changes})


def init(key: jax.Array, d: int, spec: Spec) -> Params:
  """The parameters before training: W_enc uniform in +-1/sqrt(d) (PyTorch's
  `nn.Linear` default, as `FastAutoencoder`'s encoder), W_dec its transpose with
  unit-norm rows (the "tied" start of both TopK codes), biases 0.

  Args:
    key: the random key.
    d: the activations' width.
    spec: the SAE.

  Returns:
    The parameters.
  """
  w = jax.random.uniform(key, (d, spec.width), jnp.float32, -1., 1.) / np.sqrt(d)
  w_dec = w.T / jnp.linalg.norm(w.T, axis=1, keepdims=True)
  return {'W_enc': w, 'b_enc': jnp.zeros(spec.width), 'W_dec': w_dec, 'b_dec': jnp.zeros(d)}


def _keep_top(values: jax.Array, k: int) -> jax.Array:
  """`values` with all but the k largest of each row set to 0."""
  top, index = jax.lax.top_k(values, k)
  rows = jnp.arange(values.shape[0])[:, None]
  return jnp.zeros_like(values).at[rows, index].set(top)


def normalised(x: jax.Array, spec: Spec) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """The inputs as the SAE encodes them (`spec.normalisation`), and the map back.

  Args:
    x: (n, d) activations.
    spec: the SAE.

  Returns:
    (the (n, d) normalised inputs, and the (n, 1) scale and shift that map a
    reconstruction back to the activations' space: y scale + shift).
  """
  x = jnp.asarray(x)
  ones, zeros = jnp.ones((x.shape[0], 1), x.dtype), jnp.zeros((x.shape[0], 1), x.dtype)
  if spec.normalisation == 'layer_norm':
    mean = jnp.mean(x, axis=-1, keepdims=True)
    std = jnp.std(x - mean, axis=-1, keepdims=True, ddof=1)
    return (x - mean) / (std + LAYER_NORM_EPS), std, mean
  if spec.normalisation == 'constant_norm_rescale':
    coeff = np.sqrt(x.shape[-1]) / jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x * coeff, 1. / coeff, zeros
  return x, ones, zeros


def encode(params: Params, x: jax.Array, spec: Spec) -> Tuple[jax.Array, jax.Array]:
  """The latents of `x` and the pre-activations the AuxK loss reads.

  Args:
    params: the SAE's parameters.
    x: (n, d) activations, normalised here as `spec.normalisation` says.
    spec: the SAE.

  Returns:
    ((n, m) latents, (n, m) pre-activations: before TopK for 'topk', the ReLU'd
    activations before the batch's selection for 'batch_topk', before the ReLU for
    'relu_l1'; for encoder 'saev', x W_enc + b_enc, for 'saev_pre_bias'
    (x - b_dec) W_enc + b_enc).
  """
  x = normalised(x, spec)[0]
  if spec.encoder in ('saev', 'saev_pre_bias'):
    centred = x - params['b_dec'] if spec.encoder == 'saev_pre_bias' else x
    pre = centred @ params['W_enc'] + params['b_enc']
    if spec.architecture == 'topk':
      return _keep_top(pre, spec.k), pre
    return jnp.where(pre > max(spec.threshold, 0.), pre, 0.), pre
  centred = x - params['b_dec']
  if spec.architecture == 'topk':
    pre = centred @ params['W_enc'] + params['b_enc']
    return jax.nn.relu(_keep_top(pre, spec.k)), pre
  if spec.architecture == 'batch_topk':
    acts = jax.nn.relu(centred @ params['W_enc'])
    flat = acts.reshape(-1)
    top, index = jax.lax.top_k(flat, spec.k * x.shape[0])
    return jnp.zeros_like(flat).at[index].set(top).reshape(acts.shape), acts
  pre = centred @ params['W_enc'] + params['b_enc']
  return jax.nn.relu(pre), pre


def decode(params: Params, latents: jax.Array) -> jax.Array:
  """The reconstruction latents W_dec + b_dec.

  Args:
    params: the SAE's parameters.
    latents: (n, m) latents.

  Returns:
    (n, d) reconstructions.
  """
  return latents @ params['W_dec'] + params['b_dec']


def reconstruct(params: Params, x: jax.Array, spec: Spec) -> Tuple[jax.Array, jax.Array]:
  """The SAE's reconstruction of `x` in the activations' space, and its latents.

  Args:
    params: the SAE's parameters.
    x: (n, d) activations.
    spec: the SAE.

  Returns:
    ((n, d) reconstructions, (n, m) latents).
  """
  latents = encode(params, x, spec)[0]
  _, scale, shift = normalised(x, spec)
  return decode(params, latents) * scale + shift, latents


def normalized_mse(reconstruction: jax.Array, target: jax.Array) -> jax.Array:
  """MSE over the MSE of predicting each feature's batch mean (OpenAI's
  `kernels.normalized_mse`): 1 - the fraction of variance explained.

  Args:
    reconstruction: (n, d).
    target: (n, d).

  Returns:
    The scalar.
  """
  return (jnp.mean((reconstruction - target) ** 2) /
          jnp.mean((jnp.mean(target, axis=0) - target) ** 2))


def loss(params: Params, x: jax.Array, spec: Spec, dead: jax.Array,
         mse_scale: float = 1.) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """The training loss of `spec.architecture`, as its authors' code computes it.

  Args:
    params: the SAE's parameters.
    x: (n, d) activations.
    spec: the SAE.
    dead: (m,) bool, the latents dead so far (AuxK).
    mse_scale: 'topk': 1 / the activations' mean squared deviation from their mean.

  Returns:
    (the loss, its parts: 'mse', 'aux', 'l1').
  """
  latents, pre = encode(params, x, spec)
  recon = decode(params, latents)
  zero = jnp.zeros(())
  kept = min(spec.aux_k, spec.width)
  if spec.architecture == 'topk':
    residual = x - jax.lax.stop_gradient(recon) + jax.lax.stop_gradient(params['b_dec'])

    def aux_of(aux_pre):  # the live latents' pre-activations zeroed, as `auxk_mask_fn`
      return decode(params, jax.nn.relu(_keep_top(aux_pre, kept)))

    # Without dead latents every kept value is 0 and the AuxK reconstruction is b_dec.
    aux = jax.lax.cond(jnp.any(dead), aux_of, lambda _: jnp.broadcast_to(
        params['b_dec'], x.shape), pre * dead)
    aux_loss = jnp.nan_to_num(normalized_mse(aux, residual))
    parts = {'mse': mse_scale * jnp.mean((recon - x) ** 2), 'aux': spec.aux_coef * aux_loss,
             'l1': zero}
  elif spec.architecture == 'batch_topk':

    def aux_loss_of(acts):
      aux_acts = jnp.where(dead, _keep_top(jnp.where(dead, acts, -jnp.inf), kept), 0.)
      return jnp.mean((aux_acts @ params['W_dec'] - (x - recon)) ** 2)

    aux_loss = jax.lax.cond(jnp.any(dead), aux_loss_of, lambda _: zero, pre)
    parts = {'mse': jnp.mean((recon - x) ** 2), 'aux': spec.aux_coef * aux_loss, 'l1': zero}
  else:
    weighted = latents * jnp.linalg.norm(params['W_dec'], axis=1)
    parts = {'mse': jnp.mean(jnp.sum((recon - x) ** 2, axis=-1)), 'aux': zero,
             'l1': spec.l1 * jnp.mean(jnp.sum(jnp.abs(weighted), axis=-1))}
  return parts['mse'] + parts['aux'] + parts['l1'], parts


def unit_norm_decoder(params: Params, grads: Params) -> Tuple[Params, Params]:
  """The decoder's rows renormalised to unit length and the gradient's component
  along each row removed, as both TopK codes do before each step.

  Args:
    params: the SAE's parameters.
    grads: their gradients.

  Returns:
    (params, grads) with W_dec constrained.
  """
  rows = params['W_dec'] / jnp.linalg.norm(params['W_dec'], axis=1, keepdims=True)
  along = jnp.sum(grads['W_dec'] * rows, axis=1, keepdims=True) * rows
  return {**params, 'W_dec': rows}, {**grads, 'W_dec': grads['W_dec'] - along}


def steps_since_fired(latents: jax.Array, since: jax.Array, spec: Spec
                      ) -> Tuple[jax.Array, jax.Array]:
  """Each latent's count of steps without firing, after this step's latents, and
  which are dead, by the authors' rules: OpenAI's `stats_last_nonzero` (1 on the
  step a latent fires above `FIRING`, dead beyond `dead_steps`), Bussmann et al.'s
  `num_batches_not_active` (0 on a step it is positive, dead from `dead_steps` on).

  Args:
    latents: (n, m) this step's latents.
    since: (m,) the counts before it.
    spec: the SAE.

  Returns:
    (the counts, (m,) bool dead).
  """
  if spec.architecture == 'batch_topk':
    since = jnp.where(jnp.sum(latents, axis=0) > 0, 0, since + 1)
    return since, since >= spec.dead_steps
  since = jnp.where(jnp.any(latents > FIRING, axis=0), 1, since + 1)
  return since, since > spec.dead_steps


@dataclasses.dataclass
class Trained:
  """An SAE after training, and what its training saw."""
  spec: Spec
  params: Params
  losses: np.ndarray  # the loss of each step
  steps_since_fired: np.ndarray  # per latent, at the end


def train(key: jax.Array, batches: Iterable[np.ndarray], spec: Spec) -> Trained:
  """Trains an SAE on batches of activations with optax's Adam.

  The decoder starts unit-norm; for 'topk' the pre-encoder bias b_dec starts at
  the first batch's coordinate-wise median (OpenAI start from the geometric
  median, of which this is the per-coordinate form) and `mse_scale` is the
  inverse of the first batch's mean squared deviation from its mean.

  Args:
    key: the random key of the initial parameters.
    batches: (batch, d) arrays of activations, as many as steps.
    spec: the SAE.

  Returns:
    The trained SAE.
  """
  if (spec.encoder, spec.normalisation) != ('authors', 'none'):
    raise ValueError(f'An SAE with encoder {spec.encoder!r} and normalisation '
                     f'{spec.normalisation!r} is read from its authors\' files, not trained here: '
                     'train with the authors\' encoder and no normalisation.')
  batches = iter(batches)
  first = jnp.asarray(next(batches), jnp.float32)
  params = init(key, first.shape[1], spec)
  mse_scale = 1.
  if spec.architecture == 'topk':
    params['b_dec'] = jnp.median(first, axis=0)
    mse_scale = float(1. / jnp.mean((jnp.mean(first, axis=0) - first) ** 2))
  optimiser = optax.adam(spec.lr, b1=spec.b1, b2=spec.b2, eps=spec.eps)
  state = optimiser.init(params)
  constrained = spec.architecture != 'relu_l1'

  @jax.jit
  def step(params, state, since, x):
    # The latents of this step count before its loss reads the dead ones, as OpenAI's
    # forward pass updates `stats_last_nonzero` before its AuxK.
    since, dead = steps_since_fired(encode(params, x, spec)[0], since, spec)
    (value, _), grads = jax.value_and_grad(loss, has_aux=True)(params, x, spec, dead, mse_scale)
    if constrained:
      params, grads = unit_norm_decoder(params, grads)
    updates, state = optimiser.update(grads, state, params)
    return optax.apply_updates(params, updates), state, since, value

  since = jnp.zeros(spec.width, jnp.int32)
  losses = []
  for x in [first] + [jnp.asarray(b, jnp.float32) for b in batches]:
    params, state, since, value = step(params, state, since, x)
    losses.append(float(value))
  return Trained(spec, params, np.array(losses), np.asarray(since))


def quality(params: Params, x: jax.Array, spec: Spec, dense_share: float = 0.1
            ) -> Dict[str, float]:
  """What every SAE paper reports of a dictionary on held-out activations.

  Args:
    params: the SAE's parameters.
    x: (n, d) activations it was not trained on.
    spec: the SAE.
    dense_share: a latent firing on more than this share of the inputs is dense.

  Returns:
    'fve' (fraction of variance explained, 1 - `normalized_mse`), 'normalized_mse',
    'l0' (latents firing per input), 'dead' and 'dense' (shares of the latents that
    fire on no input and on more than `dense_share` of them).
  """
  recon, latents = reconstruct(params, x, spec)
  nmse = float(normalized_mse(recon, x))
  fires = np.asarray(latents > FIRING)
  rate = fires.mean(axis=0)
  return {'fve': 1. - nmse, 'normalized_mse': nmse, 'l0': float(fires.sum(axis=1).mean()),
          'dead': float(np.mean(rate == 0)), 'dense': float(np.mean(rate > dense_share))}


def steered(x: jax.Array, latents: jax.Array, params: Params, latent: int, scale: float,
            spec: Spec) -> jax.Array:
  """Activations with one latent's contribution multiplied by `scale`:
  x + (scale - 1) a_j W_dec[j] s, with a_j the latent's activation on each input
  and s the scale that maps a reconstruction back to the activations' space
  (`normalised`; 1 without normalisation). 0 ablates the feature, 2 doubles it
  (steering); the rest of each activation, the SAE's reconstruction error
  included, is kept, so `scale` 1 gives `x` back.

  Args:
    x: (n, d) activations.
    latents: (n, m) their latents (`encode`).
    params: the SAE's parameters.
    latent: j, the latent.
    scale: what its contribution is multiplied by.
    spec: the SAE.

  Returns:
    The (n, d) edited activations.
  """
  back = normalised(x, spec)[1]
  return x + (scale - 1.) * latents[:, latent:latent + 1] * params['W_dec'][latent] * back


def class_selectivity(class_means: np.ndarray) -> float:
  """The class selectivity index (mu_max - mu_rest) / (mu_max + mu_rest) of Morcos et
  al. 2018 ("On the importance of single directions for generalization"): mu_max
  the largest of a unit's class-conditional means, mu_rest the mean of the others;
  0 for a unit equally active on every class, 1 for one active on a single class.

  Args:
    class_means: (classes,) non-negative class-conditional means.

  Returns:
    The index; 0 where every mean is 0.
  """
  means = np.asarray(class_means, np.float64)
  top = int(np.argmax(means))
  rest = np.delete(means, top).mean()
  total = means[top] + rest
  return float((means[top] - rest) / total) if total > 0 else 0.
