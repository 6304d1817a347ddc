"""Stepping a list of envs into preallocated arrays, with gymnasium's SAME_STEP autoreset: what each worker of
the pool does for its envs, and what SyncEnvs, the in-process vector env, does for all of them.

SyncEnvs replaces gymnasium's SyncVectorEnv in the rank: it writes into fixed arrays instead of batching and
copying every step's observations and (mostly empty) infos, which was a third of CartPole PPO's collect
time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

from rlrun.envs.protocol import EndedEpisodes, StepResult
from rlrun.envs.state import env_state, load_env_state
from rlrun.errors import NonFiniteError


def env_buffers(
    n: int, obs_space: gym.Space[Any], action_space: gym.Space[Any], alloc: Callable[..., np.ndarray] = np.zeros
) -> dict[str, np.ndarray]:
    """The arrays `n` envs step through; `alloc(shape, dtype)` places them (the pool's in shared memory)."""
    return {
        "obs": alloc((n, *obs_space.shape), obs_space.dtype),
        "final_obs": alloc((n, *obs_space.shape), obs_space.dtype),
        "rewards": alloc((n,), np.float64),
        "terminated": alloc((n,), np.bool_),
        "truncated": alloc((n,), np.bool_),
        "actions": alloc((n, *action_space.shape), action_space.dtype),
    }


def run_command(
    command: str,
    data: list[Any] | None,
    envs: list[gym.Env],
    offset: int,
    b: dict[str, np.ndarray],
    where: list[int | None],
    check_finite: bool = True,
) -> list[dict[str, Any]]:
    """Run one command on `envs` (rows offset.. of the buffers `b`); returns their per-env infos.
    `where[0]` tracks the env being worked on, for a worker's error report. With `check_finite`, a step or reset
    that returns a NaN or infinite observation or reward raises NonFiniteError naming the env."""
    if command == "step":
        return _step(envs, offset, b, where, check_finite)
    infos = []
    for i, env in enumerate(envs):
        where[0] = j = offset + i
        info: dict[str, Any] = {}
        if command == "reset":
            b["obs"][j], info = env.reset(seed=None if data is None else data[i])
        elif command == "get_state":
            info = env_state(env)
        elif command == "set_state":
            load_env_state(env, data[i])
        infos.append(info)
    if check_finite and command == "reset":
        require_finite_rows(b["obs"][offset : offset + len(envs)], offset, "observation")
    return infos


def _step(
    envs: list[gym.Env], offset: int, b: dict[str, np.ndarray], where: list[int | None], check_finite: bool
) -> list[dict[str, Any]]:
    """Step `envs` with their actions in `b`, autoresetting in the same step as SAME_STEP does. Rewards and flags are
    gathered in lists and written once: a numpy item write per env and field cost more than the env's own step."""
    rows = slice(offset, offset + len(envs))
    obs_rows, final_rows, actions = b["obs"][rows], b["final_obs"][rows], b["actions"][rows]
    rewards, terminated, truncated, infos = [], [], [], []
    for i, env in enumerate(envs):
        where[0] = offset + i
        obs, reward, term, trunc, info = env.step(actions[i])
        if term or trunc:
            obs, info = autoreset(env, obs, info, final_rows[i], offset + i, check_finite)
        obs_rows[i] = obs
        rewards.append(reward)
        terminated.append(term)
        truncated.append(trunc)
        infos.append(info)
    b["rewards"][rows], b["terminated"][rows], b["truncated"][rows] = rewards, terminated, truncated
    if check_finite:
        require_finite_rows(obs_rows, offset, "observation")
        require_finite_rows(b["rewards"][rows], offset, "reward")
    return infos


def autoreset(
    env: gym.Env, obs: Any, info: dict[str, Any], final_row: np.ndarray, j: int, check_finite: bool
) -> tuple[Any, dict[str, Any]]:
    """SAME_STEP autoreset of env j, whose episode ended on observation `obs` with `info`: the final observation is
    written to its row of final_obs and kept in the info beside the final info, and the env is reset. Returns the
    first observation of its next episode and that info."""
    if check_finite:  # a truncation bootstraps from it
        require_finite_rows(np.asarray(obs)[None], j, "final observation")
    final_row[:] = obs
    final = {"final_obs": final_row.copy(), "final_info": info}
    obs, info = env.reset()
    return obs, {**final, **info}


# run_command's signature (command, data, envs, offset, buffers, where, check_finite) -> infos: SyncEnvs' part that
# runs a command on its envs.
RunCommand = Callable[
    [str, list[Any] | None, list[gym.Env], int, dict[str, np.ndarray], list[int | None], bool], list[dict[str, Any]]
]


def require_finite_rows(x: np.ndarray, first_env: int, what: str) -> None:
    """Raise NonFiniteError naming the first env whose row of `x` [n, ...] (envs first_env..) holds a NaN or an
    infinity. One vectorized check per step batch; integer arrays (Atari frames) cannot hold either."""
    # np.count_nonzero: a C call, where ndarray.all() passes through Python (twice a step, at every step)
    if x.dtype.kind != "f" or np.count_nonzero(np.isfinite(x)) == x.size:
        return
    bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    row = int(np.flatnonzero(bad)[0])
    raise env_nonfinite(first_env + row, f"{'a NaN' if np.isnan(x[row]).any() else 'an infinite'} {what}")


def env_nonfinite(env: int, detail: str) -> NonFiniteError:
    """The error for env `env` returning a non-finite value (`detail`: "a NaN observation"); it keeps both, so that a
    host whose env indices are local (a Ray actor) can name the rank's index instead."""
    error = NonFiniteError(f"env {env} returned {detail}")
    error.env, error.detail = env, detail
    return error


class _Infos:
    """Batches per-env info dicts exactly as gymnasium's vector envs do (reusing their _add_info)."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int):
        self.num_envs = num_envs


def batch_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-env info dicts as one vector info dict (arrays plus `_key` masks), skipping the empty ones."""
    batch = _Infos(len(infos))
    out: dict[str, Any] = {}
    for i, info in enumerate(infos):
        if info:
            out = batch._add_info(out, info, i)
    return out


def step_results(b: dict[str, np.ndarray], envs: slice, infos: list[dict[str, Any]]) -> StepResult:
    """What VectorEnv.step returns for the envs in `envs`, whose per-env infos are `infos`: copies, as the next step
    overwrites the buffers."""
    arrays = (
        b["obs"][envs].copy(),
        b["rewards"][envs].copy(),
        b["terminated"][envs].copy(),
        b["truncated"][envs].copy(),
    )
    if not any(infos):  # most steps of most envs: no info, no episode ended
        return StepResult(*arrays, {}, EndedEpisodes.none(len(infos)))
    return StepResult(*arrays, batch_infos(infos), EndedEpisodes.of_infos(infos))


class SyncEnvs:
    """The envs of `env_fns`, stepped in this process: gymnasium's vector env interface (reset, step, close,
    spaces) plus what rlrun's collect loops use: send/recv on one group, and env state for checkpoints."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], check_finite: bool = True):
        self.envs = [fn() for fn in env_fns]
        self.check_finite = check_finite
        self.num_envs = len(self.envs)
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.metadata = self.envs[0].metadata
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.buffers = env_buffers(self.num_envs, self.single_observation_space, self.single_action_space)
        self.groups = [slice(0, self.num_envs)]
        self.num_workers = 0  # no processes of its own: acting may use every core
        # The part that runs a command on the envs, which an acceleration may replace (rlrun/fast/cartpole_arrays.py:
        # the step of CartPoles as arrays); every other command and every other backend runs run_command.
        self.run_command: RunCommand = run_command
        self._infos: list[dict[str, Any]] = []

    def _run(self, command: str, data: list[Any] | None = None) -> list[dict[str, Any]]:
        return self.run_command(command, data, self.envs, 0, self.buffers, [0], self.check_finite)

    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if isinstance(seed, int):
            seed = [seed + i for i in range(self.num_envs)]
        infos = self._run("reset", None if seed is None else list(seed))
        return self.buffers["obs"].copy(), batch_infos(infos)

    def send(self, group: int, actions: np.ndarray) -> None:
        self.buffers["actions"][:] = actions
        self._infos = self._run("step")

    def recv(self, group: int) -> StepResult:
        return step_results(self.buffers, self.groups[0], self._infos)

    def step(self, actions: np.ndarray) -> StepResult:
        self.send(0, actions)
        return self.recv(0)

    def check_alive(self) -> None:
        """Nothing to check: the envs live in this process."""

    def get_env_state(self) -> list[Any]:
        return self._run("get_state")

    def set_env_state(self, state: list[Any]) -> None:
        self._run("set_state", state)

    def close(self) -> None:
        for env in self.envs:
            env.close()


if TYPE_CHECKING:  # mypy holds this backend to the contracts it implements (rlrun/envs/protocol.py)
    from rlrun.envs.protocol import VectorEnv

    _vector_env: type[VectorEnv] = SyncEnvs
