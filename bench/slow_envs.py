"""CartPole with a simulator's step cost: each step sleeps (time.sleep: it takes time but no core, so many ranks fit
on two), `factor` times longer on the ranks in `slow_ranks`; a reset sleeps `reset_s` (a simulator loading a scene).
For bench/stragglers.py and the preemption tests:
`env.id=SlowCartPole-v0 env.imports=[slow_envs]` with this file in the working directory, and e.g.
`+env.kwargs.step_s=0.001 +env.kwargs.slow_ranks=[3] +env.kwargs.factor=10`."""

import os
import time

import gymnasium as gym


class SlowCartPole(gym.Wrapper):
    def __init__(
        self, step_s: float = 0.001, slow_ranks: tuple[int, ...] = (), factor: float = 1.0, reset_s: float = 0.0, **kw
    ):
        super().__init__(gym.make("CartPole-v1", **kw))
        slow = int(os.environ.get("RANK", "0")) in slow_ranks
        self.step_s = step_s * (factor if slow else 1.0)
        self.reset_s = reset_s

    def reset(self, **kwargs):
        time.sleep(self.reset_s)
        return self.env.reset(**kwargs)

    def step(self, action):
        time.sleep(self.step_s)
        return self.env.step(action)


gym.register("SlowCartPole-v0", entry_point=SlowCartPole)
