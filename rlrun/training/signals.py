"""How a run is asked to stop: the first signal at the next iteration boundary (with a checkpoint), a second one at
once (StopNow)."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, NoReturn

# The exception a start-up handler raised for a signal (cli.py's, a sweep worker's), kept: C code that calls Python
# and then clears whatever error it raised (the C API's PyObject_HasAttr, which a C++ extension's hasattr calls, during
# `import torch` say) swallows it silently, and the run went on to train as if the signal never came.
_raised: BaseException | None = None


def raise_from_handler(error: BaseException) -> NoReturn:
    """Raise `error` from a signal handler before training takes the signals, kept for raise_missed()."""
    global _raised
    _raised = error
    raise error


def raise_missed() -> None:
    """Raise again a start-up signal's exception if one was raised and the process is still going: at the points
    start-up passes (the config check's end; where training takes the signals), so such a signal ends start-up a
    few seconds late rather than never."""
    if _raised is not None:
        raise _raised


def forget_raised() -> None:
    """A process that goes on after a start-up signal's exception ended its job (a sweep's worker)."""
    global _raised
    _raised = None


def import_torch() -> None:
    """Import torch with SIGINT and SIGTERM held back until it has loaded; one that came meanwhile is handled as it
    ends. Raised inside torch's C++ initialisation (which imports Python modules), a handler's exception ends the
    process in std::terminate ("terminate called after throwing an instance of 'python_error'", SIGABRT, a run
    folder's lock left behind) or is lost."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
    try:
        import torch  # noqa: F401
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class StopNow(KeyboardInterrupt):
    """A second signal: stop at once, wherever the run is (the summary is still written)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class StopSignal:
    """SIGINT/SIGTERM, and SIGUSR1/SIGUSR2 (a scheduler's warning before it preempts the job or its time runs
    out), ask the loop to stop at the next iteration boundary, where state is consistent and a final checkpoint
    can be written (an evaluation under way ends early; a checkpoint being written is finished first); a second
    signal raises StopNow wherever the run is, except the same warning again: SLURM's --signal reaches every
    process of a job step, and a parallel sweep's process passes it on to its workers too, so a worker gets it
    twice. It takes the signals from listen() on; restore() puts back the handlers there were before. `announce`:
    say what the first signal does (the main rank)."""

    def __init__(self, announce: bool) -> None:
        self.signum: int | None = None
        self.announce = announce
        self._previous: dict[int, Any] = {}

    def listen(self) -> None:
        raise_missed()
        if threading.current_thread() is threading.main_thread():  # not so in some sweep launchers' workers
            signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
            self._previous = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            if signum == self.signum and signum in (signal.SIGUSR1, signal.SIGUSR2):
                return
            raise StopNow(self.signum)
        self.signum = signum
        if self.announce:  # os.write: a handler may run while the main thread is inside a buffered stream's write
            name = signal.Signals(signum).name
            again = "Ctrl-C" if signum == signal.SIGINT else name
            line = f"\nrlrun: {name}: stopping at the end of this step with a checkpoint; {again} again to stop now\n"
            os.write(2, line.encode())

    def requested(self) -> bool:
        return self.signum is not None

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
