"""The ViT paper's Fig. 7 (embedding filters, position-embedding similarity) and
attention rollout (Abnar & Zuidema)."""
from typing import Dict

import numpy as np

from analysis import attention, embeddings, features, plots
from analysis.tool import (ATTENTION, Batches, Subject, Tool, each_model, figure_path,
                           register)


def run_vit_figures(subject: Subject, batches: Batches, out: str, num_images: int = 4) -> Dict:
  """The ViT paper's Fig. 7 and attention rollout: embedding-filter principal
  components, position-embedding similarities, rollout maps on a few images."""
  grid, _ = subject.token_grid()
  result = {'figures': []}
  kernel = np.asarray(subject.parameter(subject.layers.embedding))
  components = embeddings.patch_embedding_components(kernel, k=min(28, kernel.shape[-1]))
  result['figures'].append(plots.image_grid(
      components if kernel.shape[2] == 3 else components.mean(-1),
      figure_path(out, 'embedding_filters', subject),
      f'Patch-embedding filter components: {subject.label}', cmap='gray'))
  if subject.layers.position_embedding is not None:
    posemb = subject.parameter(subject.layers.position_embedding)
    similarity = embeddings.position_embedding_similarity(posemb, grid, subject.has_cls)
    result['figures'].append(plots.image_grid(
        similarity.reshape(-1, *grid), figure_path(out, 'position_similarity', subject),
        f'Position-embedding similarity: {subject.label}', cols=grid[1], cmap='viridis'))
    result['position_similarity'] = similarity.tolist()
  images, labels = next(iter(batches('eval')))
  images = images[:num_images]
  names = features.attention_names(subject)
  inter = subject.intermediates(images, names)
  rollout = attention.attention_rollout([inter[n] for n in names])
  maps = np.asarray(attention.rollout_map(rollout, grid, subject.has_cls))
  upsampled = np.kron(maps, np.ones((1, subject.image_size // grid[0],
                                     subject.image_size // grid[1])))
  panels = np.concatenate([(images + 1) / 2, upsampled[..., None] * (images + 1) / 2])
  result['figures'].append(plots.image_grid(
      panels, figure_path(out, 'rollout', subject), f'Attention rollout: {subject.label}',
      cols=num_images, titles=[f'label {l}' for l in labels[:num_images]] * 2))
  result['rollout_maps'] = maps.tolist()
  return result


TOOL = register(Tool(
    name='vit_figures', title='Embedding filters, position embeddings, attention rollout',
    quantity='Principal components of the patch-embedding filters, cosine similarity between '
             'position embeddings, attention rollout (Abnar & Zuidema).',
    paper='ViT paper (Fig. 7): the filter components resemble bases for fine patch structure; '
          'nearby positions have similar embeddings, in rows and columns.',
    run=run_vit_figures, runs_on=ATTENTION,
    findings=each_model(lambda label, r, q: [
        f'{label}: {len(r["figures"])} panels (filters, '
        f'{"position similarity, " if "position_similarity" in r else ""}rollout)'])))
