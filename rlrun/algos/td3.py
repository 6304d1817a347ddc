"""Twin delayed DDPG (Fujimoto et al. 2018), as SB3's and CleanRL's: a deterministic actor explored with Gaussian
noise, twin Q critics trained towards the smaller target Q at a smoothed target action, and the actor and the targets
updated every policy_delay critic updates. What it shares with SAC (action bounds, the critics' learner, DDP's
arrangement of one learner per optimizer) is in continuous.py. On the delayed steps the actor's learner runs no
forward on any rank, so its DDP reducer has nothing to wait for: every rank counts updates alike.

This is the reference (torch.optim.Adam); with algo.fast, rlrun/fast/ swaps in faster optimizers."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.configs import TD3Config
from rlrun.algos.continuous import (
    ContinuousAlgorithm,
    CriticLearner,
    CriticParts,
    critic_stats,
    learner_state,
    load_learner_state,
    reference_critic_step,
    replay_layout,
)
from rlrun.algos.finite import require_finite
from rlrun.algos.off_policy import polyak_update
from rlrun.algos.parts import Optimizer, adam
from rlrun.algos.protocol import EnvSpec, Reductions, Wrap
from rlrun.config import ModelConfig
from rlrun.models import trainable
from rlrun.models.continuous import DeterministicActor, TwinQ


def smoothed_target_actions(target_actions: Tensor, noise: Tensor, noise_clip: float) -> Tensor:
    """Target policy smoothing (Fujimoto et al. 2018, eq. 15): clip(mu'(s') + clip(noise, -c, c), -1, 1), where
    `noise` is already scaled (target_policy_noise x N(0, 1))."""
    return (target_actions + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


class TD3ActorLearner(nn.Module):
    """The actor's loss module DDP wraps: forward(obs, critic) -> -Q_1(s, mu(s)) summed over the items / batch_size
    (the first critic only, as in the paper)."""

    def __init__(self, actor: DeterministicActor, batch_size: int):
        super().__init__()
        self.actor, self.batch_size = actor, batch_size

    def forward(self, obs: Tensor, critic: TwinQ) -> Tensor:
        q: Tensor = critic(obs, self.actor(obs), detached=True, first=True)
        return -q.sum() / self.batch_size


@dataclass
class TD3Parts(CriticParts):
    """The critics' parts (continuous.py), the target actor's actions mu'(s') (next obs -> [B, A], the reference: the
    module), and the actor's step: (obs) -> its loss, after one optimizer step on it (TD3.actor_step)."""

    target_actions: Callable[[Tensor], Tensor]
    actor_step: Callable[[Tensor], Tensor]


class TD3Networks(nn.Module):
    """Every network TD3 keeps (what evaluation acts with, checkpoints hold and the ranks' digests cover)."""

    def __init__(self, obs_dim: int, action_dim: int, model_cfg: ModelConfig):
        super().__init__()
        sizes, activation = list(model_cfg.hidden_sizes), model_cfg.activation
        self.actor = DeterministicActor(obs_dim, action_dim, sizes, activation)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = TwinQ(obs_dim, action_dim, sizes, activation)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)


class TD3(ContinuousAlgorithm):
    """Each update steps the critics, and every policy_delay updates the actor and both targets. Composed of
    continuous.py's parts (the action bounds, the critics' learner and step, the networks' state) on the shared replay
    (off_policy.py)."""

    parts: TD3Parts

    def __init__(
        self,
        cfg: TD3Config,
        model_cfg: ModelConfig,
        spec: EnvSpec,
        device: torch.device,
        reductions: Reductions | None = None,
    ):
        self.bounds, obs_dtype, obs_dim = replay_layout(spec, cfg.name)
        super().__init__(cfg, spec, device, reductions or Reductions(), obs_dtype, (self.bounds.dim,), np.float32)
        self.model = TD3Networks(obs_dim, self.bounds.dim, model_cfg).to(device)
        # What an acceleration may replace:
        critic_step, targets = reference_critic_step(self), self.model.critic_target
        self.parts = TD3Parts(
            adam(cfg.lr, cfg.adam_eps),
            critic_step,
            targets,
            polyak_update,
            self.exploring_actions,
            self.model.actor_target,
            self.actor_step,
        )
        # Under DDP each optimizer's parameters have a learner of their own (continuous.py says why).
        self.critic_learner: nn.Module = CriticLearner(self.model.critic, cfg.batch_size, 1.0)
        self.actor_learner: nn.Module = TD3ActorLearner(self.model.actor, cfg.batch_size)

    # Built on first use, as DQN's: an acceleration may put others in their place first.
    @functools.cached_property
    def critic_optimizer(self) -> Optimizer:
        return self.parts.make_optimizer(trainable(self.model.critic))

    @functools.cached_property
    def actor_optimizer(self) -> Optimizer:
        return self.parts.make_optimizer(trainable(self.model.actor))

    def optimizers(self) -> dict[str, Optimizer]:
        return {"critic": self.critic_optimizer, "actor": self.actor_optimizer}

    def wrap_learner(self, wrap: Wrap) -> None:
        self.critic_learner = wrap(self.critic_learner, trainable(self.model.critic))
        self.actor_learner = wrap(self.actor_learner, trainable(self.model.actor))
        self.sync_targets()

    def sync_targets(self) -> None:
        polyak_update(self.model.critic_target, self.model.critic, 1.0)
        polyak_update(self.model.actor_target, self.model.actor, 1.0)

    def unit_actions(self, obs: Tensor, deterministic: bool) -> Tensor:
        """The policy's actions in [-1, 1]^A: mu(s), or with Gaussian exploration noise."""
        mu: Tensor = self.model.actor(obs)
        if deterministic or self.cfg.exploration_noise == 0:
            return mu
        noisy: Tensor = (mu + self.cfg.exploration_noise * torch.randn(mu.shape, device=self.device)).clamp(-1.0, 1.0)
        return noisy

    def learner_state(self) -> dict[str, Any]:
        return learner_state(self.model, self.optimizers())

    def load_learner_state(self, state: dict[str, Any]) -> None:
        load_learner_state(self, self.model, self.optimizers(), state)

    def learn(
        self, batch: dict[str, Tensor], weights: Tensor, noise: Tensor | None = None
    ) -> tuple[dict[str, Tensor], Tensor]:
        """One TD3 update on this rank's items. `noise` [n, A] is the standard-normal noise of the target actions
        (drawn here when not given)."""
        c, nets = self.cfg, self.model
        obs, next_obs = batch["obs"], batch["next_obs"]
        if noise is None:
            noise = torch.randn(len(obs), self.bounds.dim, device=self.device)
        with torch.no_grad():
            smoothing = c.target_policy_noise * noise
            next_actions = smoothed_target_actions(self.parts.target_actions(next_obs), smoothing, c.target_noise_clip)
            next_q = self.parts.target_q(next_obs, next_actions).min(0).values
            targets = batch["returns"] + batch["discount"] * next_q
        stats, td_abs = critic_stats(self.parts.critic_step(obs, batch["actions"], targets, weights), c.batch_size)
        if self.updates % c.policy_delay == 0:
            stats["actor_loss"] = self.parts.actor_step(obs)
            self.parts.polyak(nets.critic_target, nets.critic, c.tau)
            self.parts.polyak(nets.actor_target, nets.actor, c.tau)
        return stats, td_abs

    def actor_step(self, obs: Tensor) -> Tensor:
        """One optimizer step of the actor on -Q_1(s, mu(s)) (the critics as they are after their step); its loss."""
        actor_loss = self.actor_learner(obs, self.model.critic)
        require_finite(actor_loss, "the TD3 actor loss")
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        loss: Tensor = actor_loss.detach()
        return loss
