"""SAC for S seeds side by side in one process (issue 35): the seeds' actors, twin critics and critic targets
stacked into one network each (rlrun/algos/stacked.py's StackedMLP), one batched forward and backward per step of
the update for all S. Read it next to rlrun/algos/sac.py, the single-seed reference: each step below is that file's,
done per seed. Each seed keeps its own replay and generator (batched_replay.py), its own Adams (critics, actor, and
the temperature's, so each seed tunes its own alpha towards its own entropy target) and its own alpha in the
targets and the actor's loss; losses are summed over seeds only to run one backward, whose gradient for each seed is
its own."""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.batched_continuous import explore, flat, step_critics, twin_q
from rlrun.algos.batched_replay import BatchedReplay
from rlrun.algos.sac import SAC, SACNetworks, soft_q_targets
from rlrun.algos.stacked import SeedSteps, StackedMLP, Tie, polyak_per_seed, share_optimizers
from rlrun.models.continuous import LOG_STD_MAX, LOG_STD_MIN, squashed_gaussian


def unbatchable(algo: object) -> str | None:
    """Why the built algorithm `algo` cannot train in a batch of seeds (BatchedSAC), or None when it can."""
    return None if isinstance(algo, SAC) and type(algo.model) is SACNetworks else type(algo).__name__


class BatchedSACNetworks(nn.Module):
    """The seeds' SACNetworks as one: actor, critic and critic_target StackedMLPs and log_alpha [S]; `ties` say
    where each seed's own parameters lie."""

    def __init__(self, nets: list[SACNetworks]) -> None:
        super().__init__()
        self.actor = StackedMLP([[n.actor.net] for n in nets])
        self.critic = StackedMLP([[*n.critic.critics] for n in nets])
        self.critic_target = StackedMLP([[*n.critic_target.critics] for n in nets]).requires_grad_(False)
        alphas = [n.log_alpha for n in nets]
        self.log_alpha = nn.Parameter(torch.stack([a.detach() for a in alphas]), requires_grad=alphas[0].requires_grad)
        own = [Tie(self.log_alpha, s, a) for s, a in enumerate(alphas)]
        self.ties = self.actor.ties + self.critic.ties + self.critic_target.ties + own

    def sample(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """GaussianActor.forward per seed: (actions [S, B, A] in [-1, 1], log-probs [S, B]) for obs [S, B, ...] and
        standard-normal noise [S, B, A]."""
        mean, log_std = self.actor(flat(obs)).squeeze(1).chunk(2, -1)
        return squashed_gaussian(mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX), noise)


class BatchedSAC(BatchedReplay):
    """S seeds' SAC (each a single-run SAC object, built as its single run builds it) trained together."""

    def __init__(
        self,
        seeds: list[SAC],
        generators: list[torch.Generator],
        device_generators: list[torch.Generator] | None = None,
    ) -> None:
        super().__init__(list(seeds), generators, device_generators)
        self.sacs = seeds
        self.nets = BatchedSACNetworks([cast(SACNetworks, a.model) for a in seeds])  # unbatchable checked them
        self.ties = self.nets.ties
        # Each seed's own optimizers (SAC's declared part, as its single run makes them) over its slices of the stack.
        make = seeds[0].parts.make_optimizer
        self.critic_optimizer = SeedSteps(list(self.nets.critic.parameters()), make)
        self.actor_optimizer = SeedSteps(list(self.nets.actor.parameters()), make)
        self.alpha_optimizer = SeedSteps([self.nets.log_alpha], make) if self.cfg.autotune else None
        steppings = [self.critic_optimizer, self.actor_optimizer]
        steppings += [self.alpha_optimizer] if self.alpha_optimizer is not None else []
        share_optimizers(seeds, steppings, self.ties, ("critic_optimizer", "actor_optimizer", "alpha_optimizer"))
        self.target_entropy = seeds[0].target_entropy
        self.load_seeds()

    @torch.inference_mode()
    def explore(self, obs: np.ndarray, progress: float) -> tuple[np.ndarray, np.ndarray]:
        """SAC.explore per seed: uniform until updates start, then the policy's samples; each seed's noise [N, A]
        from its generator."""
        n, dim = obs.shape[1], self.sacs[0].bounds.dim

        def policy() -> Tensor:
            noise = torch.stack([torch.randn(n, dim, generator=g, device=g.device) for g in self.noise_generators])
            x = torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)
            return self.nets.sample(x, noise.to(self.device))[0]

        return explore([a.bounds for a in self.sacs], self.generators, n, None if self.updates == 0 else policy)

    def learn(self, batch: dict[str, Tensor], weights: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """SAC.learn per seed: the critics' step towards soft Q targets with the seed's own alpha, then (every
        policy_frequency updates, that many times) the actor's and the temperature's, then the targets'."""
        c, nets, S = self.cfg, self.nets, self.S
        obs, B = batch["obs"], batch["obs"].shape[1]
        dim = self.sacs[0].bounds.dim
        drawn = [
            torch.randn(1 + c.policy_frequency, B, dim, generator=g, device=g.device) for g in self.noise_generators
        ]
        noise = torch.stack(drawn).to(self.device)  # [S, 1 + policy_frequency, B, A], each seed's as SAC.learn's
        with torch.no_grad():
            next_actions, next_log_prob = nets.sample(batch["next_obs"], noise[:, 0])
            next_q = twin_q(nets.critic_target, batch["next_obs"], next_actions).min(1).values
            alpha = nets.log_alpha.exp()[:, None]
            targets = soft_q_targets(batch["returns"], batch["discount"], next_q, next_log_prob, alpha)
        critic_batch = (obs, batch["actions"], targets, weights)
        stats, td_abs = step_critics(
            nets.critic, self.critic_optimizer, critic_batch, 0.5, c.batch_size, self.running, c.name
        )
        if self.updates % c.policy_frequency == 0:
            for k in range(c.policy_frequency):
                stats |= self._actor_step(obs, noise[:, 1 + k], S)
        if self.updates % c.target_update_interval == 0:
            polyak_per_seed(nets.critic_target, nets.critic, c.tau, self.running.mask)
        return stats, td_abs

    def _actor_step(self, obs: Tensor, noise: Tensor, S: int) -> dict[str, Tensor]:
        """SACActorLearner's losses and SAC._actor_step's steps, per seed (each mean over the seed's batch_size)."""
        nets, B = self.nets, self.cfg.batch_size
        actions, log_prob = nets.sample(obs, noise)
        q = twin_q(nets.critic, obs, actions, detached=True).min(1).values
        log_alpha = nets.log_alpha[:, None]
        actor_loss = (log_alpha.detach().exp() * log_prob - q).sum(-1) / B
        alpha_loss = -(log_alpha * (log_prob.detach() + self.target_entropy)).sum(-1) / B  # temperature_loss
        entropy = -log_prob.detach().sum(-1) / B
        loss = actor_loss + alpha_loss
        active = self.running.require_finite(loss, "the SAC actor loss")
        steps = [self.actor_optimizer] + ([self.alpha_optimizer] if self.alpha_optimizer is not None else [])
        for optimizer in steps:
            optimizer.zero_grad()
        torch.autograd.backward(loss.sum())
        for optimizer in steps:
            optimizer.step(active)
        stats = {"actor_loss": actor_loss.detach(), "entropy": entropy, "charts/alpha": nets.log_alpha.detach().exp()}
        return stats | ({"alpha_loss": alpha_loss.detach()} if self.alpha_optimizer is not None else {})
