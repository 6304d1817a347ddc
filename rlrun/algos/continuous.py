"""What SAC (sac.py) and TD3 (td3.py) share: actions in [-1, 1]^A inside the algorithm and scaled to the env's bounds
outside it, the twin critics' learner, uniform actions until updates start, an actor and a critics' optimizer, and
DDP's arrangement of one learner per optimizer.

Under DDP each optimizer's parameters have a learner of their own, wrapped on its own. The actor's loss reads Q
through weights cut from autograd (TwinQ's detached=True), so it never sends gradients into the critics, whose
reducer would otherwise see a second backward. Targets are no learner's parameters: each rank averages them from
its own online networks, identical on every rank, and nothing is all-reduced for them."""

from __future__ import annotations

import functools
import math

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.configs import ContinuousControlConfig
from rlrun.algos.finite import require_finite
from rlrun.algos.off_policy import ReplayAlgorithm
from rlrun.algos.parts import OptimizerParts, adam
from rlrun.algos.protocol import EnvSpec, Reductions, Wrap
from rlrun.envs import check_action_space
from rlrun.models import trainable
from rlrun.models.continuous import TwinQ
from rlrun.models.encoders import observation_dtype


class ActionBounds:
    """A Box's bounds: the algorithms act in [-1, 1]^A (what the replay stores and the critics see), the envs get
    actions scaled to [low, high]."""

    def __init__(self, space: gym.Space, algo: str):
        check_action_space(space, "continuous", "this env", algo)
        self.low, self.high, self.dtype = space.low.astype(np.float64), space.high.astype(np.float64), space.dtype
        self.dim = space.shape[0]

    def to_env(self, unit: np.ndarray) -> np.ndarray:
        return (self.low + (unit + 1.0) * 0.5 * (self.high - self.low)).astype(self.dtype)


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


class ContinuousControl(ReplayAlgorithm):
    """The base of SAC and TD3. The subclass builds `model` (with .actor and .critic, targets included), sets
    `critic_learner` and `actor_learner`, and gives its policy's actions in [-1, 1] (`unit_actions`)."""

    modal = False  # rlrun's MLPs (no user networks here) act alike in train and eval mode

    def __init__(self, cfg: ContinuousControlConfig, spec: EnvSpec, device: torch.device, reductions=None):
        self.bounds = ActionBounds(spec.action_space, cfg.name)
        obs = spec.observation_space  # uint8 images stay bytes in the replay (a quarter of float32's size)
        obs_dtype = observation_dtype(obs.shape, obs.dtype)
        super().__init__(cfg, spec, device, reductions or Reductions(), obs_dtype, (self.bounds.dim,), np.float32)
        self.obs_dim = math.prod(spec.observation_space.shape)
        self.parts = OptimizerParts(adam(cfg.lr, cfg.adam_eps))  # what an acceleration may replace
        self.critic_learner: nn.Module
        self.actor_learner: nn.Module

    def unit_actions(self, obs: Tensor, deterministic: bool) -> Tensor:
        """The policy's actions in [-1, 1]^A: with its exploration (not deterministic) or without."""
        raise NotImplementedError

    def extra_trained(self) -> list[nn.Parameter]:
        """Parameters trained beside the actor's, by the actor's learner (SAC's temperature)."""
        return []

    @functools.cached_property
    def critic_optimizer(self) -> torch.optim.Optimizer:
        """Built on first use, as DQN's: an acceleration may put another in its place first."""
        return self.adam(trainable(self.model.critic))

    @functools.cached_property
    def actor_optimizer(self) -> torch.optim.Optimizer:
        return self.adam(trainable(self.model.actor))

    def adam(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return self.parts.make_optimizer(params)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"critic": self.critic_optimizer, "actor": self.actor_optimizer}

    def wrap_learner(self, wrap: Wrap) -> None:
        self.critic_learner = wrap(self.critic_learner, trainable(self.model.critic))
        self.actor_learner = wrap(self.actor_learner, trainable(self.model.actor) + self.extra_trained())
        self.sync_targets()

    @torch.inference_mode()
    def explore(self, obs: np.ndarray, progress: float) -> tuple[np.ndarray, np.ndarray]:
        if self.updates == 0:  # until updates start: uniform actions, as SB3's and CleanRL's warm-up
            unit = torch.rand(len(obs), self.bounds.dim) * 2.0 - 1.0
        else:
            unit = self.unit_actions(self._obs(obs), deterministic=False)
        unit = unit.cpu().numpy()
        return self.bounds.to_env(unit), unit

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = True, starts: np.ndarray | None = None) -> np.ndarray:
        """The policy's actions, deterministic or exploring, scaled to the env's bounds, for evaluation and play."""
        self.model.eval()
        return self.bounds.to_env(self.unit_actions(self._obs(obs), deterministic).cpu().numpy())

    def step_critics(self, obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor) -> tuple[dict, Tensor]:
        """One optimizer step of the critics towards `targets`: (qf_loss and mean Q, |TD errors|)."""
        loss, td_abs, q = self.critic_learner(obs, actions, targets, weights)
        require_finite(loss, f"the {self.cfg.name.upper()} critic loss")
        self.critic_optimizer.zero_grad()
        loss.backward()
        self.critic_optimizer.step()
        return {"qf_loss": loss.detach(), "q_values": q.sum() / (2 * self.cfg.batch_size)}, td_abs

    def learner_state(self) -> dict:
        optimizers = {f"{name}_optimizer": o.state_dict() for name, o in self.optimizers().items()}
        return {"model": self.model.state_dict()} | optimizers

    def load_learner_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        for name, optimizer in self.optimizers().items():
            self.load_optimizer(optimizer, state[f"{name}_optimizer"])
