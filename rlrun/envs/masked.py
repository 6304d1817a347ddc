"""Partially observable envs made from fully observable ones by hiding observation components, registered
with gymnasium: `rlrun/CartPoleMasked-v1` is CartPole-v1 without its velocities, which a policy must infer
from successive observations, so it needs memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

MASKED_CARTPOLE = "rlrun/CartPoleMasked-v1"


class KeepObservation(gym.ObservationWrapper):
    """Keeps only the components `indices` of a vector observation: [D] -> [len(indices)]."""

    def __init__(self, env: gym.Env, indices: Sequence[int]):
        super().__init__(env)
        self.indices = np.asarray(indices)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[self.indices], space.high[self.indices], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        kept: np.ndarray = observation[self.indices]
        return kept


def masked_cartpole(**kwargs: Any) -> gym.Env:
    """CartPole seeing the cart position and the pole angle only (CartPole-v1's obs 0 and 2)."""
    return KeepObservation(CartPoleEnv(**kwargs), [0, 2])


def register_envs() -> None:
    # CartPole-v1's limits, so returns compare with the fully observed task.
    gym.register(
        MASKED_CARTPOLE,
        entry_point="rlrun.envs.masked:masked_cartpole",
        max_episode_steps=500,
        reward_threshold=475.0,
    )
