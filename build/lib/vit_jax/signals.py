"""SIGTERM (how Cloud TPUs and most schedulers preempt) and Ctrl-C (SIGINT), noted
while a long command runs and acted on where it can stop cleanly: training after
its next step, an analysis after its running batch or tool. A second Ctrl-C stops
at once.

A signal is noted, not raised, because Python delivers it wherever the main thread
happens to be: inside a wait for an XLA compilation that goes on in another thread
(the process would then end under it and crash), or inside code that swallows the
exception (the command would run on)."""
import logging
import signal
import threading

log = logging.getLogger(__name__)


class NotedSignals:
  """SIGTERM or Ctrl-C noted (`signalled`, `name`) while the context is open, with
  a warning saying what happens next; a second Ctrl-C raises KeyboardInterrupt.
  The previous handlers come back on exit. Outside the main thread (where Python
  allows no handlers) it notes nothing."""
  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, then: str):
    """Args:
      then: what the command does next, for the warning ('saving a checkpoint at
        the next step, then stopping').
    """
    self.then = then
    self.signalled, self.name, self._previous = False, '', {}

  def __enter__(self) -> 'NotedSignals':
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._note) for s in self.SIGNALS}
    return self

  def __exit__(self, *exc) -> None:
    for s, previous in self._previous.items():
      signal.signal(s, previous)

  def _note(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT and self.signalled:
      raise KeyboardInterrupt
    self.name = 'Ctrl-C' if signum == signal.SIGINT else signal.Signals(signum).name
    log.warning('%s: %s%s.', self.name, self.then,
                ' (Ctrl-C again stops at once)' if signum == signal.SIGINT else '')
    self.signalled = True
