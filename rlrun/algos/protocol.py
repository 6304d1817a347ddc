"""The contracts between the training loop and the algorithms: what an algorithm is built from (EnvSpec,
Reductions) and what it offers the loop (Algorithm). What it steps, VectorEnv, is the envs' (rlrun/envs/protocol.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from torch import nn

from rlrun.algos.normalize import MeanAll, identity
from rlrun.buffers.replay import ONE_SHARD, Shards
from rlrun.envs.protocol import Episodes as Episodes  # re-exported: callers may name both from here
from rlrun.envs.protocol import VectorEnv as VectorEnv

# (learner, the parameters its optimizers train) -> the learner as training calls it (in DDP when distributed)
Wrap = Callable[[nn.Module, list[nn.Parameter]], nn.Module]
# An annealed quantity: (its name, its value at a progress in [0, 1], the progress at which it reaches its end).
Annealed = tuple[str, Callable[[float], float], float]


def episodes_of(parts: Sequence[Episodes], env_steps: int) -> dict[str, Any]:
    """What a collect returns: the episodes that ended, {"episode_returns": [k], "episode_lengths": [k]}, and the
    env steps it took ("env_steps", this rank's)."""
    return {
        "episode_returns": np.concatenate([p[0] for p in parts] or [np.zeros(0)]).astype(np.float64),
        "episode_lengths": np.concatenate([p[1] for p in parts] or [np.zeros(0, dtype=np.int64)]).astype(np.int64),
        "env_steps": env_steps,
    }


@dataclass(frozen=True)
class EnvSpec:
    """What an algorithm is built for: one env's spaces, the envs this rank steps, frames per observation."""

    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    num_envs: int = 1
    frame_stack: int = 1  # frames stacked along an observation's first axis (stored once by a replay)


class FinishLine(Protocol):
    """Where ranks say their rollout is done, and see how many are (rlrun.distributed.FinishLine)."""

    def start(self) -> None: ...  # a rollout starts on this rank
    def fraction_done(self) -> float: ...  # of all ranks, cheap enough to ask between env steps
    def finish(self) -> None: ...  # this rank's rollout is done


@dataclass(frozen=True)
class Reductions:
    """How an algorithm reaches the other ranks, without knowing them: `mean_all` averages a tensor over ranks,
    `shards` is this rank's place among the replay shards, `finish_line` tells which ranks have finished a rollout
    (straggler preemption). One process: identities, and no finish line."""

    mean_all: MeanAll = identity
    shards: Shards = field(default=ONE_SHARD)
    finish_line: FinishLine | None = None


class Algorithm(Protocol):
    """What the training loop, evaluation and play use of an algorithm; built by its registry entry from (its
    config section, the model config, EnvSpec, device, Reductions). It never asks for its rank."""

    model: nn.Module  # the networks evaluation and play act with
    steps_per_collect: int  # env steps one collect takes on this rank
    update_shape: tuple[int, int, int]  # (batch per step, steps per epoch, epochs): equal on every rank

    # Each learner (a module whose forward produces a loss: what DDP wraps; SAC has one per optimizer) becomes
    # wrap(learner, the parameters its optimizer trains).
    def wrap_learner(self, wrap: Wrap) -> None: ...
    def start(self, obs: np.ndarray) -> None: ...  # the observations (after a reset) collecting starts from
    # The episodes that ended and the env steps taken (episodes_of); "preempted" too when rollouts can be cut short.
    def collect(self, envs: VectorEnv, progress: float) -> dict[str, Any]: ...
    def update(self, progress: float) -> dict[str, float]: ...
    def annealed(self) -> list[Annealed]: ...  # what `progress` anneals (a resume that extends the run says it)
    def act(self, obs: np.ndarray, deterministic: bool = True, starts: np.ndarray | None = None) -> np.ndarray: ...
    def state_dict(self) -> dict[str, Any]: ...  # shared by every rank
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def rank_state(self) -> dict[str, Any]: ...  # this rank's own (where its envs are), small
    def load_rank_state(self, state: dict[str, Any]) -> None: ...
    def shard_state(self) -> dict[str, Any] | None: ...  # this rank's own and large (a replay shard), or None
    def load_shard_state(self, state: dict[str, Any]) -> None: ...
