"""Env steps/s with random actions, no learning: rlrun's worker pool (with and without double buffering)
against gymnasium's AsyncVectorEnv (shared memory) and SyncVectorEnv, all in this invocation, plus the limit:
one env's raw steps/s times the number of cores. Ratios against AsyncVectorEnv and fractions of the limit.

    .venv/bin/python bench/env_throughput.py [--envs 16] [--seconds 5] [--only breakout|cartpole]
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from rlrun.config import AtariConfig, EnvConfig, VectorConfig
from rlrun.envs import make_env, make_vector_env

CASES = {"breakout": EnvConfig(id="ALE/Breakout-v5", atari=AtariConfig()), "cartpole": EnvConfig(id="CartPole-v1")}


def rate(step, num_envs: int, actions: list[np.ndarray], seconds: float) -> float:
    """Env steps/s over at least `seconds` (after a short warm-up)."""
    for a in actions[:20]:
        step(a)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(actions[n % len(actions)])
        n += 1
    return n * num_envs / (time.perf_counter() - start)


def raw_rate(cfg: EnvConfig, seconds: float) -> float:
    env = make_env(cfg, train=True)()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, env.action_space.n, 1000)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, te, tr, _ = env.step(actions[n % 1000])
        if te or tr:
            env.reset()
        n += 1
    env.close()
    return n / (time.perf_counter() - start)


def build(label: str, cfg: EnvConfig, fns: list):
    if label == "SyncVectorEnv":
        return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    if label == "AsyncVectorEnv":
        return AsyncVectorEnv(fns, shared_memory=True, autoreset_mode=AutoresetMode.SAME_STEP)
    vector = VectorConfig(backend="subproc", double_buffer="double" in label)
    return make_vector_env(EnvConfig(id=cfg.id, atari=cfg.atari, vector=vector), len(fns))


def pool_double_buffered(envs):
    """Steps both halves as the PPO collect loop does: one half steps while the other is handed actions."""
    half = envs.num_envs // 2

    def step(a):
        envs.send(0, a[:half])
        envs.recv(1) if step.started else None
        envs.send(1, a[half:])
        envs.recv(0)
        step.started = True

    step.started = False
    return step


class AsyncGroups(AsyncVectorEnv):
    """gymnasium's AsyncVectorEnv behind the send/recv interface PPO's collect loop uses (one group)."""

    def __init__(self, fns):
        super().__init__(fns, shared_memory=True, autoreset_mode=AutoresetMode.SAME_STEP)
        self.groups = [slice(0, self.num_envs)]

    def send(self, group, actions):
        self.step_async(actions)

    def recv(self, group):
        from rlrun.envs.protocol import EndedEpisodes, StepResult

        obs, rewards, terminated, truncated, info = self.step_wait()
        final, episodes = info.get("final_info", {}), EndedEpisodes.none(self.num_envs)
        if "episode" in final:  # gymnasium batches RecordEpisodeStatistics' infos under final_info
            episodes = EndedEpisodes(final["_episode"], final["episode"]["r"], final["episode"]["l"])
        return StepResult(obs, rewards, terminated, truncated, info, episodes)


def ppo_end_to_end(iterations: int) -> None:
    """PPO on Breakout (8 envs, Nature CNN, CleanRL's Atari settings): collect and update time per
    iteration with the worker pool vs AsyncVectorEnv, same seeds, same process."""
    import torch

    from rlrun.algos.ppo import PPO, PPOConfig
    from rlrun.algos.protocol import EnvSpec
    from rlrun.config import ModelConfig
    from rlrun.fast import accelerate

    torch.set_num_threads(os.cpu_count() or 1)
    cfg = EnvConfig(id="ALE/Breakout-v5", atari=AtariConfig(), vector=VectorConfig(backend="subproc"))
    model = ModelConfig(name="nature_cnn", hidden_sizes=[512], activation="relu", shared=True)
    rows = {}
    for label in ("AsyncVectorEnv", "rlrun pool", "rlrun pool, double buffer"):
        if label == "AsyncVectorEnv":
            envs = AsyncGroups([make_env(cfg, True) for _ in range(8)])
        else:
            vector = VectorConfig(backend="subproc", double_buffer="double" in label)
            envs = make_vector_env(EnvConfig(id=cfg.id, atari=cfg.atari, vector=vector), 8)
        torch.manual_seed(0)
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 8)
        algo = PPO(PPOConfig(clip_coef=0.1), model, spec, torch.device("cpu"))
        accelerate(algo, envs)  # as training does
        algo.start(np.array(envs.reset(seed=0)[0]))
        collect = update = 0.0
        for _ in range(iterations):
            t = time.perf_counter()
            algo.collect(envs)
            collect += time.perf_counter() - t
            t = time.perf_counter()
            algo.update(0.0)
            update += time.perf_counter() - t
        envs.close()
        rows[label] = (collect, update)
    base = sum(rows["AsyncVectorEnv"])
    print(f"\nPPO on Breakout, 8 envs, {iterations} iterations of 1024 steps")
    print("| vector env | collect s/iter | update s/iter | SPS | vs AsyncVectorEnv |")
    print("|---|---|---|---|---|")
    for label, (c, u) in rows.items():
        print(
            f"| {label} | {c / iterations:.2f} | {u / iterations:.2f} | {1024 * iterations / (c + u):.0f} | "
            f"{base / (c + u):.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", choices=list(CASES))
    parser.add_argument("--ppo-iterations", type=int, default=3, help="PPO end to end on Breakout (0: skip)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    for name, cfg in CASES.items():
        if args.only and name != args.only:
            continue
        n = args.envs
        fns = [make_env(cfg, train=True) for _ in range(n)]
        space = fns[0]().action_space
        rng = np.random.default_rng(0)
        actions = [rng.integers(0, space.n, n) for _ in range(1000)]
        results = {}
        limit = raw_rate(cfg, args.seconds) * cores
        for label in ("SyncVectorEnv", "AsyncVectorEnv", "rlrun pool", "rlrun pool, double buffer"):
            envs = build(label, cfg, fns)
            envs.reset(seed=0)
            step = pool_double_buffered(envs) if "double" in label else envs.step
            results[label] = rate(step, n, actions, args.seconds)
            envs.close()
        base = results["AsyncVectorEnv"]
        print(
            f"\n{name}, {n} envs, {cores} cores; limit = one env's raw {limit / cores:.0f} steps/s x {cores} "
            f"= {limit:.0f} steps/s"
        )
        print("| vector env | steps/s | vs AsyncVectorEnv | of the limit |")
        print("|---|---|---|---|")
        for label, sps in results.items():
            print(f"| {label} | {sps:.0f} | {sps / base:.2f}x | {sps / limit:.0%} |")
    if args.ppo_iterations:
        ppo_end_to_end(args.ppo_iterations)


if __name__ == "__main__":
    gym.logger.min_level = 40
    main()
