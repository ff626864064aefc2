"""Do final-layer tokens still know where they are? Their similarity to every
input patch token (Raghu et al. Fig. 9)."""
from typing import Dict

import jax.numpy as jnp
import numpy as np

from analysis import embeddings, features, plots
from analysis.tool import (ATTENTION, Batches, Subject, Tool, batch_mean, each_model,
                           figure_path, model_scalars, register)


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

  mean_maps = batch_mean(batches('eval'), lambda x, y: jnp.mean(maps(x, y), axis=0))
  # How often the most similar input patch is the query's own position.
  on_target = [float(np.argmax(m) == i * w + j) for m, (i, j) in zip(mean_maps, queries)]
  figure = plots.image_grid(mean_maps, figure_path(out, 'localisation', subject),
                            f'Final token vs input patches: {subject.label}', cols=5,
                            titles=[f'query {q}' for q in queries], cmap='viridis')
  return {'queries': queries, 'maps': mean_maps.tolist(), 'peak_at_query': on_target,
          'figures': [figure]}


TOOL = register(Tool(
    name='localisation', title='Localisation of final-layer tokens',
    quantity='Cosine similarity of final-layer tokens at five query positions to every input '
             'patch token, averaged over images.',
    paper='Raghu et al. (Fig. 9): ViT\'s final tokens stay most similar to the input patch at '
          'their own position; ResNet\'s and GAP models\' less so.',
    run=run_localisation, runs_on=ATTENTION,
    findings=each_model(lambda label, r, q: [
        f'{label}: share of queries whose most similar input patch is their own ',
        q('peak_at_query', reduce='mean')]),
    scalars=model_scalars(lambda r: {'localisation/peak_at_query': list(r['peak_at_query'])})))
