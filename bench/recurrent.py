"""Recurrent models: forward+backward time of the LRU's parallel scan against the same LRU stepped one time step
at a time, for several sequence lengths; then PPO's SPS with an LSTM against an MLP on masked CartPole (the
tuned config, same budget and seed), in this process, one after the other.

    .venv/bin/python bench/recurrent.py [--lengths 128 512 2048] [--envs 16] [--ppo-steps N (default: tuned)]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo_throughput import rlrun_config, run_rlrun  # noqa: E402

from rlrun.models.recurrent import LRUCore, unroll  # noqa: E402


def fwd_bwd_seconds(run, core: LRUCore, x: torch.Tensor, starts: torch.Tensor, repeats: int) -> float:
    """Median wall time of one forward and backward pass of `run` over x [T, B, F]."""
    state = torch.zeros(x.shape[1], core.state_size)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        y, _ = run(x, state, starts)
        y.square().mean().backward()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def scan_vs_loop(lengths: list[int], envs: int, features: int, size: int) -> list[tuple]:
    rows = []
    core = LRUCore(features, size)
    loop = lambda x, s, starts: unroll(core.step, x, s, starts)  # noqa: E731
    for steps in lengths:
        x = torch.randn(steps, envs, features, requires_grad=True)
        starts = torch.rand(steps, envs) < 1 / 200  # episode starts inside the sequences
        repeats = max(3, 2048 // steps)
        scan = fwd_bwd_seconds(core.forward, core, x, starts, repeats)
        stepped = fwd_bwd_seconds(loop, core, x, starts, repeats)
        rows.append((steps, scan, stepped))
        print(f"LRU T={steps}: scan {scan * 1e3:.1f} ms, loop {stepped * 1e3:.1f} ms, {stepped / scan:.1f}x")
    return rows


def ppo_sps(steps: int | None) -> list[tuple]:
    rows = []
    for model in ("mlp", "lstm", "lru"):
        cfg = rlrun_config(["env=cartpole_masked", f"model={model}"], threads=1, steps=steps)
        sps, ret = run_rlrun(cfg)
        rows.append((model, sps, ret))
        print(f"PPO {model} on cartpole_masked: {sps:.0f} sps, eval {ret:.1f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--ppo-steps", type=int, default=None)  # the tuned budget, as the learning test uses
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    scans = scan_vs_loop(args.lengths, args.envs, args.features, args.size)
    ppo = ppo_sps(args.ppo_steps)
    print(f"\nLRU forward+backward, {args.envs} sequences, {args.features} -> {args.size} (complex), 1 thread")
    print("| T | scan ms | step loop ms | loop / scan |")
    print("|---|---|---|---|")
    for steps, scan, stepped in scans:
        print(f"| {steps} | {scan * 1e3:.1f} | {stepped * 1e3:.1f} | {stepped / scan:.1f}x |")
    mlp_sps = ppo[0][1]
    print(f"\nPPO on cartpole_masked, {args.ppo_steps or 'the tuned'} env steps, seed 1, 1 thread")
    print("| model | SPS | SPS / MLP's | final eval return |")
    print("|---|---|---|---|")
    for model, sps, ret in ppo:
        print(f"| {model} | {sps:.0f} | {sps / mlp_sps:.2f}x | {ret:.1f} |")


if __name__ == "__main__":
    main()
