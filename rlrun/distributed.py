"""Rank information for the process this runs in. The only module that reads RANK/WORLD_SIZE; with world
size 1 every reduction is the identity and nothing is wrapped."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlrun.algos.normalize import MeanAll, identity


@dataclass(frozen=True)
class RankContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    is_main: bool
    mean_all: MeanAll = identity


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    return torch.device(name)


def single_process(device: str) -> RankContext:
    """The context of a run on one process."""
    return RankContext(rank=0, local_rank=0, world_size=1, device=resolve_device(device), is_main=True)
