"""A CartPole that fails for chosen seeds of a batch (copied into a run's working directory and named in
env.imports): the file FAILS there holds lines `ENV_SEED MODE STEP`; an env whose first reset had seed ENV_SEED
(rlrun.envs.env_seeds gives a run's) fails from its step STEP on: MODE raise (the step raises), nan (a NaN
observation) or huge (a reward that overflows float32, so its run's loss and gradient are not finite); or, MODE
slow, takes 2 ms a step from then on (a rollout long enough for two signals to land inside it)."""

import pathlib
import time

import gymnasium as gym
import numpy as np


class FailsForSeeds(gym.Wrapper):
    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.t, self.fails = 0, None

    def reset(self, *, seed=None, options=None):
        if seed is not None and self.fails is None:
            lines = pathlib.Path("FAILS").read_text().split("\n") if pathlib.Path("FAILS").exists() else []
            listed = {int(s): (mode, int(step)) for s, mode, step in (line.split() for line in lines if line)}
            self.fails = listed.get(seed, ("none", 0))
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.t += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        mode, at = self.fails or ("none", 0)
        if mode != "none" and self.t >= at:
            if mode == "raise":
                raise RuntimeError(f"env gave up at its step {self.t}")
            if mode == "nan":
                obs = obs * np.nan
            if mode == "huge":
                reward = 1e300
            if mode == "slow":
                time.sleep(0.002)
        return obs, reward, terminated, truncated, info


gym.register("FailsForSeeds-v0", entry_point=FailsForSeeds)
