"""Do final-layer tokens still know where they are? Their similarity to every
input patch token (Raghu et al. Fig. 9)."""
from typing import Dict, List, Mapping

import jax.numpy as jnp
import numpy as np

from analysis import embeddings, features, plots, uncertainty, verdict
from analysis.tool import (ATTENTION, Batches, Subject, Tool, batch_mean, each_model,
                           figure_path, model_scalars, per_model, register)


def run_localisation(subject: Subject, batches: Batches, out: str) -> Dict:
  """Cosine similarity of final-layer tokens at a few query positions to every input
  patch token, averaged over images: does each token still know where it is? Also
  the share of (image, query) pairs whose most similar input patch is the query's
  own, with its binomial standard error."""
  first, last = subject.layers.stream[0], subject.layers.stream[-1]
  (h, w), _ = subject.token_grid()
  queries = [(0, 0), (0, w - 1), (h // 2, w // 2), (h - 1, 0), (h - 1, w - 1)]
  own = jnp.array([i * w + j for i, j in queries])
  seen = []

  def maps(images, _):
    seen.append(len(images))
    inter = subject.intermediates(images, [first, last])
    final = features.spatial_map(subject, inter[last]).reshape(len(images), h * w, -1)
    start = features.spatial_map(subject, inter[first]).reshape(len(images), h * w, -1)
    similarity = embeddings.token_patch_similarity(final, start)[:, own]  # (B, queries, h*w)
    hits = jnp.mean(jnp.argmax(similarity, -1) == own[None])
    return jnp.concatenate([jnp.mean(similarity, axis=0).ravel(), hits[None]])

  mean, _ = batch_mean(batches('eval'), maps)
  mean_maps, share = mean[:-1].reshape(len(queries), h, w), float(mean[-1])
  num_pairs = sum(seen) * len(queries)
  # How often the most similar input patch of the mean map is the query's own position.
  on_target = [float(np.argmax(m) == i * w + j) for m, (i, j) in zip(mean_maps, queries)]
  figure = plots.image_grid(
      mean_maps, figure_path(out, 'localisation', subject),
      f'Final tokens vs input patches: {subject.label}', cols=5,
      labels=[f'query (row {i}, col {j})' for i, j in queries], cmap='viridis',
      colorbar_label='cosine similarity', vmin=float(mean_maps.min()),
      vmax=float(mean_maps.max()), marks=queries)
  return {'queries': queries, 'class_token': subject.has_cls, 'maps': mean_maps.tolist(),
          'peak_at_query': on_target,
          'own_patch_share': share, 'own_patch_share_stderr':
              float(uncertainty.binomial_stderr(share, num_pairs)),
          'num_pairs': num_pairs, 'figures': [figure]}


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  claim = ('A class-token ViT\'s final-layer tokens are most similar to the input patch at '
           'their own position (Raghu et al. Fig. 9; GAP models localise less, Fig. 10).')
  what = 'share of (image, query) pairs peaking at their own patch, minus one half'
  found = []
  for label, r in per_model(result).items():
    estimate = (r['own_patch_share'] - 0.5, r['own_patch_share_stderr'])
    if r['class_token']:
      found.append(verdict.single('tokens keep their position', claim, what, label, estimate))
    else:
      found.append(verdict.Verdict(
          'tokens keep their position', claim, f'{label}: {what} {verdict.show(estimate)}',
          verdict.NOT_COMPARABLE, 'the claim concerns class-token ViTs; this one pools its '
          'tokens'))
  return found


TOOL = register(Tool(
    name='localisation', title='Localisation of final-layer tokens',
    quantity='Cosine similarity of final-layer tokens at five query positions (red crosses) to '
             'every input patch token, averaged over images; the share of (image, query) pairs '
             'whose most similar patch is their own, with its binomial standard error.',
    paper='Raghu et al. (Fig. 9): ViT\'s final tokens stay most similar to the input patch at '
          'their own position; ResNet\'s and GAP models\' less so.',
    run=run_localisation, runs_on=ATTENTION,
    findings=each_model(lambda label, r, q: [
        f'{label}: most similar input patch is the query\'s own for ',
        q('own_patch_share'), ' ± ', q('own_patch_share_stderr'),
        ' of (image, query) pairs; on the mean maps for ', q('peak_at_query', reduce='mean'),
        ' of the queries']),
    scalars=model_scalars(lambda r: {'localisation/peak_at_query': list(r['peak_at_query'])}),
    verdicts=verdicts))
