"""CartPole with a simulator's step cost: each step sleeps (time.sleep: it takes time but no core, so many ranks fit
on two), `factor` times longer on the ranks in `slow_ranks`; a reset sleeps `reset_s` (a simulator loading a scene).
For bench/stragglers.py and the preemption tests:
`env.id=SlowCartPole-v0 env.imports=[slow_envs]` with this file in the working directory, and e.g.
`+env.kwargs.step_s=0.001 +env.kwargs.slow_ranks=[3] +env.kwargs.factor=10`.

ParallelSlowCartPole-v0 (bench/ray_envs.py) models a simulator that steps on cores of its own (a C++ or GPU
simulator that releases the GIL): the envs of one process step in parallel, so a vector step of a process's k
envs costs step_s, not k x step_s. The first of them to take its n-th step sleeps step_s; the others' n-th
steps wait only for what is left of that sleep. It measures what a vector env backend adds (transport, acting)
to envs that run in parallel, as many as there are envs, on two cores."""

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


class ParallelSlowCartPole(gym.Wrapper):
    wake = (-1, 0.0)  # (step number, when it ends) of this process's envs

    def __init__(self, step_s: float = 0.001, **kw):
        super().__init__(gym.make("CartPole-v1", **kw))
        self.step_s, self.steps = step_s, 0

    def step(self, action):
        self.steps += 1
        n, end = ParallelSlowCartPole.wake
        if n != self.steps:
            end = time.monotonic() + self.step_s
            ParallelSlowCartPole.wake = self.steps, end
        result = self.env.step(action)  # CartPole's own time is part of the step's
        left = end - time.monotonic()
        if left > 0:  # time.sleep(0) is no free call: Linux's timer slack makes it ~60 us
            time.sleep(left)
        return result


gym.register("SlowCartPole-v0", entry_point=SlowCartPole)
gym.register("ParallelSlowCartPole-v0", entry_point=ParallelSlowCartPole)
