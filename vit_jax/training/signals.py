"""SIGTERM (how Cloud TPUs and most schedulers preempt) and Ctrl-C (SIGINT), noted
while a long command runs and acted on where it can stop cleanly: training after
its next step, an analysis after its running batch or tool. A second Ctrl-C stops
at once.

A signal is noted, not raised, because Python delivers it wherever the main thread
happens to be: inside a wait for an XLA compilation that goes on in another thread
(the process would then end under it and crash), or inside code that swallows the
exception (the command would run on).

The second Ctrl-C does raise KeyboardInterrupt, wherever the main thread is. Where
Python cannot raise it (in a garbage collector's callback, such as JAX's, or in a
`__del__`), it prints "Exception ignored ..." with a traceback and drops it: while
the context is open such a KeyboardInterrupt is not printed but delivered again a
moment later, as a Ctrl-C, which then raises where the command runs."""
import logging
import os
import signal
import sys
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
    self._unraisable_hook, self._again, self._lock = None, None, threading.Lock()

  def __enter__(self) -> 'NotedSignals':
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._note) for s in self.SIGNALS}
      self._unraisable_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
    return self

  def __exit__(self, *exc) -> None:
    with self._lock:  # no Ctrl-C sent again once the handlers are the previous ones
      if self._again is not None:
        self._again.cancel()
        self._again = None
    for s, previous in self._previous.items():
      signal.signal(s, previous)
    if self._unraisable_hook is not None:
      sys.unraisablehook, self._unraisable_hook = self._unraisable_hook, None

  def _unraisable(self, unraisable) -> None:
    """A second Ctrl-C raised where Python drops exceptions: Ctrl-C again, in 50 ms
    (from another thread: the main thread may still be where it was raised)."""
    if self.signalled and issubclass(unraisable.exc_type, KeyboardInterrupt):
      with self._lock:
        self._again = threading.Timer(0.05, self._interrupt_again)
        self._again.daemon = True
        self._again.start()
    else:
      self._unraisable_hook(unraisable)

  def _interrupt_again(self) -> None:
    with self._lock:
      if self._again is not None:
        self._again = None
        os.kill(os.getpid(), signal.SIGINT)

  def _note(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT and self.signalled:
      raise KeyboardInterrupt
    self.name = 'Ctrl-C' if signum == signal.SIGINT else signal.Signals(signum).name
    log.warning('%s: %s%s.', self.name, self.then,
                ' (Ctrl-C again stops at once)' if signum == signal.SIGINT else '')
    self.signalled = True
