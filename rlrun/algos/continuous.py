"""The parts SAC (sac.py) and TD3 (td3.py) are composed of, beside the replay they share with DQN (off_policy.py):
actions in [-1, 1]^A inside the algorithm and scaled to the env's bounds outside it, uniform until updates start
(ActionBounds), and the acting built on them (ContinuousAlgorithm, their base); the twin critics' learner and its
optimizer step (CriticLearner, reference_critic_step), the target critics' Q-values, the targets' Polyak update and the
exploring actions: parts an acceleration may replace, in CriticParts; the networks' and optimizers' state
(learner_state, load_learner_state).

Under DDP each optimizer's parameters have a learner of their own, wrapped on its own. The actor's loss reads Q through
weights cut from autograd (TwinQ's detached=True), so it never sends gradients into the critics, whose reducer would
otherwise see a second backward. Targets are no learner's parameters: each rank averages them from its own online
networks, identical on every rank, and nothing is all-reduced for them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.finite import require_finite
from rlrun.algos.off_policy import ReplayAlgorithm
from rlrun.algos.parts import MakeOptimizer, Optimizer
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

    def explore(self, n: int, policy: Callable[[], np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
        """(the actions n envs take, the unit actions the replay stores) while collecting: the policy's (`policy()`,
        exploring), or uniform ones while it is None (until updates start, as SB3's and CleanRL's warm-up)."""
        unit = (torch.rand(n, self.dim) * 2.0 - 1.0).numpy() if policy is None else policy()
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


# One optimizer step of the twin critics: (obs, actions, targets, weights) -> (loss, |TD errors| [B], Q [2, B]), as
# CriticLearner's outputs.
CriticStep = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]
# The target critics' Q-values: (next obs, next actions) -> [2, B], as TwinQ's forward (the reference: the module).
TargetQ = Callable[[Tensor, Tensor], Tensor]
# The policy's exploring actions in [-1, 1]^A while collecting: a vector step's observations [N, ...] -> [N, A], drawing
# their noise from torch's generator (the reference: the algorithm's unit_actions on a tensor).
Exploration = Callable[[np.ndarray], np.ndarray]
# A target network's Polyak update toward its online network: (target, online, tau), as off_policy.polyak_update.
Polyak = Callable[[nn.Module, nn.Module, float], None]


class CriticsAlgorithm(Protocol):
    """What the reference critic step reads of SAC or TD3, at each call: DDP wraps the learner after the parts are
    made, and the optimizer is made on first use."""

    cfg: Any  # its name, for the error of a non-finite loss
    critic_learner: nn.Module
    critic_optimizer: Optimizer


def reference_critic_step(algo: CriticsAlgorithm) -> CriticStep:
    """The critics' learner's loss, checked finite, then backward and the optimizer's step."""

    def step(obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        loss, td_abs, q = algo.critic_learner(obs, actions, targets, weights)
        require_finite(loss, f"the {algo.cfg.name.upper()} critic loss")
        algo.critic_optimizer.zero_grad()
        loss.backward()
        algo.critic_optimizer.step()
        return loss.detach(), td_abs, q

    return step


@dataclass
class CriticParts:
    """What an acceleration may replace in SAC and TD3 alike (rlrun/algos/parts.py): how their optimizers are made, the
    critics' step, the target critics' Q-values, the targets' Polyak update and the policy's exploring actions. SACParts
    (sac.py) and TD3Parts (td3.py) add each one's actor step."""

    make_optimizer: MakeOptimizer
    critic_step: CriticStep
    target_q: TargetQ
    polyak: Polyak
    exploration: Exploration


class ContinuousAlgorithm(ReplayAlgorithm):
    """What SAC and TD3 share of acting: the policy's actions in [-1, 1]^A (unit_actions) scaled to the env's bounds;
    exploring through their parts' exploration once updates start, uniform before (as SB3's and CleanRL's warm-up)."""

    bounds: ActionBounds
    parts: CriticParts
    # rlrun's MLPs (no user networks here) act alike in train and eval mode: no switch between them, each a walk over
    # every module (at every step of an evaluation).
    modal = False

    def unit_actions(self, obs: Tensor, deterministic: bool) -> Tensor:
        """The policy's actions in [-1, 1]^A for observations [N, ...]: deterministic, or exploring."""
        raise NotImplementedError

    def exploring_actions(self, obs: np.ndarray) -> np.ndarray:
        """The reference of the exploration part: unit_actions on the observations as a tensor, back as numpy."""
        actions: np.ndarray = self.unit_actions(self._obs(obs), deterministic=False).cpu().numpy()
        return actions

    @torch.inference_mode()
    def explore(self, obs: np.ndarray, progress: float) -> tuple[np.ndarray, np.ndarray]:
        policy = None if self.updates == 0 else lambda: self.parts.exploration(obs)
        return self.bounds.explore(len(obs), policy)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = True, starts: np.ndarray | None = None) -> np.ndarray:
        """The policy's actions, deterministic or exploring, scaled to the env's bounds, for evaluation and play."""
        return self.bounds.to_env(self.unit_actions(self._obs(obs), deterministic).cpu().numpy())


def critic_stats(step: tuple[Tensor, Tensor, Tensor], batch_size: int) -> tuple[dict[str, Tensor], Tensor]:
    """(qf_loss and mean Q, |TD errors|) of a critic step's outputs."""
    loss, td_abs, q = step
    return {"qf_loss": loss, "q_values": q.sum() / (2 * batch_size)}, td_abs


def learner_state(model: nn.Module, optimizers: dict[str, Optimizer]) -> dict[str, Any]:
    """The networks' and the optimizers' state, shared by every rank."""
    return {"model": model.state_dict()} | {f"{name}_optimizer": o.state_dict() for name, o in optimizers.items()}


def load_learner_state(
    algo: ReplayAlgorithm, model: nn.Module, optimizers: dict[str, Optimizer], state: dict[str, Any]
) -> None:
    model.load_state_dict(state["model"])
    for name, optimizer in optimizers.items():
        algo.load_optimizer(optimizer, state[f"{name}_optimizer"])
