"""How a run is asked to stop: the first signal at the next iteration boundary (with a checkpoint), a second one at
once (StopNow); and how a signal before that, during start-up, is never lost nor aborts the process."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
import threading
from typing import Any, NoReturn

# The exception a start-up handler raised for a signal (cli.py's, a sweep worker's), kept: C code that calls Python
# and then clears whatever error it raised (the C API's PyObject_HasAttr, which a C++ extension's hasattr calls)
# swallows it silently, as does Python itself in a weakref callback or __del__ (with a traceback), and the run went on
# to train as if the signal never came.
_raised: BaseException | None = None


def quiet_lost_signals() -> None:
    """No traceback for a start-up signal's exception that Python itself lost (in a weakref callback, as an import
    runs them, or a __del__): raise_missed() raises it again, which ends start-up with its one line."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if _raised is None or unraisable.exc_value is not _raised:
            previous(unraisable)

    sys.unraisablehook = hook


def raise_from_handler(error: BaseException) -> NoReturn:
    """Raise `error` from a signal handler before training takes the signals, kept for raise_missed()."""
    global _raised
    _raised = error
    raise error


def raise_missed() -> None:
    """Raise again a start-up signal's exception if one was raised and the process is still going: at the points
    start-up passes (the config check's end; where training, the DDP launcher's agent or a parallel sweep takes the
    signals), so such a signal ends start-up a few seconds late rather than never."""
    if _raised is not None:
        raise _raised


def forget_raised() -> None:
    """A process that goes on after a start-up signal's exception ended its job (a sweep's worker), or that is not
    the one it was for (a DDP rank forked from the launcher)."""
    global _raised
    _raised = None


# Packages whose C++ initialisation calls Python, where a start-up handler's exception does worse than get lost:
# - torch: inside its C++ init (which imports Python modules) it ended the process in std::terminate ("terminate called
#   after throwing an instance of 'python_error'", SIGABRT, a run folder's lock left behind);
# - ale_py: inside nanobind's making of its enums, the same ('nanobind::python_error');
# - mujoco: pybind11 turned it into an ImportError, reported as "env ... needs MuJoCo: pip install 'rlrun[mujoco]'".
# (Box2D's and others' inits lose it, which raise_missed() covers.)
HELD_LOADS = frozenset({"torch", "ale_py", "mujoco"})


class LoadsHeld(importlib.abc.MetaPathFinder):
    """In sys.meta_path (the CLI's first step, and a sweep worker's): wherever one of HELD_LOADS is first imported (a
    checkpoint's load, the run, the env's registry, a user's env module), SIGINT and SIGTERM are only noted while it
    loads."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in HELD_LOADS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Held(spec.loader)
        return spec


_STOPS = (signal.SIGINT, signal.SIGTERM)


class _Held(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__spec__.loader = module.__loader__ = self.loader  # the package's own from here on
        if threading.current_thread() is not threading.main_thread():  # handlers are the main thread's to change
            self.loader.exec_module(module)
            return
        came: list[int] = []
        # Handlers that note, rather than a blocked mask: a signal the kernel hands another thread still runs the
        # main thread's handler, inside the package's initialisation.
        handlers: dict[int, Any] = {s: signal.signal(s, lambda signum, frame: came.append(signum)) for s in _STOPS}
        try:
            self.loader.exec_module(module)
        finally:
            for s, handler in handlers.items():
                signal.signal(s, handler)
            if came:
                _deliver(handlers[came[0]], came[0])


def _deliver(handler: Any, signum: int) -> None:
    """A signal that came while a held package loaded, given to its handler now. An exception the handler raises waits
    for raise_missed(), at start-up's next check: raised here, inside the import, it would leave the package
    half-imported (initialised, yet out of sys.modules)."""
    global _raised
    if not callable(handler):  # the default (a rank of an external job: SIGTERM ends it) or ignored, restored already
        os.kill(os.getpid(), signum)
        return
    try:
        handler(signum, None)
    except BaseException as e:  # noqa: BLE001 (kept, not lost: raise_missed raises it)
        _raised = e


_exiting = False  # a signal stopped the run, and the process is ending


def exit_at_once_on_a_further_signal(code: int) -> None:
    """For a process about to exit with `code` after a signal stopped its run (its checkpoint, summary and last line
    written, its folders let go): a further SIGINT or SIGTERM (a second Ctrl-C right after the first) ends it at once
    with the same code while it unwinds and runs its exit handlers, and is ignored after them. Python's finalization
    resets a handler of its own to the default, which would end the process as killed by the signal instead."""
    global _exiting
    if threading.current_thread() is not threading.main_thread():  # handlers are the main thread's to change
        return
    sys.stdout.flush()
    sys.stderr.flush()
    _exiting = True
    for s in _STOPS:
        signal.signal(s, lambda signum, frame: os._exit(code))


def ignore_stops_after_exit_handlers() -> None:
    """An exit handler the CLI registers at its start, so that it runs after those registered later (torch's, the
    trackers'): exit_at_once_on_a_further_signal says why."""
    if _exiting:
        for s in _STOPS:
            signal.signal(s, signal.SIG_IGN)


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
