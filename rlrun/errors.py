"""The one exception type for user mistakes: the CLI prints its message as a single line and exits 2."""


class NothingToDo(Exception):
    """A command that has nothing to do (resuming a run that is complete): one line, exit 0, nothing written."""


class UserError(Exception):
    """Bad input (config value, env id, checkpoint file): the message says what is wrong and what is accepted."""
