"""Envs that fail on purpose, for the recovery tests (copied into a run's working directory and named in
env.imports): Flaky-v0 and BadEval-v0."""

import pathlib

import gymnasium as gym


class Flaky(gym.Wrapper):
    """CartPole whose 300th step raises while the file BREAK exists in the working directory."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.t = 0

    def step(self, action):
        self.t += 1
        if self.t == 300 and pathlib.Path("BREAK").exists():
            raise RuntimeError("flaky env gave up")
        return self.env.step(action)


class BadEval(gym.Wrapper):
    """CartPole; the fourth one made in a process (the eval env, after the pre-flight's env and two training envs)
    raises when stepped."""

    made = 0

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        BadEval.made += 1
        self.eval = BadEval.made > 3

    def step(self, action):
        if self.eval:
            raise RuntimeError("eval env broke")
        return self.env.step(action)


gym.register("Flaky-v0", entry_point=Flaky)
gym.register("BadEval-v0", entry_point=BadEval)
