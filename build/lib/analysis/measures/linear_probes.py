"""Linear probes in closed form: ridge regression from features to {-1, 1} class
targets, the few-shot evaluation of the ViT paper and the per-layer probes of
Raghu et al. 2021. Host-side float64 numpy: the solves are small and must be exact.
They run on one BLAS thread: at these sizes a second thread gains little on an
idle machine, and beside other work OpenBLAS's waiting threads make them ten
times slower or worse.
"""
from typing import Dict, Sequence, Tuple

import numpy as np
import threadpoolctl

DEFAULT_L2 = (1e-4, 1e-2, 1., 1e2, 1e4)


def ridge_fit(x: np.ndarray, targets: np.ndarray, l2s: Sequence[float]
              ) -> Tuple[np.ndarray, np.ndarray]:
  """Weights (len(l2s), d, k) and biases (len(l2s), k) minimising
  ||x W + b - targets||^2 + l2 ||W||^2 for every l2, from one SVD of the centred x.

  Args:
    x: (n, ...) features, flattened per example.
    targets: (n, k) regression targets.
    l2s: the ridge penalties.

  Returns:
    (weights (len(l2s), d, k), biases (len(l2s), k)).
  """
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  targets = np.asarray(targets, np.float64)
  x_mean, t_mean = x.mean(0), targets.mean(0)
  u, s, vt = np.linalg.svd(x - x_mean, full_matrices=False)
  projected = u.T @ (targets - t_mean)
  weights = np.stack([vt.T @ ((s / (s**2 + l2))[:, None] * projected) for l2 in l2s])
  biases = t_mean - np.einsum('d,ldk->lk', x_mean, weights)
  return weights, biases


def signed_one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
  """(n, num_classes) targets: 1 at each example's class, -1 elsewhere.

  Args:
    labels: (n,) integer labels.
    num_classes: the number of classes.

  Returns:
    The targets.
  """
  return 2. * np.eye(num_classes)[labels] - 1.


@threadpoolctl.threadpool_limits.wrap(limits=1, user_api='blas')
def ridge_accuracies(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                     test_y: np.ndarray, num_classes: int,
                     l2s: Sequence[float] = DEFAULT_L2) -> np.ndarray:
  """Test accuracy of the ridge classifier for each l2.

  Args:
    train_x: (n, ...) training features.
    train_y: their integer labels.
    test_x: (m, ...) test features.
    test_y: their integer labels.
    num_classes: the number of classes.
    l2s: the ridge penalties.

  Returns:
    The accuracy per l2, (len(l2s),).
  """
  weights, biases = ridge_fit(train_x, signed_one_hot(train_y, num_classes), l2s)
  test_x = np.asarray(test_x, np.float64).reshape(len(test_x), -1)
  scores = np.einsum('nd,ldk->lnk', test_x, weights) + biases[:, None]
  return np.mean(scores.argmax(-1) == np.asarray(test_y)[None], axis=1)


def probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                   test_y: np.ndarray, num_classes: int, l2s: Sequence[float] = DEFAULT_L2,
                   holdout: float = 0.2) -> Dict[str, float]:
  """Linear-probe test accuracy with l2 chosen on a held-out part of the training
  features (the last `holdout` fraction), then refitted on all of them.

  Args:
    train_x: (n, ...) training features.
    train_y: their integer labels.
    test_x: (m, ...) test features.
    test_y: their integer labels.
    num_classes: the number of classes.
    l2s: the ridge penalties to choose from.
    holdout: the share of the training features held out to choose l2.

  Returns:
    {'accuracy': the test accuracy, 'l2': the penalty chosen}.
  """
  cut = int(round(len(train_x) * (1 - holdout)))
  held_out = ridge_accuracies(train_x[:cut], train_y[:cut], train_x[cut:], train_y[cut:],
                              num_classes, l2s)
  l2 = l2s[int(np.argmax(held_out))]
  accuracy = ridge_accuracies(train_x, train_y, test_x, test_y, num_classes, [l2])[0]
  return {'accuracy': float(accuracy), 'l2': float(l2)}


def few_shot_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                      test_y: np.ndarray, num_classes: int, shots: int, l2: float = 1.,
                      seeds: Sequence[int] = (0, 1, 2)) -> float:
  """Mean test accuracy of ridge classifiers fitted on `shots` examples per class,
  drawn afresh for each seed (the ViT paper's few-shot linear evaluation).

  Args:
    train_x: (n, ...) training features the shots are drawn from.
    train_y: their integer labels.
    test_x: (m, ...) test features.
    test_y: their integer labels.
    num_classes: the number of classes.
    shots: the training examples per class.
    l2: the ridge penalty.
    seeds: one draw of the shots per seed.

  Returns:
    The test accuracy averaged over the draws.
  """
  train_y = np.asarray(train_y)
  accuracies = []
  for seed in seeds:
    rng = np.random.RandomState(seed)
    chosen = []
    for c in range(num_classes):
      members = np.flatnonzero(train_y == c)
      if len(members) < shots:
        raise ValueError(f'Class {c} has {len(members)} training examples, fewer than '
                         f'{shots} shots; use more images.')
      chosen.append(rng.choice(members, shots, replace=False))
    chosen = np.concatenate(chosen)
    accuracies.append(ridge_accuracies(train_x[chosen], train_y[chosen], test_x, test_y,
                                       num_classes, [l2])[0])
  return float(np.mean(accuracies))


def few_shot_per_position(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                          test_y: np.ndarray, num_classes: int, shots: int, l2: float = 1.,
                          seeds: Sequence[int] = (0, 1, 2)) -> np.ndarray:
  """`few_shot_accuracy` of a probe on each position of (N, H, W, D) feature maps,
  as an (H, W) grid: how well a single token (or a CNN's single position) classifies.

  Args:
    train_x: (n, H, W, D) training feature maps.
    train_y: their integer labels.
    test_x: (m, H, W, D) test feature maps.
    test_y: their integer labels.
    num_classes: the number of classes.
    shots: the training examples per class.
    l2: the ridge penalty.
    seeds: one draw of the shots per seed.

  Returns:
    The (H, W) grid of test accuracies.
  """
  h, w = np.shape(train_x)[1:3]
  return np.array([[few_shot_accuracy(train_x[:, i, j], train_y, test_x[:, i, j], test_y,
                                      num_classes, shots, l2, seeds) for j in range(w)]
                   for i in range(h)])
