"""The exception types whose message the CLI prints as a single line: a user's mistake (exit 2), or a fault of the
machine the run cannot go on through (exit 1)."""


class UserError(Exception):
    """Bad input (config value, env id, checkpoint file): the message says what is wrong and what is accepted."""


class Fault(Exception):
    """The machine failed the run, not the input nor rlrun (a full disk, an I/O error, a read-only folder): the
    message names the file, the error and what is left to continue from."""
