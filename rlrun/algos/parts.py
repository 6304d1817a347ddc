"""The parts an acceleration (rlrun/fast/) may swap in an algorithm, declared by the algorithm as named, typed fields
of one small dataclass: the algorithm builds them from its reference code and reads them where it uses them, and
fast/ replaces a field with a part of the same signature. Nothing else of an algorithm is patched from outside."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn


class Optimizer(Protocol):
    """What the algorithms use of an optimizer: a torch.optim one, or a drop-in (rlrun/fast/flat_adam.py)."""

    param_groups: list[dict[str, Any]]  # the algorithms set each group's "lr" (annealing, a resume's rate)

    def zero_grad(self) -> None: ...
    def step(self) -> object: ...
    def state_dict(self) -> dict[str, Any]: ...  # in torch.optim's format, so either optimizer resumes the other's
    def load_state_dict(self, state_dict: dict[str, Any], /) -> None: ...


# (the parameters it trains) -> the optimizer over them
MakeOptimizer = Callable[[list[nn.Parameter]], Optimizer]
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
