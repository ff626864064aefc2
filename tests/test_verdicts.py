"""Verdicts: each tool's rule on constructed JSON that agrees with the paper, differs
from it, and lies within the uncertainty; and the standard errors they rest on."""
import numpy as np
import pytest

from analysis import tool
from analysis.measures import uncertainty
from analysis.cli import report
from analysis.reporting import verdict
from analysis.tools import TOOLS
from vit_jax.models.family import CONVNET, TRANSFORMER

MODELS = {'vit': {'architecture': TRANSFORMER}, 'bit': {'architecture': CONVNET}}
# (value predicted to be positive, its standard error) -> expected verdict
CASES = [((0.5, 0.1), verdict.AGREES), ((-0.5, 0.1), verdict.DIFFERS),
         ((0.1, 0.1), verdict.INCONCLUSIVE)]


def test_weighted_mean_stderr_is_the_familiar_formula():
  x = np.array([[1., 4.], [2., 0.], [6., 5.], [3., 3.]])
  np.testing.assert_allclose(uncertainty.weighted_mean_stderr(x, [8, 8, 8, 8]),
                             x.std(axis=0, ddof=1) / 2)
  # Unequal batches: the weighted mean's standard error, written out.
  sizes = np.array([10., 30., 20., 40.])
  w = sizes / sizes.sum()
  mean = (w[:, None] * x).sum(0)
  expected = np.sqrt(4 / 3 * (w[:, None]**2 * (x - mean)**2).sum(0))
  np.testing.assert_allclose(uncertainty.weighted_mean_stderr(x, sizes), expected)
  assert np.isnan(uncertainty.weighted_mean_stderr(x[:1], [5]))[0]
  np.testing.assert_allclose(uncertainty.binomial_stderr(0.9, 1000), np.sqrt(.09 / 1000))


@pytest.mark.parametrize('estimate, expected', CASES)
def test_judge_says_differs_only_beyond_two_standard_errors(estimate, expected):
  assert verdict.judge(estimate)[0] == expected
  assert verdict.judge((np.nan, 0.1))[0] == verdict.NOT_COMPARABLE
  assert verdict.judge((0.5, np.nan))[0] == verdict.INCONCLUSIVE


def _contrast(value, se):
  """JSON values of a transformer (a) and a convnet (b) whose difference a - b is
  `value` with standard error `se` (split equally between the two)."""
  half = se / np.sqrt(2)
  return (1. + value, half), (1., half)


def _cka(a, b):  # uniformity a / 2 and b / 2 (CKA lies in [0, 1])
  matrix = lambda x: (np.full((3, 3), x) + (1 - x) * np.eye(3)).tolist()
  return {'cka': {'vit': matrix(a[0] / 2), 'bit': matrix(b[0] / 2), 'vit vs bit': matrix(.5)},
          'offdiag_mean_stderr': {'vit': a[1] / 2, 'bit': b[1] / 2}}


def _norm_ratio(a, b):
  # log10 ratios of a and b with standard errors se: ratio 10^v, its stderr se * ratio * ln 10.
  entry = lambda e: {'ratios': {'x': {'spatial': 10**e[0]}},
                     'ratios_stderr': {'x': {'spatial': e[1] * 10**e[0] * np.log(10)}}}
  return {'vit': entry(a), 'bit': entry(b)}


def _erf(a, b):
  entry = lambda e: {'half_mass_pixels': [e[0]] * 4, 'half_mass_stderr': [e[1]] * 4}
  return {'vit': entry(a), 'bit': entry(b)}


def _hessian_flat(a, b):  # ViT flatter: the claim's number is ResNet's minus ViT's
  entry = lambda e, se: {'top_per_minibatch': [[e + se * d] for d in (-1, 1)],
                         'negative_fraction_beyond_1pct': 0., 'negative_fraction_beyond_1pct_stderr': 0.}
  # Two minibatches at e -+ s: mean e, standard error s.
  return {'vit': entry(b[0], b[1]), 'bit': entry(a[0], a[1])}


def _hessian_negative(a, b):
  entry = lambda e: {'top_per_minibatch': [[1.], [1.]], 'negative_fraction_beyond_1pct': e[0],
                     'negative_fraction_beyond_1pct_stderr': e[1]}
  return {'vit': entry(a), 'bit': entry(b)}


def _robustness(a, b):  # accuracies a / 4 and b / 4 at f = pi
  entry = lambda e: {'accuracy': [[None, 0.5, e[0] / 4]], 'accuracy_stderr': [[None, 0., e[1] / 4]],
                     'frequencies': [0., 1.5, np.pi], 'band_pixels': [0, 4, 8]}
  return {'vit': entry(a), 'bit': entry(b)}


def _localisation_contrast(a, b):
  entry = lambda e, token: {'own_margin': e[0], 'own_margin_stderr': e[1], 'class_token': token}
  return {'vit': entry(a, True), 'bit': entry(b, False)}


CONTRASTS = [('cka', 'uniform representations', _cka),
             ('localisation', 'ViT localises more than ResNet', _localisation_contrast),
             ('norm_ratio', 'stronger skips in ViT', _norm_ratio),
             ('erf', 'larger fields low in ViT', _erf),
             ('hessian', 'flatter ViT', _hessian_flat),
             ('hessian', 'negative curvature in ViT', _hessian_negative),
             ('robustness', 'ViT robust to high frequencies', _robustness)]


def _found(name, result, models, finding):
  return [v for v in TOOLS[name].verdicts(result, models) if v.finding == finding]


@pytest.mark.parametrize('name, finding, make', CONTRASTS)
@pytest.mark.parametrize('estimate, expected', CASES)
def test_a_contrast_of_vit_and_resnet(name, finding, make, estimate, expected):
  """Each rule on JSON whose ViT-minus-ResNet number (in the claim's direction) is
  the case's; without a ResNet it is not comparable."""
  result = make(*_contrast(*estimate))
  found = _found(name, result, MODELS, finding)
  assert [v.verdict for v in found] == [expected], (found, result)
  alone = _found(name, result, {'vit': MODELS['vit']}, finding)
  assert [v.verdict for v in alone] == [verdict.NOT_COMPARABLE]
  assert 'needs a' in alone[0].why


def _attention_distance(value, se):
  # Block 0 all heads at 10 px, the last block's at 10 + value.
  head = se / np.sqrt(2)
  return {'vit': {'distance_per_layer_head': [[10., 10.], [10. + value, 10. + value]],
                  'distance_stderr': [[head, head], [head, head]]}}


def _probes(value, se):
  rows = lambda acc, s: [{'accuracy': acc, 'stderr': s}] * 3
  return {'vit': {'layers': ['a', 'b', 'c'], 'probes': {
      'token mean': rows(0.5 + value, se / np.sqrt(2)), 'class token': rows(0.5, se / np.sqrt(2))}}}


def _localisation(value, se):
  return {'vit': {'own_margin': value, 'own_margin_stderr': se, 'class_token': True}}


def _fourier(value, se):
  change = {'mean': -value, 'stderr': se}
  return {'vit': {'attention_high_frequency_change': change,
                  'attention_log_variance_change': change}}


def _head_range(value, se):
  # Block 0's heads span 1 + value px, the last block's 1 px.
  head = se / 2
  return {'vit': {'distance_per_layer_head': [[10., 11. + value], [20., 21.]],
                  'distance_stderr': [[head] * 2] * 2}}


def _low_frequencies(value, se):
  half = se / np.sqrt(2)
  return {'vit': {'accuracy': [[None, 0.4, 0.4 + value / 2]],
                  'accuracy_stderr': [[None, half / 2, half / 2]],
                  'frequencies': [0., 1.5, np.pi], 'band_pixels': [0, 4, 8]}}


def _positions(value, se):
  return {'vit': {'neighbour_similarity': {'neighbours': 0.2 + value, 'others': 0.2}}}


SINGLES = [('attention_distance', 'global attention deeper', _attention_distance),
           ('probes', 'class token decoded late', _probes),
           ('localisation', 'tokens keep their position', _localisation),
           ('fourier', 'attention is a low-pass filter', _fourier),
           ('fourier', 'attention lowers variance', _fourier),
           ('attention_distance', 'local and global heads low', _head_range),
           ('robustness', 'ViT hurt by low frequencies', _low_frequencies)]


@pytest.mark.parametrize('name, finding, make', SINGLES)
@pytest.mark.parametrize('estimate, expected', CASES)
def test_a_claim_on_one_model(name, finding, make, estimate, expected):
  found = _found(name, make(*estimate), MODELS, finding)
  assert [v.verdict for v in found] == [expected], found


def test_exact_quantities_and_claims_without_support():
  found = _found('vit_figures', _positions(0.05, 0.), MODELS, 'nearby positions alike')
  assert [v.verdict for v in found] == [verdict.AGREES]
  found = _found('vit_figures', _positions(-0.05, 0.), MODELS, 'nearby positions alike')
  assert [v.verdict for v in found] == [verdict.DIFFERS]
  pooled = _localisation(0.4, 0.01)
  pooled['vit']['class_token'] = False
  found = _found('localisation', pooled, MODELS, 'tokens keep their position')
  assert [v.verdict for v in found] == [verdict.NOT_COMPARABLE]
  gap = {'bit': {'layers': ['a', 'b'], 'probes': {'token mean': [{'accuracy': .5, 'stderr': .1}] * 2}}}
  found = _found('probes', gap, MODELS, 'class token decoded late')
  assert [v.verdict for v in found] == [verdict.NOT_COMPARABLE]
  # A band without support at f = pi: no value, so no verdict either way.
  result = _robustness((1., .01), (1., .01))
  result['vit']['accuracy'][0][-1] = None
  result['vit']['accuracy_stderr'][0][-1] = None
  found = _found('robustness', result, MODELS, 'ViT robust to high frequencies')
  assert [v.verdict for v in found] == [verdict.NOT_COMPARABLE]


def test_values_without_support_are_null_in_json_and_no_value_in_the_report():
  result = {'a': [1., float('nan')], 'b': np.float32(np.inf), 'c': {'d': np.float64(2.)}}
  assert tool.to_json(result) == {'a': [1., None], 'b': None, 'c': {'d': 2.}}
  results = {'fourier': {'vit': {'variance': [2., None], 'variance_stderr': [None, None]}}}
  assert report.Quote(results, 'fourier', ['vit', 'variance', -1]).text == report.NO_VALUE
  assert report.Quote(results, 'fourier', ['vit', 'variance'], 'max').text == '2'
  assert report.Quote(results, 'fourier', ['vit', 'variance_stderr'], 'max').text == \
      report.NO_VALUE
  assert verdict.judge((None, 0.1))[0] == verdict.NOT_COMPARABLE
  assert verdict.judge((0.3, None))[0] == verdict.INCONCLUSIVE
  assert verdict.show((None, None)) == 'no value'
