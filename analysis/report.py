"""The analysis report: one page (report.html, and the same as report.md) with a
section per tool that ran, its figures (joint ones first) and captions built from
the tools' JSON: the quantity and its convention, the paper's finding, and what
these models show. Every number in a caption is a value of the JSON file beside
it (in the HTML, tagged with its file, path and reduction).
"""
import html
import json
import os
from typing import Dict, List, Mapping, Sequence, Union

import numpy as np

from analysis import joint_figures

SUBJECTS_FILE = 'subjects.json'
TITLES = {
    'cka': 'Representation similarity (CKA)',
    'attention_distance': 'Attention distance',
    'norm_ratio': 'Skip connections: norm ratios',
    'erf': 'Effective receptive fields',
    'probes': 'Linear probes',
    'localisation': 'Localisation of final-layer tokens',
    'vit_figures': 'Embedding filters, position embeddings, attention rollout',
    'hessian': 'Hessian spectra',
    'fourier': 'Fourier analysis and feature-map variance',
    'robustness': 'Robustness to frequency-band noise',
}
QUANTITY = {
    'cka': 'Linear CKA between every pair of residual-stream layers, minibatch HSIC '
           '(Nguyen et al.; unbiased unless the JSON says otherwise) over the evaluation '
           'images; layer 0 at the bottom left.',
    'attention_distance': 'Mean attention distance in pixels per head: distance from each '
                          'spatial query to every key patch weighted by its attention, the '
                          'class-token key dropped and the rest renormalised.',
    'norm_ratio': '||z|| / ||f(z)||: norm of the stream entering a residual branch over the '
                  'norm of what the branch adds, per token, class token apart.',
    'erf': 'Effective receptive field of the centre location: |d output / d input| summed '
           'over channels and images; the number is the area in pixels holding half its mass.',
    'probes': 'Ridge linear probes per layer on the class token, the centre token and the '
              'token mean; few-shot linear accuracy on the pre-logits.',
    'localisation': 'Cosine similarity of final-layer tokens at five query positions to every '
                    'input patch token, averaged over images.',
    'vit_figures': 'Principal components of the patch-embedding filters, cosine similarity '
                   'between position embeddings, attention rollout (Abnar & Zuidema).',
    'hessian': 'Top-5 Hessian eigenvalues on each minibatch by Lanczos, and the SLQ spectral '
               'density on all of them, of the objective the JSON names.',
    'fourier': 'Relative log amplitude of the feature maps\' 2-D Fourier transform: the '
               'high-frequency value is delta log amplitude at pi against 0, per layer; '
               'variance is the unbiased feature-map variance per layer.',
    'robustness': 'Accuracy under noise eps * sign(N(0,1)) masked to a frequency band around '
                  'f in [0, pi] (Park & Kim\'s protocol), images in [-1, 1].',
}
PAPER = {
    'cka': 'Raghu et al. (Fig. 1-2): ViT\'s representations are uniform across depth, while '
           'ResNet\'s lower and higher layers differ (block structure); ViT\'s lower half '
           'matches a larger share of ResNet\'s depth.',
    'attention_distance': 'Raghu et al. (Fig. 3), ViT paper (Fig. 7): lower layers hold '
                          'local and global heads, higher layers attend globally; with less '
                          'pre-training data the local heads of lower layers disappear.',
    'norm_ratio': 'Raghu et al. (Fig. 5): in ViT the ratio is high for the class token in '
                  'early blocks and for spatial tokens later; skips carry representations '
                  'more strongly in ViT than in ResNet.',
    'erf': 'Raghu et al. (Fig. 6): ViT\'s receptive fields are larger in its lower layers than '
           'ResNet\'s, which grow gradually with depth.',
    'probes': 'Raghu et al. (Fig. 12-13): a class-token ViT\'s class token becomes decodable '
              'only in the last layers, while the spatial tokens\' mean is decodable earlier.',
    'localisation': 'Raghu et al. (Fig. 9): ViT\'s final tokens stay most similar to the input '
                    'patch at their own position; ResNet\'s and GAP models\' less so.',
    'vit_figures': 'ViT paper (Fig. 7): the filter components resemble bases for fine patch '
                   'structure; nearby positions have similar embeddings, in rows and columns.',
    'hessian': 'Park & Kim (Fig. 1, 4): ViT\'s top eigenvalues are smaller (a flatter '
               'landscape) than ResNet\'s, but its spectrum has negative eigenvalues that '
               'large data and training suppress.',
    'fourier': 'Park & Kim (Fig. 2b, 9): multi-head attention lowers high-frequency amplitude '
               '(low-pass) and convolutions raise it; MSAs lower feature-map variance, '
               'convolutions raise it.',
    'robustness': 'Park & Kim (Fig. 2c): ViT is robust to high-frequency noise where ResNet is '
                  'vulnerable; both suffer from low-frequency noise.',
}
REDUCTIONS = ('value', 'mean', 'min', 'max', 'offdiag_mean')


class Quote:
  """A number quoted from a tool's JSON: the file, the key path into it and a
  reduction over the leaves found there."""

  def __init__(self, results: Mapping, tool: str, path: Sequence[Union[str, int]],
               reduce: str = 'value', fmt: str = '.3g'):
    assert reduce in REDUCTIONS, reduce
    node = results[tool]
    for key in path:
      node = node[key]
    self.file, self.path, self.reduce = f'{tool}.json', list(path), reduce
    self.value = reduce_value(node, reduce)
    self.text = format(self.value, fmt)


def leaves(node) -> List[float]:
  """Every number under a JSON node, in order."""
  if isinstance(node, Mapping):
    return [x for v in node.values() for x in leaves(v)]
  if isinstance(node, (list, tuple)):
    return [x for v in node for x in leaves(v)]
  return [float(node)]


def reduce_value(node, reduce: str) -> float:
  if reduce == 'value':
    return float(node)
  if reduce == 'offdiag_mean':  # mean similarity between distinct layers
    matrix = np.asarray(node, np.float64)
    return float(matrix[~np.eye(len(matrix), dtype=bool)].mean())
  return float(getattr(np, reduce)(leaves(node)))


Fragment = Union[str, Quote]


def findings(tool: str, results: Mapping) -> Dict[str, List[Fragment]]:
  """What the models show, per model label (or model pair for CKA), as text and quotes."""
  q = lambda *path, reduce='value': Quote(results, tool, path, reduce)
  result = results[tool]
  if tool == 'cka':
    out = {}
    for key in result['cka']:
      if ' vs ' in key:
        out[key] = [f'{key}: mean CKA ', q('cka', key, reduce='mean'), ', highest ',
                    q('cka', key, reduce='max')]
      else:
        out[key] = [f'{key}: first vs last layer ', q('cka', key, 0, -1),
                    ', mean over distinct layer pairs ', q('cka', key, reduce='offdiag_mean')]
    return out
  out = {}
  for label, r in joint_figures.per_model(result).items():
    if tool == 'attention_distance':
      out[label] = [f'{label}: block 0 heads from ', q(label, 'distance_per_layer_head', 0,
                                                        reduce='min'),
                    ' to ', q(label, 'distance_per_layer_head', 0, reduce='max'),
                    ' px, last block from ', q(label, 'distance_per_layer_head', -1, reduce='min'),
                    ' to ', q(label, 'distance_per_layer_head', -1, reduce='max'), ' px']
    elif tool == 'norm_ratio':
      kind = 'cls' if 'cls' in next(iter(r['ratios'].values())) else 'spatial'
      branches = list(r['ratios'])
      out[label] = [f'{label}: {kind} tokens {branches[0]} ',
                    q(label, 'ratios', branches[0], kind), f', {branches[-1]} ',
                    q(label, 'ratios', branches[-1], kind), '; all branches and tokens from ',
                    q(label, 'ratios', reduce='min'), ' to ', q(label, 'ratios', reduce='max')]
    elif tool == 'erf':
      out[label] = [f'{label}: half the mass within ', q(label, 'half_mass_pixels', 0),
                    f' px at {r["layers"][0]}, ', q(label, 'half_mass_pixels', -1),
                    f' px at {r["layers"][-1]}']
    elif tool == 'probes':
      parts = [f'{label}: last-layer probes ']
      for i, kind in enumerate(r['probes']):
        parts += [', ' if i else '', f'{kind} ', q(label, 'probes', kind, -1, 'accuracy')]
      for shots in r['few_shot_pre_logits']:
        parts += [f'; {shots}-shot on pre-logits ', q(label, 'few_shot_pre_logits', shots)]
      out[label] = parts
    elif tool == 'localisation':
      out[label] = [f'{label}: share of queries whose most similar input patch is their own ',
                    q(label, 'peak_at_query', reduce='mean')]
    elif tool == 'vit_figures':
      out[label] = [f'{label}: {len(r["figures"])} panels (filters, '
                    f'{"position similarity, " if "position_similarity" in r else ""}rollout)']
    elif tool == 'hessian':
      out[label] = [f'{label} ({r["objective"]["name"]} objective, ',
                    q(label, 'num_parameters'), ' parameters): top eigenvalues from ',
                    q(label, 'top_per_minibatch', reduce='min'), ' to ',
                    q(label, 'top_per_minibatch', reduce='max'),
                    '; negative spectral mass ', q(label, 'negative_fraction'),
                    ', beyond 1% of the largest ', q(label, 'negative_fraction_beyond_1pct')]
    elif tool == 'fourier':
      out[label] = [f'{label}: high-frequency delta log amplitude ',
                    q(label, 'high_frequency', 0), f' at {r["layers"][0]}, ',
                    q(label, 'high_frequency', -1), f' at {r["layers"][-1]}; variance ',
                    q(label, 'variance', 0), ' to ', q(label, 'variance', -1)]
    elif tool == 'robustness':
      out[label] = [f'{label}: clean ', q(label, 'clean_accuracy'), '; at eps ',
                    q(label, 'epsilons', -1), ' accuracy ', q(label, 'accuracy', -1, 0),
                    ' for f = 0 and ', q(label, 'accuracy', -1, -1), ' for f = pi']
  return out


def load_results(out: str) -> Dict[str, Mapping]:
  """Every tool's JSON in `out`, in the tools' order."""
  results = {}
  for tool in TITLES:
    path = os.path.join(out, f'{tool}.json')
    if os.path.exists(path):
      with open(path) as f:
        results[tool] = json.load(f)
  return results


def load_subjects(out: str) -> Dict[str, Mapping]:
  path = os.path.join(out, SUBJECTS_FILE)
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _html(fragments: Sequence[Fragment]) -> str:
  parts = []
  for fragment in fragments:
    if isinstance(fragment, Quote):
      parts.append(f'<span class="num" data-file="{fragment.file}" '
                   f'data-path="{html.escape(json.dumps(fragment.path))}" '
                   f'data-reduce="{fragment.reduce}">{fragment.text}</span>')
    else:
      parts.append(html.escape(fragment))
  return ''.join(parts)


def _text(fragments: Sequence[Fragment]) -> str:
  return ''.join(f.text if isinstance(f, Quote) else f for f in fragments)


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
figure{display:inline-block;margin:0.5em;vertical-align:top;max-width:100%}
figure img{max-width:100%}figcaption{font-size:0.9em;max-width:640px}
p.quantity{color:#444}p.paper{font-style:italic}.num{font-weight:bold}"""


def write_report(out: str) -> Dict[str, str]:
  """Writes the joint figures, report.html and report.md for the JSON in `out`;
  returns the two pages' paths."""
  results, subjects = load_results(out), load_subjects(out)
  if not results:
    raise FileNotFoundError(f'No analysis results (tool JSON files) in {out}; run '
                            '`python -m analysis all --out DIR ...` first.')
  families = {label: s.get('family', '') for label, s in subjects.items()}
  joint = joint_figures.joint_figures(results, families, out)
  title = 'Analysis of ' + ', '.join(subjects or sorted(
      {label for r in results.values() for label in joint_figures.per_model(r)}))
  page = [f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}'
          f'</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>']
  markdown = [f'# {title}', '']
  if subjects:
    rows = ''.join(f'<li>{html.escape(label)}: {html.escape(s.get("model_name", ""))} '
                   f'({html.escape(s.get("family", ""))}) from '
                   f'{html.escape(s.get("source", ""))}</li>' for label, s in subjects.items())
    page.append(f'<ul>{rows}</ul>')
    markdown += [f'- {label}: {s.get("model_name", "")} ({s.get("family", "")}) from '
                 f'{s.get("source", "")}' for label, s in subjects.items()] + ['']
  for tool, result in results.items():
    shown = findings(tool, results)
    json_file = f'{tool}.json'
    page += [f'<section id="{tool}"><h2>{html.escape(TITLES[tool])}</h2>',
             f'<p class="quantity">{html.escape(QUANTITY[tool])}</p>',
             f'<p class="paper">{html.escape(PAPER[tool])}</p>',
             f'<p>Numbers: <a href="{json_file}">{json_file}</a></p>']
    markdown += [f'## {TITLES[tool]}', '', QUANTITY[tool], '', f'*{PAPER[tool]}*', '',
                 f'Numbers: [{json_file}]({json_file})', '']
    figures = [(path, list(shown)) for path in joint.get(tool, [])]
    if tool == 'cka':  # run_cka draws one figure per key, in the keys' order
      figures += [(path, [key]) for key, path in zip(result['cka'], result['figures'])]
    else:
      figures += [(path, [label]) for label, r in joint_figures.per_model(result).items()
                  for path in r.get('figures', [])]
    for path, keys in figures:
      name = os.path.basename(path)
      page.append(f'<figure><img src="{html.escape(name)}" alt="{html.escape(name)}">'
                  '<figcaption>' + '<br>'.join(_html(shown[k]) for k in keys) +
                  '</figcaption></figure>')
      markdown += [f'![{name}]({name})', '', *[_text(shown[k]) + '  ' for k in keys], '']
    page.append('</section>')
  page.append('</body></html>')
  paths = {'html': os.path.join(out, 'report.html'), 'md': os.path.join(out, 'report.md')}
  for kind, text in (('html', '\n'.join(page)), ('md', '\n'.join(markdown))):
    with open(paths[kind] + '.tmp', 'w') as f:
      f.write(text + '\n')
    os.replace(paths[kind] + '.tmp', paths[kind])
  return paths
