"""How long the analysis tools will take, before they run.

Each tool counts the model passes it makes (`Tool.work`: forward passes,
gradients and Hessian-vector products over one batch, and the programs it
compiles); one timed pass of each kind on each model prices them. The estimate
leaves out what is not a model pass (the CKA products, the probes' solves,
figures), which on the quick-start models is a small part; the docs compare
estimates with the measured times.
"""
import dataclasses
import time
from typing import Callable, Dict, Mapping, Sequence

import jax
import numpy as np

from analysis import features, hessian

KINDS = ('forward', 'gradient', 'hvp')


@dataclasses.dataclass(frozen=True)
class Amounts:
  """The data the command line gives every tool."""
  num_images: int  # per split
  batch_size: int

  @property
  def batches(self) -> int:
    return -(-self.num_images // self.batch_size)


@dataclasses.dataclass(frozen=True)
class Work:
  """A tool's passes over one batch of the command's size, and its compilations,
  by kind ('forward', 'gradient', 'hvp')."""
  passes: Mapping[str, float]
  compiles: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    unknown = (set(self.passes) | set(self.compiles)) - set(KINDS)
    if unknown:
      raise ValueError(f'Unknown kinds of work {sorted(unknown)}; use {KINDS}.')


def one_pass_over_the_data(subject: features.Subject, options: Mapping, amounts: Amounts) -> Work:
  """A forward pass over the evaluation split: what a tool that declares no work does."""
  return Work({'forward': amounts.batches}, {'forward': 1})


@dataclasses.dataclass(frozen=True)
class Prices:
  """Seconds of one pass over one batch, and of compiling it, by kind."""
  run: Mapping[str, float]
  compile: Mapping[str, float]

  def seconds(self, work: Work) -> float:
    compiles = dict(work.compiles) or {kind: 1 for kind, n in work.passes.items() if n}
    return (sum(n * self.run[kind] for kind, n in work.passes.items()) +
            sum(n * self.compile[kind] for kind, n in compiles.items()))


def _timed(fn: Callable, *args) -> tuple:
  """(seconds of the first call, seconds of a second one): compiling, then running."""
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  second = time.perf_counter() - start
  return max(first - second, 0.), second


def price(subject: features.Subject, images: np.ndarray, labels: np.ndarray,
          kinds: Sequence[str] = KINDS) -> Prices:
  """Times one pass of each of `kinds` over the batch (images, labels) on `subject`:
  the forward pass with the residual stream kept, the gradient of the
  cross-entropy, and a Hessian-vector product of it, as the tools run them."""
  params = subject.params
  if labels.ndim == 1:
    labels = jax.nn.one_hot(labels, subject.config.num_classes)
  unroll = hessian.loops_on_host(subject.family.convolutional)
  batch = tuple(features.shard_examples(x, axis=1, mesh=subject.mesh)
                for x in hessian.stack_batches([(images, labels)]))
  loss = hessian.training_loss(subject.model, unroll=unroll)
  timed = {}
  if 'forward' in kinds:  # compiled once for the subject, as the tools then use it
    timed['forward'] = _timed(lambda x: subject.intermediates(x, subject.layers.stream), images)
  if 'gradient' in kinds:
    timed['gradient'] = _timed(jax.jit(jax.grad(loss)), params, batch)
  if 'hvp' in kinds:
    matvec, dim = hessian.flat_hvp(loss, params, unroll=unroll)
    vector = jax.random.normal(jax.random.PRNGKey(0), (dim,))
    timed['hvp'] = _timed(jax.jit(matvec), vector, params, batch)
  return Prices({k: t[1] for k, t in timed.items()}, {k: t[0] for k, t in timed.items()})


def kinds_needed(works: Sequence[Work]) -> Sequence[str]:
  """The kinds of pass the works use, in KINDS order."""
  used = {kind for w in works for kind, n in {**w.passes, **w.compiles}.items() if n}
  return [kind for kind in KINDS if kind in used]


def estimates(tools: Mapping[str, Callable[[features.Subject], Work]],
              subjects: Sequence[features.Subject],
              prices: Mapping[str, Prices]) -> Dict[str, float]:
  """Seconds of each tool, summed over the subjects it runs on: `tools` maps a
  tool's name to its work on one subject (None where it does not apply)."""
  total = {}
  for name, work_on in tools.items():
    total[name] = 0.
    for s in subjects:
      work = work_on(s)
      if work is not None:
        total[name] += prices[s.label].seconds(work)
  return total
