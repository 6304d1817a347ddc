"""off_policy.polyak_update (continuous.py's Polyak part) for target networks laid out as flat Adam lays out their
online networks: each target's parameters become views into one flat tensor, so its update toward the online
network, whose parameters are views into flat Adam's buffer in the same order, is one lerp over the whole network
instead of torch's foreach lerp over each parameter tensor. Layout only: the same lerp, at the same weight, on the
same numbers, so the targets are polyak_update's to the bit (tests/unit/test_fast_paths.py steps both)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlrun.algos.off_policy import polyak_update
from rlrun.fast.flat_adam import FlatAdam, flatten


def flattenable(target: nn.Module, online: nn.Module, optimizer: FlatAdam) -> bool:
    """Whether `optimizer` holds every parameter of `online`, in order, and `target` has parameters of the same shapes
    and neither has buffers (polyak_update copies those)."""
    params, owned = list(online.parameters()), optimizer.owned
    held = len(params) == len(owned) and all(p is q for p, q in zip(params, owned))
    shapes = [p.shape for p in target.parameters()] == [p.shape for p in params]
    return held and shapes and not list(target.buffers()) and not list(online.buffers())


class FlatPolyak:
    """Build it once the optimizers exist (their buffers are the online side) and before any checkpoint loads; any
    other pair goes to polyak_update."""

    def __init__(self, pairs: Sequence[tuple[nn.Module, nn.Module, FlatAdam]]):
        self.flats: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        for target, online, optimizer in pairs:
            self.flats[id(target), id(online)] = (flatten(list(target.parameters())), optimizer.params)

    @torch.no_grad()
    def __call__(self, target: nn.Module, online: nn.Module, tau: float) -> None:
        flats = self.flats.get((id(target), id(online)))
        if flats is None:
            return polyak_update(target, online, tau)
        flat, online_flat = flats
        flat.lerp_(online_flat, 1.0 - (1.0 - tau))  # polyak_update's weight, as torch's EMA function computes it
        return None
