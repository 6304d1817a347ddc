"""Soft actor-critic (Haarnoja et al. 2018), as SB3's and CleanRL's: twin Q critics with Polyak-averaged targets, a
tanh-squashed Gaussian actor, and the entropy temperature alpha tuned towards a target entropy (-|A| by default), on
replay shards whose global batches sample as one buffer (off_policy.py). What it shares with TD3, DDP's arrangement
included, is in continuous.py. The actor's and the temperature's losses touch disjoint parameters: one learner
(one DDP module) computes both, and one backward serves their two optimizers.

This is the reference (torch.optim.Adam); with algo.fast, rlrun/fast/ swaps in faster optimizers."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.configs import SACConfig
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
from rlrun.models.continuous import GaussianActor, TwinQ


def soft_q_targets(returns: Tensor, discount: Tensor, next_q: Tensor, next_log_prob: Tensor, alpha: Tensor) -> Tensor:
    """y = R + gamma^m (min_k Q'_k(s', a') - alpha log pi(a'|s')), a' ~ pi(s') (Haarnoja et al. 2018, eq. 3 with
    clipped double Q); `discount` is gamma^m, or 0 after termination; next_q is already the minimum. [B]"""
    return returns + discount * (next_q - alpha * next_log_prob)


def temperature_loss(log_alpha: Tensor, log_prob: Tensor, target_entropy: float, batch_size: int) -> Tensor:
    """-log alpha (log pi + H_target), summed over the items / batch_size (Haarnoja et al. 2018b, eq. 18, in log alpha
    as SB3): its gradient raises alpha when the policy's entropy -log pi is below the target, and lowers it above."""
    return -(log_alpha * (log_prob.detach() + target_entropy)).sum() / batch_size


class SACActorLearner(nn.Module):
    """The actor's and temperature's loss module DDP wraps: forward(obs, noise [B, A], critic) -> (actor loss +
    temperature loss, then each alone and the entropy estimate, all summed over the items / batch_size).
    Actor loss: alpha log pi(a|s) - min_k Q_k(s, a), a = tanh(mean + std noise) (reparameterized)."""

    def __init__(self, actor: GaussianActor, log_alpha: nn.Parameter, target_entropy: float, batch_size: int):
        super().__init__()
        self.actor, self.log_alpha = actor, log_alpha
        self.target_entropy, self.batch_size = target_entropy, batch_size

    def forward(self, obs: Tensor, noise: Tensor, critic: TwinQ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        actions, log_prob = self.actor(obs, noise)
        q = critic(obs, actions, detached=True).min(0).values
        actor_loss = (self.log_alpha.detach().exp() * log_prob - q).sum() / self.batch_size
        alpha_loss = temperature_loss(self.log_alpha, log_prob, self.target_entropy, self.batch_size)
        entropy = -log_prob.detach().sum() / self.batch_size
        return actor_loss + alpha_loss, actor_loss.detach(), alpha_loss.detach(), entropy


@dataclass
class SACParts(CriticParts):
    """The critics' parts (continuous.py); the next actions the targets read: (next obs, noise [B, A]) -> (actions
    [B, A], log-probs [B]) of the online actor (the reference: the module, GaussianActor's forward); and the actor's and
    temperature's step: (obs, noise [B, A]) -> SACActorLearner's (loss, actor loss, temperature loss, entropy), after
    their optimizers' steps (SAC.actor_step)."""

    next_actions: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
    actor_step: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor, Tensor]]


class SACNetworks(nn.Module):
    """Every network SAC keeps (what evaluation acts with, checkpoints hold and the ranks' digests cover)."""

    def __init__(self, obs_dim: int, action_dim: int, model_cfg: ModelConfig, cfg: SACConfig):
        super().__init__()
        sizes, activation = list(model_cfg.hidden_sizes), model_cfg.activation
        self.actor = GaussianActor(obs_dim, action_dim, sizes, activation)
        self.critic = TwinQ(obs_dim, action_dim, sizes, activation)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.alpha)), requires_grad=cfg.autotune)


class SAC(ContinuousAlgorithm):
    """Each update steps the critics, then (every policy_frequency updates, that many times) the actor and the
    temperature, then (every target_update_interval updates) the critics' targets. Composed of continuous.py's parts
    (the action bounds, the critics' learner and step, the networks' state) on the shared replay (off_policy.py)."""

    parts: SACParts

    def __init__(
        self,
        cfg: SACConfig,
        model_cfg: ModelConfig,
        spec: EnvSpec,
        device: torch.device,
        reductions: Reductions | None = None,
    ):
        self.bounds, obs_dtype, obs_dim = replay_layout(spec, cfg.name)
        super().__init__(cfg, spec, device, reductions or Reductions(), obs_dtype, (self.bounds.dim,), np.float32)
        self.model = nets = SACNetworks(obs_dim, self.bounds.dim, model_cfg, cfg).to(device)
        self.target_entropy = -float(self.bounds.dim) if cfg.target_entropy is None else cfg.target_entropy
        # What an acceleration may replace:
        critic_step, targets = reference_critic_step(self), nets.critic_target
        self.parts = SACParts(
            adam(cfg.lr, cfg.adam_eps),
            critic_step,
            targets,
            polyak_update,
            self.exploring_actions,
            nets.actor,
            self.actor_step,
        )
        # Under DDP each optimizer's parameters have a learner of their own (continuous.py says why).
        self.critic_learner: nn.Module = CriticLearner(nets.critic, cfg.batch_size, 0.5)
        self.actor_learner: nn.Module = SACActorLearner(nets.actor, nets.log_alpha, self.target_entropy, cfg.batch_size)

    # Built on first use, as DQN's: an acceleration may put others in their place first.
    @functools.cached_property
    def critic_optimizer(self) -> Optimizer:
        return self.parts.make_optimizer(trainable(self.model.critic))

    @functools.cached_property
    def actor_optimizer(self) -> Optimizer:
        return self.parts.make_optimizer(trainable(self.model.actor))

    @functools.cached_property
    def alpha_optimizer(self) -> Optimizer | None:
        return self.parts.make_optimizer(self.temperature_trained()) if self.cfg.autotune else None

    def optimizers(self) -> dict[str, Optimizer]:
        alpha = {"alpha": self.alpha_optimizer} if self.alpha_optimizer is not None else {}
        return {"critic": self.critic_optimizer, "actor": self.actor_optimizer} | alpha

    def temperature_trained(self) -> list[nn.Parameter]:
        """The temperature, when tuned: trained beside the actor, by the actor's learner."""
        return [self.model.log_alpha] if self.cfg.autotune else []

    def wrap_learner(self, wrap: Wrap) -> None:
        self.critic_learner = wrap(self.critic_learner, trainable(self.model.critic))
        self.actor_learner = wrap(self.actor_learner, trainable(self.model.actor) + self.temperature_trained())
        self.sync_targets()

    def sync_targets(self) -> None:
        polyak_update(self.model.critic_target, self.model.critic, 1.0)

    def unit_actions(self, obs: Tensor, deterministic: bool) -> Tensor:
        """The policy's actions in [-1, 1]^A: its mode, or a sample."""
        if deterministic:
            return self.model.actor.mode(obs)
        actions: Tensor = self.model.actor(obs, torch.randn(len(obs), self.bounds.dim, device=self.device))[0]
        return actions

    def learner_state(self) -> dict[str, Any]:
        return learner_state(self.model, self.optimizers())

    def load_learner_state(self, state: dict[str, Any]) -> None:
        load_learner_state(self, self.model, self.optimizers(), state)

    def learn(
        self, batch: dict[str, Tensor], weights: Tensor, noise: Tensor | None = None
    ) -> tuple[dict[str, Tensor], Tensor]:
        """One SAC update on this rank's items. `noise` [1 + policy_frequency, n, A] is the standard-normal noise of
        the next actions and of each actor step (drawn here when not given)."""
        c, nets = self.cfg, self.model
        obs = batch["obs"]
        if noise is None:
            noise = torch.randn(1 + c.policy_frequency, len(obs), self.bounds.dim, device=self.device)
        with torch.no_grad():
            next_actions, next_log_prob = self.parts.next_actions(batch["next_obs"], noise[0])
            next_q = self.parts.target_q(batch["next_obs"], next_actions).min(0).values
            alpha = nets.log_alpha.exp()
            targets = soft_q_targets(batch["returns"], batch["discount"], next_q, next_log_prob, alpha)
        stats, td_abs = critic_stats(self.parts.critic_step(obs, batch["actions"], targets, weights), c.batch_size)
        if self.updates % c.policy_frequency == 0:
            for k in range(c.policy_frequency):
                _, actor_loss, alpha_loss, entropy = self.parts.actor_step(obs, noise[1 + k])
                stats |= {"actor_loss": actor_loss, "entropy": entropy, "charts/alpha": nets.log_alpha.detach().exp()}
                if self.alpha_optimizer is not None:
                    stats["alpha_loss"] = alpha_loss
        if self.updates % c.target_update_interval == 0:
            self.parts.polyak(nets.critic_target, nets.critic, c.tau)
        return stats, td_abs

    def actor_step(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One optimizer step of the actor and of the temperature (when tuned) on their losses (SACActorLearner)."""
        loss, actor_loss, alpha_loss, entropy = self.actor_learner(obs, noise, self.model.critic)
        require_finite(loss, "the SAC actor loss")
        steps = [self.actor_optimizer] + ([self.alpha_optimizer] if self.alpha_optimizer is not None else [])
        for optimizer in steps:
            optimizer.zero_grad()
        loss.backward()
        for optimizer in steps:
            optimizer.step()
        return loss.detach(), actor_loss, alpha_loss, entropy
