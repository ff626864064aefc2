"""A sparse autoencoder on one residual-stream entry of a model
(`analysis.measures.sparse_autoencoder`): trained on the training split's spatial
tokens, judged on the evaluation split's by what SAE papers report, with the
model's loss when the reconstruction replaces the site, and the images its most
used latents fire on."""
import dataclasses
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from analysis.measures import sparse_autoencoder, uncertainty
from analysis.reporting import plots
from analysis.runtime import features, progress, sae_files
from analysis.runtime.estimate import Amounts, Work
from analysis.tool import Batches, Kept, Subject, Tool, each_model, figure_path, register
from analysis.tool_options import Budget, option
from vit_jax.errors import ConfigError
from vit_jax.models.family import SCALES, SHIFTS

SHOWN_IMAGES = 4  # top images drawn per studied latent
SPLICES = ('clean', 'spliced', 'zero_ablated')  # the site as it is, reconstructed, zeroed
ENCODE_CHUNK = 4096  # training tokens encoded at a time, for the latents' firing rates


@dataclasses.dataclass(frozen=True)
class Options:
  """The SAE and its training."""
  sae_architecture: str = option(
      'topk', 'The SAE, as its authors define it: topk (Gao et al. 2024), batch_topk (Bussmann '
      'et al. 2024) or relu_l1 (SAELens\' standard SAE).',
      choices=sparse_autoencoder.ARCHITECTURES)
  sae_expansion: int = option(8, 'Latents per dimension of the site\'s activations.', least=1)
  sae_k: int = option(32, 'Latents kept per token (topk; batch_topk on average).', least=1)
  sae_steps: int = option(1000, 'Training steps of --sae_batch tokens drawn from the '
                          'training split\'s.', least=1, budget=Budget(minimum=200, order=1))
  sae_batch: int = option(256, 'Tokens per training step (the authors train on GPUs with '
                          'thousands; a CPU takes a step of 256 in milliseconds).', least=1)
  sae_site: str = option('', 'The residual-stream entry, by its label in the report '
                         '(e.g. block1/+mlp); empty: the middle one.')
  sae_features: int = option(4, 'Latents studied (the most often firing ones on the training '
                             'tokens that are not dense): their top images, and what '
                             'scaling their contribution at the site does to each class\'s '
                             'logit and to accuracy.', least=0)
  sae_feature_scale: float = option(0., 'What each studied latent\'s contribution at the site '
                                    'is multiplied by: 0 ablates it, 2 doubles it (steering).')
  sae_format: str = option('npz', 'The dictionary\'s file: npz, or safetensors (its spec and '
                           'site in the header, for PyTorch code).',
                           choices=sae_files.FORMATS)
  sae_load: str = option('', 'A trained dictionary to measure instead of training one: this '
                         'tool\'s .npz or .safetensors, saev\'s file or ViT-Prisma\'s .pt (its '
                         'config.json beside it), read with the forward pass of the code that '
                         'wrote it; its site is the file\'s where it names one (a different '
                         '--sae_site is refused), else --sae_site.')

  def __post_init__(self):
    if self.sae_load:  # read once here, so a bad file is named before any tool runs
      if not os.path.isfile(self.sae_load):
        raise ConfigError(f'--sae_load={self.sae_load}: no such file.')
      try:
        sae_files.read(self.sae_load)
      except (ValueError, OSError, RuntimeError) as error:
        raise ConfigError(f'--sae_load: {error}') from None


def site_of(subject: Subject, options: Options, about: Optional[Dict[str, str]] = None
            ) -> Tuple[str, str]:
  """(label, sown name) of the stream entry the SAE reads.

  Args:
    subject: the model.
    options: the tool's options.
    about: what a loaded dictionary's file says of it (`sae_files.read`).

  Returns:
    The site: the loaded file's where it names one, else --sae_site, else the
    middle entry.

  Raises:
    ConfigError: a --sae_site the model does not have, naming those it has; a
      --sae_site other than the site the loaded file names; or a loaded
      dictionary trained on no residual-stream entry, without --sae_site.
  """
  labels = list(subject.layers.labels)
  about = about or {}
  if options.sae_site and about.get('site') and options.sae_site != about['site']:
    raise ConfigError(f'--sae_site={options.sae_site}, but {options.sae_load} was trained on '
                      f'{about["site"]} ({about.get("hook_point") or "its file says so"}): '
                      'leave --sae_site out to apply it where it was trained.')
  if not options.sae_site and about.get('hook_point') and 'site' not in about:
    raise ConfigError(f'{options.sae_load} was trained on {about["hook_point"]}, which is no '
                      'residual-stream entry: give --sae_site to apply it to one anyway.')
  label = options.sae_site or about.get('site') or labels[len(labels) // 2]
  if label not in labels:
    raise ConfigError(f'--sae_site={label} is not a residual-stream entry of {subject.label}; '
                      f'its entries: {", ".join(labels)}.')
  return label, subject.layers.stream[labels.index(label)]


def spec_of(options: Options, width: int) -> sparse_autoencoder.Spec:
  """The SAE the options ask for on activations `width` wide, with its authors'
  optimiser settings.

  Args:
    options: the tool's options.
    width: the site's activation width.

  Returns:
    The spec.

  Raises:
    ConfigError: a topk or batch_topk SAE asked to keep as many latents as it has
      or more, which would keep every latent: no sparsity.
  """
  latents = options.sae_expansion * width
  if options.sae_architecture != 'relu_l1' and options.sae_k >= latents:
    raise ConfigError(f'--sae_k={options.sae_k} keeps every one of the {latents} latents '
                      f'(--sae_expansion={options.sae_expansion} times the site\'s {width} '
                      'dimensions): no sparsity. Give a smaller --sae_k or a larger '
                      '--sae_expansion.')
  return sparse_autoencoder.authors_spec(options.sae_architecture, latents, k=options.sae_k)


def _tokens(subject: Subject, name: str, images: np.ndarray) -> Tuple[np.ndarray, jax.Array]:
  """The spatial tokens (B * h * w, D) of the site on a batch, and the sown value."""
  value = subject.intermediates(images, [name])[name]
  grid = np.asarray(features.spatial_map(subject, value), np.float32)
  return grid.reshape(-1, grid.shape[-1]), value


def _spliced(value: jax.Array, tokens: np.ndarray, has_cls: bool, registers: int
             ) -> Dict[str, object]:
  """The `scales` and `shifts` of one site that put `tokens` (the spatial tokens, in
  `_tokens`' order) in place of the spatial tokens of `value`, the class token and
  registers kept."""
  if value.ndim == 4:  # a map: every position is spatial
    return {'scale': np.float32(0.), 'shift': tokens.reshape(value.shape)}
  first = int(has_cls) + registers
  scale = np.ones((1, value.shape[1], 1), np.float32)
  scale[:, first:] = 0.
  shift = np.zeros(value.shape, np.float32)
  shift[:, first:] = tokens.reshape(value.shape[0], -1, value.shape[2])
  return {'scale': scale, 'shift': shift}


def _edits(name: str, scale, shift) -> Dict[str, object]:
  key = tuple(name.split('/'))
  unflatten = flax.traverse_util.unflatten_dict
  return {SCALES: unflatten({key: scale}), SHIFTS: unflatten({key: shift})}


def measure(subject: Subject, batches: Batches, options: Options = Options()) -> Dict:
  """Trains the SAE on the training split's tokens at the site, then measures it on
  the evaluation split's.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    options: the tool's options.

  Returns:
    The model's JSON but its figures (`draw`'s), with what they show: each latent's
    firing rate on the evaluation tokens, the studied latents' activations where
    they fire (binned, `plots.bin_counts`) and their top images (8-bit) with each
    token's activation. A dictionary trained here is its `dictionary`, a
    `tool.Kept` file that `Tool.run_one` writes beside the JSON.
  """
  loaded = sae_files.read(options.sae_load) if options.sae_load else None
  label, name = site_of(subject, options, loaded[2] if loaded else None)
  pool = np.concatenate([_tokens(subject, name, images)[0] for images, _ in batches('train')])
  trained, params, spec = _dictionary(subject, options, loaded, label, pool)
  encode = jax.jit(lambda x: sparse_autoencoder.encode(params, x, spec)[0])
  fired = sum(np.asarray(encode(jnp.asarray(pool[i:i + ENCODE_CHUNK])) > sparse_autoencoder.FIRING
                         ).sum(axis=0) for i in range(0, len(pool), ENCODE_CHUNK))
  studied = _studied_latents(fired / len(pool), options.sae_features)
  seen = _evaluation(subject, batches, name, params, spec, studied, options)
  quality = sparse_autoencoder.quality(params, jnp.asarray(seen['tokens']), spec)
  labels, logits = seen['labels'], seen['logits']
  loss = {kind: float(np.mean(optax.softmax_cross_entropy_with_integer_labels(v, labels)))
          for kind, v in logits.items()}
  accuracy = {kind: float(np.mean(np.argmax(v, -1) == labels)) for kind, v in logits.items()}
  # SAELens' "CE loss score": the share of the loss the zero ablation adds that the
  # reconstruction takes back.
  # Undefined where the ablation leaves the loss as it is (nothing to take back).
  added = loss['zero_ablated'] - loss['clean'] if logits else 0.
  recovered = (loss['zero_ablated'] - loss['spliced']) / added if added else None
  latents = seen['latents']
  per_image = latents.reshape(len(labels), -1, latents.shape[1]).mean(axis=1)
  effects = [_effects(latent, logits['clean'], seen['steered'][latent], labels,
                      per_image[:, latent]) for latent in studied if logits]
  about = {'site': label, 'sown': name, 'model': subject.config.name, 'normalisation': 'none'}
  dictionary = (os.path.basename(options.sae_load) if loaded else Kept(
      f'sae_{subject.label}.{options.sae_format}',
      lambda path: sae_files.save(path, trained, about)))
  return {'site': label, 'architecture': spec.architecture, 'latents': spec.width, 'k': spec.k,
          **({} if loaded else {'trained_architecture': spec.architecture}),
          'encoder': spec.encoder, 'normalisation': spec.normalisation,
          'source': loaded[2].get('source', 'this project') if loaded else 'trained here',
          'steps': 0 if loaded else options.sae_steps, 'training_tokens': int(len(pool)),
          'evaluation_tokens': int(len(seen['tokens'])), **quality,
          'loss': loss, 'accuracy': accuracy, 'loss_recovered': recovered,
          'feature_scale': options.sae_feature_scale,
          'features': effects, 'dictionary': dictionary, **_shown(seen, studied)}


def _dictionary(subject: Subject, options: Options,
                loaded: Optional[Tuple[Dict, sparse_autoencoder.Spec, Dict]], label: str,
                pool: np.ndarray) -> Tuple[Optional[sparse_autoencoder.Trained], Dict,
                                           sparse_autoencoder.Spec]:
  """The dictionary: the file's (its width checked against the site's tokens), or
  one trained here on `pool`, the training split's tokens. Returns (the trained
  SAE or None, its parameters, its spec)."""
  if loaded:
    params, spec, _ = loaded
    if params['W_enc'].shape[0] != pool.shape[1]:
      raise ConfigError(f'{options.sae_load} reads activations {params["W_enc"].shape[0]} wide; '
                        f'{label} of {subject.label} is {pool.shape[1]} wide: give the model it '
                        'was trained on, or its site with --sae_site.')
    return None, params, spec
  spec = spec_of(options, pool.shape[1])
  rng = np.random.default_rng(0)
  done = progress.Progress(f'sae {subject.label}', options.sae_steps, 'training steps')

  def draws():
    for _ in range(options.sae_steps):
      yield pool[rng.integers(0, len(pool), options.sae_batch)]
      done.advance()  # as the next step asks for its tokens
  trained = sparse_autoencoder.train(jax.random.PRNGKey(0), draws(), spec)
  return trained, trained.params, spec


def _evaluation(subject: Subject, batches: Batches, name: str, params: Dict,
                spec: sparse_autoencoder.Spec, studied: Sequence[int], options: Options
                ) -> Dict[str, Any]:
  """The evaluation split through the dictionary: its tokens and latents, images and
  labels, and, for a model with a head, the logits clean, with the reconstruction
  spliced in and with the site zero-ablated (`SPLICES`), and with each studied
  latent scaled by `sae_feature_scale`."""
  reconstruct = jax.jit(lambda x: sparse_autoencoder.reconstruct(params, x, spec))
  head = bool(subject.config.num_classes)  # a headless model: no loss, no logit effects
  held, images_seen, labels_seen = [], [], []
  outputs = {kind: [] for kind in SPLICES} if head else {}
  steered = {latent: [] for latent in studied} if head else {}
  for images, labels in batches('eval'):
    tokens, value = _tokens(subject, name, images)
    recon, latents = reconstruct(jnp.asarray(tokens))
    held.append((tokens, np.asarray(latents)))
    images_seen.append(images)
    labels_seen.append(np.asarray(labels))
    if not head:
      continue
    spliced = _spliced(value, np.asarray(recon), subject.has_cls, subject.registers)
    for kind, logits in zip(SPLICES, (subject.logits(images), subject.edited_logits(
        images, _edits(name, **spliced)), subject.edited_logits(images, _edits(
            name, spliced['scale'], np.zeros_like(spliced['shift']))))):
      outputs[kind].append(np.asarray(logits))
    for latent in studied:
      edited = sparse_autoencoder.steered(jnp.asarray(tokens), latents, params, latent,
                                          options.sae_feature_scale, spec)
      steered[latent].append(np.asarray(subject.edited_logits(images, _edits(
          name, **_spliced(value, np.asarray(edited), subject.has_cls, subject.registers)))))
  return {'tokens': np.concatenate([t for t, _ in held]),
          'latents': np.concatenate([lat for _, lat in held]),
          'images': np.concatenate(images_seen), 'labels': np.concatenate(labels_seen),
          'logits': {kind: np.concatenate(v) for kind, v in outputs.items()},
          'steered': {latent: np.concatenate(v) for latent, v in steered.items()}}


def _shown(seen: Dict[str, Any], studied: Sequence[int]) -> Dict[str, Any]:
  """What `draw` shows beyond the numbers: each latent's firing rate, the studied
  latents' activations where they fire (binned on shared bins) and, per studied
  latent, the `SHOWN_IMAGES` evaluation images it fires on most (8-bit, RGB) with
  its activation per token (spatial positions, row by row)."""
  latents = seen['latents']
  shown = {'firing_rate': np.float32((latents > sparse_autoencoder.FIRING).mean(axis=0)).tolist()}
  firing = {f'latent {j}': latents[latents[:, j] > sparse_autoencoder.FIRING, j]
            for j in studied}
  if any(len(v) for v in firing.values()):
    shown['activation_histogram'] = plots.bin_counts(firing)
  per_image = latents.reshape(len(seen['images']), -1, latents.shape[1])
  shown['top_images'] = []
  for latent in studied:
    strength = per_image[:, :, latent]
    for i in np.argsort(-strength.max(axis=1), kind='stable')[:SHOWN_IMAGES]:
      picture = (np.asarray(seen['images'][i], np.float64) + 1) / 2
      if picture.shape[-1] == 1:
        picture = np.repeat(picture, 3, axis=-1)
      shown['top_images'].append({
          'latent': latent,
          'image': np.round(np.clip(picture, 0, 1) * 255).astype(np.uint8).tolist(),
          'activation': np.float32(strength[i] / max(strength.max(), 1e-12)).tolist()})
  return shown


def draw(entry: Mapping, subject: Subject, out: str, options: Options) -> List[str]:
  """The figures of one model's numbers (`measure`): the latents' firing rates, the
  studied latents' top images (the tokens each fires on tinted red by its
  activation) and activations, and their effects on the class logits.

  See `analysis.tool.Draw`.
  """
  label, site = subject.label, entry['site']
  rate = np.asarray(entry['firing_rate'])
  figures = [plots.histogram(
      np.log10(rate[rate > 0]), figure_path(out, 'sae_frequency', subject),
      f'SAE latents\' firing rate at {site}: {label}', 'log10 share of tokens fired on',
      logy=True, marks=[(np.log10(0.1), 'dense (10%)')])]
  if entry['top_images']:
    figures.append(_top_images(entry['top_images'], figure_path(out, 'sae_top_images', subject),
                               f'Top images of SAE latents at {site}: {label}'))
  if 'activation_histogram' in entry:
    figures.append(plots.binned(
        entry['activation_histogram']['counts'], entry['activation_histogram']['edges'],
        figure_path(out, 'sae_activations', subject),
        f'SAE latents\' activations at {site}: {label}', 'activation where the latent fires',
        logy=True))
  effects = entry['features']
  if effects:
    figures.append(plots.heatmap(
        np.array([e['logit_change'] for e in effects]), figure_path(out, 'sae_effects', subject),
        f'Class logits with SAE latents x{entry["feature_scale"]:g} at {site}: {label}',
        'class', 'latent', vmin=None, vmax=None,
        ylabels=[f'latent {e["latent"]}' for e in effects],
        colorbar_label='mean change of the logit'))
  return figures


def _studied_latents(rate: np.ndarray, count: int) -> List[int]:
  """The `count` most often firing latents that are not dense, most first."""
  usable = np.flatnonzero((rate > 0) & (rate <= 0.1))
  return [int(i) for i in usable[np.argsort(-rate[usable], kind='stable')][:count]]


def _effects(latent: int, clean: np.ndarray, edited: np.ndarray, labels: np.ndarray,
             activation: np.ndarray) -> Dict[str, object]:
  """What scaling one latent's contribution did, over the evaluation images.

  Args:
    latent: the latent.
    clean: (n, classes) the model's logits.
    edited: (n, classes) its logits with the latent's contribution scaled.
    labels: (n,) the images' labels.
    activation: (n,) the latent's mean activation over each image's tokens.

  Returns:
    The latent's entry of the JSON: each class's mean logit change and its standard
    error over the images, the accuracy drop (paired, with its standard error), the
    class selectivity of its activation (Morcos et al. 2018) and of its effect (the
    same index on each class's mean |change of its own logit| on its images), each
    with a bootstrap standard error over the images and the class it picks.
  """
  n, classes = clean.shape
  change = edited - clean
  correct = np.stack([clean.argmax(-1) == labels, edited.argmax(-1) == labels]).astype(float)
  drop, drop_se = uncertainty.paired_drops(correct)
  own = np.abs(change[np.arange(n), labels])

  def per_class(values: np.ndarray, draw: np.ndarray) -> np.ndarray:
    """Each class's mean of `values` over the drawn images of that class present."""
    counts = np.bincount(labels[draw], minlength=classes)
    sums = np.bincount(labels[draw], weights=values[draw], minlength=classes)
    return sums[counts > 0] / counts[counts > 0]

  everything, present = np.arange(n), np.flatnonzero(np.bincount(labels, minlength=classes))
  result = {'latent': latent, 'logit_change': change.mean(axis=0).tolist(),
            'logit_change_stderr': (change.std(axis=0, ddof=1) / np.sqrt(n)).tolist()
            if n > 1 else [None] * classes,
            'accuracy_drop': float(drop[0]), 'accuracy_drop_stderr': float(drop_se[0])}
  for key, values, picked in (('activation_selectivity', activation, 'preferred_class'),
                              ('effect_selectivity', own, 'most_affected_class')):
    result[key] = sparse_autoencoder.class_selectivity(per_class(values, everything))
    result[f'{key}_stderr'] = float(uncertainty.bootstrap_stderr(
        lambda draw: sparse_autoencoder.class_selectivity(per_class(values, draw)), n))
    result[picked] = int(present[np.argmax(per_class(values, everything))])
  return result


def _top_images(tiles: Sequence[Mapping], path: str, title: str) -> str:
  """The top images (`_shown`'s), the tokens each latent fires on tinted red by its
  activation, `SHOWN_IMAGES` to a row."""
  tinted = []
  for tile in tiles:
    picture = np.asarray(tile['image'], np.float64) / 255
    activation = np.asarray(tile['activation'])
    side = int(round(np.sqrt(len(activation))))
    heat = np.kron(activation.reshape(side, side),
                   np.ones((picture.shape[0] // side, picture.shape[1] // side)))
    picture[:heat.shape[0], :heat.shape[1], 0] = np.maximum(
        picture[:heat.shape[0], :heat.shape[1], 0], heat)
    tinted.append(np.clip(picture, 0, 1))
  return plots.image_grid(np.stack(tinted), path, title, cols=SHOWN_IMAGES,
                          labels=[f'latent {tile["latent"]}' for tile in tiles])


def _findings(label, r, q):
  source = r.get('source', 'trained here')
  read = '' if source in ('trained here', 'this project') else f' read from {source}\'s file'
  return [f'{label}: at {r["site"]}, a {r["architecture"]} SAE of {r["latents"]} latents{read} '
          'explains ', q('fve'), ' of the held-out tokens\' variance with L0 ', q('l0'), '; ',
          q('dead'), ' of its latents are dead and ', q('dense'), ' dense'] + ([
              '; spliced in, it recovers ', q('loss_recovered'), ' of the loss a zero '
              'ablation adds (loss ', q('loss', 'clean'), ' clean, ', q('loss', 'spliced'),
              ' spliced, ', q('loss', 'zero_ablated'), ' ablated)'] if r['loss'] else [
              '; the model has no classifier head, so no loss is spliced']) + (r['features'] and [
              f'; its latent {r["features"][0]["latent"]} (the most used one that is not '
              f'dense) times {r["feature_scale"]:g} changes accuracy by minus ',
              q('features', 0, 'accuracy_drop'), ', with a class selectivity of ',
              q('features', 0, 'activation_selectivity'), ' in its activation (class ',
              f'{r["features"][0]["preferred_class"]}) and of ',
              q('features', 0, 'effect_selectivity'), ' in its effect (class '
              f'{r["features"][0]["most_affected_class"]})'])


def work(subject: Subject, options: Options, amounts: Amounts) -> Work:
  """A pass reading the site over the training and the evaluation split, a clean and
  two edited passes over the evaluation split, one more for each studied latent, and
  the SAE's training steps.

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  return Work({'forward': (5 + options.sae_features) * amounts.batches}, {'forward': 3},
              host={SAE_STEP: 0 if options.sae_load else options.sae_steps})


SAE_STEP = 'SAE training step'
TIMED_STEPS = 20


def host_prices(subject: Subject, images: np.ndarray, labels: np.ndarray, options: Options,
                amounts: Amounts) -> Dict[str, float]:
  """Seconds of one SAE training step at the site's width, timed over `TIMED_STEPS`
  steps after a first (compiled) one.

  Args:
    subject: the model.
    images: one evaluation batch of images.
    labels: their labels.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    Seconds per unit, by the unit's name.
  """
  if options.sae_load:  # nothing to train
    return {SAE_STEP: 0.}
  _, name = site_of(subject, options)
  tokens, _ = _tokens(subject, name, images)
  spec = spec_of(options, tokens.shape[1])
  rng = np.random.default_rng(0)
  draw = lambda: tokens[rng.integers(0, len(tokens), options.sae_batch)]
  sparse_autoencoder.train(jax.random.PRNGKey(0), [draw(), draw()], spec)
  start = time.perf_counter()
  sparse_autoencoder.train(jax.random.PRNGKey(0), [draw() for _ in range(TIMED_STEPS)], spec)
  return {SAE_STEP: (time.perf_counter() - start) / TIMED_STEPS}


TOOL = register(Tool(
    name='sae', importance=20, title='Sparse autoencoder', splits=('train', 'eval'),
    quantity='A sparse autoencoder (TopK of Gao et al. 2024 by default; BatchTopK or SAELens\' '
             'ReLU + L1 as options, each with its authors\' loss) trained on the spatial tokens '
             'of one residual-stream entry (the middle one by default) over the training '
             'images; on the evaluation images: the fraction of variance explained, L0, dead '
             'and dense (firing on more than 10% of tokens) latents, and the loss with the '
             'reconstruction spliced in against the clean model and the zero-ablated site '
             '(loss recovered, SAELens\' CE loss score).',
    paper='Not from the two papers: the tool interpretability work on vision models uses '
          'since 2024 (OpenAI\'s TopK SAEs, SAELens, saev), on the same sites.',
    run=measure, draw=draw, options=Options, findings=each_model(_findings),
    work=work, host_prices=host_prices, shortened_by=('sae_steps',),
    minimum='200 training steps'))
