"""What runs in a worker process of hydra/launcher=joblib (joblib_launcher.py): its start, and each job. The leading
underscore keeps Hydra's plugin scan, which runs in each job, from executing this module again in place (which
would reset _sweep_pid)."""

import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn

STOPS = (signal.SIGINT, signal.SIGTERM)
WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)  # a scheduler's, before it preempts: a job stops at them too
# From the sweep process when another worker died (its pool is broken): stop the job as SIGTERM does, then exit.
ABANDON = signal.SIGHUP

_sweep_pid = 0  # in a worker: the sweep process's
_in_job = False
_abandoned = False


def _orphaned() -> bool:
    return os.getppid() != _sweep_pid


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):  # os._exit does not flush them
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def start_worker(sweep_pid: int) -> None:
    """A worker process, before its first job: in a session of its own (a terminal's Ctrl-C reaches the sweep
    process only, which sends it on), its signals then let through (the sweep process blocked them while it started
    the worker). A signal while no job runs is noted: the job it may be about to get (one the sweep process handed
    out as the signal came) ends at once. If the sweep process dies, the worker sends itself SIGTERM once: a job
    stops as a single run stops, then the worker ends (loky's would wait for a next job for good). A thread watches
    rather than the kernel's PR_SET_PDEATHSIG, which sends its signal twice here (a second signal stops a run at
    once)."""
    import threading
    import time

    from rlrun.training.signals import LoadsHeld, quiet_lost_signals

    global _sweep_pid
    _sweep_pid = sweep_pid
    os.setsid()

    def watch() -> None:
        while not _orphaned():
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    for s in STOPS + WARNINGS:  # SLURM's --signal reaches every process of the job step, idle workers too
        signal.signal(s, _idle)
    signal.signal(ABANDON, _abandon)
    quiet_lost_signals()
    import torch  # noqa: F401  (while the signals are still blocked: rlrun.training.signals.HELD_LOADS says why)

    sys.meta_path.insert(0, LoadsHeld())  # the others (a job's env) load with them held, as in the CLI

    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS + WARNINGS)
    threading.Thread(target=watch, name="rlrun-sweep-watch", daemon=True).start()


_noted: int | None = None  # a signal that came while no job ran


def _abandon(signum: int, frame: object) -> None:
    """The sweep's pool broke (a worker died, and loky ends the others next): a running job stops as SIGTERM stops
    it, with its checkpoint and an interrupted summary, and the worker then exits without sending its result
    (nobody reads it); an idle worker exits now."""
    global _abandoned
    _abandoned = True
    if not _in_job:
        _exit(128 + signum)
    # os.write: a handler may run while the main thread is inside a buffered stream's write
    os.write(2, b"\nrlrun: a worker process of the sweep died: this job stops with a checkpoint (as on SIGTERM)\n")
    os.kill(os.getpid(), signal.SIGTERM)


def _idle(signum: int, frame: object) -> None:
    global _noted
    if _orphaned():
        _exit(128 + signum)
    _noted = signum


def run_job(idx: int, overrides: Sequence[str], *job: Any) -> JobReturn:
    """One job in a worker, as Hydra's joblib launcher runs it. A signal before training takes the signals (or
    noted before the job came) ends it as a single run's start-up is ended, with exit status 128 + signal
    (SystemExit: the sweep process gets it as the job's outcome) and no summary."""
    from hydra_plugins.hydra_joblib_launcher._core import execute_job

    from rlrun.cli import mark_pooled_job
    from rlrun.training.signals import forget_raised, raise_from_handler

    def interrupted(signum: int, frame: object) -> None:
        raise_from_handler(SystemExit(128 + signum))

    global _in_job
    previous: dict[int, Any] = {}
    try:
        for signum in STOPS + WARNINGS:
            previous[signum] = signal.signal(signum, interrupted)
        mark_pooled_job()
        _in_job = True
        if _noted is not None:
            raise SystemExit(128 + _noted)
        ran: JobReturn = execute_job(idx, overrides, *job)
        return ran
    finally:
        _in_job = False
        for s, handler in previous.items():
            signal.signal(s, handler)
        forget_raised()  # after: the job's handler can no longer raise
        if _orphaned() or _abandoned:  # its job done, nobody to hand the result to
            _exit(1)
