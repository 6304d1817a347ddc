"""Return and advantage estimators as pure functions on [T, N] tensors (time, env)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rlrun.algos.normalize import MeanAll, global_moments, identity


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    done: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016), eq. 16. Returns (advantages, returns).

    All inputs are [T, N]. `next_values[t]` is V of the observation that followed step t: for a truncated
    episode that is V(final observation), so truncation bootstraps while termination does not.
    `done` = terminated | truncated ends the recursion; the rollout edge needs no flag because
    next_values[T-1] is V of the observation after the rollout.
    """
    not_terminated = 1.0 - terminated.float()
    deltas = rewards + gamma * next_values * not_terminated - values
    # The recursion runs in numpy on the CPU: T small steps cost a tenth of what they do as torch ops.
    deltas_np = deltas.cpu().numpy()
    decay = gamma * lam * (1.0 - done.float()).cpu().numpy()
    advantages = np.empty_like(deltas_np)
    last = np.zeros_like(deltas_np[0])
    for t in range(len(deltas_np) - 1, -1, -1):
        last = deltas_np[t] + decay[t] * last
        advantages[t] = last
    adv = torch.from_numpy(advantages).to(values.device)
    return adv, adv + values


def explained_variance(predicted: Tensor, target: Tensor, mean_all: MeanAll = identity) -> float:
    """1 - Var[target - predicted] / Var[target] over all ranks (`mean_all` averages a scalar across them; ranks
    hold equal batches); nan when the target is constant."""
    var = global_moments(target, mean_all)[1]
    return float("nan") if var == 0 else float(1 - global_moments(target - predicted, mean_all)[1] / var)
