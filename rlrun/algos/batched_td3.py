"""TD3 for S seeds side by side in one process (issue 35): the seeds' actors, critics and both targets stacked into
one network each (rlrun/algos/stacked.py's StackedMLP), one batched forward and backward per step of the update for
all S. Read it next to rlrun/algos/td3.py, the single-seed reference: each step below is that file's, done per seed.
Each seed keeps its own replay and generator (batched_replay.py: its exploration and target-smoothing noise are its
own draws), its own Adams, and its own delayed schedule of actor and target updates (the seeds of a batch count
updates alike, so the delays fall on the same updates)."""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.batched_continuous import explore, flat, step_critics, twin_q
from rlrun.algos.batched_replay import BatchedReplay
from rlrun.algos.stacked import SeedSteps, StackedMLP, polyak_per_seed, share_optimizers
from rlrun.algos.td3 import TD3, TD3Networks, smoothed_target_actions


def unbatchable(algo: object) -> str | None:
    """Why the built algorithm `algo` cannot train in a batch of seeds (BatchedTD3), or None when it can."""
    return None if isinstance(algo, TD3) and type(algo.model) is TD3Networks else type(algo).__name__


class BatchedTD3Networks(nn.Module):
    """The seeds' TD3Networks as one: actor, actor_target, critic and critic_target StackedMLPs; `ties` say where
    each seed's own parameters lie."""

    def __init__(self, nets: list[TD3Networks]) -> None:
        super().__init__()
        self.actor = StackedMLP([[n.actor.net] for n in nets])
        self.actor_target = StackedMLP([[n.actor_target.net] for n in nets]).requires_grad_(False)
        self.critic = StackedMLP([[*n.critic.critics] for n in nets])
        self.critic_target = StackedMLP([[*n.critic_target.critics] for n in nets]).requires_grad_(False)
        self.ties = self.actor.ties + self.actor_target.ties + self.critic.ties + self.critic_target.ties


def deterministic(actor: StackedMLP, obs: Tensor) -> Tensor:
    """DeterministicActor.forward per seed: actions [S, B, A] in [-1, 1] for obs [S, B, ...]."""
    mu: Tensor = actor(flat(obs))
    return torch.tanh(mu.squeeze(1))


class BatchedTD3(BatchedReplay):
    """S seeds' TD3 (each a single-run TD3 object, built as its single run builds it) trained together."""

    def __init__(
        self,
        seeds: list[TD3],
        generators: list[torch.Generator],
        device_generators: list[torch.Generator] | None = None,
    ) -> None:
        super().__init__(list(seeds), generators, device_generators)
        self.td3s = seeds
        self.nets = BatchedTD3Networks([cast(TD3Networks, a.model) for a in seeds])  # unbatchable checked them
        self.ties = self.nets.ties
        # Each seed's own optimizers (TD3's declared part, as its single run makes them) over its slices of the stack.
        make = seeds[0].parts.make_optimizer
        self.critic_optimizer = SeedSteps(list(self.nets.critic.parameters()), make)
        self.actor_optimizer = SeedSteps(list(self.nets.actor.parameters()), make)
        steppings = [self.critic_optimizer, self.actor_optimizer]
        share_optimizers(seeds, steppings, self.ties, ("critic_optimizer", "actor_optimizer"))
        self.load_seeds()

    @torch.inference_mode()
    def explore(self, obs: np.ndarray, progress: float) -> tuple[np.ndarray, np.ndarray]:
        """TD3.explore per seed: uniform until updates start, then mu(s) with Gaussian noise from each seed's
        generator (none when exploration_noise is 0, as TD3.unit_actions)."""
        n, sigma = obs.shape[1], float(self.cfg.exploration_noise)

        def policy() -> Tensor:
            mu = deterministic(self.nets.actor, torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device))
            if sigma == 0:
                return mu
            noise = torch.stack(
                [torch.randn(mu.shape[1:], generator=g, device=g.device) for g in self.noise_generators]
            )
            return (mu + sigma * noise.to(self.device)).clamp(-1.0, 1.0)

        return explore([a.bounds for a in self.td3s], self.generators, n, None if self.updates == 0 else policy)

    def learn(self, batch: dict[str, Tensor], weights: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """TD3.learn per seed: the critics' step towards the smaller target Q at smoothed target actions, then every
        policy_delay updates the actor's step and both targets'."""
        c, nets = self.cfg, self.nets
        obs, next_obs = batch["obs"], batch["next_obs"]
        B, dim = obs.shape[1], self.td3s[0].bounds.dim
        drawn = [torch.randn(B, dim, generator=g, device=g.device) for g in self.noise_generators]
        noise = torch.stack(drawn).to(self.device)  # [S, B, A], each seed's as TD3.learn's
        with torch.no_grad():
            smoothing = c.target_policy_noise * noise
            next_actions = smoothed_target_actions(
                deterministic(nets.actor_target, next_obs), smoothing, c.target_noise_clip
            )
            next_q = twin_q(nets.critic_target, next_obs, next_actions).min(1).values
            targets = batch["returns"] + batch["discount"] * next_q
        critic_batch = (obs, batch["actions"], targets, weights)
        stats, td_abs = step_critics(
            nets.critic, self.critic_optimizer, critic_batch, 1.0, c.batch_size, self.running, c.name
        )
        if self.updates % c.policy_delay == 0:  # TD3ActorLearner's loss: -Q_1(s, mu(s)) per seed
            actor_loss = -twin_q(nets.critic, obs, deterministic(nets.actor, obs), detached=True, first=True)
            actor_loss = actor_loss.flatten(1).sum(1) / c.batch_size
            active = self.running.require_finite(actor_loss, "the TD3 actor loss")
            self.actor_optimizer.zero_grad()
            torch.autograd.backward(actor_loss.sum())
            self.actor_optimizer.step(active)
            polyak_per_seed(nets.critic_target, nets.critic, c.tau, active)
            polyak_per_seed(nets.actor_target, nets.actor, c.tau, active)
            stats["actor_loss"] = actor_loss.detach()
        return stats, td_abs
