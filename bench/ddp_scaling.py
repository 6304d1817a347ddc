"""PPO on Breakout with 1 rank and with N ranks (same envs per rank), through the real CLI: global SPS, and the
time from command to the first training iteration. Two ratios, each meaningful on its own kind of machine:
- at equal cores, SPS_N / SPS_1: both runs use all of this machine's cores (1 rank takes them all, N ranks share
  them), so this is what DDP costs or gains here (its collectives, the ranks' work split);
- per-rank efficiency, SPS_N / (N x SPS_1): the scaling figure, meaningful only where each rank has cores (or a
  GPU) of its own, N times those of the 1-rank run; on a machine where 1 rank already uses every core it divides
  by cores that do not exist, and the table says so.
On a GPU box the same command uses nccl and one GPU per rank (device=auto).

    .venv/bin/python bench/ddp_scaling.py [--ranks 2] [--iterations 6] [--env breakout]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(ranks: int, iterations: int, env: str, folder: Path) -> tuple[float, float]:
    """(global SPS from the run's summary, seconds from command to the first iteration's start)."""
    per_iteration = 8 * 128 * ranks
    cmd = [
        sys.executable,
        "-m",
        "rlrun",
        "train",
        f"env={env}",
        f"distributed.nproc_per_node={ranks}",
        f"total_steps={per_iteration * iterations}",
        "eval.every_steps=0",
        "eval.episodes=1",
        "eval.num_envs=1",
        "checkpoint.every_steps=0",
        "logging.progress=plain",
        "logging.tensorboard=false",
        f"logging.every_steps={per_iteration}",
        f"hydra.run.dir={folder}",
    ]
    env_vars = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_vars)
    first = None
    for line in proc.stdout:
        if first is None and line.startswith("run folder"):  # printed right before the first iteration
            first = time.perf_counter() - start
    if proc.wait() != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    return json.loads((folder / "summary.json").read_text())["sps"], first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--env", default="breakout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one = run(1, args.iterations, args.env, Path(tmp) / "one")
        many = run(args.ranks, args.iterations, args.env, Path(tmp) / "many")
    cores = os.cpu_count() or 1
    own_cores = cores >= 2 * args.ranks  # each rank could have the cores (at least 2) the 1-rank run used
    per_rank = f"{many[0] / (args.ranks * one[0]):.2f}" + ("" if own_cores else " (not meaningful here)")
    print(f"\nPPO on {args.env}, 8 envs per rank, {cores} cores")
    print("| ranks | global SPS | at equal cores: SPS_N / SPS_1 | per-rank efficiency | command to first iteration |")
    print("|---|---|---|---|---|")
    print(f"| 1 | {one[0]:.0f} | 1.00 | 1.00 | {one[1]:.1f} s |")
    print(f"| {args.ranks} | {many[0]:.0f} | {many[0] / one[0]:.2f} | {per_rank} | {many[1]:.1f} s |")
    if not own_cores:
        print(f"Here 1 rank already uses all {cores} cores: the equal-cores ratio is DDP's overhead on them; the")
        print("per-rank efficiency needs a machine where each rank has cores of its own.")


if __name__ == "__main__":
    main()
