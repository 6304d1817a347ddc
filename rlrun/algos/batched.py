"""The batched learners by algorithm name (many seeds of one config in one process, issue 35): what the batch's
driver (rlrun/seeds.py) builds for the seeds it trains, and what it asks of one. A batched learner is built from
the seeds' single-run algorithms, each built as its single run builds it, and their training generators; it collects
and updates for all of them at once and leaves each seed's state in the seed's own algorithm object, which the
seed's loop evaluates, checkpoints and plays as a single run's. A new one is a module beside this one and an entry
below (config/batched.py names what a batch trains, before anything is built)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlrun.envs.protocol import VectorEnv
from rlrun.errors import NonFiniteError


class BatchedAlgorithm(Protocol):
    """S seeds' algorithm trained side by side; what the driver asks of it. Lists are per seed, in the seeds' order."""

    def load_seeds(self) -> None: ...  # take the seeds' own state (after a resume loaded their checkpoints)
    # One collect of every seed, seed s on envs[s]: each one's result, as its single run's collect returns it.
    def collect(self, envs: list[VectorEnv], progress: float) -> list[dict[str, Any]]: ...
    # An update of the seeds still training: each one's stats (as its single run's), or the NonFiniteError that
    # stopped it, before its optimizer stepped (a seed stopped before gets stats that mean nothing).
    def update(self, progress: float) -> list[dict[str, float] | NonFiniteError]: ...
    # Seed s never moves again: weights, optimizer state and targets stay (any time, from inside collect too).
    def stop_seed(self, seed: int) -> None: ...


@dataclass(frozen=True)
class Entry:
    """A batched learner: "module:Class", built as Class(seeds, generators, **options), and "module:function", which
    says why a seed's built algorithm cannot train in it (None when it can); `takes`: the options of batch_of that
    Class takes (the others are not given to it)."""

    build: str
    refusal: str
    takes: tuple[str, ...] = ()


def _load(path: str) -> Any:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


BATCHED: dict[str, Entry] = {
    "ppo": Entry(
        "rlrun.algos.batched_ppo:BatchedPPO", "rlrun.algos.batched_ppo:unbatchable", ("device_generators", "fast")
    ),
    "a2c": Entry("rlrun.algos.batched_a2c:BatchedA2C", "rlrun.algos.batched_a2c:unbatchable", ("device_generators",)),
    # DQN draws everything on the CPU, on a GPU too (its epsilon-greedy coins and random actions)
    "dqn": Entry("rlrun.algos.batched_dqn:BatchedDQN", "rlrun.algos.batched_dqn:unbatchable"),
    "sac": Entry("rlrun.algos.batched_sac:BatchedSAC", "rlrun.algos.batched_sac:unbatchable", ("device_generators",)),
    "td3": Entry("rlrun.algos.batched_td3:BatchedTD3", "rlrun.algos.batched_td3:unbatchable", ("device_generators",)),
}


def unbatchable(name: str, algo: object) -> str | None:
    """Why `algo`, built for algo=`name`, cannot train in a batch of seeds, or None when it can."""
    if name not in BATCHED:
        return f"algo={name}"
    refusal: Callable[[object], str | None] = _load(BATCHED[name].refusal)
    return refusal(algo)


def batch_of(
    name: str,
    seeds: list[Any],
    generators: list[torch.Generator],
    device_generators: list[torch.Generator] | None = None,
    fast: bool = False,
) -> BatchedAlgorithm:
    """The batched learner of algo=`name` for the seeds' algorithms (each checked by unbatchable first) and their
    training generators. Options, for the learners that take them (Entry.takes): `device_generators`, on a GPU each
    seed's stream of the device's generator (where its single run draws PPO's and A2C's sampling noise and SAC's
    and TD3's Gaussian noise; DQN draws on the CPU); `fast`, the run's algo.fast (whether
    rlrun/fast/ may accelerate the learner's parts)."""
    entry = BATCHED[name]
    build: Callable[..., BatchedAlgorithm] = _load(entry.build)
    options = {"device_generators": device_generators, "fast": fast}
    return build(seeds, generators, **{k: v for k, v in options.items() if k in entry.takes})
