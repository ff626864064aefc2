"""Similarity scores calibrated against their permutation null
(`analysis.measures.null_calibration`): the authors' formulas written out here
from their code (mlbio-epfl/Aristotelian, calibrated_similarity/calibration.py,
version 0.1.1), and their package itself run on the same permutations, in a
PyTorch process of its own (as timm's side runs, tests/test_timm.py)."""
import importlib.util
import json
import math
import subprocess

import numpy as np
import pytest

from analysis.measures import null_calibration as nc


def _linear_cka(x, y):
  """Linear CKA of two (n, d) representations, as the authors' docstring example
  (calibration.py:149-152): centred, HSIC over the Grams' norms."""
  x, y = x - x.mean(0), y - y.mean(0)
  gx, gy = x @ x.T, y @ y.T
  return float((gx * gy).sum() / np.linalg.norm(gx) / np.linalg.norm(gy))


def _authors_calibration(observed, null, alpha, smax):
  """calibration.py:183-199, in numpy: the combined sort, the clamped
  ceil((1 - alpha)(K + 1)) - 1 index, the add-one p-value, the rescaled score."""
  k = len(null)
  combined = np.sort(np.concatenate([[observed], null]))
  idx = max(0, min(int(math.ceil((1.0 - alpha) * (k + 1))) - 1, k))
  tau = combined[idx]
  p = (1.0 + np.sum(np.asarray(null) >= observed)) / float(k + 1)
  if smax is None:
    return max(observed - tau, 0.0), p, tau
  return min(max((observed - tau) / max(smax - tau, 1e-12), 0.0), 1.0), p, tau


@pytest.mark.parametrize('alpha', [0.05, 0.1, 0.5])
@pytest.mark.parametrize('smax', [1.0, 2.0, None])
def test_the_calibration_is_the_authors_formula(alpha, smax):
  rng = np.random.default_rng(0)
  for count in (19, 20, 57, 200):
    null = rng.uniform(0, 1, count).round(2)  # rounded: ties with the observed score
    for observed in (null[3], 0.99, 0.0, float(np.quantile(null, 0.9))):
      got = nc.calibrated(observed, null, alpha, smax)
      score, p, tau = _authors_calibration(observed, null, alpha, smax)
      assert (got.score, got.p_value, got.threshold) == pytest.approx((score, p, tau), abs=1e-12)
      assert got.raw == observed


def test_a_representation_against_itself_and_a_constant_measure():
  """x against itself: CKA 1, above every shuffled copy, so p = 1/(K+1) and the
  calibrated score 1; a measure blind to the pairing: p = 1 and score 0."""
  rng = np.random.default_rng(1)
  x = rng.normal(size=(30, 5))
  permutations = nc.row_permutations(30, 99, seed=2)
  itself = nc.calibrate(x, x, _linear_cka, permutations)
  assert itself.raw == pytest.approx(1.0) and itself.score == pytest.approx(1.0)
  assert itself.p_value == pytest.approx(1 / 100)
  # Blind to the pairing to the bit: sorted before they are summed, b's entries give
  # one sum in any row order (a norm's summation order follows the rows, and its last
  # bit with them on some CPUs).
  blind = nc.calibrate(x, x, lambda a, b: float(np.sum(np.sort(np.ravel(b) ** 2))), permutations)
  assert (blind.score, blind.p_value) == (0.0, 1.0)


def test_independent_representations_are_not_significant_at_their_level():
  """Under the null (independent x and y) the p-value is uniform: at the 5% level
  about 5% of pairs are significant, the calibrated score 0 for the others."""
  rng = np.random.default_rng(3)
  permutations = nc.row_permutations(20, 39, seed=4)
  found = [nc.calibrate(rng.normal(size=(20, 3)), rng.normal(size=(20, 3)), _linear_cka,
                        permutations) for _ in range(200)]
  significant = np.mean([f.p_value <= 0.05 for f in found])
  assert significant < 0.12  # 5% expected; binomial sd 1.5%
  assert all(f.score == 0 for f in found if f.p_value > 0.05)


def test_the_layer_aggregate_takes_one_permutation_for_every_layer():
  """Algorithm 2 written out (calibration.py:300-322): each null matrix from one
  permutation of every layer of the second model, then its max or mean."""
  rng = np.random.default_rng(5)
  shared = rng.normal(size=(25, 4))
  xs = [shared + rng.normal(size=(25, 4)) * s for s in (0.1, 1.0, 3.0)]
  ys = [shared @ rng.normal(size=(4, 6)) + rng.normal(size=(25, 6)) * s for s in (0.5, 2.0)]
  permutations = nc.row_permutations(25, 49, seed=6)
  for aggregate, reduce in (('max', np.max), ('mean', np.mean)):
    got = nc.calibrate_layers(xs, ys, _linear_cka, permutations, aggregate)
    observed = reduce([[_linear_cka(x, y) for y in ys] for x in xs])
    null = [reduce([[_linear_cka(x, y[pi]) for y in ys] for x in xs]) for pi in permutations]
    score, p, tau = _authors_calibration(observed, null, 0.05, 1.0)
    assert (got.raw, got.score, got.p_value, got.threshold) == pytest.approx(
        (observed, score, p, tau), abs=1e-12)
    assert got.p_value == pytest.approx(1 / 50)  # the shared signal beats every shuffle


@pytest.mark.parametrize('call,says', [
    (lambda: nc.check_null(1, 200), 'at least 2 images; 1 were given'),
    (lambda: nc.check_null(50, 10), '10 permutations cannot give a p-value below 0.05'),
    (lambda: nc.check_null(50, 200, alpha=1.5), 'strictly between 0 and 1'),
    (lambda: nc.calibrate(np.zeros((5, 2)), np.zeros((6, 2)), _linear_cka,
                          nc.row_permutations(5, 30)), 'hold \\[5, 6\\] images'),
    (lambda: nc.calibrate(np.ones((5, 2)), np.ones((5, 2)), _linear_cka,
                          np.zeros((30, 5), int)), 'each row a permutation'),
    (lambda: nc.calibrate_layers([np.ones((5, 2))], [np.ones((5, 2))], _linear_cka,
                                 nc.row_permutations(5, 30), 'median'), "use 'max' or 'mean'"),
])
def test_a_null_that_cannot_be_estimated_is_refused_in_one_sentence(call, says):
  with pytest.raises(ValueError, match=says):
    call()


# The authors' package on the same inputs and permutations (perm_fn gives them in
# order), linear CKA in torch as their docstring writes it.
AUTHORS_SIDE = r'''
import json, sys
import numpy as np
import torch
from calibrated_similarity import calibrate, calibrate_layers

spec = json.loads(sys.argv[1])
data = np.load(spec['data'])
xs = [torch.from_numpy(data[f'x{i}']) for i in range(spec['xs'])]
ys = [torch.from_numpy(data[f'y{i}']) for i in range(spec['ys'])]
permutations = iter(torch.from_numpy(data['permutations']))


def cka(x, y):
  x, y = x - x.mean(0), y - y.mean(0)
  gx, gy = x @ x.T, y @ y.T
  return (gx * gy).sum() / gx.norm() / gy.norm()


found = {}
for name, run in (('scalar', lambda f: calibrate(xs[0], ys[0], cka, K=spec['k'], perm_fn=f)),
                  ('max', lambda f: calibrate_layers(xs, ys, cka, agg='max', K=spec['k'],
                                                     perm_fn=f)),
                  ('mean', lambda f: calibrate_layers(xs, ys, cka, agg='mean', K=spec['k'],
                                                      perm_fn=f))):
  permutations = iter(torch.from_numpy(data['permutations']))
  found[name] = [float(v) for v in run(lambda n, device: next(permutations))]
print(json.dumps(found))
'''


@pytest.mark.skipif(importlib.util.find_spec('calibrated_similarity') is None
                    or importlib.util.find_spec('torch') is None,
                    reason='calibrated-similarity and torch are not installed '
                           '(requirements-timm.txt)')
def test_the_authors_package_gives_the_same_scores_p_values_and_thresholds(tmp_path,
                                                                           torch_python):
  rng = np.random.default_rng(7)
  shared = rng.normal(size=(40, 3))
  xs = [(shared @ rng.normal(size=(3, 8)) + rng.normal(size=(40, 8)) * s).astype(np.float64)
        for s in (0.5, 4.0)]
  ys = [(shared @ rng.normal(size=(3, 5)) + rng.normal(size=(40, 5)) * s).astype(np.float64)
        for s in (1.0, 6.0, 12.0)]
  permutations = nc.row_permutations(40, 60, seed=8)
  data = tmp_path / 'data.npz'
  np.savez(data, permutations=permutations, **{f'x{i}': x for i, x in enumerate(xs)},
           **{f'y{i}': y for i, y in enumerate(ys)})
  done = subprocess.run([torch_python, '-c', AUTHORS_SIDE, json.dumps(
      {'data': str(data), 'xs': len(xs), 'ys': len(ys), 'k': len(permutations)})],
                        capture_output=True, text=True, check=True)
  theirs = json.loads(done.stdout.strip().splitlines()[-1])
  ours = {'scalar': nc.calibrate(xs[0], ys[0], _linear_cka, permutations),
          'max': nc.calibrate_layers(xs, ys, _linear_cka, permutations, 'max'),
          'mean': nc.calibrate_layers(xs, ys, _linear_cka, permutations, 'mean')}
  for name, (score, p_value, threshold) in theirs.items():
    # Theirs are float32 (calibration.py:166, 171): scores agree to its precision.
    assert ours[name].score == pytest.approx(score, abs=1e-5), name
    assert ours[name].p_value == pytest.approx(p_value, abs=1e-6), name
    assert ours[name].threshold == pytest.approx(threshold, abs=1e-6), name
  assert 0 < ours['scalar'].score < 1 and ours['mean'].p_value < 0.05
