"""The one exception type for user mistakes: the CLI prints its message as a single line and exits 2."""


class UserError(Exception):
    """Bad input (config value, env id, checkpoint file): the message says what is wrong and what is accepted."""
