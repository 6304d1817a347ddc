"""ALE games that take the seed of their first reset while they are made. ale-py loads the ROM when an env is made
and again at every seeded reset (the ALE reads its seed when it loads); a training env is made and then reset
with its seed at once, so half of its start-up, and most of Breakout's, went into a load thrown away."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
from ale_py.env import AtariEnv


class SeededAtLoad(AtariEnv):
    """AtariEnv loaded with `seed`; its first reset, when it asks for that seed, starts the game without loading it
    again. Made and reset so, it gives the same observations, rewards and sticky-action draws as an AtariEnv reset
    with that seed: both seed the ALE and the env's numpy RNG from the seed, then load, then start the game."""

    def __init__(self, *args: Any, seed: int, **kwargs: Any):
        self._load_seed: int | None = seed  # AtariEnv.__init__ seeds (seed_game) right before it loads
        super().__init__(*args, **kwargs)

    def seed_game(self, seed: int | None = None) -> tuple[int, int]:
        return super().seed_game(self._load_seed if seed is None else seed)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        loaded_with, self._load_seed = self._load_seed, None
        return super().reset(seed=None if seed == loaded_with else seed, options=options)


def seeded_spec(env_id: str, seed: int) -> gym.envs.registration.EnvSpec | str:
    """The registered spec of `env_id` made as SeededAtLoad with `seed`; the id itself for anything but ale-py's
    own AtariEnv (a user's registration of an ALE id)."""
    spec = gym.spec(env_id)
    if spec.entry_point not in ("ale_py.env:AtariEnv", AtariEnv):
        return env_id
    return dataclasses.replace(spec, entry_point=SeededAtLoad, kwargs={**spec.kwargs, "seed": seed})
