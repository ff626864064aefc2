"""High-norm artifact tokens (Darcet et al. 2024, "Vision Transformers Need
Registers"): patch tokens whose norm in the residual stream is far above the
rest, which large and long-trained ViTs grow in low-information background
patches, which the class token attends to, and which registers take away.

Per layer, the distribution of the patch tokens' L2 norms and the share beyond
the outlier rule; where the outliers of the last layer sit (how alike their
patches are to their neighbours: Darcet et al.'s Sec. 2.1 measure, the cosine
similarity of the patch embeddings right after the patch embedding layer, the
sign of a redundant background patch; the patches' raw pixels are a named
departure, `--artifact_similarity pixels`), and how much of the class token's
attention in the last layer they receive. The paper's rule is an absolute norm: 150, set on DINOv2 ViT-g, whose
outliers it separates from a bulk below 100 (their Sec. 3.1 and Fig. 3). It
depends on the model's scale, so small models need the relative rule, a named
departure (`--artifact_rule relative`): a token is an outlier where its norm is
more than `--artifact_factor` times the median norm of the patch tokens at its
layer.

The same reading gives the massive activations of Sun et al. 2024 ("Massive
Activations in Large Language Models", their ViT figures): per stream entry,
each image's largest activation magnitudes over all tokens and channels against
their median, as their code computes them (`top_activations`).
"""
import dataclasses
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from analysis.reporting import plots, verdict
from analysis.runtime.estimate import Work
from analysis.tool import (ATTENTION, Batches, Subject, Tool, each_model, figure_path, per_model,
                           register)
from analysis.tool_options import option

PAPER_THRESHOLD = 150.  # Darcet et al.'s outlier norm for DINOv2 ViT-g (Sec. 3.1)
EMBEDDING, PIXELS = 'embedding', 'pixels'  # what the neighbour similarity compares


@dataclasses.dataclass(frozen=True)
class Options:
  """The artifact-token tool's command-line options."""
  artifact_rule: str = option(
      'absolute', f'absolute: a patch token is an outlier where its norm exceeds '
      f'--artifact_threshold (Darcet et al.: {PAPER_THRESHOLD:g}, set on DINOv2 ViT-g); '
      'relative: where it exceeds --artifact_factor times the median patch-token norm of its '
      'layer (a departure for models of another scale).', choices=('absolute', 'relative'))
  artifact_threshold: float = option(PAPER_THRESHOLD, 'The norm beyond which a patch token is '
                                     'an outlier, under --artifact_rule absolute.', least=0.)
  artifact_factor: float = option(4., 'The multiple of the median patch-token norm beyond '
                                  'which a token is an outlier, under --artifact_rule relative.',
                                  least=1.)
  artifact_similarity: str = option(
      EMBEDDING, f'What a patch is compared with its neighbours by: {EMBEDDING}, the cosine '
      'similarity of the patch embeddings right after the patch embedding layer (Darcet et al. '
      f'Sec. 2.1); {PIXELS}, of the patches\' raw pixels (a departure).',
      choices=(EMBEDDING, PIXELS))


def pixel_patches(images: np.ndarray, grid: int) -> np.ndarray:
  """The images cut into a grid of patches, each patch's pixels one vector.

  Args:
    images: (B, H, W, C) square images, each patch `H // grid` pixels square (a
      border the patches do not cover is left out).
    grid: patches per side.

  Returns:
    (B, grid, grid, patch pixels x C).
  """
  p = images.shape[1] // grid
  images = images[:, :grid * p, :grid * p]
  b, c = images.shape[0], images.shape[-1]
  return images.reshape(b, grid, p, grid, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(
      b, grid, grid, -1)


def neighbour_similarity(patches: np.ndarray) -> np.ndarray:
  """Each patch's mean cosine similarity to its 4 neighbours on the grid (those
  that exist): near 1 on uniform background, lower on an object's edges and
  textures.

  Args:
    patches: (B, rows, cols, F): a vector per patch (its embedding, or its pixels).

  Returns:
    (B, rows * cols) similarities, patches in row-major order.
  """
  patches = np.asarray(patches, np.float64)
  b, rows, cols = patches.shape[:3]
  unit = patches / np.maximum(np.linalg.norm(patches, axis=-1, keepdims=True), 1e-12)
  total, count = np.zeros((b, rows, cols)), np.zeros((1, rows, cols))
  for axis in (1, 2):
    size = unit.shape[axis]
    similar = np.sum(np.take(unit, range(1, size), axis) * np.take(unit, range(size - 1), axis),
                     -1)
    for lead in (slice(1, None), slice(None, -1)):  # the later and the earlier of each pair
      index = [slice(None)] * 3
      index[axis] = lead
      total[tuple(index)] += similar
      count[tuple(index)] += 1
  return (total / np.maximum(count, 1)).reshape(b, rows * cols)


def top_activations(stream: np.ndarray, count: int = 3) -> Tuple[np.ndarray, np.ndarray,
                                                                   np.ndarray]:
  """Each image's largest activation magnitudes in a residual-stream entry, over
  all its tokens and channels, and their median, as Sun et al.'s code measures
  massive activations in a ViT (locuslab/massive-activations, main_vit.py, `exp2`:
  `torch.sort(feat_abs.flatten(), descending=True)` of one image's block output,
  its first 3 values, and `torch.median(feat_abs)`, which for an even count is the
  lower of the two middle values).

  Args:
    stream: (B, tokens, channels) one stream entry of B images.
    count: the largest values kept.

  Returns:
    ((B, count) the largest magnitudes, largest first; (B,) their median; (B, 2)
    the token and channel of each image's largest).
  """
  stream = np.asarray(stream, np.float64)
  flat = np.abs(stream).reshape(len(stream), -1)
  n = flat.shape[1]
  top = -np.sort(-np.partition(flat, n - count, axis=1)[:, n - count:], axis=1)
  median = np.partition(flat, (n - 1) // 2, axis=1)[:, (n - 1) // 2]
  token, channel = np.divmod(np.argmax(flat, axis=1), stream.shape[-1])
  return top, median, np.stack([token, channel], axis=1)


def _massive(tops: List[np.ndarray], medians: List[np.ndarray], positions: List[np.ndarray],
             labels) -> Dict:
  """Per stream entry, the mean over images of the largest three magnitudes and of
  the median (main_vit.py averages the per-image statistics, `np.mean(stats,
  axis=0)`), their ratio, and where the largest sits at the entry of the largest
  ratio: the most common (token, channel) and the share of images it holds."""
  top = [t.mean(0) for t in tops]
  median = [float(m.mean()) for m in medians]
  ratio = [float(t[0] / m) if m > 0 else None for t, m in zip(top, median)]
  peak = int(np.nanargmax([r if r is not None else np.nan for r in ratio]))
  where, counts = np.unique(positions[peak], axis=0, return_counts=True)
  return {'massive_top3': [t.tolist() for t in top], 'massive_median': median,
          'massive_ratio': ratio, 'massive_peak_layer': labels[peak],
          'massive_peak_position': where[np.argmax(counts)].tolist(),
          'massive_peak_position_share': float(counts.max() / counts.sum())}


def _threshold(norms: np.ndarray, rule: str, threshold: float, factor: float) -> float:
  return threshold if rule == 'absolute' else factor * float(np.median(norms))


def measure(subject: Subject, batches: Batches, options: Options = Options()) -> Dict:
  """Patch-token norms per residual-stream entry on the evaluation split; the
  outliers' share (± its standard error over images) at each; at the last entry,
  the outliers' neighbour similarity against the other patches' and the class
  token's attention they receive in the last attention layer.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    options: the tool's options: `artifact_rule` 'absolute' (the paper's, at
      `artifact_threshold`) or 'relative' (`artifact_factor` times the median);
      `artifact_similarity` EMBEDDING (the paper's) or PIXELS, what the neighbour
      similarity compares. A model without a patch embedding (AlterNet) has only
      its pixels, which its JSON records.

  Returns:
    The model's JSON but its figures (`draw`'s); `norm_histogram` bins the last
    entry's patch-token norms (`plots.bin_counts`).
  """
  layers = subject.layers
  if not layers.attention_weights:
    raise ValueError(f'{subject.label} ({subject.config.name}) sows no global attention over '
                     'a token sequence: artifact tokens need a ViT.')
  prefix = int(subject.has_cls) + subject.registers
  similarity, norms, prefix_norms, similar, cls_attention, massive = _read(subject, batches,
                                                                          options)
  norms = [np.concatenate(n) for n in norms]  # per entry, (N, patches)
  n = len(norms[0])
  cuts = [_threshold(v, options.artifact_rule, options.artifact_threshold,
                     options.artifact_factor) for v in norms]
  per_image = [np.mean(v > cut, axis=1) for v, cut in zip(norms, cuts)]
  share = [float(s.mean()) for s in per_image]
  share_stderr = [float(s.std(ddof=1) / np.sqrt(n)) if n > 1 else 0. for s in per_image]
  outlier = norms[-1] > cuts[-1]
  similar = np.concatenate(similar)
  result = {
      'layers': list(layers.labels), 'rule': options.artifact_rule, 'threshold': cuts,
      'similarity': similarity,
      'percentiles': [50, 90, 99, 100],
      'norm_percentiles': [np.percentile(v, [50, 90, 99, 100]).tolist() for v in norms],
      'share': share, 'share_stderr': share_stderr,
      'first_outlier_layer': next((layers.labels[k] for k, s in enumerate(share) if s > 0),
                                  None),
      'prefix_norm_last': (np.concatenate(prefix_norms).mean(0).tolist() if prefix else []),
      'neighbour_similarity_outliers': _mean_or_none(similar[outlier]),
      'neighbour_similarity_others': _mean_or_none(similar[~outlier]),
      'registers': subject.registers, 'num_images': n,
      **_massive(*massive, layers.labels)}
  if cls_attention:
    attention = np.concatenate(cls_attention)
    result['cls_attention_outliers'] = _mean_or_none(attention[outlier])
    result['cls_attention_others'] = _mean_or_none(attention[~outlier])
    result['cls_attention_share_outliers'] = float(np.sum(attention * outlier) /
                                                   np.sum(attention))
  result['norm_histogram'] = plots.bin_counts(norms[-1])
  return result


def draw(result: Mapping, subject: Subject, out: str, options: Options = Options()
         ) -> List[str]:
  """The figures of the tool's numbers (`measure`): the last entry's patch-token
  norms with the outlier rule's cut, the outliers' share at each entry, and the
  largest activation and the median at each.

  See `analysis.tool.Draw`.
  """
  layers = subject.layers
  share, share_stderr, cut = result['share'], result['share_stderr'], result['threshold'][-1]
  return [
      plots.binned(result['norm_histogram']['counts'], result['norm_histogram']['edges'],
                   figure_path(out, 'artifact_tokens', subject),
                   f'Patch-token norms at {layers.labels[-1]}: {subject.label}',
                   'L2 norm', logy=True,
                   marks=[(cut, f'outlier rule ({result["rule"]}: {cut:.3g})')]),
      plots.curves({'outliers': 100 * np.array(share)},
                   figure_path(out, 'artifact_tokens_layers', subject),
                   f'Outlier patch tokens per layer: {subject.label}', 'layer',
                   'share of patch tokens (%)', xlabels=layers.labels, stages=layers.stages,
                   errors={'outliers': 100 * np.array(share_stderr)}),
      plots.curves({'largest': np.array([t[0] for t in result['massive_top3']]),
                    'median': np.array(result['massive_median'])},
                   figure_path(out, 'massive_activations', subject),
                   f'Largest activation and median per layer: {subject.label}', 'layer',
                   'magnitude (mean over images)', logy=True, xlabels=layers.labels,
                   stages=layers.stages)]


def _read(subject: Subject, batches: Batches, options: Options
          ) -> Tuple[str, List, List, List, List, Tuple[List, List, List]]:
  """The evaluation split read once: the similarity compared (`artifact_similarity`,
  PIXELS without a patch embedding), per stream entry the patch tokens' norms, the
  last entry's class-token and register norms, each patch's neighbour similarity,
  with a class token its attention to the patches in the last layer, and per
  stream entry each image's largest activations (`top_activations`)."""
  layers = subject.layers
  (side, _), _ = subject.token_grid()
  prefix = int(subject.has_cls) + subject.registers
  last_attention = layers.attention_weights[-1]
  # Without a patch embedding there is nothing else to compare; recorded, so the report
  # names it.
  similarity = (PIXELS if layers.patch_tokens is None else options.artifact_similarity)
  names = list(layers.stream) + [last_attention] + (
      [layers.patch_tokens] if similarity == EMBEDDING else [])
  norms, prefix_norms, similar, cls_attention = [[] for _ in layers.stream], [], [], []
  massive = tuple([[] for _ in layers.stream] for _ in range(3))  # tops, medians, positions
  for images, _ in batches('eval'):
    inter = subject.intermediates(images, names)
    for k, name in enumerate(layers.stream):
      for kept, found in zip(massive, top_activations(inter[name])):
        kept[k].append(found)
      tokens = np.linalg.norm(np.asarray(inter[name], np.float64), axis=-1)  # (B, T)
      norms[k].append(tokens[:, prefix:])
      if k == len(layers.stream) - 1:
        prefix_norms.append(tokens[:, :prefix])
    vectors = (np.asarray(inter[layers.patch_tokens]).reshape(len(images), side, side, -1)
               if similarity == EMBEDDING else pixel_patches(np.asarray(images), side))
    similar.append(neighbour_similarity(vectors))
    if subject.has_cls:  # the class token's row, averaged over heads, to the patches
      cls_attention.append(np.asarray(inter[last_attention], np.float64)[:, :, 0, prefix:].mean(1))
  massive = tuple([np.concatenate(entry) for entry in kept] for kept in massive)
  return similarity, norms, prefix_norms, similar, cls_attention, massive


def _mean_or_none(values: np.ndarray) -> Optional[float]:
  return float(values.mean()) if values.size else None


def verdicts(result: Mapping, models: verdict.Models) -> List[verdict.Verdict]:
  """Darcet et al.'s claim that registers take the outliers off the patches, on
  each pair of a model without registers and one with them (in the order given).

  Args:
    result: the tool's JSON.
    models: what the report knows of each model label.

  Returns:
    The verdicts.
  """
  entries = per_model(result)
  without = [label for label, r in entries.items() if not r['registers']]
  with_registers = [label for label, r in entries.items() if r['registers']]
  claim = ('With registers, the high-norm outlier tokens leave the patches (Darcet et al. '
           'Fig. 7).')
  if not without or not with_registers:
    return [verdict.Verdict('registers remove outliers', claim, '', verdict.NOT_COMPARABLE,
                            'needs a ViT with registers and one without, analysed together')]
  found = []
  for plain, registered in zip(without, with_registers):
    last = lambda label: (entries[label]['share'][-1], entries[label]['share_stderr'][-1])
    value = verdict.difference(last(plain), last(registered))
    judged, why = verdict.judge(value)
    if not last(plain)[0] and not last(registered)[0]:
      judged, why = verdict.NOT_COMPARABLE, ('neither model has a patch token beyond the '
                                             'outlier rule: there is nothing to remove')
    found.append(verdict.Verdict(
        'registers remove outliers', claim,
        f'outlier share of the patch tokens at the last layer, {plain} '
        f'{verdict.show(last(plain))} minus {registered} ({entries[registered]["registers"]} '
        f'registers) {verdict.show(last(registered))}', judged, why))
  return found


def _findings(label, r, q) -> List:
  text = [f'{label}: at {r["layers"][-1]}, ', q('share', -1), ' ± ', q('share_stderr', -1),
          f' of patch tokens beyond the outlier rule ({r["rule"]}: norm > ',
          q('threshold', -1), '; median norm ', q('norm_percentiles', -1, 0), ', largest ',
          q('norm_percentiles', -1, 3), ')']
  text += ['; the largest activation is ', q('massive_ratio', r['layers'].index(
      r['massive_peak_layer'])), f' times the median at {r["massive_peak_layer"]}']
  if r['first_outlier_layer'] is None:
    return text + ['; no layer has an outlier']
  text += [f'; outliers from {r["first_outlier_layer"]} on; their patches\' similarity to '
           'their neighbours ', q('neighbour_similarity_outliers'), ' against ',
           q('neighbour_similarity_others')]
  if 'cls_attention_share_outliers' in r:
    text += ['; they receive ', q('cls_attention_share_outliers'),
             " of the class token's attention in the last layer"]
  return text


TOOL = register(Tool(
    name='artifact_tokens', importance=19, title='Artifact tokens',
    quantity='L2 norms of the patch tokens in the residual stream (class token and registers '
             'apart) at each stream entry, on the evaluation split; the share beyond the '
             'outlier rule (± its standard error over images); at the last entry, the '
             "outliers' mean cosine similarity to their 4 neighbouring patches (of the patch "
             'embeddings right after the patch embedding layer, or of pixels, as the JSON '
             "records) against the other patches', and their share of the class token's "
             'attention (mean over heads) in the last attention layer. Per stream entry, '
             "massive activations as Sun et al.'s code measures them (main_vit.py, exp2): "
             "each image's three largest activation magnitudes over all its tokens and "
             'channels and their median (the lower middle value), averaged over the images, '
             'and where the largest sits at the entry of the largest ratio.',
    paper='Darcet et al. (Fig. 2-4, 7): large, long-trained ViTs (DINOv2, OpenCLIP, DeiT '
          'III) grow about 2% high-norm patch tokens (norm > 150 on DINOv2 ViT-g, Sec. 3.1: a '
          'threshold set on that model) '
          'from the middle layers on, in background patches alike to their neighbours; the '
          "class token's attention picks them out; registers take them off the patches. "
          'Sun et al. 2024 (Fig. 9-10): CLIP and DINOv2-reg ViTs have a few activations '
          'hundreds to thousands of times the median, from the middle layers on, at fixed '
          'channels (in DINOv2-reg, in a register).',
    run=measure, draw=draw, runs_on=ATTENTION, findings=each_model(_findings),
    verdicts=verdicts,
    options=Options,
    scalars=lambda result, label: ({'artifact_tokens/share': result[label]['share']}
                                   if label in result else {}),
    work=lambda subject, options, amounts: Work({'forward': amounts.batches}, {'forward': 1})))
