"""A vector env whose envs live in forked worker processes, k per worker. Observations, rewards, flags and
actions travel through shared memory; only small control messages (and per-step info dicts) cross pipes.
Beyond stepping, a worker runs jobs on its envs (`run`), such as a whole rollout acted by a copy of the
policy, over arrays the rank shares with it after the fork (`share`).

Workers are forked, never spawned, so they inherit what the rank set up at runtime (the config, envs
registered with gym.register, imported plugins). Forking must happen before the rank starts threads (its
process group, torch's intra-op pool): a fork after threaded work can leave the child hung. A failing,
dying or stuck worker raises EnvWorkerError in the rank; a dying rank takes its workers with it.
"""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import reduction
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from rlrun.envs.protocol import ArgsOf, Job, StepResult
from rlrun.envs.sync import batch_infos, env_buffers, run_command, step_results
from rlrun.errors import NonFiniteError

# Parent ends of every worker pipe this process holds. A forked child closes all of them, so that when the
# rank dies the only ends left are its own and the workers' recv() sees EOF instead of blocking forever.
_PARENT_ENDS: set[mp.connection.Connection] = set()


class EnvWorkerError(RuntimeError):
    """An env worker failed: raised in an env, died, or did not answer. The message names the worker, the
    env index where known, and carries the worker's traceback."""


class EnvWorkerTimeout(EnvWorkerError):
    pass


def _shared(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array in anonymous shared memory: forked children see (and write) the same pages."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer(mmap.mmap(-1, max(size, 1)), dtype=dtype, count=int(np.prod(shape))).reshape(shape)


# (name, shape, dtype string, offset) of each array packed into a shared block
Layout = list[tuple[str, tuple[int, ...], str, int]]


def _layout(specs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> tuple[Layout, int]:
    """[(name, shape, dtype, offset)] of arrays packed into one block (64-byte aligned), and its size."""
    layout, size = [], 0
    for name, (shape, dtype) in specs.items():
        layout.append((name, tuple(shape), np.dtype(dtype).str, size))
        size += -(-max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1) // 64) * 64
    return layout, max(size, 1)


def _map(fd: int, layout: Layout, size: int) -> dict[str, np.ndarray]:
    """The arrays of `layout` over the file `fd`, mapped shared: what one process writes, the others read."""
    block = mmap.mmap(fd, size)
    return {
        name: np.frombuffer(block, np.dtype(dtype), int(np.prod(shape)), offset).reshape(shape)
        for name, shape, dtype, offset in layout
    }


def _shared_file(size: int) -> int:
    """A descriptor of `size` bytes of memory-backed file (memfd on Linux; elsewhere an unlinked temp file)."""
    fd = os.memfd_create("rlrun-shared") if hasattr(os, "memfd_create") else os.dup(tempfile.TemporaryFile().fileno())
    os.ftruncate(fd, size)
    return fd


@dataclass
class WorkerContext:
    """What a job run in a worker (WorkerPool.run) works with: its envs (rows `rows` of the buffers), the
    step buffers, the arrays the rank shared, and `memory` that lasts from one job to the next."""

    index: int
    envs: list[gym.Env]
    rows: slice
    buffers: dict[str, np.ndarray]
    beats: np.ndarray  # [num_workers] progress counters: the rank times out a job that stops advancing
    where: list[int | None]  # the env being worked on (None: none), for the error report
    check_finite: bool = True  # env.check_finite: a NaN or infinite observation or reward raises NonFiniteError
    shared: dict[str, np.ndarray] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)

    def step(self) -> list[dict[str, Any]]:
        """Step this worker's envs with the actions in the step buffers (SAME_STEP autoreset); their infos."""
        infos = run_command("step", None, self.envs, self.rows.start, self.buffers, self.where, self.check_finite)
        self.beats[self.index] += 1
        return infos


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this worker when the rank that forked it dies (Linux PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _yield_on_wakeup() -> None:
    """SCHED_BATCH: a worker woken by the rank's step command does not preempt the rank, which goes on to
    wake the other workers (or to act for the other half) instead of waiting for a core to free up behind the
    worker it woke. Same CPU share as before; only wakeup preemption changes."""
    if hasattr(os, "SCHED_BATCH"):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _limit_threads() -> None:
    # A forked child inherits a broken intra-op pool from a parent that used one: one thread avoids it,
    # and a worker stepping envs has no use for more.
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if "cv2" in sys.modules:
        sys.modules["cv2"].setNumThreads(0)


def _worker(
    index: int,
    env_fns: Sequence[Callable[[], gym.Env]],
    offset: int,
    conn: mp.connection.Connection,
    buffers: dict[str, np.ndarray],
    beats: np.ndarray,
    lazy: bool,
    check_finite: bool,
) -> None:
    for end in list(_PARENT_ENDS):
        end.close()
    _PARENT_ENDS.clear()
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the rank decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's start-up handler, which the fork copied
    _limit_threads()
    _yield_on_wakeup()
    envs: list[gym.Env] = []
    w = WorkerContext(index, envs, slice(offset, offset + len(env_fns)), buffers, beats, [offset], check_finite)
    try:
        if not lazy:
            _make_envs(env_fns, envs, w)
        while True:
            try:
                command, data = conn.recv()
            except (EOFError, OSError):
                break  # the rank is gone
            if command == "close":
                break
            if not envs:  # lazy: at the first command
                _make_envs(env_fns, envs, w)
            if command == "share":
                fd = reduction.recv_handle(conn)
                w.shared.update(_map(fd, *data))
                os.close(fd)
                conn.send(("ok", None))
            elif command == "run":
                job, args = data
                conn.send(("ok", job(w, *args)))
            else:
                conn.send(("ok", run_command(command, data, envs, offset, buffers, w.where, check_finite)))
    except Exception as e:
        conn.send(_failure(e, w.where[0]))
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:
                pass
        conn.close()


def _failure(error: Exception, env_index: int | None) -> tuple[str, object]:
    """What a failing worker answers: a non-finite value from an env as its one line (the env's data is at fault,
    not code), anything else with the env it happened in and the traceback."""
    if isinstance(error, NonFiniteError):
        return "nonfinite", str(error)
    return "error", (env_index, traceback.format_exc())


def _make_envs(env_fns: Sequence[Callable[[], gym.Env]], envs: list[gym.Env], w: WorkerContext) -> None:
    for i, fn in enumerate(env_fns):
        w.where[0] = w.rows.start + i
        envs.append(fn())


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def split_envs(num_envs: int, num_workers: int, groups: int) -> tuple[list[slice], list[list[int]], list[slice]]:
    """Contiguous, near-equal slices of the envs per worker; the workers of each group (consecutive); each group's
    envs. A vector env's layout, whatever process or actor hosts the workers."""
    bounds = np.linspace(0, num_envs, num_workers + 1).astype(int)
    slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    cut = np.linspace(0, num_workers, groups + 1).astype(int)
    group_workers = [list(range(cut[g], cut[g + 1])) for g in range(groups)]
    return slices, group_workers, [slice(slices[w[0]].start, slices[w[-1]].stop) for w in group_workers]


class WorkerPool:
    """`num_workers` forked processes hosting len(env_fns) envs, contiguous slices per worker.

    Gymnasium's vector env interface (reset, step with SAME_STEP autoreset, close, spaces) plus
    send/recv per group for double buffering: with `groups=2` the workers split into two halves that
    step while the caller computes actions for the other. Observations come back as copies of the shared
    buffers, which the next step overwrites. With `lazy` the workers make their envs at their first command
    instead of at once: an eval pool is forked at start (a later fork could hang), its envs made at the first
    evaluation, off training's start-up.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        num_workers: int,
        step_timeout_s: float,
        groups: int = 1,
        role: str = "env worker",
        lazy: bool = False,
        check_finite: bool = True,
    ):
        self.num_envs = len(env_fns)
        self.role = role  # how errors name a worker: "env worker 1 (pid ...)"
        num_workers = max(1, min(num_workers, self.num_envs))
        if groups > num_workers:
            raise ValueError(f"{groups} groups need at least {groups} workers, got {num_workers}")
        probe = env_fns[0]()
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        self.metadata = probe.metadata
        probe.close()
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.timeout = step_timeout_s
        self.buffers = env_buffers(self.num_envs, self.single_observation_space, self.single_action_space, _shared)
        self.beats = _shared((num_workers,), np.int64)
        self.slices, self.group_workers, self.groups = split_envs(self.num_envs, num_workers, groups)
        self.conns: list[mp.connection.Connection] = []
        self.procs: list[mp.Process] = []
        self.num_workers = len(self.slices)
        self.closed = False
        ctx = mp.get_context("fork")  # explicitly: inheritance is the point, whatever the default is
        for w, sl in enumerate(self.slices):
            parent_end, child_end = ctx.Pipe()
            _PARENT_ENDS.add(parent_end)
            proc = ctx.Process(
                target=_worker,
                args=(w, env_fns[sl], sl.start, child_end, self.buffers, self.beats, lazy, check_finite),
                name=f"rlrun-env-worker-{w}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            self.conns.append(parent_end)
            self.procs.append(proc)

    def _send(self, w: int, message: tuple[str, Any], fd: int | None = None) -> None:
        """Send to worker w (and the descriptor `fd` after it). A worker that died meanwhile is reported by the
        _recv that follows, which names it and how it died; the broken pipe says neither."""
        try:
            self.conns[w].send(message)
            if fd is not None:
                reduction.send_handle(self.conns[w], fd, self.procs[w].pid)
        except OSError:
            pass

    def _wait(self, w: int) -> list[Any]:
        """Wait until worker w answers or dies, or makes no progress (WorkerContext.step) for the timeout."""
        conn, proc = self.conns[w], self.procs[w]
        beats, changed = int(self.beats[w]), time.monotonic()
        while True:  # a job of many steps may take long: what must not exceed the timeout is one step
            left = changed + self.timeout - time.monotonic()
            ready = mp.connection.wait([conn, proc.sentinel], timeout=max(0.0, min(left, self.timeout / 4)))
            if ready:
                return ready
            if self.beats[w] != beats:
                beats, changed = int(self.beats[w]), time.monotonic()
            elif left <= self.timeout / 4:
                return []

    def _where(self, w: int) -> str:
        sl = self.slices[w]
        return f"{self.role} {w} (pid {self.procs[w].pid}, envs {sl.start}-{sl.stop - 1})"

    def _recv(self, w: int, what: str) -> list[Any]:
        conn, proc, where = self.conns[w], self.procs[w], self._where(w)
        ready = self._wait(w)
        if conn in ready:
            try:
                status, payload = conn.recv()
            except (EOFError, OSError):
                status, payload = "dead", None
            if status == "ok":
                results: list[Any] = payload
                return results
            if status == "nonfinite":
                raise NonFiniteError(payload)
            if status == "error":
                env_index, tb = payload
                place = "while acting" if env_index is None else f"in env {env_index}"
                raise EnvWorkerError(f"{where} raised {place} during {what}:\n{tb.rstrip()}")
        if ready:
            proc.join(1.0)
            raise EnvWorkerError(f"{where} {_describe_exit(proc.exitcode)} during {what}")
        raise EnvWorkerTimeout(f"{where} made no progress in {what} for {self.timeout:g} s (env.vector.step_timeout_s)")

    def _call(self, command: str, per_env: Sequence[Any] | None = None) -> list[Any]:
        """Send a command to every worker (per-env data sliced to each), gather per-env results."""
        for w, sl in enumerate(self.slices):
            self._send(w, (command, None if per_env is None else list(per_env[sl])))
        return [item for w in range(len(self.slices)) for item in self._recv(w, command)]

    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if isinstance(seed, int):
            seed = [seed + i for i in range(self.num_envs)]
        infos = self._call("reset", seed)
        return self.buffers["obs"].copy(), batch_infos(infos)

    def send(self, group: int, actions: np.ndarray) -> None:
        """Start stepping the envs of `group` with `actions` (one per env of the group)."""
        self.buffers["actions"][self.groups[group]] = actions
        for w in self.group_workers[group]:
            self._send(w, ("step", None))

    def recv(self, group: int) -> StepResult:
        """Wait for `group`'s step: what its envs returned."""
        infos = [item for w in self.group_workers[group] for item in self._recv(w, "step")]
        return step_results(self.buffers, self.groups[group], infos)

    def step(self, actions: np.ndarray) -> StepResult:
        for g, sl in enumerate(self.groups):
            self.send(g, actions[sl])
        infos = [item for w in range(len(self.slices)) for item in self._recv(w, "step")]
        return step_results(self.buffers, slice(0, self.num_envs), infos)

    def share(self, specs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, np.ndarray]:
        """Zeroed arrays {name: (shape, dtype)} in memory shared with every worker, where jobs find them in
        WorkerContext.shared. The workers are forked already: the memory reaches them as a file descriptor."""
        layout, size = _layout(specs)
        fd = _shared_file(size)
        try:
            for w in range(self.num_workers):
                self._send(w, ("share", (layout, size)), fd)
            for w in range(self.num_workers):
                self._recv(w, "share")
            return _map(fd, layout, size)
        finally:
            os.close(fd)

    def run(self, what: str, job: Job, args_of: ArgsOf) -> list[Any]:
        """JobRunner.run: job(WorkerContext, *args_of(its envs)) in every worker at once; their results, in worker
        order. The arguments cross a pipe, pickled; large arrays go through `share` instead."""
        for w, sl in enumerate(self.slices):
            self._send(w, ("run", (job, args_of(sl))))
        return [self._recv(w, what) for w in range(self.num_workers)]

    def check_alive(self) -> None:
        """Raise EnvWorkerError naming a worker that died while idle (killed, out of memory), without waiting."""
        for w, proc in enumerate(self.procs):
            if not proc.is_alive():
                proc.join(1.0)
                raise EnvWorkerError(f"{self._where(w)} {_describe_exit(proc.exitcode)} while idle")

    def get_env_state(self) -> list[Any]:
        return self._call("get_state")

    def set_env_state(self, state: list[Any]) -> None:
        self._call("set_state", state)

    def close(self) -> None:
        """Stop every worker and reap it, also after an error; killing those that do not stop."""
        if self.closed:
            return
        self.closed = True
        for w, proc in enumerate(self.procs):
            if proc.is_alive():
                self._send(w, ("close", None))
        deadline = time.monotonic() + 2.0  # one for all: a worker busy with a job is killed, not waited on
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for conn in self.conns:
            _PARENT_ENDS.discard(conn)
            conn.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.close()


if TYPE_CHECKING:  # mypy holds this backend to the contracts it implements (rlrun/envs/protocol.py)
    from rlrun.envs.protocol import JobContext, JobRunner, VectorEnv

    _vector_env: type[VectorEnv] = WorkerPool
    _job_runner: type[JobRunner] = WorkerPool
    _job_context: type[JobContext] = WorkerContext
