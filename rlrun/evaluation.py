"""Whole episodes on a vector env, returned in a fixed order (evaluation, play), and the main rank's evaluator."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from rlrun.algos.protocol import Algorithm
from rlrun.checkpoint import rng_devices
from rlrun.config import TrainConfig
from rlrun.envs import env_seeds, finished_episodes, make_vector_env
from rlrun.seeding import EVALUATION, torch_seed


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


class Evaluator:
    """The main rank's evaluation: eval.episodes whole episodes on envs of its own, acting with the algorithm,
    drawing nothing from the training RNG streams and using no collective."""

    def __init__(self, cfg: TrainConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.envs = make_vector_env(cfg.env, min(cfg.eval.num_envs, cfg.eval.episodes), train=False)

    def __call__(self, algo: Algorithm) -> np.ndarray:
        """The returns of the episodes, in a fixed order."""
        with torch.random.fork_rng(devices=rng_devices(self.device)):
            torch.manual_seed(torch_seed(self.cfg.seed, 0, EVALUATION))  # every evaluation draws the same noise
            seeds = env_seeds(self.cfg.seed, 0, self.envs.num_envs, stream=1)
            act = lambda o, starts: algo.act(o, self.cfg.eval.deterministic, starts)  # noqa: E731
            return run_episodes(self.envs, act, self.cfg.eval.episodes, seeds)[0]

    def check_alive(self) -> None:
        """A dead eval worker is reported at the iteration it died in, not at the next evaluation (maybe hours
        later)."""
        self.envs.check_alive()

    def close(self) -> None:
        self.envs.close()


class NullEvaluator:
    """The other ranks': they evaluate nothing."""

    def __call__(self, algo: Algorithm) -> None:
        return None

    def check_alive(self) -> None: ...
    def close(self) -> None: ...
