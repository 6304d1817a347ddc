"""The exception types rlrun explains itself: the CLI prints their message as one line instead of a traceback."""


class UserError(Exception):
    """Bad input (config value, env id, checkpoint file): the message says what is wrong and what is accepted."""


class NonFiniteError(RuntimeError):
    """A NaN or infinity where training cannot go on (an env's observation or reward, a loss, a gradient): the
    message names what and where. Raised before the value reaches the parameters, so what is trained stays finite."""

    env: int | None = None  # the env that returned the value, when an env did
    detail = ""  # what it returned ("a NaN observation")
