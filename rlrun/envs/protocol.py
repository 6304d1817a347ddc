"""The contracts of the envs' side: what one vector step returns (StepResult, with the episodes that ended as a typed
field), the vector env every backend is (VectorEnv: in-process, forked workers, Ray actors), and the job runner the
forked pool and the Ray actors both are (JobRunner: a function run on every worker's envs at once)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, NamedTuple, Protocol

import gymnasium as gym
import numpy as np

Episodes = tuple[np.ndarray, np.ndarray]  # (returns [k], lengths [k]) of the episodes that ended


class EndedEpisodes(NamedTuple):
    """The episodes that ended in one vector step, per env [N]: `ended` marks them; their raw return (float64) and
    length in agent steps (int64), as RecordEpisodeStatistics counts them, are 0 where `ended` is False."""

    ended: np.ndarray
    returns: np.ndarray
    lengths: np.ndarray

    @classmethod
    def none(cls, num_envs: int) -> EndedEpisodes:
        """No episode ended among `num_envs` envs (read-only arrays, shared: most steps end no episode)."""
        return _no_episodes(num_envs)

    @classmethod
    def zeros(cls, num_envs: int) -> EndedEpisodes:
        """Arrays for `num_envs` envs to mark the episodes that ended in."""
        return cls(np.zeros(num_envs, dtype=bool), np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64))

    @classmethod
    def of_infos(cls, infos: Sequence[dict[str, Any]]) -> EndedEpisodes:
        """The episodes that ended, from the per-env infos of one step with SAME_STEP autoreset: an env whose episode
        ended has its last step's info under "final_info", where RecordEpisodeStatistics put "episode" {r, l}."""
        out = cls.zeros(len(infos))
        for i, info in enumerate(infos):
            episode = info.get("final_info", {}).get("episode")
            if episode is not None:
                out.ended[i], out.returns[i], out.lengths[i] = True, episode["r"], episode["l"]
        return out

    def finished(self) -> Episodes:
        """(returns [k], lengths [k]) of the k episodes that ended, in env order."""
        if not np.count_nonzero(self.ended):  # a C call: ndarray.any() passes through Python, about 2 us a step
            return _NO_EPISODES
        return self.returns[self.ended], self.lengths[self.ended]

    @staticmethod
    def joined(parts: Sequence[EndedEpisodes]) -> EndedEpisodes:
        """The episodes of consecutive groups of envs, as one vector step's."""
        return EndedEpisodes(*(np.concatenate(arrays) for arrays in zip(*parts)))


@functools.cache
def _no_episodes(num_envs: int) -> EndedEpisodes:
    episodes = EndedEpisodes.zeros(num_envs)
    for array in episodes:
        array.flags.writeable = False
    return episodes


_NO_EPISODES: Episodes = _no_episodes(0)[1:]


class StepResult(NamedTuple):
    """What a vector step returns, [N, ...] per env: gymnasium's five (obs, rewards, terminated, truncated, info),
    where a finished episode's last observation is info["final_obs"] (SAME_STEP autoreset: `obs` already starts the
    next one), and the episodes that ended. Copies: the next step does not overwrite them."""

    obs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]
    episodes: EndedEpisodes


class VectorEnv(Protocol):
    """A batch of N envs with gymnasium's vector semantics (SAME_STEP autoreset), stepped whole or by groups (double
    buffering): SyncEnvs (rlrun/envs/sync.py), WorkerPool (pool.py), RayEnvs (ray_envs.py)."""

    num_envs: int
    num_workers: int  # processes (or native threads) of its own stepping the envs (0: in this process)
    single_observation_space: gym.Space[Any]
    single_action_space: gym.Space[Any]
    groups: list[slice]  # env ranges that step independently: send(g, ...) then recv(g)

    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]: ...
    def step(self, actions: np.ndarray) -> StepResult: ...
    def send(self, group: int, actions: np.ndarray) -> None: ...
    def recv(self, group: int) -> StepResult: ...  # the envs of groups[group] only
    def check_alive(self) -> None: ...  # raises EnvWorkerError naming a worker that died while idle
    def get_env_state(self) -> list[Any]: ...
    def set_env_state(self, state: list[Any]) -> None: ...
    def close(self) -> None: ...


class JobContext(Protocol):
    """What a job run in a worker works with (the pool's and the Ray actors' WorkerContext): its envs (rows `rows`
    of the step buffers), the buffers, the arrays the rank shared, and `memory` that lasts from one job to the
    next; step() steps its envs with the actions in the buffers and returns their infos."""

    index: int
    envs: list[gym.Env]
    rows: slice
    buffers: dict[str, np.ndarray]
    shared: dict[str, np.ndarray]
    memory: dict[str, Any]
    where: list[int | None]  # the env being worked on, for an error report: a job sets [0] = None outside an env

    def step(self) -> list[dict[str, Any]]: ...


# A job: a module-level function (it is pickled by name) of a worker's JobContext and the arguments for its envs.
if TYPE_CHECKING:
    Job = Callable[Concatenate[JobContext, ...], Any]
else:
    Job = Callable[..., Any]  # Concatenate[X, ...] takes a bare ... from Python 3.11 on
# Its arguments for the worker hosting the envs `slice` of the vector env.
ArgsOf = Callable[[slice], tuple[Any, ...]]


class JobRunner(Protocol):
    """A vector env whose envs live in workers of their own (forked processes: WorkerPool; Ray actors: RayEnvs) that
    run jobs on their envs: a whole rollout acted by a copy of the policy costs one command per worker."""

    num_workers: int
    slices: list[slice]  # the envs each worker hosts, contiguous, in worker order

    def run(self, what: str, job: Job, args_of: ArgsOf) -> list[Any]:
        """job(its WorkerContext, *args_of(its envs)) in every worker at once; their results, in worker order. `what`
        names the job in errors. A job that steps envs through WorkerContext.step may run as long as it keeps
        stepping: the step timeout applies to each step. A job that fails outside an env sets where[0] = None."""
        ...
