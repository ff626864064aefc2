"""An analysis stopped by SIGTERM or Ctrl-C, as training is: the signal is noted
(`vit_jax.training.signals`) and the analysis stops at the next safe point, after its running
batch, Hessian-vector product or tool (`check`), with one line (`Stopped`); the
results of the tools that finished stay in --out. A second Ctrl-C stops at once
(`errors.Interrupted`)."""
import contextlib
from typing import Iterator, List, Tuple

from vit_jax import training
from vit_jax.errors import Interrupted, UserError


class Stopped(UserError):
  """An analysis stopped by SIGTERM or Ctrl-C at a safe point."""


_NOTED: List[Tuple[training.NotedSignals, str]] = []  # the open `on_signals`, innermost last


@contextlib.contextmanager
def on_signals(out: str) -> Iterator[None]:
  """Notes SIGTERM and Ctrl-C while the analysis writing into `out` runs, for `check`;
  a second Ctrl-C raises `errors.Interrupted`.

  Args:
    out: --out, named in the message.
  """
  with training.NotedSignals('stopping after the running batch or tool; the results of '
                             f'the tools that finished stay in {out}') as noted:
    _NOTED.append((noted, out))
    try:
      yield
    except KeyboardInterrupt:
      raise Interrupted(message('Ctrl-C', out)) from None
    finally:
      _NOTED.pop()


def check() -> None:
  """Raises `Stopped` if a signal was noted by the open `on_signals`; outside one,
  does nothing."""
  if _NOTED and _NOTED[-1][0].signalled:
    noted, out = _NOTED[-1]
    raise Stopped(message(noted.name, out))


def message(by: str, out: str) -> str:
  """What a stopped analysis says.

  Args:
    by: the signal ('Ctrl-C', 'SIGTERM').
    out: --out.

  Returns:
    The message.
  """
  return (f'Stopped by {by}; the tools that finished kept their results in {out} '
          f'(python -m analysis report --out {out} writes their report): rerun the command '
          'to run the others.')
