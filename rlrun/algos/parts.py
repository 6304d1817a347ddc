"""The parts an acceleration (rlrun/fast/) may swap in an algorithm, declared by the algorithm as named, typed fields
of one small dataclass: the algorithm builds them from its reference code and reads them where it uses them, and
fast/ replaces a field with a part of the same signature. Nothing else of an algorithm is patched from outside."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

# (the parameters it trains) -> the optimizer (zero_grad, step, param_groups' "lr", state_dict as torch.optim's)
MakeOptimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
# (parameters, max_norm) -> the gradient norm before clipping, as nn.utils.clip_grad_norm_
ClipGradNorm = Callable[[list[nn.Parameter], float], Tensor]


class Acting(Protocol):
    """What acts for a feedforward policy while collecting (the actor-critic itself, in the reference)."""

    def act(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...  # (action, log-prob, value) for obs [B, ...]
    def value(self, obs: Tensor) -> Tensor: ...  # V [B]


def adam(lr: float, eps: float) -> MakeOptimizer:
    """torch.optim.Adam at this rate and epsilon, built when the algorithm first asks (torch.optim's first optimizer
    imports torch._dynamo, about a second: never, when an acceleration swaps in another first)."""
    return lambda params: torch.optim.Adam(params, lr=lr, eps=eps)


@dataclass
class OptimizerParts:
    """An algorithm's gradient steps: how its optimizers are made, and how it clips gradients."""

    make_optimizer: MakeOptimizer
    clip_grad_norm_: ClipGradNorm = nn.utils.clip_grad_norm_
