"""The rollout step, written once and run by every collector: the rank's collect loops (PPO, A2C) and the env
workers' loop (rlrun/fast/worker_acting.py). In two halves, so that a double-buffered vector env can step one
group of envs while the policy acts for the other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from rlrun.envs.protocol import Episodes, StepResult

# `out` holds the rollout's arrays under Rollout's names, [T, N, ...]: the rank's Rollout, or a worker's rows of the
# arrays it shares with the rank.

ACTED = ("obs", "actions", "log_probs", "values")  # what act_step stores
STEPPED = ("rewards_np", "terminated_np", "truncated_np")  # what observe_step stores (numpy views), and next_values
# (obs [n, ...], t, envs) -> action, log-prob, value; and (final obs [k, ...], their env indices) -> V [k]. Rows are
# tensors, or numpy arrays where acting is numpy's and `out` holds numpy views (rlrun/fast/numpy_rollout.py).
Rows = TypeVar("Rows", Tensor, np.ndarray)
Act = Callable[[Rows, int, slice], tuple[Rows, Rows, Rows]]
ValueOf = Callable[[np.ndarray, np.ndarray], Tensor | np.ndarray]


def act_step(act: Act[Rows], obs: Rows, t: int, envs: slice, out: Any) -> Rows:
    """Act on the observations `obs` of the envs `envs` at rollout step t, storing obs, action, log-prob and
    value in row t of `out`; returns the actions."""
    action, log_prob, value = act(obs, t, envs)
    out.obs[t, envs] = obs
    out.actions[t, envs] = action
    out.log_probs[t, envs] = log_prob
    out.values[t, envs] = value
    return action


def observe_step(value_of: ValueOf, result: StepResult, t: int, envs: slice, out: Any) -> tuple[np.ndarray, Episodes]:
    """Store what the envs `envs` returned for rollout step t: rewards and flags, and where an episode was
    truncated, V of its final observation (in next_values), which the return bootstraps from (a terminated
    episode does not bootstrap). Returns the envs' next observations and the episodes that ended."""
    obs, reward, terminated, truncated, info, episodes = result
    out.rewards_np[t, envs] = reward
    out.terminated_np[t, envs] = terminated
    out.truncated_np[t, envs] = truncated
    cut = truncated.nonzero()[0]  # (np.flatnonzero's Python-level ravel costs more than the rest of this function)
    if len(cut):  # the autoreset replaced the final observation; gymnasium keeps it in the info
        out.next_values[t, envs.start + cut] = value_of(np.stack(info["final_obs"][cut]), envs.start + cut)
    return obs, episodes.finished()


def step_groups(
    envs: Any,
    obs: np.ndarray,
    num_steps: int,
    act: Callable[[np.ndarray, int, slice], np.ndarray],
    value_of: ValueOf,
    out: Any,
    cut: Callable[[int], bool] | None = None,
) -> tuple[np.ndarray, list[Episodes], int]:
    """Up to num_steps rollout steps of the vector env `envs` from its observations `obs` [N, ...], in its groups of
    envs (one, or two when it double-buffers: a group steps while the policy acts for the next). `act(obs of a group,
    t, its envs)` returns the actions to send (and stores what it keeps); observe_step stores what the envs return
    in `out`. `cut(t)`, asked before each step t > 0, ends the rollout after t steps when true (a preempted
    straggler). Returns the observations after the last step, in env order, the episodes that ended and the number
    of steps taken."""
    groups, episodes = envs.groups, []
    group_obs = [obs[g] for g in groups]
    for t in range(num_steps + 1):
        last = t == num_steps or (t > 0 and cut is not None and cut(t))
        for i, g in enumerate(groups):
            if t > 0:
                group_obs[i], ended = observe_step(value_of, envs.recv(i), t - 1, g, out)
                episodes.append(ended)
            if not last:
                envs.send(i, act(group_obs[i], t, g))
        if last:
            break
    return np.concatenate(group_obs), episodes, t


class StepRows:
    """One rollout tensor [T, N, ...] as a collect loop writes it on the rank: each step's rows are kept as they
    come and written in one copy per group of envs when the rollout ends (a copy per step and field costs more
    than acting does for a few envs), or stacked into one tensor that keeps their autograd graph (A2C)."""

    def __init__(self, target: Tensor | None = None):
        self.target = target
        self.rows: dict[tuple[int, int], list[Tensor]] = {}  # (first env, end) of a group -> its rows, by step

    def __setitem__(self, index: tuple[int, slice], value: Tensor) -> None:
        _, envs = index  # steps come in order, each group's at every step
        self.rows.setdefault((envs.start, envs.stop), []).append(value)

    def stacked(self) -> Tensor:
        """The rows as one tensor [T, N, ...], groups in env order; differentiable."""
        return torch.cat([torch.stack(self.rows[g]) for g in sorted(self.rows)], dim=1)

    def flush(self) -> None:
        assert self.target is not None, "flush writes into the target tensor given (stacked() makes one)"
        for (start, stop), values in self.rows.items():
            self.target[: len(values), start:stop] = torch.stack(values)  # a rollout cut short fills fewer steps
        self.rows.clear()
