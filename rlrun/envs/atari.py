"""Atari wrappers gymnasium lacks, with the semantics of the DQN/PPO papers' preprocessing (as in SB3/CleanRL)."""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np


class EpisodicLife(gym.Wrapper):
    """A life lost ends the training episode (terminated=True), but the game only resets when it is over.

    gymnasium's AtariPreprocessing(terminal_on_life_loss=True) resets the whole game on every life lost,
    so an agent would never see its later lives; this keeps playing the same game instead.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)  # no-op to the next life
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after reset in games that wait for it (Breakout), so episodes do not stall."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def needs_fire(env: gym.Env) -> bool:
    meanings = env.unwrapped.get_action_meanings()
    return len(meanings) >= 3 and meanings[1] == "FIRE"


def sign_reward(reward: float) -> float:
    return float(np.sign(reward))
