"""Raw env steps/s with random actions, no learning, of each rlrun backend (sync: in-process; subproc: forked
workers; native: the env's own vectorized implementation; ray with --ray; and for CartPole sync's envs stepped as
arrays, rlrun/fast/cartpole_arrays.py, as the accelerations step them) on Breakout and CartPole, pinned to 1 core
and to 2 (os.sched_setaffinity: the backend gets that many workers or threads), beside gymnasium's SyncVectorEnv and
AsyncVectorEnv (the peers, in this invocation). Ratios are against gymnasium's SyncVectorEnv on the same cores.
Then CartPole as arrays against native in alternating rounds (what env.vector.backend=auto weighs), and PPO end to end
on Breakout (collect and update per iteration) on subproc (acting in the workers) and native.

    .venv/bin/python bench/env_throughput.py [--seconds 3] [--only breakout|cartpole] [--ppo-iterations 3] [--ray]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from rlrun.config import AtariConfig, EnvConfig, VectorConfig
from rlrun.envs import make_env, make_vector_env
from rlrun.fast.cartpole_arrays import CartPoleArrays

BREAKOUT = EnvConfig(id="ALE/Breakout-v5", atari=AtariConfig())
CARTPOLE = EnvConfig(id="CartPole-v1")
# (name, env, number of envs): Breakout as PPO trains it (8 envs), CartPole at 2, CleanRL's 4, 8 (where auto turns to
# native without the arrays), 16 and 32 (a batch of 8 seeds of 4 envs: rlrun/seeds.py).
CASES = [("breakout", BREAKOUT, 8), *(("cartpole", CARTPOLE, n) for n in (2, 4, 8, 16, 32))]
PEER = "gymnasium SyncVectorEnv"
ARRAYS = "rlrun sync, CartPole as arrays"


def rate(step: Callable[[np.ndarray], Any], num_envs: int, actions: list[np.ndarray], seconds: float) -> float:
    """Env steps/s over at least `seconds` (after a short warm-up)."""
    for a in actions[:20]:
        step(a)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(actions[n % len(actions)])
        n += 1
    return n * num_envs / (time.perf_counter() - start)


def build(label: str, cfg: EnvConfig, n: int, cores: int) -> Any:
    """The vector env `label` of n envs of `cfg`, with as many workers or threads as `cores`."""
    if label == PEER:
        return SyncVectorEnv([make_env(cfg, train=True) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP)
    if label == "gymnasium AsyncVectorEnv":
        fns = [make_env(cfg, train=True) for _ in range(n)]
        return AsyncVectorEnv(fns, shared_memory=True, autoreset_mode=AutoresetMode.SAME_STEP)
    if label == ARRAYS:
        envs = make_vector_env(replace(cfg, vector=VectorConfig(backend="sync")), n)
        envs.run_command = CartPoleArrays(envs.envs).rows(0, n)
        return envs
    backend = label.removeprefix("rlrun ")
    return make_vector_env(replace(cfg, vector=VectorConfig(backend=backend, num_workers=cores)), n)


def measure(labels: list[str], seconds: float) -> dict[tuple[str, int, str, int], float]:
    """Steps/s of each case and label, pinned to 1 core, then to 2."""
    results = {}
    for cores in (1, 2):
        os.sched_setaffinity(0, range(cores))
        for name, cfg, n in CASES:
            rng = np.random.default_rng(0)
            space = make_env(cfg, train=True)().action_space
            actions = [rng.integers(0, space.n, n) for _ in range(1000)]
            for label in labels:
                if label == "rlrun subproc" and cores == 1 and name == "cartpole":
                    continue  # one worker process for cheap envs: the round trip alone, shown for Breakout
                if label == ARRAYS and name != "cartpole":
                    continue
                envs = build(label, cfg, n, cores)
                envs.reset(seed=list(range(n)))
                results[(name, n, label, cores)] = rate(envs.step, n, actions, seconds)
                envs.close()
                print(f"{name} x{n}, {cores} core(s), {label}: {results[(name, n, label, cores)]:.0f} steps/s")
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    return results


def print_table(results: dict[tuple[str, int, str, int], float], labels: list[str]) -> None:
    print("\n| env (envs) | vector env | 1 core steps/s | vs peer | 2 cores steps/s | vs peer |")
    print("|---|---|---|---|---|---|")
    for name, _, n in CASES:
        for label in labels:
            cells = []
            for cores in (1, 2):
                sps, peer = results.get((name, n, label, cores)), results[(name, n, PEER, cores)]
                cells += ["-", "-"] if sps is None else [f"{sps:,.0f}", f"{sps / peer:.2f}x"]
            print(f"| {name} ({n}) | {label} | {' | '.join(cells)} |")


def ppo_end_to_end(iterations: int) -> None:
    """PPO on Breakout (8 envs, Nature CNN, CleanRL's Atari settings, 2 torch threads): collect and update time per
    iteration on each backend as a run picks its parts (accelerate: acting in the workers on subproc), same seeds,
    same process."""
    import torch

    from rlrun.algos.ppo import PPO, PPOConfig
    from rlrun.algos.protocol import EnvSpec
    from rlrun.config import ModelConfig
    from rlrun.fast import accelerate

    torch.set_num_threads(os.cpu_count() or 1)
    model = ModelConfig(name="nature_cnn", hidden_sizes=[512], activation="relu", shared=True)
    rows = {}
    for backend in ("subproc", "native"):
        envs = make_vector_env(replace(BREAKOUT, vector=VectorConfig(backend=backend)), 8, seeds=list(range(8)))
        torch.manual_seed(0)
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 8)
        algo = PPO(PPOConfig(clip_coef=0.1), model, spec, torch.device("cpu"))
        applied = accelerate(algo, envs)  # as training does
        algo.start(np.array(envs.reset(seed=list(range(8)))[0]))
        collect = update = 0.0
        for _ in range(iterations):
            t = time.perf_counter()
            algo.collect(envs)
            collect += time.perf_counter() - t
            t = time.perf_counter()
            algo.update(0.0)
            update += time.perf_counter() - t
        envs.close()
        rows[f"rlrun {backend} ({', '.join(applied)})"] = (collect, update)
    base = sum(next(iter(rows.values())))
    print(f"\nPPO on Breakout, 8 envs, {iterations} iterations of 1024 steps, {os.cpu_count()} cores")
    print("| vector env | collect s/iter | update s/iter | SPS | vs subproc |")
    print("|---|---|---|---|---|")
    for label, (c, u) in rows.items():
        sps = 1024 * iterations / (c + u)
        print(f"| {label} | {c / iterations:.2f} | {u / iterations:.2f} | {sps:.0f} | {base / (c + u):.2f}x |")


def arrays_against_native(seconds: float, rounds: int = 5) -> None:
    """What env.vector.backend=auto weighs for CartPole when the accelerations step in-process CartPoles as arrays:
    the arrays against native at 8, 16 and 32 envs on 1 core, rounds alternating the two (median steps/s), under
    random actions (an episode ends every 20-odd steps, so resets weigh) and a balancing policy (long episodes, as
    once an agent learns)."""
    os.sched_setaffinity(0, [0])
    labels = [ARRAYS, "rlrun native"]
    print("\n| policy | envs | arrays steps/s | native steps/s | arrays / native |\n|---|---|---|---|---|")
    for policy in ("random", "balancing"):
        for n in (8, 16, 32):
            envs = {label: build(label, CARTPOLE, n, 1) for label in labels}
            rates: dict[str, list[float]] = {label: [] for label in labels}
            for r in range(rounds):
                for label in labels if r % 2 == 0 else labels[::-1]:
                    rates[label].append(_policy_rate(envs[label], n, policy, seconds))
            arrays, native = (float(np.median(rates[label])) for label in labels)
            print(f"| {policy} | {n} | {arrays:,.0f} | {native:,.0f} | {arrays / native:.2f}x |")
    os.sched_setaffinity(0, range(os.cpu_count() or 1))


def _policy_rate(envs: Any, n: int, policy: str, seconds: float) -> float:
    obs, rng = envs.reset(seed=list(range(n)))[0], np.random.default_rng(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        actions = rng.integers(0, 2, n) if policy == "random" else (obs[:, 3] > 0).astype(np.int64)
        obs = envs.step(actions)[0]
        steps += 1
    return steps * n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--only", choices=["breakout", "cartpole"])
    parser.add_argument("--ppo-iterations", type=int, default=3, help="PPO end to end on Breakout (0: skip)")
    parser.add_argument("--ray", action="store_true", help="also the ray backend (its workers: Ray actors)")
    args = parser.parse_args()
    if args.only:
        CASES[:] = [c for c in CASES if c[0] == args.only]
    labels = [PEER, "gymnasium AsyncVectorEnv", "rlrun sync", ARRAYS, "rlrun subproc", "rlrun native"]
    labels += ["rlrun ray"] if args.ray else []
    print(f"load average before: {os.getloadavg()}")
    print_table(measure(labels, args.seconds), labels)
    if args.only != "breakout":
        arrays_against_native(min(args.seconds, 1.0))
    if args.ppo_iterations and args.only != "cartpole":
        ppo_end_to_end(args.ppo_iterations)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    gym.logger.min_level = 40
    main()
