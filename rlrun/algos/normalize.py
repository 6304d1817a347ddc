"""Running statistics for observation and reward normalization, and advantage normalization.

Every statistic that all ranks must share takes `mean_all`, which averages a tensor across ranks
(the identity on one process); ranks hold equal batch sizes, so a mean of means is the global mean (when a
straggler's rollout is cut short they do not, and weighted_mean_all weighs each rank's mean by its size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor

MeanAll = Callable[[Tensor], Tensor]


def float_entries(obs_space: gym.Space[Any]) -> Tensor | None:
    """bool [size] marking the entries of encoded observations (rlrun.envs.spaces.EncodedBox) that come from float
    Box keys, the ones observation normalization rescales: one-hots, bits, integer vectors, images and action
    masks keep their values. None for observations as the env gives them (every entry is rescaled)."""
    floats = getattr(obs_space, "floats", None)
    if floats is None or obs_space.shape is None:  # (an EncodedBox, which has floats, has a shape)
        return None
    scaled = torch.zeros(obs_space.shape, dtype=torch.bool)
    for start, end in floats:
        scaled[start:end] = True
    return scaled


def identity(x: Tensor) -> Tensor:
    return x


def weighted_mean_all(mean_all: MeanAll, weight: float) -> MeanAll:
    """mean_all for ranks holding unequal batches: a rank's mean counts by `weight`, its batch size over the mean
    batch size of all ranks, so that a mean of means becomes the mean over every element of every rank."""
    return lambda x: mean_all(x * weight)


def global_moments(x: Tensor, mean_all: MeanAll = identity) -> tuple[Tensor, Tensor]:
    """(mean, variance) of all elements of `x` over all ranks; `mean_all` averages a scalar across ranks."""
    mu = mean_all(x.mean())
    return mu, mean_all((x - mu).square().mean())


def normalize_advantages(adv: Tensor, mean_all: MeanAll = identity) -> Tensor:
    """Zero-mean, unit-variance advantages; `mean_all` averages a scalar across ranks."""
    mu, var = global_moments(adv, mean_all)
    return (adv - mu) / (var.sqrt() + 1e-8)


class RunningMoments:
    """Mean and variance of a stream of batches [B, *shape], merged with Chan et al.'s parallel formula. The
    statistics live on `device`, where the batches are; state_dict holds CPU copies."""

    def __init__(
        self,
        shape: tuple[int, ...] = (),
        mean_all: MeanAll = identity,
        device: torch.device | str = "cpu",
        scaled: Tensor | None = None,
    ):
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = 1e-4
        self.mean_all = mean_all
        # bool [*shape]: the entries normalize rescales (None: all); the others pass as they are
        self.scaled = None if scaled is None else scaled.to(device)

    def update(self, batch: Tensor) -> None:
        x = batch.double()
        b_mean = self.mean_all(x.mean(0))
        b_var = self.mean_all((x - b_mean).square().mean(0))
        b_count = x.shape[0]
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta.square() * self.count * b_count / total
        self.var = m2 / total
        self.count = total

    def normalize(self, x: Tensor, clip: float) -> Tensor:
        out = ((x.double() - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-clip, clip).float()
        return out if self.scaled is None else torch.where(self.scaled, out, x.float())

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.cpu().clone(), "var": self.var.cpu().clone(), "count": float(self.count)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.mean.device
        self.mean, self.var = state["mean"].to(device, copy=True), state["var"].to(device, copy=True)
        self.count = float(state["count"])
