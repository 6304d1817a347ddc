"""The exception types whose message the CLI prints as a single line: a user's mistake (exit 2), or a fault the run
cannot go on through, the machine's (Fault) or its numbers' (NonFiniteError) (exit 1)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT), or SIGTERM, where training's own handler is not listening (start-up, play): what the CLI's
    handler raises instead of a plain KeyboardInterrupt, with the signal as its argument. CPython marks a plain one
    that passes through code run by exec() or eval() of a string (dataclasses and namedtuples make their methods so,
    in many imports) as unhandled, even when the CLI then handles it, and `python -m rlrun` ends by SIGINT, not with
    its own exit status; it checks the exact type."""


class NothingToDo(Exception):
    """A command that has nothing to do (resuming a run that is complete): one line, exit 0, nothing written."""


class UserError(Exception):
    """Bad input (config value, env id, checkpoint file): the message says what is wrong and what is accepted."""


class FolderHeld(UserError):
    """A run folder another live job holds (rlrun/run_folder.py): that job's, so the refused one writes nothing there,
    not even a failed summary."""


class Fault(Exception):
    """The machine failed the run, not the input nor rlrun (a full disk, an I/O error, a read-only folder): the
    message names the file, the error and what is left to continue from."""


class NonFiniteError(RuntimeError):
    """A NaN or infinity where training cannot go on (an env's observation or reward, a loss, a gradient): the
    message names what and where. Raised before the value reaches the parameters, so what is trained stays finite."""

    env: int | None = None  # the env that returned the value, when an env did
    detail = ""  # what it returned ("a NaN observation")
