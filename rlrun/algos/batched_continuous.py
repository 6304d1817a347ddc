"""What the batched SAC and TD3 share (rlrun/algos/continuous.py's parts, for S seeds at once): acting in [-1, 1]^A
and scaling to each seed's env bounds, uniform until updates start; the seeds' twin critics as one stacked network
and their optimizer step (CriticLearner's loss and step_critics', per seed)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from rlrun.algos.continuous import ActionBounds
from rlrun.algos.stacked import Running, SeedSteps, StackedMLP


def flat(obs: Tensor) -> Tensor:
    """Observations [S, B, ...] of any shape and dtype as the MLPs take them, [S, 1, B, D] float32 (one MLP each)."""
    return obs.flatten(2).float()[:, None]


def twin_q(critic: StackedMLP, obs: Tensor, actions: Tensor, detached: bool = False, first: bool = False) -> Tensor:
    """TwinQ for each seed: Q-values [S, 2, B] of (obs [S, B, ...], actions [S, B, A]), [S, 1, B] with `first` (the
    first critic only); `detached` cuts the critics' weights from autograd (the actors' losses)."""
    x = torch.cat([obs.flatten(2).float(), actions], -1)[:, None]
    members = 1 if first else 2
    q: Tensor = critic(x.expand(-1, members, -1, -1), members=members, detached=detached)
    return q.squeeze(-1)


def explore(
    bounds: list[ActionBounds], generators: list[torch.Generator], n: int, policy: Callable[[], Tensor] | None
) -> tuple[np.ndarray, np.ndarray]:
    """(the actions each seed's n envs take, the unit actions its replay stores), [S, n, A] each: the policy's
    (`policy()`, exploring, [S, n, A]), or while it is None uniform ones from each seed's generator, as
    ActionBounds.explore draws them."""
    if policy is None:
        dim = bounds[0].dim
        unit = torch.stack([torch.rand(n, dim, generator=g, device=g.device) * 2.0 - 1.0 for g in generators])
    else:
        unit = policy()
    units = unit.cpu().numpy()
    return np.stack([b.to_env(u) for b, u in zip(bounds, units)]), units


def step_critics(
    critic: StackedMLP,
    optimizer: SeedSteps,
    batch: tuple[Tensor, Tensor, Tensor, Tensor],
    scale: float,
    batch_size: int,
    running: Running,
    name: str,
) -> tuple[dict[str, Tensor], Tensor]:
    """One optimizer step of every running seed's critics on its (obs, actions, targets, weights) [S, B, ...]:
    CriticLearner's loss, scale x sum_k sum_i w_i (Q_k(s_i, a_i) - y_i)^2 / batch_size, per seed (a seed whose loss
    is not finite stops there). Returns (qf_loss and mean Q [S], |TD errors| [S, B], the mean of the two
    critics'), as step_critics."""
    obs, actions, targets, weights = batch
    q = twin_q(critic, obs, actions)
    td = q - targets[:, None]
    loss = scale * (weights * td.square().sum(1)).sum(-1) / batch_size
    active = running.require_finite(loss, f"the {name.upper()} critic loss")
    optimizer.zero_grad()
    torch.autograd.backward(loss.sum())  # d(sum)/d(seed's loss) = 1: each seed's gradient is its own
    optimizer.step(active)
    q_values = q.detach().flatten(1).sum(1) / (2 * batch_size)
    return {"qf_loss": loss.detach(), "q_values": q_values}, td.detach().abs().mean(1)
