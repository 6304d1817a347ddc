"""The two APIs CleanRL 1.2.0's scripts were written for, rebuilt over gymnasium 1.x so the scripts run unmodified:
gym 0.23's (`import gym`: ppo, ppo_atari, sac and td3_continuous_action) and gymnasium 0.28's vector env (dqn.py).
Only the env API changes; what an env computes is gymnasium's (the same envs rlrun and SB3 step).

gym 0.23, as `sys.modules["gym"]` (install_gym):
- `gym.make(id)` is gymnasium's make (its TimeLimit, passive checker), ALE ids registered from ale_py on demand.
- `gym.vector.SyncVectorEnv` is 0.23's: `reset() -> obs`, `step(a) -> obs, reward, done, infos` with `done =
  terminated or truncated`, infos a list of dicts, and an ended episode's last observation in
  `infos[i]["terminal_observation"]` (the returned obs is already the next episode's first, reset in the same step),
  `infos[i]["TimeLimit.truncated"] = truncated and not terminated` as 0.23's TimeLimit set it (SB3's ReplayBuffer,
  `handle_timeout_termination=True`, reads it to bootstrap truncations).
- `env.seed(s)` on the outermost wrapper keeps `s` for the env's first reset (0.23 seeded the env's generator at
  once; gymnasium seeds it at reset: the same stream).
- `gym.wrappers.RecordEpisodeStatistics` puts 0.23's `info["episode"] = {"r", "l", "t"}` in an episode's last step;
  `ResizeObservation` (cv2.resize, INTER_AREA), `GrayScaleObservation` (cv2 RGB2GRAY, no channel axis) and
  `FrameStack` (the last k frames, the first one repeated after a reset, as an array [k, ...] where 0.23 gave
  LazyFrames of the same values) are 0.23's. They are gymnasium wrappers, so SB3's atari_wrappers (which ppo_atari.py
  imports, gymnasium API in SB3 2.x) sit between them unchanged.

gymnasium 0.28's vector env (install_gymnasium_028): gymnasium.vector.SyncVectorEnv with SAME_STEP autoreset (1.x
defaults to NEXT_STEP, whose step after an episode's end would be stored by dqn.py as a transition), and 0.28's info
keys: `final_observation` (1.x: `final_obs`) and `final_info` as an object array of each env's info dict (1.x merges
them into one dict of arrays, which dqn.py's `for info in infos["final_info"]` would walk as key names).
"""

from __future__ import annotations

import sys
import time
import types
from collections import deque
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode


def make(env_id: str, **kwargs: Any) -> gymnasium.Env:
    if env_id not in gymnasium.registry:
        import ale_py  # ALE's ids: gym 0.23 found them through ale-py's plugin entry point

        gymnasium.register_envs(ale_py)
    return gymnasium.make(env_id, **kwargs)


class _Seedable:
    """gym 0.23's `env.seed(s)`, on the wrappers a script's thunk ends with: the vector env seeds the first reset."""

    compat_seed: int | None = None

    def seed(self, seed: int | None = None) -> list[int | None]:
        self.compat_seed = seed
        return [seed]


class RecordEpisodeStatistics(_Seedable, gymnasium.Wrapper):
    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.episode_return, self.episode_length, self.t0 = 0.0, 0, time.perf_counter()

    def reset(self, **kwargs: Any) -> Any:
        self.episode_return, self.episode_length, self.t0 = 0.0, 0, time.perf_counter()
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.episode_return += float(reward)
        self.episode_length += 1
        if terminated or truncated:
            elapsed = round(time.perf_counter() - self.t0, 6)
            info = {**info, "episode": {"r": self.episode_return, "l": self.episode_length, "t": elapsed}}
        return obs, reward, terminated, truncated, info


class ResizeObservation(_Seedable, gymnasium.ObservationWrapper):
    def __init__(self, env: gymnasium.Env, shape: tuple[int, int]) -> None:
        super().__init__(env)
        self.shape = tuple(shape)
        space = env.observation_space
        self.observation_space = gymnasium.spaces.Box(0, 255, self.shape + space.shape[2:], np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        import cv2

        frame = cv2.resize(observation, self.shape[::-1], interpolation=cv2.INTER_AREA)
        return frame[..., None] if frame.ndim == 2 and observation.ndim == 3 else frame


class GrayScaleObservation(_Seedable, gymnasium.ObservationWrapper):
    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.observation_space = gymnasium.spaces.Box(0, 255, env.observation_space.shape[:2], np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        import cv2

        return cv2.cvtColor(observation, cv2.COLOR_RGB2GRAY)


class FrameStack(_Seedable, gymnasium.Wrapper):
    def __init__(self, env: gymnasium.Env, num_stack: int) -> None:
        super().__init__(env)
        self.frames: deque[np.ndarray] = deque(maxlen=num_stack)
        space = env.observation_space
        low, high = np.repeat(space.low[None], num_stack, 0), np.repeat(space.high[None], num_stack, 0)
        self.observation_space = gymnasium.spaces.Box(low, high, dtype=space.dtype)

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.frames.maxlen or 0):
            self.frames.append(obs)
        return np.stack(self.frames), info

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames.append(obs)
        return np.stack(self.frames), reward, terminated, truncated, info


class SyncVectorEnv:
    """gym 0.23's SyncVectorEnv over gymnasium-API envs (see the module docstring)."""

    def __init__(self, env_fns: list[Any]) -> None:
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.seeded = False

    def reset(self) -> np.ndarray:
        seeds = [None] * self.num_envs if self.seeded else [getattr(e, "compat_seed", None) for e in self.envs]
        self.seeded = True
        return np.stack([env.reset(seed=seed)[0] for env, seed in zip(self.envs, seeds)])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        observations, rewards, dones, infos = [], np.zeros(self.num_envs), np.zeros(self.num_envs, bool), []
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            obs, rewards[i], terminated, truncated, info = env.step(action)
            info = dict(info)
            dones[i] = terminated or truncated
            if truncated:
                info["TimeLimit.truncated"] = not terminated
            if dones[i]:
                info["terminal_observation"] = obs
                obs, _ = env.reset()
            observations.append(obs)
            infos.append(info)
        return np.stack(observations), rewards, dones, infos

    def close(self) -> None:
        for env in self.envs:
            env.close()


def install_gym() -> None:
    """`import gym` gives the gym 0.23 API above."""
    gym = types.ModuleType("gym")
    wrappers = types.ModuleType("gym.wrappers")
    vector = types.ModuleType("gym.vector")
    for cls in (RecordEpisodeStatistics, ResizeObservation, GrayScaleObservation, FrameStack):
        setattr(wrappers, cls.__name__, cls)
    vector.SyncVectorEnv = SyncVectorEnv  # type: ignore[attr-defined]
    gym.make, gym.spaces, gym.wrappers, gym.vector = make, gymnasium.spaces, wrappers, vector  # type: ignore[attr-defined]
    gym.Env, gym.Wrapper = gymnasium.Env, gymnasium.Wrapper  # type: ignore[attr-defined]
    sys.modules.update({"gym": gym, "gym.wrappers": wrappers, "gym.vector": vector, "gym.spaces": gymnasium.spaces})


class SyncVectorEnv028(gymnasium.vector.SyncVectorEnv):
    """gymnasium 0.28's SyncVectorEnv step results from 1.x's (see the module docstring)."""

    def __init__(self, env_fns: Any, copy: bool = True, **kwargs: Any) -> None:
        super().__init__(env_fns, copy=copy, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)

    def step(self, actions: Any) -> Any:
        obs, rewards, terminated, truncated, infos = super().step(actions)
        if "final_obs" in infos:
            infos["final_observation"], infos["_final_observation"] = infos.pop("final_obs"), infos.pop("_final_obs")
        return obs, rewards, terminated, truncated, infos

    def _add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        if "final_info" not in env_info:
            return super()._add_info(vector_infos, env_info, env_num)
        rest = {k: v for k, v in env_info.items() if k != "final_info"}
        vector_infos = super()._add_info(vector_infos, rest, env_num)
        array = vector_infos.get("final_info", np.full(self.num_envs, None, dtype=object))
        mask = vector_infos.get("_final_info", np.zeros(self.num_envs, dtype=bool))
        array[env_num], mask[env_num] = env_info["final_info"], True
        vector_infos["final_info"], vector_infos["_final_info"] = array, mask
        return vector_infos


def install_gymnasium_028() -> None:
    """gymnasium.vector.SyncVectorEnv gives 0.28's step results (above)."""
    gymnasium.vector.SyncVectorEnv = SyncVectorEnv028  # type: ignore[misc]


def install_strtobool() -> None:
    """`from distutils.util import strtobool` where distutils is gone (Python 3.12): the same function."""
    try:
        import distutils.util  # noqa: F401
    except ImportError:

        def strtobool(value: str) -> int:
            value = value.lower()
            if value in ("y", "yes", "t", "true", "on", "1"):
                return 1
            if value in ("n", "no", "f", "false", "off", "0"):
                return 0
            raise ValueError(f"invalid truth value {value!r}")

        distutils, util = types.ModuleType("distutils"), types.ModuleType("distutils.util")
        util.strtobool, distutils.util = strtobool, util  # type: ignore[attr-defined]
        sys.modules.update({"distutils": distutils, "distutils.util": util})
