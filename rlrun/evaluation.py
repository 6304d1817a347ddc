"""Run a fixed number of whole episodes on a vector env and return them in a fixed order (evaluation, play)."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from rlrun.envs import finished_episodes


def run_episodes(
    envs: gym.vector.VectorEnv,
    act: Callable[[np.ndarray, np.ndarray], np.ndarray],
    episodes: int,
    seeds: list[int],
) -> tuple[np.ndarray, np.ndarray]:
    """(returns, lengths) of `episodes` episodes. Env i plays episodes i, i+N, ... so the set of episodes
    does not depend on which ones finish first (no bias towards short episodes).

    `act(obs [N, ...], starts [N] bool) -> actions [N]`; starts marks the envs whose episode begins with this
    observation (all of them at first), for a policy with memory to reset; a stateless one ignores it.
    """
    n = envs.num_envs
    wanted = np.array([len(range(i, episodes, n)) for i in range(n)])
    results: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    obs, _ = envs.reset(seed=seeds)
    starts = np.ones(n, dtype=bool)
    while any(len(r) < w for r, w in zip(results, wanted)):
        obs, _, terminated, truncated, info = envs.step(act(obs, starts))
        starts = terminated | truncated  # SAME_STEP autoreset: obs already starts the next episode
        ended, returns, lengths = finished_episodes(info, n)
        for i in np.flatnonzero(ended):
            if len(results[i]) < wanted[i]:
                results[i].append((float(returns[i]), int(lengths[i])))
    ordered = [results[i % n][i // n] for i in range(episodes)]
    return np.array([r for r, _ in ordered]), np.array([length for _, length in ordered])
