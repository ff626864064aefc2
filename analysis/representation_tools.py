"""The representation tools of Raghu et al. 2021 and the ViT paper, run on zoo models
over a dataset: each returns the numbers behind its figures and writes the figures.

A `Batches` callable gives a fresh iterator of (images, labels) for 'train' or
'eval', so a tool streams a dataset without holding it in memory.
"""
import os
from typing import Callable, Dict, Iterator, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from analysis import attention, cka, embeddings, erf, features, plots, probes, skip

Batches = Callable[[str], Iterator[Tuple[np.ndarray, np.ndarray]]]
Subject = features.Subject


def figure_path(out: str, tool: str, subject: Subject) -> str:
  """Where a tool writes its figure of one subject."""
  return os.path.join(out, f'{tool}_{subject.label}.png')


def _batch_mean(batches: Iterator, fn: Callable[[np.ndarray, np.ndarray], jax.Array]
                ) -> np.ndarray:
  """Mean of fn(images, labels) over batches, weighted by batch size."""
  total, count = 0., 0
  for images, labels in batches:
    total = total + np.asarray(fn(images, labels), np.float64) * len(images)
    count += len(images)
  return total / count


def run_cka(subjects: Sequence[Subject], batches: Batches, out: str,
            unbiased: bool = True) -> Dict:
  """All-pairs minibatch linear CKA of every subject's residual stream, within and
  across models, in one pass over the evaluation split."""
  names = [s.layers.stream for s in subjects]
  stream = cka.MinibatchCKA('linear', unbiased=unbiased)
  for images, _ in batches('eval'):
    stream.update(features.layer_representations(subjects, names, images))
  matrix = stream.result()
  result = {'layers': {s.label: list(s.layers.labels) for s in subjects},
            'num_examples': stream.num_examples, 'unbiased': unbiased, 'cka': {},
            'figures': []}
  bounds = np.cumsum([0] + [len(n) for n in names])
  for i, a in enumerate(subjects):
    for j, b in enumerate(subjects[i:], start=i):
      block = matrix[bounds[i]:bounds[i + 1], bounds[j]:bounds[j + 1]]
      key = a.label if i == j else f'{a.label} vs {b.label}'
      result['cka'][key] = block.tolist()
      result['figures'].append(plots.heatmap(
          block.T, os.path.join(out, f'cka_{a.label}_{b.label}.png'), f'CKA: {key}',
          f'{a.label} layer', f'{b.label} layer', xlabels=a.layers.labels,
          ylabels=b.layers.labels))
  return result


def run_attention_distance(subject: Subject, batches: Batches, out: str) -> Dict:
  """Mean attention distance in pixels per layer and head, averaged over images:
  spatial queries, the class-token key dropped and the rest renormalised; for
  class-token models also with that key kept as it is (weight at distance 0)."""
  names = features.attention_names(subject)
  grid, pixels = subject.token_grid()
  variants = (False, True) if subject.has_cls else (False,)

  def per_layer(images, _):
    inter = subject.intermediates(images, names)
    return jnp.stack([jnp.stack([attention.mean_attention_distance(
        inter[n], grid, pixels, subject.has_cls, keep) for n in names]) for keep in variants])

  distances = _batch_mean(batches('eval'), per_layer)
  figure = plots.scatter_by_layer(distances[0], figure_path(out, 'attention_distance', subject),
                                  f'Mean attention distance: {subject.label}', 'pixels')
  result = {'distance_per_layer_head': distances[0].tolist(), 'pixels_per_token': pixels,
            'figures': [figure]}
  if subject.has_cls:
    result['distance_with_class_key_per_layer_head'] = distances[1].tolist()
  return result


def run_norm_ratio(subject: Subject, batches: Batches, out: str) -> Dict:
  """||z|| / ||f(z)|| for every residual branch, class token apart from the rest."""
  rows = subject.layers.branches
  names = sorted({n for row in rows for n in (row.skip, row.output)})
  kinds = ('cls', 'spatial') if subject.has_cls else ('spatial',)

  def ratios(images, _):
    inter = subject.intermediates(images, names)
    values = [skip.token_norm_ratios(inter[row.skip], inter[row.output], subject.has_cls)
              for row in rows]
    return jnp.array([[v[k] for k in kinds] for v in values])

  table = _batch_mean(batches('eval'), ratios)
  result = {row.label: dict(zip(kinds, map(float, values))) for row, values in zip(rows, table)}
  # One curve per kind of branch and token, each over the branches of that kind in depth
  # order, at their positions among all branches.
  series, x = {}, {}
  for branch in dict.fromkeys(row.kind for row in rows):
    where = [i for i, row in enumerate(rows) if row.kind == branch]
    for k, kind in enumerate(kinds):
      series[f'{branch} ({kind})'], x[f'{branch} ({kind})'] = table[where, k], where
  figure = plots.curves(series, figure_path(out, 'norm_ratio', subject),
                        f'||z|| / ||f(z)||: {subject.label}', 'residual branch', 'ratio',
                        x=x, logy=True, decades=3, xlabels=[row.label for row in rows])
  return {'ratios': result, 'figures': [figure]}


def run_erf(subject: Subject, batches: Batches, out: str, num_images: int = 32) -> Dict:
  """Effective receptive field of the centre location of every block output."""
  images = np.concatenate([b for b, _ in _take(batches('eval'), num_images)])[:num_images]
  names = subject.layers.stream
  fields = []
  for name in names:
    feature_fn = lambda x, name=name: features.spatial_map(
        subject, subject.intermediates(x, [name])[name])
    fields.append(np.asarray(erf.effective_receptive_field(jax.jit(feature_fn), images)))
  # Area (in pixels) holding half of the total gradient mass: one number per layer.
  half_mass = [int(np.searchsorted(np.cumsum(np.sort(f.ravel())[::-1]), 0.5 * f.sum()) + 1)
               for f in fields]
  figure = plots.image_grid(np.stack(fields), figure_path(out, 'erf', subject),
                            f'Effective receptive fields: {subject.label}',
                            titles=list(subject.layers.labels), cmap='viridis')
  return {'layers': list(subject.layers.labels), 'half_mass_pixels': half_mass,
          'fields': [f.tolist() for f in fields], 'figures': [figure]}


def _take(iterator: Iterator, num_images: int) -> Iterator:
  seen = 0
  for batch in iterator:
    if seen >= num_images:
      return
    seen += len(batch[0])
    yield batch


def _token_features(subject: Subject, x: jax.Array) -> Dict[str, jax.Array]:
  """Per-example probe inputs from one representation: the class token, the centre
  spatial token (position) and the mean over spatial tokens (positions)."""
  grid = features.spatial_map(subject, x)
  h, w = grid.shape[1:3]
  out = {'centre token': grid[:, h // 2, w // 2], 'token mean': jnp.mean(grid, axis=(1, 2))}
  if subject.has_cls:
    out['class token'] = x[:, 0]
  return out


def _collect(subject: Subject, iterator: Iterator, names: Sequence[str]):
  feats, labels = {}, []
  for images, batch_labels in iterator:
    inter = subject.intermediates(images, names)
    for name in names:
      per_token = inter[name] if inter[name].ndim == 2 else _token_features(subject, inter[name])
      if inter[name].ndim == 2:
        per_token = {'features': per_token}
      for kind, value in per_token.items():
        feats.setdefault((name, kind), []).append(np.asarray(value))
    labels.append(batch_labels)
  return {k: np.concatenate(v) for k, v in feats.items()}, np.concatenate(labels)


def run_probes(subject: Subject, batches: Batches, out: str,
               shots: Sequence[int] = (1, 5, 10, 25)) -> Dict:
  """Ridge probes per layer and token kind, and few-shot accuracy on pre-logits."""
  names, pre_logits = list(subject.layers.stream), subject.layers.pre_logits
  train_x, train_y = _collect(subject, batches('train'), names + [pre_logits])
  test_x, test_y = _collect(subject, batches('eval'), names + [pre_logits])
  num_classes = int(max(train_y.max(), test_y.max())) + 1
  kinds = sorted({kind for name, kind in train_x if name != pre_logits})
  layers = {kind: [probes.probe_accuracy(train_x[n, kind], train_y, test_x[n, kind], test_y,
                                         num_classes) for n in names] for kind in kinds}
  smallest_class = int(np.bincount(train_y, minlength=num_classes).min())
  few_shot = {k: probes.few_shot_accuracy(train_x[pre_logits, 'features'], train_y,
                                          test_x[pre_logits, 'features'], test_y, num_classes, k)
              for k in shots if k <= smallest_class}
  figure = plots.curves({kind: [r['accuracy'] for r in rows] for kind, rows in layers.items()},
                        figure_path(out, 'probes', subject), f'Linear probes: {subject.label}',
                        'layer', 'test accuracy', xlabels=subject.layers.labels)
  return {'layers': list(subject.layers.labels), 'probes': layers,
          'few_shot_pre_logits': few_shot,
          'shots_left_out': [k for k in shots if k > smallest_class], 'num_train': len(train_y), 'num_test': len(test_y),
          'figures': [figure]}


def run_localisation(subject: Subject, batches: Batches, out: str) -> Dict:
  """Cosine similarity of final-layer tokens at a few query positions to every input
  patch token, averaged over images: does each token still know where it is?"""
  first, last = subject.layers.stream[0], subject.layers.stream[-1]
  (h, w), _ = subject.token_grid()
  queries = [(0, 0), (0, w - 1), (h // 2, w // 2), (h - 1, 0), (h - 1, w - 1)]

  def maps(images, _):
    inter = subject.intermediates(images, [first, last])
    final = features.spatial_map(subject, inter[last]).reshape(len(images), h * w, -1)
    start = features.spatial_map(subject, inter[first]).reshape(len(images), h * w, -1)
    similarity = embeddings.token_patch_similarity(final, start)
    return jnp.stack([similarity[:, i * w + j].reshape(-1, h, w) for i, j in queries], axis=1)

  mean_maps = _batch_mean(batches('eval'), lambda x, y: jnp.mean(maps(x, y), axis=0))
  # How often the most similar input patch is the query's own position.
  on_target = [float(np.argmax(m) == i * w + j) for m, (i, j) in zip(mean_maps, queries)]
  figure = plots.image_grid(mean_maps, figure_path(out, 'localisation', subject),
                            f'Final token vs input patches: {subject.label}', cols=5,
                            titles=[f'query {q}' for q in queries], cmap='viridis')
  return {'queries': queries, 'maps': mean_maps.tolist(), 'peak_at_query': on_target,
          'figures': [figure]}


def run_vit_figures(subject: Subject, batches: Batches, out: str, num_images: int = 4) -> Dict:
  """The ViT paper's Fig. 7 and attention rollout: embedding-filter principal
  components, position-embedding similarities, rollout maps on a few images."""
  grid, _ = subject.token_grid()
  result = {'figures': []}
  kernel = np.asarray(subject.params['embedding']['kernel'])
  components = embeddings.patch_embedding_components(kernel, k=min(28, kernel.shape[-1]))
  result['figures'].append(plots.image_grid(
      components if kernel.shape[2] == 3 else components.mean(-1),
      figure_path(out, 'embedding_filters', subject),
      f'Patch-embedding filter components: {subject.label}', cmap='gray'))
  posemb = subject.params['Transformer'].get('posembed_input', {}).get('pos_embedding')
  if posemb is not None:
    similarity = embeddings.position_embedding_similarity(posemb, grid, subject.has_cls)
    result['figures'].append(plots.image_grid(
        similarity.reshape(-1, *grid), figure_path(out, 'position_similarity', subject),
        f'Position-embedding similarity: {subject.label}', cols=grid[1], cmap='viridis'))
    result['position_similarity'] = similarity.tolist()
  images, labels = next(iter(batches('eval')))
  images = images[:num_images]
  inter = subject.intermediates(images, features.attention_names(subject))
  rollout = attention.attention_rollout([inter[n] for n in features.attention_names(subject)])
  maps = np.asarray(attention.rollout_map(rollout, grid, subject.has_cls))
  upsampled = np.kron(maps, np.ones((1, subject.image_size // grid[0],
                                     subject.image_size // grid[1])))
  panels = np.concatenate([(images + 1) / 2, upsampled[..., None] * (images + 1) / 2])
  result['figures'].append(plots.image_grid(
      panels, figure_path(out, 'rollout', subject), f'Attention rollout: {subject.label}',
      cols=num_images, titles=[f'label {l}' for l in labels[:num_images]] * 2))
  result['rollout_maps'] = maps.tolist()
  return result
