"""The errors a user can act on: a wrong setting, missing or bad data, a checkpoint
that does not fit, a workdir another run holds, a full disk, a diverged run. The
entry points print such an error as its message alone (the traceback only with
--traceback); anything else is a bug and keeps its traceback."""


class UserError(Exception):
  """A mistake or fault the user can fix; the message says what and how."""


class ConfigError(UserError, ValueError):
  """A recipe field with a value it does not allow, or a field no recipe has."""


class WorkdirError(UserError, RuntimeError):
  """A workdir held by another run, recorded with other settings, or out of space."""


class DataError(UserError, ValueError):
  """A dataset that cannot be found, prepared or read."""


class Interrupted(UserError):
  """A command stopped at once by a second Ctrl-C. The entry points end the process
  without Python's finalisation (`os._exit`): native work may still run in other
  threads (an XLA compilation whose wait the Ctrl-C broke), and tearing down JAX's
  client under it crashes the process."""
