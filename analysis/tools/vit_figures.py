"""The ViT paper's Fig. 7 (embedding filters, position-embedding similarity) and
attention rollout (Abnar & Zuidema)."""
from typing import Dict, List, Mapping

import numpy as np

from analysis.measures import attention, embeddings
from analysis.reporting import plots, verdict
from analysis.runtime import features
from analysis.runtime.estimate import Work
from analysis.tool import (ATTENTION, Batches, Figure, Subject, Tool, figure_path, per_model,
                           register)

PANELS = ('filters', 'positions', 'rollout')  # the figures, in order; positions may be absent


ROLLOUT_IMAGES = 4


def measure(subject: Subject, batches: Batches, num_images: int = ROLLOUT_IMAGES) -> Dict:
  """The ViT paper's Fig. 7 and attention rollout: embedding-filter principal
  components, position-embedding similarities, rollout maps on a few images.

  Args:
    subject: the model (a ViT).
    batches: split -> its (images, labels) batches.
    num_images: the images rollout maps are drawn for.

  Returns:
    The model's JSON but its figures (`draw`'s): with what they show, the filter
    components (float32), and the rollout's images (8-bit, as `rollout_images`) and
    their class names.
  """
  grid, _ = subject.token_grid()
  images, labels = next(iter(batches('eval')))
  kernel = np.asarray(subject.parameter(subject.layers.embedding))
  components = embeddings.patch_embedding_components(kernel, k=min(28, kernel.shape[-1]))
  result = {'panels': ['filters'], 'filter_components': np.float32(
      components if kernel.shape[2] == 3 else components.mean(-1)).tolist()}
  if kernel.shape[2] > 1 and np.all(images == images[..., :1]):
    # Gray images: most of what the components draw may be filter directions no image reaches.
    result['gray_reached_share'] = embeddings.gray_reached_share(kernel)
  if subject.layers.position_embedding is not None:
    posemb = subject.parameter(subject.layers.position_embedding)
    # With registers the table holds the patches only (no class-token row); a table
    # resized to each image's grid (SigLIP 2's, `posemb_grid`) is drawn at its own.
    table_grid = tuple(subject.config.get('posemb_grid') or grid)
    similarity = embeddings.position_embedding_similarity(
        posemb, table_grid, subject.has_cls and not subject.registers)
    result['panels'].append('positions')
    result['position_similarity'] = similarity.tolist()
    result['neighbour_similarity'] = neighbour_similarity(similarity, table_grid)
  images = images[:num_images]
  names = features.attention_names(subject)
  inter = subject.intermediates(images, names)
  rollout = attention.attention_rollout([inter[n] for n in names])
  maps = np.asarray(attention.rollout_map(rollout, grid, subject.has_cls, subject.registers))
  result['panels'].append('rollout')
  result['rollout_maps'] = maps.tolist()
  result['rollout_images'] = np.round(np.clip((np.asarray(images, np.float64) + 1) / 2, 0, 1)
                                      * 255).astype(np.uint8).tolist()
  result['rollout_labels'] = [subject.class_name(int(l)) for l in labels[:num_images]]
  return result


def draw(entry: Mapping, subject: Subject, out: str) -> List[str]:
  """The figures of one model's numbers (`measure`), in `entry['panels']`' order: the
  filter components, the position-embedding similarities (where the model has a
  table), and the rollout images over their rollout-weighted copies.

  See `analysis.tool.Draw`.
  """
  label, figures = subject.label, []
  title = f'Patch-embedding filter components (each scaled to its range): {label}'
  if 'gray_reached_share' in entry:
    title += (f'\ngray images reach {entry["gray_reached_share"]:.0%} of the kernel\'s '
              'squared norm')
  components = np.asarray(entry['filter_components'])
  figures.append(plots.image_grid(
      components, figure_path(out, 'embedding_filters', subject), title, cmap='gray',
      labels=[f'component {i}' for i in range(len(components))]))
  if 'position_similarity' in entry:
    similarity = np.asarray(entry['position_similarity'])
    grid = similarity.shape[:2]
    figures.append(plots.image_grid(
        similarity.reshape(-1, *grid), figure_path(out, 'position_similarity', subject),
        f'Position-embedding similarity (a panel per position, rows top to bottom): {label}',
        cols=grid[1], cmap='viridis', vmin=-1., vmax=1., colorbar_label='cosine similarity'))
  images = np.asarray(entry['rollout_images'], np.float64) / 255
  maps = np.asarray(entry['rollout_maps'])
  upsampled = np.kron(maps, np.ones((1, images.shape[1] // maps.shape[1],
                                     images.shape[2] // maps.shape[2])))
  names = entry['rollout_labels']
  figures.append(plots.image_grid(
      np.concatenate([images, upsampled[..., None] * images]),
      figure_path(out, 'rollout', subject),
      f'Attention rollout (top: images, bottom: weighted by rollout): {label}',
      cols=len(images), labels=names + [f'{n}, rollout' for n in names]))
  return figures


def neighbour_similarity(similarity, grid) -> Dict[str, float]:
  """Mean cosine similarity of position embeddings to their 4-neighbours and to
  every other position (self excluded).

  Args:
    similarity: (h, w, h, w) position-embedding similarities.
    grid: (h, w).

  Returns:
    The means for neighbours and the rest.
  """
  h, w = grid
  sim = np.asarray(similarity).reshape(h * w, h * w)
  rows, cols = np.divmod(np.arange(h * w), w)
  distance = np.abs(rows[:, None] - rows[None]) + np.abs(cols[:, None] - cols[None])
  return {'neighbours': float(sim[distance == 1].mean()), 'others': float(sim[distance > 1].mean())}


def figures(result: Mapping) -> List[Figure]:
  """The figures of the tool's JSON, with their captions' keys.

  Args:
    result: the tool's JSON.

  Returns:
    The figures.
  """
  return [Figure(path, f'{label} {panel}', (label,)) for label, r in per_model(result).items()
          for path, panel in zip(r['figures'], r['panels'])]


def findings(result: Mapping, q) -> Dict[str, list]:
  """What the models show, per caption key.

  Args:
    result: the tool's JSON.
    q: makes a quote of a number of the JSON (`tool.QuoteFn`).

  Returns:
    Text fragments per caption key.
  """
  out = {}
  for label, r in per_model(result).items():
    out[f'{label} filters'] = [f'{label}: principal components of the patch-embedding filters']
    if 'gray_reached_share' in r:
      out[f'{label} filters'] += [
          '; the images are gray, so each filter acts on them through its sum over the '
          'channels alone, which holds ', q(label, 'gray_reached_share'), ' of the kernel\'s '
          'squared norm: the rest, never trained by an image, is in the components too']
    if 'neighbour_similarity' in r:
      out[f'{label} positions'] = [
          f'{label}: cosine similarity of each position embedding to the others; mean to '
          '4-neighbours ', q(label, 'neighbour_similarity', 'neighbours'), ', to the rest ',
          q(label, 'neighbour_similarity', 'others')]
    out[f'{label} rollout'] = [f'{label}: attention rollout on evaluation images']
  return out


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """The paper's claims judged on the tool's JSON.

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  found = []
  for label, r in per_model(result).items():
    if 'neighbour_similarity' not in r:
      continue
    near = r['neighbour_similarity']
    found.append(verdict.single(
        'nearby positions alike', 'Nearby positions have similar position embeddings (ViT '
        'paper Fig. 7).', 'mean cosine similarity to 4-neighbours minus to the rest (of the '
        'parameters: no sampling error)', label,
        (near['neighbours'] - near['others'], 0.)))
  return found


TOOL = register(Tool(
    name='vit_figures', importance=12, title='Embedding filters, position embeddings, attention rollout',
    quantity='Principal components of the patch-embedding filters, cosine similarity between '
             'position embeddings (parameters: exact, no sampling), attention rollout (Abnar & '
             'Zuidema).',
    paper='ViT paper (Fig. 7): the filter components resemble bases for fine patch structure; '
          'nearby positions have similar embeddings, in rows and columns.',
    run=measure, draw=draw, runs_on=ATTENTION, findings=findings, figures=figures,
    verdicts=verdicts, shortened_by=(),
    # One forward pass of the rollout's few images.
    work=lambda subject, options, amounts: Work({'forward': min(
        ROLLOUT_IMAGES, amounts.batch_size) / amounts.batch_size},
        {'forward': 1})))
