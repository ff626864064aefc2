"""Activation patching: which parts of a model carry the difference between a
clean image and a corrupted copy of it to the prediction.

The model runs on the corrupted image with one site's activation replaced by
its value on the clean image (the `scales` and `shifts` collections,
`family.sow_edited`): a residual branch's output (attention or MLP of a ViT
block, a ResNet unit's residual) or one attention head's output before the
projection. The share of the clean logit difference it restores is what
TransformerLens and ViT-Prisma draw as "denoising" patching: with m the logit of
the clean run's prediction minus that of the corrupted run's,

    restored = sum (m_patched - m_corrupted) / sum (m_clean - m_corrupted)

over the pairs whose prediction the corruption changes; 0 where the site
carries nothing of it, 1 where it alone restores the clean run.
"""
import dataclasses
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import flax
import numpy as np

from analysis.measures import corruptions, uncertainty
from analysis.reporting import plots
from analysis.runtime.estimate import Work
from analysis.tool import Batches, Subject, Tool, each_model, figure_path, register
from analysis.tool_options import option
from analysis.tools.common import head_counts
from vit_jax.models.family import SCALES, SHIFTS

MIN_PAIRS = 2  # below this, no share is reported


@dataclasses.dataclass(frozen=True)
class Options:
  """The activation-patching tool's command-line options."""
  patching_corruption: str = option(
      'gaussian_noise', 'The corruption of the patching pairs (CIFAR-C\'s parameters up to '
      '64 px, ImageNet-C\'s above, as the corruption tool).', choices=corruptions.CORRUPTIONS)
  patching_severity: int = option(5, 'Its severity, 1-5.', least=1)


@dataclasses.dataclass(frozen=True)
class Site:
  """One patched activation: a sown name, and the head where it is one head's output."""
  name: str
  label: str
  kind: str  # the branch's kind, or 'head'
  head: int = -1  # the head along axis 2 of the sown (B, T, heads, D/heads); -1: all of it


def sites(subject: Subject) -> List[Site]:
  """Every residual branch's output, then every attention head's, in depth order.

  Args:
    subject: the model.

  Returns:
    The sites.
  """
  layers = subject.layers
  out = [Site(b.output, b.label, b.kind) for b in layers.branches]
  attention = [b.label for b in layers.branches if b.kind == 'attention']
  for name, label, count in zip(layers.head_outputs, attention, head_counts(subject)
                                if layers.head_outputs else []):
    out += [Site(name, f'{label} head {h}', 'head', h) for h in range(count)]
  return out


def _edits(patched: Sequence[Site], clean: Dict[str, Any]) -> Dict[str, Any]:
  """The `scales` and `shifts` collections that put the clean values of `patched`
  in place of the run's own (every other sown value kept)."""
  scales, shifts = {}, {}
  for site in patched:
    value = np.asarray(clean[site.name])
    key = tuple(site.name.split('/'))
    if site.head < 0:
      scales[key], shifts[key] = np.float32(0.), value
    else:  # one head along axis 2; heads patched before in this set are kept
      scale = scales.get(key, np.ones((value.shape[2], 1), np.float32)).copy()
      shift = shifts.get(key, np.zeros_like(value)).copy()
      scale[site.head] = 0.
      shift[:, :, site.head] = value[:, :, site.head]
      scales[key], shifts[key] = scale, shift
  unflatten = flax.traverse_util.unflatten_dict
  return {SCALES: unflatten(scales), SHIFTS: unflatten(shifts)}


def patched_logits(subject: Subject, clean: np.ndarray, corrupted: np.ndarray,
                   site_sets: Sequence[Sequence[Site]]) -> List[np.ndarray]:
  """The model's logits on `corrupted`, with each set of sites in turn patched
  from its run on `clean` (an empty set: the corrupted run itself).

  Args:
    subject: the model.
    clean: (B, H, W, 3) images.
    corrupted: the same images, corrupted.
    site_sets: the sets of sites patched together, one run each.

  Returns:
    One (B, classes) array per set.
  """
  names = sorted({site.name for patched in site_sets for site in patched})
  values = subject.intermediates(clean, names) if names else {}
  return [np.asarray(subject.edited_logits(corrupted, _edits(patched, values)))
          for patched in site_sets]


def logit_difference(logits: np.ndarray, label: np.ndarray, other: np.ndarray) -> np.ndarray:
  """m = logit of `label` minus logit of `other`, per image.

  Args:
    logits: (N, classes).
    label: (N,) the clean run's answer.
    other: (N,) the corrupted run's answer.

  Returns:
    (N,) differences.
  """
  rows = np.arange(len(logits))
  return logits[rows, label] - logits[rows, other]


def measure(subject: Subject, batches: Batches, options: Options = Options()) -> Dict:
  """Per site, the share of the clean logit difference that patching its clean
  activation into the corrupted run restores, ± its delta-method standard error
  over the pairs (`uncertainty.ratio_of_means`), on the evaluation images whose
  prediction the corruption changes (labels are not read).

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.
    options: the tool's options: `patching_corruption`, one of
      `corruptions.CORRUPTIONS`, at `patching_severity` 1-5.

  Returns:
    The model's JSON but its figures (`draw`'s); where the corruption changes fewer than `MIN_PAIRS`
    predictions, no share, and under 'refused' why and what to change.
  """
  every = sites(subject)
  restored, full, seen = _patched(subject, batches, every, options)
  pairs = sum(len(f) for f in full)
  about = {'corruption': options.patching_corruption, 'severity': options.patching_severity,
           'pairs': pairs, 'num_images': seen}
  if pairs < MIN_PAIRS:
    return {**about, 'refused': (
        f'{options.patching_corruption} at severity {options.patching_severity} changes the '
        f'prediction on {pairs} of {seen} '
        f'evaluation images; patching needs at least {MIN_PAIRS}: raise '
        '--patching_severity, pick another --patching_corruption, or analyse more images')}
  share, stderr = uncertainty.ratio_of_means(np.concatenate(restored, axis=1),
                                             np.concatenate(full))
  return {**about, 'sites': [s.label for s in every], 'kinds': [s.kind for s in every],
          'restored': share.tolist(), 'restored_stderr': stderr.tolist()}


def _patched(subject: Subject, batches: Batches, every: Sequence[Site], options: Options
             ) -> Tuple[List[np.ndarray], List[np.ndarray], int]:
  """On the evaluation images the corruption changes the prediction of (the pairs),
  per batch: the logit difference each site's patch restores, the whole clean
  difference, and the images seen."""
  parameters = corruptions.parameters_for(subject.image_size)
  restored, full, seen = [], [], 0
  for seed, (images, _) in enumerate(batches('eval')):
    images = np.asarray(images)
    corrupted = corruptions.corrupt(images, options.patching_corruption,
                                    options.patching_severity, seed, parameters)
    seen += len(images)
    clean_logits, corrupted_logits = (np.asarray(subject.logits(x)) for x in (images, corrupted))
    answer, other = clean_logits.argmax(-1), corrupted_logits.argmax(-1)
    pairs = answer != other
    if not pairs.any():
      continue
    # The whole batch runs (one compiled shape for every batch); the pairs are kept.
    logits = patched_logits(subject, images, corrupted, [[s] for s in every])
    m = lambda z: logit_difference(z[pairs], answer[pairs], other[pairs])
    base = m(corrupted_logits)
    full.append(m(clean_logits) - base)
    restored.append(np.stack([m(z) - base for z in logits]))
  return restored, full, seen


def draw(result: Mapping, subject: Subject, out: str, options: Options = Options()) -> List[str]:
  """The figures of the tool's numbers (`measure`): the share restored per branch,
  and per head where every attention layer has as many heads; none where it refused.

  See `analysis.tool.Draw`.
  """
  if 'refused' in result:
    return []
  share, stderr = np.asarray(result['restored']), np.asarray(result['restored_stderr'])
  labels, kinds = result['sites'], result['kinds']
  branches = [k for k, kind in enumerate(kinds) if kind != 'head']
  heads = [k for k, kind in enumerate(kinds) if kind == 'head']
  figures = [plots.bars(share[branches], stderr[branches], [labels[k] for k in branches],
                        [kinds[k] for k in branches],
                        figure_path(out, 'activation_patching', subject),
                        f'Activation patching ({result["corruption"]} '
                        f'{result["severity"]}): {subject.label}',
                        'clean logit difference restored')]
  counts = head_counts(subject) if subject.layers.head_outputs else []
  if heads and len(set(counts)) == 1:
    figures.append(plots.heatmap(
        share[heads].reshape(len(counts), counts[0]),
        figure_path(out, 'activation_patching_heads', subject),
        f'Patching one head: {subject.label}', 'head', 'attention layer', vmin=None,
        vmax=None, xlabels=[str(h) for h in range(counts[0])],
        ylabels=[b.label for b in subject.layers.branches if b.kind == 'attention'],
        colorbar_label='clean logit difference restored'))
  return figures


def _findings(label, r, q):
  if 'refused' in r:
    return [f'{label}: not measured: {r["refused"]}']
  branches = [k for k, kind in enumerate(r['kinds']) if kind != 'head']
  best = max(branches, key=lambda k: r['restored'][k])
  text = [f'{label}: on {r["pairs"]} of {r["num_images"]} images whose prediction '
          f'{r["corruption"]} (severity {r["severity"]}) changes, one branch patched from the '
          'clean run '
          'restores from ', q('restored', branches[0]), ' (', r['sites'][branches[0]],
          ') to ', q('restored', best), ' ± ', q('restored_stderr', best),
          f' ({r["sites"][best]}) of the clean logit difference']
  heads = [k for k, kind in enumerate(r['kinds']) if kind == 'head']
  if heads:
    top = max(heads, key=lambda k: r['restored'][k])
    text += ['; the most one head restores is ', q('restored', top), ' ± ',
             q('restored_stderr', top), f' ({r["sites"][top]})']
  return text


TOOL = register(Tool(
    name='activation_patching', importance=20, title='Activation patching',
    quantity='On the evaluation images whose prediction a corruption changes, the model run '
             'on the corrupted image with one residual branch\'s output (or one attention '
             "head's, before the projection) replaced by its value on the clean image: the "
             'share of the clean logit difference (clean prediction minus corrupted '
             'prediction) it restores, summed over pairs, ± its delta-method standard error.',
    paper='No claim of the two papers: denoising activation patching as TransformerLens and '
          'ViT-Prisma draw it (Meng et al. 2022 call it causal tracing), per branch and '
          'per head.',
    reads_logits=True,
    options=Options,
    run=measure, draw=draw, findings=each_model(_findings),
    scalars=lambda result, label: ({'activation_patching/restored': result[label]['restored']}
                                   if 'restored' in result.get(label, {}) else {}),
    # The clean and corrupted runs, the clean intermediates and one run per site;
    # a compilation per sown name patched (the edits' tree differs), once for all
    # batches.
    work=lambda subject, options, amounts: Work(
        {'forward': (3 + len(sites(subject))) * amounts.batches},
        {'forward': 3 + len({site.name for site in sites(subject)})})))
