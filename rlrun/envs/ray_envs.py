"""A vector env whose envs live in Ray actors, k per actor, on any node of a Ray cluster: for envs too slow for
one machine's cores. The same interface as the forked worker pool (rlrun/envs/pool.py), and the same per-env
stepping (run_command); what differs is the transport. Stepping costs a round trip per actor and step; what
makes Ray pay is `run`, which has each actor run a whole job, such as a rollout segment acted by a copy of the
policy (rlrun/fast/worker_acting.py), and return it as one object.

Failures are reported as the pool's are, as EnvWorkerError naming the actor, its node and the env: an env's
exception with its traceback, a dead actor or lost node as soon as Ray knows, a stuck one after
env.vector.step_timeout_s without progress. With env.vector.ray_address unset, the rank starts a Ray of its own
for its actors and shuts it down when the last of its vector envs closes.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector.utils import batch_space

from rlrun.config import EnvConfig
from rlrun.envs.pool import EnvWorkerError, EnvWorkerTimeout, WorkerContext, split_envs
from rlrun.envs.protocol import ArgsOf, EndedEpisodes, Job, StepResult
from rlrun.envs.sync import batch_infos, env_buffers, env_nonfinite, run_command
from rlrun.errors import NonFiniteError, UserError

# A Ray this process started for its vector envs, and how many of them are open: the last to close shuts it down.
_own_ray = {"started": False, "open": 0}
log = logging.getLogger("rlrun")


class EnvActor:
    """Ray's side: hosts the envs `offset..offset + len(seeds) - 1` of a rank's vector env, built here from the
    config (its env.imports imported first, as the rank did, in the rank's working directory if this node has it)
    with the seeds of their first reset (or Nones), and steps them or runs jobs on them on command. Answers ("ok",
    result) or ("error", (env index or None, traceback)), as a pool worker does."""

    def __init__(self, cfg: EnvConfig, train: bool, offset: int, seeds: list[int | None], lazy: bool, cwd: str):
        os.environ["OMP_NUM_THREADS"] = "1"  # stepping envs has no use for more; acting a few envs neither
        from rlrun.envs import check_env_id, import_env_modules, make_env

        if os.path.isdir(cwd):  # as forked workers have it: envs' relative paths, modules beside the config
            os.chdir(cwd)
            sys.path.append(cwd)
        import_env_modules(cfg.imports)
        check_env_id(cfg.id)
        self.fns = [make_env(cfg, train, seed=s) for s in seeds]
        count = len(seeds)
        self.offset, self.lazy = offset, lazy
        probe = self.fns[0]()
        self.buffers = env_buffers(count, probe.observation_space, probe.action_space)
        probe.close()
        self.w = WorkerContext(0, [], slice(0, count), self.buffers, np.zeros(1, np.int64), [offset], cfg.check_finite)
        if not lazy:
            self._make_envs()

    def _make_envs(self) -> None:
        for i, fn in enumerate(self.fns):
            self.w.where[0] = i
            self.w.envs.append(fn())

    def where(self) -> tuple[str, int]:
        """(its node: address and the start of Ray's node id, which tells apart nodes on one host; its pid)."""
        import ray

        node = f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"
        return node, os.getpid()

    def progress(self) -> int:
        """Steps taken so far (WorkerContext.step counts them): answered while a job runs."""
        return int(self.w.beats[0])

    def _answer(self, work: Callable[[], object]) -> tuple[str, object]:
        try:
            if not self.w.envs:  # lazy: at the first command
                self._make_envs()
            return "ok", work()
        except NonFiniteError as e:  # this actor's env index, as the rank counts its envs
            return "nonfinite", str(env_nonfinite(self.offset + e.env, e.detail))
        except Exception:
            env = self.w.where[0]
            return "error", (None if env is None else self.offset + env, traceback.format_exc())

    def call(self, command: str, data: list[Any] | None) -> tuple[str, object]:
        """A pool command (reset, step with the given actions, get_state, set_state) on every env; a step or reset
        answers with the observations (and rewards and flags) beside the infos."""

        def work() -> object:
            if command == "step":
                self.buffers["actions"][:] = data
            infos = run_command(
                command,
                None if command == "step" else data,
                self.w.envs,
                0,
                self.buffers,
                self.w.where,
                self.w.check_finite,
            )
            self.w.beats[0] += command == "step"
            b = self.buffers
            if command == "step":
                return b["obs"].copy(), b["rewards"].copy(), b["terminated"].copy(), b["truncated"].copy(), infos
            return (b["obs"].copy(), infos) if command == "reset" else infos

        return self._answer(work)

    def run(self, job: Callable[..., Any], *args: Any) -> tuple[str, object]:
        return self._answer(lambda: job(self.w, *args))

    def close(self) -> None:
        for env in self.w.envs:
            env.close()


def _start_ray(address: str | None, num_workers: int) -> Any:  # the ray module (untyped)
    """Ray, connected: to the cluster at `address`, else the one this process started, else a new local one with
    room (logical CPUs) for `num_workers` actors, which the last RayEnvs to close shuts down."""
    try:
        import ray
    except ImportError as e:
        raise UserError("env.vector.backend=ray needs Ray: pip install 'rlrun[ray]'") from e
    if ray.is_initialized():
        return ray
    kwargs = dict(include_dashboard=False, configure_logging=False, log_to_driver=True)
    if address:
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UserError(f"env.vector.ray_address={address}: cannot connect to a Ray cluster there ({e})") from e
        return ray
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, num_workers), **kwargs)  # never a running one
    _own_ray["started"] = True
    return ray


class RayEnvs:
    """`num_envs` copies of the configured env in `num_workers` Ray actors (0: one per CPU of the cluster, at most
    one per env), contiguous slices per actor, spread over the cluster's nodes; each training actor reserves
    env.vector.ray_cpus_per_worker CPUs. Gymnasium's vector env interface plus send/recv per group, as WorkerPool: with
    `groups=2` the actors split into two halves that step while the caller acts for the other. With `lazy` the
    actors make their envs at their first command."""

    def __init__(
        self,
        cfg: EnvConfig,
        num_envs: int,
        train: bool,
        groups: int = 1,
        role: str = "env worker",
        lazy: bool = False,
        seeds: list[int] | None = None,
    ):
        v = cfg.vector
        seeds = seeds or [None] * num_envs
        ray = self.ray = _start_ray(v.ray_address, v.num_workers or num_envs)
        self.own_ray = _own_ray["started"]
        _own_ray["open"] += self.own_ray
        self.closed, self.actors = False, []
        self.num_envs, self.role, self.timeout = num_envs, role, v.step_timeout_s
        cpus = ray.cluster_resources().get("CPU", 1)
        num_workers = min(v.num_workers or max(1, int(cpus // v.ray_cpus_per_worker)), num_envs)
        self.slices, self.group_workers, self.groups = split_envs(num_envs, max(num_workers, groups), groups)
        self.num_workers = len(self.slices)
        # A second thread answers `where` and `progress` while a job runs; envs stay on the first.
        remote = ray.remote(concurrency_groups={"probe": 1})(EnvActor)
        # Eval actors reserve no CPU: they step only between training's rollouts, when its actors are idle.
        remote = remote.options(num_cpus=v.ray_cpus_per_worker if train else 0, scheduling_strategy="SPREAD")
        cwd = os.getcwd()
        self.actors = [remote.remote(cfg, train, sl.start, seeds[sl], lazy, cwd) for sl in self.slices]
        self.nodes = self._placed()
        where = "a local Ray" if self.own_ray else f"the Ray cluster at {v.ray_address}"
        nodes = len({node for node, _ in self.nodes})
        log.info(
            "%d Ray %ss on %d node%s of %s, %d envs", self.num_workers, role, nodes, "s"[: nodes > 1], where, num_envs
        )
        from rlrun.envs import make_env  # the spaces, as the actors' envs have them

        probe = make_env(cfg, train)()
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        self.metadata = probe.metadata
        probe.close()
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._pending: dict[int, list[Any]] = {}

    def _placed(self) -> list[tuple[str, int]]:
        """(node, pid) of every actor once all are up; actors the cluster cannot place within the step timeout (not
        enough free CPUs) are reported, not waited on."""
        refs = [a.where.options(concurrency_group="probe").remote() for a in self.actors]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=self.timeout)
        if len(ready) < len(refs):
            free = self.ray.available_resources().get("CPU", 0)
            self.close()
            raise EnvWorkerError(
                f"only {len(ready)} of {len(refs)} Ray {self.role}s started within {self.timeout:g} s "
                f"(each needs env.vector.ray_cpus_per_worker CPUs; the cluster has {free:g} free): "
                "lower env.vector.num_workers or env.vector.ray_cpus_per_worker"
            )
        try:
            started: list[tuple[str, int]] = self.ray.get(refs)
            return started
        except self.ray.exceptions.RayError as e:
            self.close()
            raise EnvWorkerError(f"a Ray {self.role} failed to start: {_cause(e)}") from e

    def _where(self, w: int) -> str:
        sl, (node, pid) = self.slices[w], self.nodes[w]
        return f"Ray {self.role} {w} (node {node}, pid {pid}, envs {sl.start}-{sl.stop - 1})"

    def _recv(self, workers: Sequence[int], refs: list[Any], what: str) -> list[Any]:
        """The answers of `workers` to `refs`, in order. An actor that dies is reported as soon as Ray knows; one that
        makes no progress (EnvActor.progress) for the step timeout, when it is past."""
        marks = {w: (-1, time.monotonic()) for w in workers}
        pending = dict(zip(refs, workers))
        while pending:
            ready, _ = self.ray.wait(list(pending), num_returns=len(pending), timeout=self.timeout / 4)
            for ref in ready:
                pending.pop(ref)
            for w in pending.values():
                self._check_progress(w, marks, what)
        answers = []
        for w, ref in zip(workers, refs):
            try:
                status, payload = self.ray.get(ref)
            except self.ray.exceptions.RayError as e:
                raise EnvWorkerError(f"{self._where(w)} died during {what}: {_cause(e)}") from e
            if status == "nonfinite":
                raise NonFiniteError(payload)
            if status == "error":
                env_index, tb = payload
                place = "while acting" if env_index is None else f"in env {env_index}"
                raise EnvWorkerError(f"{self._where(w)} raised {place} during {what}:\n{tb.rstrip()}")
            answers.append(payload)
        return answers

    def _check_progress(self, w: int, marks: dict[int, tuple[int, float]], what: str) -> None:
        """Raise EnvWorkerTimeout when actor w's step count has not moved for the step timeout."""
        try:
            beats = self.ray.get(self.actors[w].progress.options(concurrency_group="probe").remote(), timeout=1)
        except self.ray.exceptions.RayError:  # dead (its answer says how) or too busy to answer: not progress
            beats = marks[w][0]
        now = time.monotonic()
        if beats != marks[w][0]:
            marks[w] = beats, now
        elif now - marks[w][1] > self.timeout:
            raise EnvWorkerTimeout(
                f"{self._where(w)} made no progress in {what} for {self.timeout:g} s (env.vector.step_timeout_s)"
            )

    def _call(self, command: str, per_env: Sequence[Any] | None = None) -> list[Any]:
        refs = [
            a.call.remote(command, None if per_env is None else list(per_env[sl]))
            for a, sl in zip(self.actors, self.slices)
        ]
        return self._recv(range(self.num_workers), refs, command)

    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if isinstance(seed, int):
            seed = [seed + i for i in range(self.num_envs)]
        answers = self._call("reset", seed)
        return np.concatenate([obs for obs, _ in answers]), batch_infos([i for _, infos in answers for i in infos])

    def send(self, group: int, actions: np.ndarray) -> None:
        """Start stepping the envs of `group` with `actions` (one per env of the group)."""
        start = self.groups[group].start
        self._pending[group] = [
            self.actors[w].call.remote("step", actions[self.slices[w].start - start : self.slices[w].stop - start])
            for w in self.group_workers[group]
        ]

    def recv(self, group: int) -> StepResult:
        """Wait for `group`'s step: what its envs returned."""
        return _joined(self._recv(self.group_workers[group], self._pending.pop(group), "step"))

    def step(self, actions: np.ndarray) -> StepResult:
        for g, sl in enumerate(self.groups):
            self.send(g, actions[sl])
        answers = []
        for g in range(len(self.groups)):
            answers += self._recv(self.group_workers[g], self._pending.pop(g), "step")
        return _joined(answers)

    def run(self, what: str, job: Job, args_of: ArgsOf) -> list[Any]:
        """JobRunner.run: job(WorkerContext, *args_of(its envs)) in every actor at once, over its own envs and arrays;
        their results, in actor order. An array all actors take goes through Ray's object store once when passed as
        ray.put's reference (an actor gets the array)."""
        refs = [a.run.remote(job, *args_of(sl)) for a, sl in zip(self.actors, self.slices)]
        return self._recv(range(self.num_workers), refs, what)

    def check_alive(self) -> None:
        """Raise EnvWorkerError naming an actor that died while idle."""
        refs = [a.progress.options(concurrency_group="probe").remote() for a in self.actors]
        for w, ref in enumerate(refs):
            try:
                self.ray.get(ref, timeout=self.timeout)
            except self.ray.exceptions.RayError as e:
                raise EnvWorkerError(f"{self._where(w)} died while idle: {_cause(e)}") from e

    def get_env_state(self) -> list[Any]:
        return self._call("get_state")

    def set_env_state(self, state: list[Any]) -> None:
        self._call("set_state", state)

    def close(self) -> None:
        """End every actor; the last vector env of a Ray this process started shuts it down."""
        if self.closed:
            return
        self.closed = True
        for actor in self.actors:
            self.ray.kill(actor)
        _own_ray["open"] -= self.own_ray
        if self.own_ray and not _own_ray["open"]:
            _own_ray["started"] = False
            self.ray.shutdown()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.close()


def _joined(answers: list[tuple[Any, ...]]) -> StepResult:
    """One vector step's results from the answers of consecutive actors: arrays joined, infos batched."""
    obs, rewards, terminated, truncated, infos = zip(*answers)
    per_env = [i for part in infos for i in part]
    arrays = (np.concatenate(a) for a in (obs, rewards, terminated, truncated))
    return StepResult(*arrays, batch_infos(per_env), EndedEpisodes.of_infos(per_env))


def _cause(e: Exception) -> str:
    """The first line of a Ray error: why the actor is gone (killed, its node lost, out of memory)."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


if TYPE_CHECKING:  # mypy holds this backend to the contracts it implements (rlrun/envs/protocol.py)
    from rlrun.envs.protocol import JobRunner, VectorEnv

    _vector_env: type[VectorEnv] = RayEnvs
    _job_runner: type[JobRunner] = RayEnvs
