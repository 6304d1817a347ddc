"""Whole episodes on a vector env, returned in a fixed order (evaluation, play), and the main rank's evaluator."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import gymnasium as gym
import numpy as np
import torch

from rlrun.algos.protocol import Algorithm
from rlrun.checkpoint import rng_devices
from rlrun.config import EnvConfig, TrainConfig
from rlrun.envs import check_env_id, env_seeds, import_env_modules, make_vector_env
from rlrun.envs.protocol import VectorEnv
from rlrun.errors import NonFiniteError
from rlrun.logger import NullLogger, RunLogger
from rlrun.seeding import EVALUATION, torch_seed


def run_episodes(
    envs: VectorEnv,
    act: Callable[[np.ndarray, np.ndarray], np.ndarray],
    episodes: int,
    seeds: list[int],
    should_stop: Callable[[], bool] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(returns, lengths) of `episodes` episodes. Env i plays episodes i, i+N, ... so the set of episodes
    does not depend on which ones finish first (no bias towards short episodes).

    `act(obs [N, ...], starts [N] bool) -> actions [N]`; starts marks the envs whose episode begins with this
    observation (all of them at first), for a policy with memory to reset; a stateless one ignores it.
    `should_stop()`, asked once per vector step, ends the episodes early when true (a signal): the result then holds
    the episodes before the first one not finished (maybe none), in episode order. `on_step(episodes done, vector
    steps)` is told after every vector step (progress).
    """
    n = envs.num_envs
    wanted = np.array([len(range(i, episodes, n)) for i in range(n)])
    results: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    obs, _ = envs.reset(seed=seeds)
    starts = np.ones(n, dtype=bool)
    done = steps = 0
    while done < episodes and not (should_stop is not None and should_stop()):
        obs, _, terminated, truncated, _, (ended, returns, lengths) = envs.step(act(obs, starts))
        starts = terminated | truncated  # SAME_STEP autoreset: obs already starts the next episode
        for i in np.flatnonzero(ended):
            if len(results[i]) < wanted[i]:
                results[i].append((float(returns[i]), int(lengths[i])))
                done += 1
        steps += 1
        if on_step is not None:
            on_step(done, steps)
    ordered = []
    for k in range(episodes):  # stopped early: the episodes before the first one not finished
        if len(results[k % n]) <= k // n:
            break
        ordered.append(results[k % n][k // n])
    return np.array([r for r, _ in ordered]), np.array([length for _, length in ordered], dtype=np.int64)


def eval_time_limit(env: EnvConfig, cap: int | None) -> int | None:
    """The agent steps an evaluation episode may last: the env's own limit (env.max_episode_steps, else the one
    gymnasium registered) when it is shorter than `cap` (eval.max_episode_steps), else the cap."""
    own = env.max_episode_steps if env.max_episode_steps is not None else gym.spec(env.id).max_episode_steps
    limits = [x for x in (own, cap) if x is not None]
    return min(limits) if limits else None


class Evaluator:
    """The main rank's evaluation: eval.episodes whole episodes on envs of its own (on the training envs' backend,
    so stepped in parallel where those are), each at most eval.max_episode_steps long, acting with the algorithm,
    drawing nothing from the training RNG streams and using no collective. It says what it does and how far it
    is through the logger it reports to (report_to: the RunLogger, once made), and keeps the seconds it took
    (`seconds`), which the run's SPS leaves out."""

    def __init__(self, cfg: TrainConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.logger: RunLogger | NullLogger = NullLogger()
        import_env_modules(cfg.env.imports)
        check_env_id(cfg.env.id)
        self.cap = cfg.eval.max_episode_steps
        # The cap goes where the env's own time limit goes (below the episode statistics, which see it truncate);
        # an env whose own limit is shorter keeps it.
        env = replace(cfg.env, max_episode_steps=eval_time_limit(cfg.env, self.cap))
        self.envs = make_vector_env(env, min(cfg.eval.num_envs, cfg.eval.episodes), train=False)
        self.seconds = 0.0

    def __call__(self, algo: Algorithm, should_stop: Callable[[], bool] | None = None) -> np.ndarray:
        """The returns of the episodes, in a fixed order: all of them, or with `should_stop` those finished
        when it said stop (maybe none)."""
        start = time.perf_counter()
        episodes, n = self.cfg.eval.episodes, self.envs.num_envs
        self.logger.eval_started(episodes, n, self.cap)
        with torch.random.fork_rng(devices=rng_devices(self.device)):
            torch.manual_seed(torch_seed(self.cfg.seed, 0, EVALUATION))  # every evaluation draws the same noise
            seeds = env_seeds(self.cfg.seed, 0, n, stream=1)
            act = lambda o, starts: algo.act(o, self.cfg.eval.deterministic, starts)  # noqa: E731
            on_step = lambda done, steps: self.logger.eval_progress(done, steps * n)  # noqa: E731
            try:
                returns, lengths = run_episodes(self.envs, act, episodes, seeds, should_stop, on_step)
            except NonFiniteError as e:
                raise NonFiniteError(f"eval {e}; env.check_finite=false accepts it") from None
        seconds = time.perf_counter() - start
        self.seconds += seconds
        capped = int((lengths >= self.cap).sum()) if self.cap is not None else 0
        self.logger.eval_finished(len(returns), seconds, capped, self.cap)
        return returns

    def report_to(self, logger: RunLogger | NullLogger) -> None:
        self.logger = logger

    def check_alive(self) -> None:
        """A dead eval worker is reported at the iteration it died in, not at the next evaluation (maybe hours
        later)."""
        self.envs.check_alive()

    def close(self) -> None:
        self.envs.close()


class NullEvaluator:
    """The other ranks': they evaluate nothing (Evaluator's methods, doing nothing)."""

    seconds = 0.0

    def __call__(self, algo: Algorithm, should_stop: Callable[[], bool] | None = None) -> None:
        return None

    def report_to(self, logger: RunLogger | NullLogger) -> None: ...
    def check_alive(self) -> None: ...
    def close(self) -> None: ...
