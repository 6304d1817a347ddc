"""The seeds of torch's random streams, each derived from numpy's SeedSequence over (seed, rank, purpose), as the
envs' seeds are (rlrun.envs.env_seeds): seed 1's rank 1 and seed 2's rank 0 draw unrelated streams (with
`seed + rank` they drew the same one), and evaluation's stream is its own."""

from __future__ import annotations

import numpy as np

# Purposes. A rank's training stream (sampling noise, exploration, minibatch permutations) is TRAIN; a resume that
# cannot restore a rank's generator (another world size, a recovery checkpoint) draws RESUMED at its iteration;
# `rlrun play` (stochastic actions with deterministic=false) draws PLAY.
TRAIN, RESUMED, EVALUATION, PLAY = 0, 1, 2, 3
_TORCH = 1  # SeedSequence's spawn key: torch's seeds never coincide with the envs' (which have none)


def torch_seed(seed: int, rank: int, purpose: int, *more: int) -> int:
    """A 64-bit seed for torch.manual_seed, distinct per (seed, rank, purpose, *more)."""
    sequence = np.random.SeedSequence([seed, rank, purpose, *more], spawn_key=(_TORCH,))
    return int(sequence.generate_state(1, np.uint64)[0])
