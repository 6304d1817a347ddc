"""DQN for S seeds side by side in one process (issue 35): the seeds' Q-networks (rlrun's MLP QNetwork, plain or
dueling) and their targets stacked into one network each (rlrun/algos/stacked.py's StackedMLP), one batched forward
per vector step and one forward and backward per update for all S. Read it next to rlrun/algos/dqn.py, the
single-seed reference: each step below is that file's, done per seed. Each seed keeps its own replay (and PER) and
generator (batched_replay.py: its epsilon-greedy draws are its own), its own epsilon schedule, gradient-norm clip
(a norm per seed, never one over the stack) and Adam, and its own target syncs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.batched_replay import BatchedReplay
from rlrun.algos.dqn import DQN, Noise, linear_schedule, q_targets, td_loss
from rlrun.algos.protocol import VectorEnv
from rlrun.algos.stacked import SeedSteps, StackedMLP, clip_grad_norm_per_seed, polyak_per_seed, share_optimizers
from rlrun.models.encoders import FlatFloat
from rlrun.models.q_network import QNetwork


def unbatchable(algo: object) -> str | None:
    """Why the built algorithm `algo` cannot train in a batch of seeds (BatchedDQN), or None when it can."""
    if not isinstance(algo, DQN):
        return type(algo).__name__
    model = algo.model
    if type(model) is not QNetwork or not isinstance(model.encoder, nn.Sequential):
        return f"a {type(model).__name__} network that is not model=mlp"
    if not isinstance(model.encoder[0], FlatFloat):
        return "a network that is not an MLP (image observations take a CNN)"
    return None


class StackedQNetwork(nn.Module):
    """The seeds' QNetworks (MLP encoder, Q head, dueling value head) as one: obs [S, B, ...] -> Q-values [S, B, A],
    QNetwork.forward per seed; `ties` say where each seed's own parameters lie."""

    def __init__(self, nets: list[QNetwork]) -> None:
        super().__init__()
        self.encoder = StackedMLP([[n.encoder] for n in nets], activate_last=True)
        self.head = StackedMLP([[n.head] for n in nets])
        values = [n.value for n in nets if n.value is not None]
        self.value = StackedMLP([[v] for v in values]) if values else None
        self.mask_size = nets[0].mask_size
        self.ties = self.encoder.ties + self.head.ties + (self.value.ties if self.value is not None else [])

    def forward(self, obs: Tensor) -> Tensor:
        x = self.encoder(obs.flatten(2).float()[:, None])  # [S, 1, B, features]
        q: Tensor = self.head(x)
        if self.value is not None:
            q = self.value(x) + q - q.mean(-1, keepdim=True)
        q = q.squeeze(1)
        if self.mask_size:  # illegal actions' Q at -1e9, as QNetwork's
            q = q.masked_fill(obs[..., -self.mask_size :] < 0.5, -1e9)
        return q


class BatchedDQN(BatchedReplay):
    """S seeds' DQN (each a single-run DQN object, built as its single run builds it) trained together."""

    def __init__(self, seeds: list[DQN], generators: list[torch.Generator]) -> None:
        super().__init__(list(seeds), generators)
        self.dqns = seeds
        self.model = StackedQNetwork([cast(QNetwork, a.model) for a in seeds])  # unbatchable checked them
        self.target = StackedQNetwork([cast(QNetwork, a.target) for a in seeds]).requires_grad_(False)
        self.ties = self.model.ties + self.target.ties
        # Each seed's own optimizer (DQN's declared part, as its single run makes it) over its slices of the stack.
        make = seeds[0].parts.make_optimizer
        self.optimizer = SeedSteps(list(self.model.parameters()), make)
        share_optimizers(seeds, [self.optimizer], self.ties, ("optimizer",))
        self.noises: list[Iterator[Noise]] = [iter(()) for _ in seeds]  # each seed's this collect (DQN.noise)
        self.load_seeds()

    def collect(self, envs: list[VectorEnv], progress: float) -> list[dict[str, Any]]:
        """BatchedReplay.collect, each seed's exploration noise drawn at its start from the seed's generator, as its
        single run draws it (DQN.collect)."""
        n = self.cfg.train_freq
        self.noises = [a.draw_noise(n, self.N, g) for a, g in zip(self.dqns, self.generators, strict=True)]
        return super().collect(envs, progress)

    @torch.inference_mode()
    def explore(self, obs: np.ndarray, progress: float) -> tuple[np.ndarray, np.ndarray]:
        """DQN.explore per seed: epsilon on its linear schedule, then greedy or random actions on the seed's noise."""
        c = self.cfg
        epsilon = linear_schedule(c.start_e, c.end_e, c.exploration_fraction, progress)
        x = torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)
        greedy = self.model(x).argmax(-1).cpu().numpy()  # [S, N]
        actions = []
        for s, (a, g) in enumerate(zip(self.dqns, self.generators, strict=True)):
            a.epsilon = epsilon  # what it logs
            coins, picks = a.step_noise(self.noises[s], self.N, g)
            actions.append(np.where(coins < epsilon, a.random_actions(obs[s], picks), greedy[s]))
        chosen = np.stack(actions)
        return chosen, chosen

    def learn(self, batch: dict[str, Tensor], weights: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """DQN.learn per seed: double-DQN targets, the weighted TD loss over the seed's batch_size, its gradient
        clipped by the seed's own norm, its Adam step, and its target sync when due."""
        c = self.cfg
        with torch.no_grad():
            next_obs, returns, discount = batch["next_obs"], batch["returns"], batch["discount"]
            targets = q_targets(self.model, self.target, next_obs, returns, discount, c.double_q)
        q = self.model(batch["obs"]).gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)  # DQNLearner, per seed
        loss = (weights * td_loss(q, targets, c.loss)).sum(-1) / c.batch_size
        self.optimizer.zero_grad()
        torch.autograd.backward(loss.sum())  # d(sum)/d(seed's loss) = 1: each seed's gradient is its own
        norms = clip_grad_norm_per_seed(self.optimizer.params, c.max_grad_norm)
        active = self.running.require_finite(norms, "the DQN gradient norm")
        self.optimizer.step(active)
        if self.updates % c.target_update_interval == 0:
            polyak_per_seed(self.target, self.model, c.tau, active)
        q = q.detach()
        return {"td_loss": loss.detach(), "q_values": q.sum(-1) / c.batch_size}, (q - targets).abs()
