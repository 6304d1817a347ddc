"""The parts SAC (sac.py) and TD3 (td3.py) are composed of, beside the replay they share with DQN (off_policy.py):
actions in [-1, 1]^A inside the algorithm and scaled to the env's bounds outside it, uniform until updates start
(ActionBounds); the twin critics' learner and its optimizer step (CriticLearner, step_critics); the networks' and
optimizers' state (learner_state, load_learner_state).

Under DDP each optimizer's parameters have a learner of their own, wrapped on its own. The actor's loss reads Q
through weights cut from autograd (TwinQ's detached=True), so it never sends gradients into the critics, whose
reducer would otherwise see a second backward. Targets are no learner's parameters: each rank averages them from
its own online networks, identical on every rank, and nothing is all-reduced for them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.finite import require_finite
from rlrun.algos.off_policy import ReplayAlgorithm
from rlrun.algos.parts import Optimizer
from rlrun.algos.protocol import EnvSpec
from rlrun.envs import check_action_space
from rlrun.models.continuous import TwinQ
from rlrun.models.encoders import observation_dtype


class ActionBounds:
    """A Box's bounds: the algorithms act in [-1, 1]^A (what the replay stores and the critics see), the envs get
    actions scaled to [low, high]."""

    def __init__(self, space: gym.Space[Any], algo: str):
        check_action_space(space, "continuous", "this env", algo)
        self.low, self.high, self.dtype = space.low.astype(np.float64), space.high.astype(np.float64), space.dtype
        self.dim = space.shape[0]

    def to_env(self, unit: np.ndarray) -> np.ndarray:
        actions: np.ndarray = (self.low + (unit + 1.0) * 0.5 * (self.high - self.low)).astype(self.dtype)
        return actions

    def explore(self, n: int, policy: Callable[[], Tensor] | None) -> tuple[np.ndarray, np.ndarray]:
        """(the actions n envs take, the unit actions the replay stores) while collecting: the policy's (`policy()`,
        exploring), or uniform ones while it is None (until updates start, as SB3's and CleanRL's warm-up)."""
        unit = (torch.rand(n, self.dim) * 2.0 - 1.0 if policy is None else policy()).cpu().numpy()
        return self.to_env(unit), unit


def replay_layout(spec: EnvSpec, algo: str) -> tuple[ActionBounds, torch.dtype, int]:
    """(the action bounds, the observations' dtype in the replay, their size) of a continuous-control algorithm: uint8
    images stay bytes in the replay (a quarter of float32's size)."""
    obs = spec.observation_space
    return ActionBounds(spec.action_space, algo), observation_dtype(obs.shape, obs.dtype), math.prod(obs.shape)


class CriticLearner(nn.Module):
    """The critics' loss module DDP wraps: forward(obs, actions, targets, weights) -> (loss, |TD errors| [B] (mean
    of the two critics'), Q [2, B]). The loss is scale x sum_k sum_i w_i (Q_k(s_i, a_i) - y_i)^2 / batch_size (SB3:
    scale 1/2 for SAC, 1 for TD3); with DDP's averaging over ranks, the mean over the global batch however many of
    its items each rank holds (as DQN's, replay.py)."""

    def __init__(self, critic: TwinQ, batch_size: int, scale: float):
        super().__init__()
        self.critic, self.batch_size, self.scale = critic, batch_size, scale

    def forward(self, obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q = self.critic(obs, actions)
        td = q - targets
        loss = self.scale * (weights * td.square().sum(0)).sum() / self.batch_size
        return loss, td.detach().abs().mean(0), q.detach()


def step_critics(
    learner: nn.Module,
    optimizer: Optimizer,
    batch: tuple[Tensor, Tensor, Tensor, Tensor],
    name: str,
    batch_size: int,
) -> tuple[dict[str, Tensor], Tensor]:
    """One optimizer step of the critics' learner on (obs, actions, targets, weights): (qf_loss and mean Q, |TD
    errors|). `name` says whose loss a non-finite one is."""
    loss, td_abs, q = learner(*batch)
    require_finite(loss, f"the {name.upper()} critic loss")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"qf_loss": loss.detach(), "q_values": q.sum() / (2 * batch_size)}, td_abs


def learner_state(model: nn.Module, optimizers: dict[str, Optimizer]) -> dict[str, Any]:
    """The networks' and the optimizers' state, shared by every rank."""
    return {"model": model.state_dict()} | {f"{name}_optimizer": o.state_dict() for name, o in optimizers.items()}


def load_learner_state(
    algo: ReplayAlgorithm, model: nn.Module, optimizers: dict[str, Optimizer], state: dict[str, Any]
) -> None:
    model.load_state_dict(state["model"])
    for name, optimizer in optimizers.items():
        algo.load_optimizer(optimizer, state[f"{name}_optimizer"])
