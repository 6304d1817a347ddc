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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", choices=list(CASES))
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


if __name__ == "__main__":
    gym.logger.min_level = 40
    main()
