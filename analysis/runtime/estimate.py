"""How long the analysis tools will take, before they run.

Each tool counts the model passes it makes (`Tool.work`: forward passes,
gradients and Hessian-vector products over one batch, and the programs it
compiles); one timed pass of each kind on each model prices them. A tool whose
host-side work is a large part of its time (the probes' solves, corrupting
images) counts that work in units of its own (`Work.host`) and times a sample of
one unit (`Tool.host_prices`). What neither counts (the CKA products, figures)
is a small part on the quick-start models; the docs compare estimates with the
measured times, and the analysis re-plans between tools against the clock
(`analysis.cli.planning`).
"""
import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from analysis.measures import curvature
from analysis.runtime import features, objectives

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
  by kind ('forward', 'gradient', 'hvp'); and units of its host-side work, by
  names its `Tool.host_prices` prices."""
  passes: Mapping[str, float]
  compiles: Mapping[str, float] = dataclasses.field(default_factory=dict)
  host: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    unknown = (set(self.passes) | set(self.compiles)) - set(KINDS)
    if unknown:
      raise ValueError(f'Unknown kinds of work {sorted(unknown)}; use {KINDS}.')


def one_pass_over_the_data(subject: features.Subject, options: Any, amounts: Amounts) -> Work:
  """A forward pass over the evaluation split: what a tool that declares no work does.

  Args:
    subject: the model.
    options: the tool's options.
    amounts: the data the command gives every tool.

  Returns:
    The work.
  """
  return Work({'forward': amounts.batches}, {'forward': 1})


@dataclasses.dataclass(frozen=True)
class Prices:
  """Seconds of one pass over one batch, and of compiling it, by kind; and of one
  unit of each tool's host work, by the unit's name."""
  run: Mapping[str, float]
  compile: Mapping[str, float]
  host: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def seconds(self, work: Work) -> float:
    """The estimated seconds of `work`.

    Args:
      work: a tool's work on one model.

    Returns:
      Its seconds.
    """
    compiles = dict(work.compiles) or {kind: 1 for kind, n in work.passes.items() if n}
    return (sum(n * self.run[kind] for kind, n in work.passes.items()) +
            sum(n * self.compile[kind] for kind, n in compiles.items()) +
            sum(n * self.host[unit] for unit, n in work.host.items()))


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
  cross-entropy, and a Hessian-vector product of it, as the tools run them.

  Args:
    subject: the model.
    images: one batch of images.
    labels: their labels (integers or distributions).
    kinds: the kinds of pass to time.

  Returns:
    The prices (without host prices: `Tool.host_prices`).
  """
  params = subject.params
  if labels.ndim == 1:
    labels = jax.nn.one_hot(labels, subject.config.num_classes)
  unroll = curvature.loops_on_host(subject.layers.architecture)
  batch = tuple(features.shard_examples(x, axis=1, mesh=subject.mesh)
                for x in curvature.stack_batches([(images, labels)]))
  loss = objectives.training_loss(subject.model, unroll=unroll)
  timed = {}
  if 'forward' in kinds:  # compiled once for the subject, as the tools then use it
    timed['forward'] = _timed(lambda x: subject.intermediates(x, subject.layers.stream), images)
  if 'gradient' in kinds:
    timed['gradient'] = _timed(jax.jit(jax.grad(loss)), params, batch)
  if 'hvp' in kinds:
    matvec, dim, operands, _ = curvature.minibatch_hvp(
        loss, params, batch, unroll, compiler_options=objectives.compiler_options())
    vector = jax.random.normal(jax.random.PRNGKey(0), (dim,))
    timed['hvp'] = _timed(matvec, vector, *operands(slice(None)))
  return Prices({k: t[1] for k, t in timed.items()}, {k: t[0] for k, t in timed.items()})


def kinds_needed(works: Sequence[Work]) -> Sequence[str]:
  """The kinds of pass the works use, in KINDS order.

  Args:
    works: tools' work.

  Returns:
    The kinds.
  """
  used = {kind for w in works for kind, n in {**w.passes, **w.compiles}.items() if n}
  return [kind for kind in KINDS if kind in used]
