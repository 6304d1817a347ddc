"""Hydra's launcher for `hydra/launcher=joblib` (rlrun.compose.store registers it under that name): the jobs of a
sweep in n_jobs parallel worker processes, as Hydra's joblib launcher runs them (its execute_job, in joblib's loky
processes), but stopped as a single run is. Hydra's launcher hands the jobs to joblib.Parallel, which on Ctrl-C kills
its workers mid-checkpoint (a .tmp checkpoint, no summary), and on a SIGTERM to the sweep's process dies alone, its
workers training on and starting the jobs queued for them.

Here the workers sit in their own sessions, so a signal reaches them only through this process: the first SIGINT
or SIGTERM the sweep gets goes to each worker (each job stops at its next iteration with a checkpoint, as a single
run does), no job starts after it, and the sweep ends when the running jobs have, with the line that continues it;
a second signal goes on to the workers (they stop at once, their summaries written). A job that ends otherwise than
a job of a sweep does (a signal only its worker got, an error outside the task) stops the others the same way. A
worker whose sweep process dies stops its job and ends (_worker.py: no orphans training on). A worker that dies
(SIGKILL, the OOM killer) breaks loky's pool, which kills the others at once: they first stop their jobs with
their checkpoints (_stop_before_kill)."""

import contextlib
import gc
import logging
import os
import re
import signal
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

# The workers' functions come from a module imported as usual: cloudpickle sends them by reference, where this
# module's (which Hydra's plugin scan loads outside sys.modules) would go by value, each with its own globals.
from hydra_plugins.rlrun_joblib_launcher._worker import ABANDON, STOPS, WARNINGS, run_job, start_worker

log = logging.getLogger(__name__)
GRACE = 300.0  # seconds the jobs beside a dead worker have to stop with their checkpoints before loky kills them


@dataclass
class JoblibLauncherConf:
    """Stored as hydra/launcher=joblib in place of Hydra's joblib launcher's (rlrun.compose.store.register_configs)."""

    _target_: str = "hydra_plugins.rlrun_joblib_launcher.joblib_launcher.JoblibLauncher"
    n_jobs: int = -1  # jobs at a time; -1: one per core


class JoblibLauncher(Launcher):
    def __init__(self, n_jobs: int = -1) -> None:
        self.n_jobs = n_jobs
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        self.pool: Any = None  # loky's ProcessPoolExecutor, once started
        self.broken = False  # a worker died: loky's manager thread ends the others (_stop_before_kill)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from rlrun.cli import end_interrupted_sweep, fail
        from rlrun.run_folder import resume_command
        from rlrun.training.signals import raise_missed

        try:
            from joblib import effective_n_jobs
            from joblib.externals.loky import ProcessPoolExecutor
        except ImportError:
            fail("hydra/launcher=joblib needs the sweep extra: pip install 'rlrun[sweep]'")
        assert self.config is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        workers = effective_n_jobs(self.n_jobs)
        n_jobs = min(workers, len(job_overrides))
        log.info("Launching %d jobs, %d at a time, sweep output dir : %s", len(job_overrides), n_jobs, sweep_dir)
        for idx, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", initial_job_idx + idx, " ".join(filter_overrides(overrides)))
        if self.pool is None:  # one for the whole sweep: a sweeper's batches (Optuna's trials) reuse its workers
            self.pool = ProcessPoolExecutor(workers, initializer=start_worker, initargs=(os.getpid(),))
        raise_missed()  # the sweep's handler takes the signals from here: a start-up signal that was lost ends here
        with _Stop() as stop:
            stop.pool = self.pool
            returns, ended = self._run(list(job_overrides), initial_job_idx, n_jobs, stop)
            if self.broken:  # the line last, once the other jobs have stopped with their checkpoints
                self.pool._executor_manager_thread.join()
        if ended or stop.signum is not None:
            # The workers (idle now) end, and the pool's locks are let go (their finalizers run when collected): a
            # process that a warning's default action then ends runs no cleanup, and loky's resource tracker would
            # warn of leaked locks after the sweep's last line.
            pool, self.pool = self.pool, None
            pool.shutdown(wait=True)
            del pool
            gc.collect()
        if ended:
            fail(f"{ended}; continue the sweep with: {resume_command(sweep_dir)}", 1)
        if stop.signum is not None:  # the sweep stops here; the jobs not started continue with it
            end_interrupted_sweep(sweep_dir, stop.signum)  # a warning then goes to the handler there before
        return [returns[idx] for idx in range(len(job_overrides))]

    def _run(
        self, job_overrides: list[Sequence[str]], first: int, n_jobs: int, stop: "_Stop"
    ) -> tuple[dict[int, JobReturn], str | None]:
        """Each job's JobReturn, by its place in job_overrides, and why the sweep ended early other than by a
        signal (one line), or None."""
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        job = (self.hydra_context, self.config, self.task_function, Singleton.get_state())
        returns: dict[int, JobReturn] = {}
        queued = list(enumerate(job_overrides))
        running: dict[Future[JobReturn], int] = {}
        ended: list[str] = []
        while queued or running:
            # One job a free worker at a time: nothing waits in a queue to start after a signal.
            while queued and len(running) < n_jobs and stop.signum is None and not ended:
                idx, overrides = queued.pop(0)
                try:
                    # Signals wait until the worker it may start holds its own (loky's fork and exec keep the
                    # mask): a new worker has no session of its own yet, nor rlrun's handlers.
                    with _signals_blocked():
                        future = self.pool.submit(run_job, first + idx, overrides, *job)
                except BrokenProcessPool as e:
                    ended.append(self._died(e))
                    break
                _stop_before_kill(self.pool._executor_manager_thread)  # started by the first submit
                running[future] = idx
            if not running:
                break
            done, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            stop.reach_new_workers()
            for future in done:
                idx = running.pop(future)
                try:
                    returns[idx] = _outcome(future, stop)
                except BrokenProcessPool as e:  # loky ends the other workers too, once their jobs have stopped
                    ended.append(self._died(e))
                except BaseException as e:  # outside the task's own handling (a full disk for .hydra/)
                    ended.append(f"job {first + idx} failed: {type(e).__name__}: {e}")
                    stop.request(signal.SIGTERM)  # the others stop with their checkpoints
        return returns, ended[0] if ended else None

    def _died(self, e: BrokenProcessPool) -> str:
        self.broken = True
        codes = re.search(r"exit codes of the workers are (\{.*?\})", str(e))
        died = codes.group(1) if codes else e
        return f"a worker process of the sweep died ({died}); the jobs running beside it stopped with a checkpoint"


def _stop_before_kill(manager: Any) -> None:
    """loky's manager thread (the one per pool that reads the workers' results) kills every worker with SIGKILL
    once one has died: their jobs would lose what they trained since their last checkpoint. Hooked here, it first
    sends each remaining worker ABANDON, on which its job stops as SIGTERM stops it (a checkpoint, an interrupted
    summary) and the worker exits (_worker.py), and waits up to GRACE seconds for them."""
    if getattr(manager, "rlrun_hooked", False):
        return
    kill = manager.kill_workers

    def stop_then_kill(reason: str = "") -> None:
        if reason == "broken executor":
            workers = list(manager.processes.values())
            for p in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, ABANDON)
            deadline = time.monotonic() + GRACE
            for p in workers:
                p.join(max(0.0, deadline - time.monotonic()))
        kill(reason)

    manager.kill_workers, manager.rlrun_hooked = stop_then_kill, True


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS + WARNINGS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS + WARNINGS)


class _Stop:
    """The sweep process's SIGINT/SIGTERM handler while its jobs run: it records the first signal (the sweep's exit
    status) and sends every signal on to the workers (which a terminal's Ctrl-C does not reach: they are in their
    own sessions). A scheduler's warning (SIGUSR1/2: SLURM's --signal) goes on as it came (a worker that got it from
    the scheduler too takes the copy for the same one: training/signals.py), and once the jobs have stopped the sweep
    passes it to the handler that was there before (cli.end_interrupted_sweep), as a single run does."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.pool: Any = None
        self._previous: dict[int, Any] = {}
        self._sending: int | None = None  # the last signal, and the workers that have had it
        self._sent: set[int] = set()

    def __enter__(self) -> "_Stop":
        self._previous = {s: signal.signal(s, self._handle) for s in STOPS + WARNINGS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: object) -> None:
        self.request(signum)

    def request(self, signum: int) -> None:
        """Stop the sweep for `signum` (the first one counts): every worker gets it."""
        if self.signum is None:
            self.signum = signum
        self._sending, self._sent = signum, set()
        self.reach_new_workers()

    def reach_new_workers(self) -> None:
        """Send the last signal to the workers that have not had it (loky keeps them by pid in _processes, as
        concurrent.futures does; one may have started since): a job stops, an idle worker only notes it."""
        if self._sending is None:
            return
        for pid in list(getattr(self.pool, "_processes", None) or {}):
            if pid not in self._sent:
                self._sent.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, self._sending)


def _outcome(future: Future[JobReturn], stop: _Stop) -> JobReturn:
    """A finished job's JobReturn. A job a signal stopped ended as a single run ends (SystemExit 128 + signal, also
    during its start-up, before training took the signals): the sweep stops with it, and so do the other jobs (the
    signal may have been its worker's alone: a scheduler's warning, say)."""
    try:
        return future.result()
    except SystemExit as e:
        signum = e.code - 128 if isinstance(e.code, int) else None
        if signum not in STOPS + WARNINGS:
            raise
        if stop.signum is None:
            stop.request(signum)
        return JobReturn()
