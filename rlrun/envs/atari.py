"""Atari wrappers gymnasium lacks, with the semantics of the DQN/PPO papers' preprocessing (as in SB3/CleanRL)."""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import OrderEnforcing


class AtariFrames(gym.wrappers.AtariPreprocessing):
    """gymnasium's AtariPreprocessing, whose step plays its frames on the ALE itself: per frame the act and the end
    tests that AtariEnv.step beneath it (one frame, a discrete action) makes, and the preprocessing's screen grabs,
    without what AtariEnv.step also makes and the preprocessing throws away, an RGB copy of the screen and an info
    dict per frame: a fifth of an agent step of Breakout. The same observations, rewards, flags and infos
    (tests/unit/test_checkpoint_and_envs.py steps both side by side). Where anything but OrderEnforcing sits between
    the two (a TimeLimit counting frames, the pre-flight's env checker), and before the first reset, gymnasium's own
    step runs."""

    def __init__(self, env: gym.Env, **kwargs: Any):
        from ale_py.env import AtariEnv  # (the atari extra's)

        super().__init__(env, **kwargs)
        inner = env
        while isinstance(inner, OrderEnforcing):
            inner = inner.env
        plain = isinstance(inner, AtariEnv) and inner._frameskip == 1 and not inner.continuous
        self.atari = inner if plain else None
        self.direct = False  # until the first reset, OrderEnforcing's step says the env needs one

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = super().reset(**kwargs)
        self.direct = self.atari is not None
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if not self.direct:
            return super().step(action)
        assert self.atari is not None
        ale, skip = self.ale, self.frame_skip
        ale_action = self.atari._action_set[action]
        grab = ale.getScreenGrayscale if self.grayscale_obs else ale.getScreenRGB
        total_reward, terminated, truncated = 0.0, False, False
        for t in range(skip):  # AtariPreprocessing.step's loop, AtariEnv.step inlined
            total_reward += ale.act(ale_action, 1.0)
            terminated, truncated = ale.game_over(with_truncation=False), ale.game_truncated()
            self.game_over = terminated
            if self.terminal_on_life_loss:
                lives = ale.lives()
                terminated = terminated or lives < self.lives
                self.game_over, self.lives = terminated, lives
            if terminated or truncated:
                break
            if t == skip - 2:
                grab(self.obs_buffer[1])
            elif t == skip - 1:
                grab(self.obs_buffer[0])
        info = {  # AtariEnv's, of the last frame
            "lives": ale.lives(),
            "episode_frame_number": ale.getEpisodeFrameNumber(),
            "frame_number": ale.getFrameNumber(),
        }
        return self._get_obs(), total_reward, terminated, truncated, info


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
