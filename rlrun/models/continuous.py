"""The networks of off-policy continuous control (SAC, TD3): actors that output actions in [-1, 1]^A (the algorithms
scale them to the env's bounds) and twin Q critics. MLPs with torch's default Linear initialization, as SB3's and
CleanRL's."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from rlrun.models.encoders import ACTIVATIONS

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SB3's bounds on the actor's log-std


def squashed_gaussian(mean: Tensor, log_std: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """tanh(u) with u = mean + std * noise ~ N(mean, std), and its log-density: log N(u) - sum log(1 - tanh(u)^2)
    (Haarnoja et al. 2018, appendix C, eq. 21), the last written 2 (log 2 - u - softplus(-2u)), which stays finite
    where tanh(u) rounds to +-1. [B, A] -> ([B, A], [B])."""
    u = mean + log_std.exp() * noise
    gaussian = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)  # (u - mean) / std = noise
    squash = (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
    return torch.tanh(u), gaussian - squash


def mlp(in_dim: int, hidden_sizes: list[int], activation: str, out_dim: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(in_dim, size), ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers, nn.Linear(in_dim, out_dim))


class GaussianActor(nn.Module):
    """SAC's policy: obs [B, D] -> (action [B, A] in [-1, 1], log-prob [B]) given standard-normal noise [B, A];
    `mode` gives the deterministic action tanh(mean)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: list[int], activation: str):
        super().__init__()
        self.net = mlp(obs_dim, hidden_sizes, activation, 2 * action_dim)  # mean and log-std, one output layer

    def _moments(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        mean, log_std = self.net(obs.flatten(1).float()).chunk(2, -1)  # observations of any shape and dtype
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def forward(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        return squashed_gaussian(*self._moments(obs), noise)

    def mode(self, obs: Tensor) -> Tensor:
        return torch.tanh(self._moments(obs)[0])


class DeterministicActor(nn.Module):
    """TD3's policy: obs [B, D] -> action [B, A] in [-1, 1]."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: list[int], activation: str):
        super().__init__()
        self.net = mlp(obs_dim, hidden_sizes, activation, action_dim)

    def forward(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.net(obs.flatten(1).float()))


class TwinQ(nn.Module):
    """Two Q networks on (obs, action) (clipped double Q, Fujimoto et al. 2018): MLPs on their concatenation, as
    SB3's. ([B, D], [B, A]) -> Q-values [2, B]. `detached=True` computes the same values with the weights cut from
    autograd (the actor's loss differentiates Q with respect to actions only); `first=True` the first critic's only
    ([1, B]: TD3's actor loss reads no other)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: list[int], activation: str):
        super().__init__()
        self.critics = nn.ModuleList(mlp(obs_dim + action_dim, hidden_sizes, activation, 1) for _ in range(2))

    def forward(self, obs: Tensor, actions: Tensor, detached: bool = False, first: bool = False) -> Tensor:
        x = torch.cat([obs.flatten(1).float(), actions], -1)
        q = []
        for critic in self.critics[: 1 if first else 2]:
            h = x
            for layer in critic:
                detach = detached and isinstance(layer, nn.Linear)
                h = F.linear(h, layer.weight.detach(), layer.bias.detach()) if detach else layer(h)
            q.append(h)
        return torch.cat(q, -1).t()
