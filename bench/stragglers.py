"""Straggler preemption (algo.preempt_fraction, DD-PPO's sync_frac), through the real CLI on a sleep-based env
(bench/slow_envs.py: a step costs time, not a core, so 4 ranks fit on 2 cores).

1. Throughput: PPO, 4 ranks, one of them k times slower (k = 1, 2, 5, 10), preemption off and on: global SPS and
   SPS relative to k = 1 without preemption, as DD-PPO's paper tabulates it.
2. Inside one rank: env workers with a slow reset now and then (a simulator loading a scene), 1 group of workers
   or 2 double-buffered: what double buffering does for a late worker.
3. Learning: CartPole with 4 ranks, one 5x slower with preemption on, against 4 equal ranks: env steps until the
   evaluation return reaches 475.

    .venv/bin/python bench/stragglers.py [--part 1 2 3] [--step-ms 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUIET = ["logging.progress=none", "logging.tensorboard=false", "checkpoint.every_steps=0"]


def train(folder: Path, *overrides: str) -> dict:
    """Run `rlrun train` in `folder` (where slow_envs.py is importable); returns its summary and metrics."""
    run = folder / f"run{len(list(folder.glob('run*')))}"
    cmd = [sys.executable, "-m", "rlrun", "train", *QUIET, *overrides, f"hydra.run.dir={run}"]
    out = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return json.loads((run / "summary.json").read_text()) | {"metrics": metrics}


def slow_env(step_s: float, slow_rank: int | None = None, factor: float = 1.0) -> list[str]:
    out = ["env.id=SlowCartPole-v0", "tuned=ppo_cartpole", "env.imports=[slow_envs]", f"+env.kwargs.step_s={step_s}"]
    if slow_rank is not None:
        out += [f"+env.kwargs.slow_ranks=[{slow_rank}]", f"+env.kwargs.factor={factor}"]
    return out


def throughput(folder: Path, step_s: float) -> None:
    ranks, envs, steps, iterations = 4, 4, 64, 8
    common = [
        f"distributed.nproc_per_node={ranks}",
        f"env.num_envs={envs}",
        f"algo.num_steps={steps}",
        "algo.update_epochs=4",
        f"total_steps={ranks * envs * steps * iterations}",
        "eval.every_steps=0",
        "eval.episodes=1",
        "eval.num_envs=1",
    ]
    modes = {
        "off": [],
        "on, floor 0.25": ["algo.preempt_fraction=0.6"],
        "on, floor 0.05": ["algo.preempt_fraction=0.6", "algo.preempt_floor=0.05"],
    }
    table = {}
    for k in (1, 2, 5, 10):
        for mode, extra in modes.items():
            s = train(folder, *common, *slow_env(step_s, ranks - 1, k), *extra)
            cut = s.get("preempted_per_rank", [0] * ranks)
            table[k, mode] = s["sps"]
            print(f"k={k} {mode}: {s['sps']:.0f} sps, slow rank cut in {cut[-1]} of {s['iterations']}", flush=True)
    base = table[1, "off"]
    shape = f"{ranks} ranks x {envs} envs x {steps} steps"
    print(f"\nPPO, {shape}, env step {step_s * 1e3:.1f} ms (sleep), rank 3 k x slower;")
    print("preemption at fraction 0.6 (the 4th rank is cut once 3 are done), floors as fractions of algo.num_steps")
    print("| k | " + " | ".join(f"{m}: SPS (vs k=1 off)" for m in modes) + " |")
    print("|---|" + "---|" * len(modes))
    for k in (1, 2, 5, 10):
        cells = [f"{table[k, m]:.0f} ({table[k, m] / base:.2f})" for m in modes]
        print(f"| {k} | " + " | ".join(cells) + " |")


def in_rank(folder: Path, step_s: float) -> None:
    common = [
        "env.num_envs=8",
        "env.vector.backend=subproc",
        "env.vector.num_workers=2",
        "total_steps=16384",
        "eval.every_steps=0",
        "eval.episodes=1",
        "eval.num_envs=1",
        f"+env.kwargs.step_s={step_s}",
        "env.id=SlowCartPole-v0",
        "tuned=ppo_cartpole",
        "env.imports=[slow_envs]",
    ]
    print(f"\nOne rank, 8 envs on 2 workers, env step {step_s * 1e3:.1f} ms (sleep); resets instant or 50 ms")
    print("| resets | workers act (default) | one group, the rank acts | double-buffered, the rank acts |")
    print("|---|---|---|---|")
    for reset in (0.0, 0.05):
        cells = []
        for extra in ([], ["algo.act_in_workers=false"], ["env.vector.double_buffer=true"]):
            s = train(folder, *common, f"+env.kwargs.reset_s={reset}", *extra)
            cells.append(f"{s['sps']:.0f}")
        print(f"| {'50 ms' if reset else 'instant'} | " + " | ".join(cells) + " |", flush=True)


def learning(folder: Path, seeds: list[int]) -> None:
    common = [
        "distributed.nproc_per_node=4",
        "total_steps=200000",
        "eval.every_steps=10000",
        "eval.episodes=10",
        "eval.num_envs=10",
    ]
    runs = {
        "4 equal ranks": slow_env(0.0002),
        "rank 3 5x slower, preemption on": [*slow_env(0.0002, 3, 5), "algo.preempt_fraction=0.6"],
    }
    print("\nCartPole, 4 ranks (tuned PPO, 8 envs each): env steps until eval return >= 475 (10 episodes)")
    print("| seed | " + " | ".join(runs) + " | ratio |")
    print("|---|---|---|---|")
    for seed in seeds:
        solved = []
        for extra in runs.values():
            s = train(folder, *common, *extra, f"seed={seed}")
            hits = [m["env_steps"] for m in s["metrics"] if m.get("eval/return_mean", 0) >= 475]
            solved.append(hits[0] if hits else None)
        ratio = f"{solved[1] / solved[0]:.2f}" if all(solved) else "-"
        print(f"| {seed} | " + " | ".join(str(x) for x in solved) + f" | {ratio} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--step-ms", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copy(HERE / "slow_envs.py", folder / "slow_envs.py")
        if 1 in args.part:
            throughput(folder, args.step_ms / 1e3)
        if 2 in args.part:
            in_rank(folder, args.step_ms / 1e3)
        if 3 in args.part:
            learning(folder, args.seeds)


if __name__ == "__main__":
    main()
