"""Every convention an analysis quantity follows: the authors' definition with its
source, this project's default, and the named options that depart from it.

`CONVENTIONS` is the one list: docs/analysis.md's conventions table is `table()`
of it (a test keeps the two equal), a test checks each default against the
tool's options and flag, and the report names in each tool's section the
conventions its JSON records (`used`), marking any departure.
"""
import dataclasses
from typing import Dict, List, Mapping, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Convention:
  """One quantity's convention.

  Attributes:
    tool: the tool that computes the quantity.
    quantity: what is computed.
    authors: the authors' definition.
    source: where the authors' code defines it (repository, file, lines).
    option: the field of the tool's options (and the command-line flag of its
      name) that chooses the convention, or None where there is no other.
    default: this project's default value of `option` (the authors').
    departures: the other values of `option` and what each computes.
    record: the key path in a model's JSON (or the tool's, for a tool over all
      models) that records the value used.
  """
  tool: str
  quantity: str
  authors: str
  source: str
  option: Optional[str] = None
  default: Optional[str] = None
  departures: Tuple[Tuple[str, str], ...] = ()
  record: Tuple[str, ...] = ()


PK = 'xxxnell/how-do-vits-work'
CONVENTIONS: Tuple[Convention, ...] = (
    Convention(
        'hessian', 'L2 term of the training objective',
        'weight_decay (PyTorch AdamW\'s, here weight_decay / lr) / 2 x the squared norm of '
        'every parameter: AdamW decays all of model.parameters()',
        f'{PK} ops/trains.py, get_optimizer', 'hessian_l2_on', 'all',
        (('kernels', 'the kernels alone, the parameters this project\'s optimizer decays'),),
        ('objective', 'l2_on')),
    Convention(
        'hessian', 'width of the SLQ density\'s Gaussians',
        'variance 1e-5 x max(1, lambda_max - lambda_min) (means over probes of the extreme '
        'nodes, widened by 0.01)', 'amirgholami/PyHessian density_plot.py, lines 40-53',
        'hessian_density_width', 'pyhessian',
        (('wide', 'standard deviation span / 100, a smoother curve'),), ('density_width',)),
    Convention(
        'hessian', 'max eigenvalue spectra (joint figure)',
        'the top-k eigenvalues by magnitude of every minibatch, negative members included',
        'Park & Kim Fig. 1 and 4; PyHessian hessian.eigenvalues(top_n)'),
    Convention(
        'hessian', 'trace', 'Hutchinson\'s estimate from Rademacher probes',
        'amirgholami/PyHessian pyhessian/hessian.py, trace'),
    Convention(
        'landscape', 'L2 term',
        'weight_decay (PyTorch\'s, here weight_decay / lr) x the sum over every parameter '
        'tensor of its unsquared norm', f'{PK} ops/norm.py, l2, lines 15-22; '
        'losslandscape.ipynb: loss = NLL + weight_decay * l2', 'landscape_l2',
        'authors', (('objective', '(weight_decay / lr) / 2 x the squared norm of the kernels, '
                     'the term whose gradient is this project\'s decay'),),
        ('objective', 'l2_term')),
    Convention(
        'landscape', 'normalisation of the random directions',
        'per PyTorch tensor over its first (output) axis; tensors of fewer than two axes and '
        'names matching pos_embed or relative_position zeroed; fused qkv (timm) and to_kv '
        '(AlterNet) normalised as one tensor, their 1-D biases zeroed',
        f'{PK} ops/loss_landscapes.py, create_bases, lines 11-65; losslandscape.ipynb kws',
        'landscape_normalisation', 'authors',
        (('per_array', 'every array of two or more axes alone, q, k and v apart, position '
                       'embeddings and q/k/v biases perturbed'),), ('normalisation',)),
    Convention(
        'landscape', 'grid', '21 x 21 points from -1 to 1 along each direction',
        f'{PK} losslandscape.ipynb (n = 21)', 'landscape_points', '21',
        (('any other count', 'a coarser or finer grid over the same square'),)),
    Convention(
        'nll', 'training NLL (Fig. 3)',
        'the training loss as logged (train/nll): SoftTargetCrossEntropy on timm\'s Mixup '
        'targets with label_smoothing, train mode', f'{PK} ops/trains.py, train_epoch',
        'nll_train', 'training',
        (('plain', 'cross-entropy without smoothing, evaluation mode'),), ('train_nll_kind',)),
    Convention(
        'corruption', 'corruption parameters',
        'CIFAR-C\'s parameters for 32 px images', 'hendrycks/robustness '
        'ImageNet-C/create_c/make_cifar_c.py, lines 130-389', 'corruption_parameters',
        'auto',
        (('cifar', 'CIFAR-C\'s at any image size'),
         ('imagenet', 'ImageNet-C\'s (imagecorruptions, set for 224 px images)')),
        ('parameters',)),
    Convention(
        'calibration', 'ECE bins',
        '10 equal-width bins of the top-class confidence; count and accuracy over (start, '
        'end], summed confidence over [start, end), float64 edges',
        f'{PK} ops/tests.py, test and ece'),
    Convention(
        'cka', 'minibatch CKA', 'linear CKA from unbiased HSIC summed over minibatches',
        'Nguyen, Raghu & Kornblith (2021); Kornblith et al. (2019) CKA'),
    Convention(
        'similarities', 'linear and debiased CKA',
        'CKA of linear Gram matrices of the centred features, biased HSIC (linear) and '
        'the unbiased HSIC of Song et al. (debiased), on all the images at once',
        'google-research/google-research representation_similarity/Demo.ipynb, cka and '
        'feature_space_linear_cka (debiased=True)'),
    Convention(
        'similarities', 'Procrustes distance',
        'features centred, each representation scaled to unit Frobenius norm, then '
        '2 - 2 ||X^T Y||_* (from n x n Gram matrices, the same number)',
        'js-d/sim_metric dists/score_pair.py line 95 (score_local_pair) and dists/scoring.py '
        'line 116 (procrustes)'),
    Convention(
        'similarities', 'mutual k-NN alignment',
        'entries clipped at the 0.95 quantile of their absolute values, rows L2-normalised, '
        'the k = 10 nearest by inner product without the image itself, the shared share '
        'averaged over the images',
        'minyoungg/platonic-rep metrics.py lines 55 (mutual_knn), 272 and 327',
        'similarity_knn', '10', (('any other k', 'a larger or smaller neighbourhood'),)),
    Convention(
        'similarities', 'mutual k-NN\'s clipping bound',
        'one bound for all of a model\'s layers: the features stacked into one (N, L, D) '
        'tensor, its absolute entries sorted, the entry at index int(0.95 N L D)',
        'minyoungg/platonic-rep measure_alignment.py lines 16-29 and 103 (prepare_features '
        'on the stacked features), metrics.py lines 327-341 (remove_outliers, exact)',
        'similarity_knn_clip', 'model',
        (('layer', 'each layer clipped at its own 0.95 quantile'),), ('knn_clip',)),
    Convention(
        'similarities', 'RSA',
        'Spearman correlation of the upper triangles of the images\' correlation-distance '
        'matrices (1 - Pearson correlation of their activity patterns)',
        'Kriegeskorte, Mur & Bandettini 2008, Sec. 2 (no code is published with it)'),
    Convention(
        'similarities', 'SVCCA and PWCCA',
        'SVCCA: the top singular directions holding 99% of the singular values\' sum, then '
        'the mean canonical correlation; PWCCA: canonical correlations weighted by the '
        'projection of the side with fewer neurons, on the channels averaged over positions',
        'google/svcca cca_core.py line 217 (get_cca_similarity), pwcca.py line 28 '
        '(compute_pwcca), tutorials/002 ("Average Pool")', 'similarity_svcca_dims', '0',
        (('any count', 'SVCCA on that many directions per layer (google/svcca\'s tutorial 001 '
          'keeps 20), for layers that keep nearly as many directions as there are images'),)),
    Convention(
        'similarities', 'standard errors',
        'none published: the bootstrap over the images (20 draws with replacement; a copy '
        'of an image is not its own neighbour, and pairs of copies are left out of RSA)',
        'Efron & Tibshirani 1993; Kornblith et al. and Ding et al. report spreads over '
        'training runs instead', 'similarity_resamples', '20',
        (('any other count', 'more draws, a steadier standard error'),)),
    Convention(
        'head_similarities', 'measures of a head',
        'the similarities tool\'s measures and bootstrap (the rows above), on each head\'s '
        'spatial tokens before the output projection; PWCCA on the head\'s channels averaged '
        'over the tokens; the heads\' mean attention distances drawn with the images',
        'Raghu et al. 2021 Fig. 5 (linear CKA alone); the measures\' sources above',
        'similarity_measures', 'all',
        (('a comma-separated list', 'those measures alone, in less time'),)),
    Convention(
        'localisation_similarities', 'measures of a position',
        'the similarities tool\'s measures and bootstrap (the rows above), between the final '
        'representation at a query position and an input patch\'s pixels; PWCCA on the '
        'query\'s vector and the patch\'s pixels, neither having positions to average; a '
        'patch with the same pixels on every image has no value under any measure',
        'Raghu et al. 2021 Fig. 9-10 (linear CKA alone); the measures\' sources above',
        'similarity_measures', 'all',
        (('a comma-separated list', 'those measures alone, in less time'),)),
    Convention(
        'fourier', 'relative log amplitude',
        'log amplitude of the 2-D Fourier transform of the feature maps at frequencies '
        'along the diagonal, minus that at frequency 0', f'{PK} fourier_analysis.ipynb'),
    Convention(
        'head_ablation', 'removing a head',
        "the head's output multiplied by a mask of 0 before the output projection, one head "
        'at a time, the accuracy compared with the intact model\'s',
        'pmichel31415/are-16-heads-really-better-than-1 experiments/BERT/heads_ablation.sh, '
        'lines 12-20 (--attention_mask_heads layer:head)', 'head_ablation', 'zero',
        (('mean', "the head's output replaced by its mean over the evaluation images, per "
          'token (mean-ablation)'),), ('mode',)),
    Convention(
        'artifact_tokens', 'outlier rule',
        'a token whose norm exceeds 150, a threshold set on DINOv2 ViT-g/14 (no code of the '
        'analysis is published)', 'Darcet et al. 2024, Sec. 3.1', 'artifact_rule', 'absolute',
        (('relative', 'a norm beyond --artifact_factor (default 4) times the median '
          'patch-token norm of its layer, for models of another scale'),), ('rule',)),
    Convention(
        'artifact_tokens', 'neighbour similarity',
        'the cosine similarity of a patch with its 4 neighbours, of the patch embeddings '
        '"right after the patch embedding layer" (no code of the analysis is published)',
        'Darcet et al. 2024, Sec. 2.1 and Fig. 4a', 'artifact_similarity',
        'embedding', (('pixels', "the patches' raw pixels (the only choice for a model "
                                 'without a patch embedding, AlterNet)'),), ('similarity',)),
    Convention(
        'artifact_tokens', 'massive activations',
        "per image (a batch of one), the block output's magnitudes over all tokens and "
        'channels sorted, the first 3, and their median (`torch.median`: the lower middle '
        'value); then the mean over the images. Read here at every stream entry, the block '
        'outputs (`+mlp`) being theirs',
        'locuslab/massive-activations main_vit.py, exp2, lines 58-83'),
    Convention(
        'activation_patching', 'restored share',
        '(m(patched) - m(corrupted)) / (m(clean) - m(corrupted)), m the logit of the clean '
        "run's answer minus that of the corrupted run's, averaged over the pairs",
        'TransformerLensOrg/TransformerLens demos/Activation_Patching_in_TL_Demo.ipynb, '
        'get_logit_diff and ioi_metric (cells 10-11)'),
    Convention(
        'sae', 'SAE architecture and loss',
        'TopK: ReLU of the k largest of (x - b_dec) W_enc + b_enc; the MSE over the '
        "activations' mean squared deviation plus 1/32 x the AuxK loss (the dead latents' "
        '256 largest pre-activations reconstructing the residual); unit-norm decoder rows, '
        "the gradient's component along them removed; Adam at 1e-4, eps 6.25e-10",
        'openai/sparse_autoencoder sparse_autoencoder/train.py: FastAutoencoder, '
        'unit_norm_decoder_grad_adjustment_, main', 'sae_architecture', 'topk',
        (('batch_topk', 'Bussmann et al. 2024 (bartbussmann/BatchTopK sae.py): the k x batch '
                        'largest activations of the batch, no encoder bias'),
         ('relu_l1', "SAELens' standard SAE (sae_lens/saes/standard_sae.py): ReLU and an L1 "
                     'penalty weighted by decoder norms')), ('trained_architecture',)),
    Convention(
        'sae', 'forward pass of a dictionary read from a file (--sae_load)',
        "the code that wrote it: saev's x W_enc + b_enc (TopK without a ReLU; BatchTopK a "
        'JumpReLU at its running threshold), or, for files without a schema and schema 1 '
        "files written before saev's commit e7ca004 (the header's commit), (x - b_dec) W_enc "
        "+ b_enc; or ViT-Prisma's TopK or ReLU of (x' - b_dec) W_enc + b_enc, x' its "
        'run-time normalisation, undone on the reconstruction',
        'OSU-NLP-Group/saev src/saev/nn/modeling.py: SparseAutoencoder.encode, '
        'TopKActivation, BatchTopKActivation, and forward lines 87-93 at 4f87ac7 (before '
        'e7ca004); soniajoseph/ViT-Prisma src/vit_prisma/sae/sae.py: encode_standard, '
        'forward, get_activation_fn'),
    Convention(
        'sae', 'loss recovered',
        '(CE with the site zero-ablated - CE with the reconstruction) / (CE zero-ablated - '
        'CE clean): the share of the loss the ablation adds that the SAE takes back',
        'jbloomAus/SAELens sae_lens/evals.py, get_downstream_reconstruction_metrics '
        '(ce_loss_score)'),
)
# 'auto' resolves to a set by image size; the JSON records the set.
AUTHORS_VALUES = {('corruption', 'corruption_parameters'): ('auto', 'cifar')}


def table() -> str:
  """The conventions as docs/analysis.md's markdown table."""
  lines = ['| tool | quantity | the authors\' definition | source | default | options |',
           '|---|---|---|---|---|---|']
  for c in CONVENTIONS:
    default = f'`--{c.option}={c.default}` (the authors\')' if c.option else 'the authors\''
    options = '; '.join(f'`{value}`: {text}' for value, text in c.departures) or 'none'
    lines.append(f'| {c.tool} | {c.quantity} | {c.authors} | {c.source} | {default} | '
                 f'{options} |')
  return '\n'.join(lines)


def _lookup(result: Mapping, path: Tuple[str, ...]):
  for key in path:
    if not isinstance(result, Mapping) or key not in result:
      return None
    result = result[key]
  return result


def used(tool: str, result: Mapping) -> List[Tuple[Convention, Dict[str, object]]]:
  """The recorded conventions of `tool` in its JSON `result`: for each, the value
  used per model label (or under '' for a tool over all models).

  Args:
    tool: the tool's name.
    result: its JSON.

  Returns:
    (convention, {model label: value}) pairs.
  """
  found = []
  for c in CONVENTIONS:
    if c.tool != tool or not c.record:
      continue
    values = {'': _lookup(result, c.record)}
    if values[''] is None:
      values = {label: _lookup(r, c.record) for label, r in result.items()
                if isinstance(r, Mapping) and _lookup(r, c.record) is not None}
    if values and any(v is not None for v in values.values()):
      found.append((c, values))
  return found


def is_authors(convention: Convention, value: object) -> bool:
  """Whether `value` of the convention's option is the authors' convention.

  Args:
    convention: the convention.
    value: the option's value.

  Returns:
    Whether it is the authors'.
  """
  return value in AUTHORS_VALUES.get((convention.tool, convention.option), (convention.default,))


def caption(tool: str, result: Mapping) -> str:
  """One sentence naming the conventions `tool`'s JSON records, each the authors'
  or a named departure; '' where it records none.

  Args:
    tool: the tool's name.
    result: its JSON.

  Returns:
    The sentence.
  """
  parts = []
  for c, values in used(tool, result):
    shown = sorted({str(v) for v in values.values()})
    departs = [v for v in values.values() if not is_authors(c, v)]
    parts.append(f'{c.quantity}: {", ".join(shown)} '
                 + ('(a departure from the authors\')' if departs else '(the authors\')'))
  return ('Conventions: ' + '; '.join(parts) + '.') if parts else ''
