"""A rollout's acting noise (rlrun/algos/batched_ppo.py's draw_noise: each seed's T draws of [N, A] from its own
generator, step by step) drawn as one [T, N, A] per seed: torch's CPU exponential kernel draws element by element, so
one draw of T x N x A numbers is the T draws in order and leaves the generator where they leave it, for S calls per
rollout instead of S per step. That is how torch draws today, not a promise: the self-check (fast/selfcheck.py)
compares both on copies of the generators at the first rollout in every process, and steps aside if they differ."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def draw_noise_at_once(
    generators: Sequence[torch.Generator], kind: str, shape: tuple[int, int, int], device: torch.device
) -> Tensor:
    """draw_noise (DrawNoise) for categorical policies on CPU generators: [T, S, N, A]."""
    if kind != "categorical":
        raise ValueError("the noise is drawn at once for categorical policies only")
    return torch.stack([torch.empty(shape).exponential_(generator=g) for g in generators], dim=1).to(device)
