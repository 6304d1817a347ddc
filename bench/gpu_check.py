"""`make gpu-check`: on a machine with CUDA, one short run of each algorithm family on the GPU (1 rank, and 2
ranks with nccl when 2 GPUs exist), each followed by an exact-resume check (N steps resumed for N more against
2N straight, parameters compared), printed as a table. Where there is no GPU it says so and exits 0.

    make gpu-check            # or: .venv/bin/python bench/gpu_check.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CASES = {
    "ppo mlp cartpole": ["algo=ppo", "env=cartpole"],
    "ppo normalize_obs acrobot": ["algo=ppo", "env=acrobot"],
    "ppo cnn breakout": ["algo=ppo", "env=breakout", "env.vector.backend=sync", "env.num_envs=4", "algo.num_steps=64"],
    "ppo lstm cartpole_masked": ["algo=ppo", "env=cartpole_masked", "model=lstm"],
    "dqn per cartpole": ["algo=dqn", "env=cartpole", "algo.replay.prioritized=true", "algo.learning_starts=512"],
    "a2c mlp cartpole": ["algo=a2c", "env=cartpole"],
    "sac per pendulum": ["algo=sac", "env=pendulum", "algo.replay.prioritized=true", "algo.learning_starts=512"],
    "td3 pendulum": ["algo=td3", "env=pendulum", "algo.learning_starts=512"],
    "a2c cnn breakout": ["algo=a2c", "env=breakout", "env.vector.backend=sync", "env.num_envs=4"],
    # A user's network with BatchNorm: SyncBatchNorm over nccl with 2 GPUs.
    "a2c user batchnorm": ["algo=a2c", "env=cartpole", "model._target_=tests.data.user_nets.BatchNormNet"],
}
STEPS = 4096
COMMON = ["device=cuda", "logging.progress=none", "eval.every_steps=0", "eval.episodes=2", "eval.num_envs=2"]


def run(folder: Path, args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    repo = str(Path(__file__).resolve().parent.parent)  # tests.data.user_nets, for the user-network case
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    )
    cmd = [sys.executable, "-m", "rlrun", "train", *COMMON, *args]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


def final_params(run_dir: Path) -> dict:
    last = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1]
    return torch.load(last, weights_only=True)["algo"]["model"]


def check(name: str, args: list[str], ranks: int, folder: Path) -> tuple[str, str, str]:
    """(status, seconds, resume result) of one case."""
    dist = [f"distributed.nproc_per_node={ranks}"] if ranks > 1 else []
    steps = STEPS * ranks
    start = time.monotonic()
    full = folder / f"{name.replace(' ', '_')}_{ranks}_full"
    out = run(folder, [*args, *dist, f"total_steps={2 * steps}", f"hydra.run.dir={full}"])
    if out.returncode != 0:
        return "FAILED: " + out.stderr.strip().splitlines()[-1], f"{time.monotonic() - start:.0f}", "-"
    seconds = f"{time.monotonic() - start:.0f}"
    part = folder / f"{name.replace(' ', '_')}_{ranks}_part"
    out = run(folder, [*args, *dist, f"total_steps={steps}", f"hydra.run.dir={part}"])
    if out.returncode == 0:
        out = run(folder, [f"resume={part}", f"total_steps={2 * steps}"])
    if out.returncode != 0:
        return "ok", seconds, "resume FAILED: " + out.stderr.strip().splitlines()[-1]
    a, b = final_params(full), final_params(part)
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    return "ok", seconds, "exact" if diff == 0 else f"max |diff| {diff:.2e} (GPU kernels are not all deterministic)"


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: skipped: no CUDA device visible to torch (this machine has none).")
        return 0
    gpus = torch.cuda.device_count()
    print(f"gpu-check: {gpus} GPU(s): {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in [1, 2] if gpus >= 2 else [1]:
            for name, args in CASES.items():
                rows.append((name, ranks, *check(name, args, ranks, Path(tmp))))
                print(f"  {name:<28} ranks={ranks}  {rows[-1][2]}  {rows[-1][3]} s  resume: {rows[-1][4]}", flush=True)
    print("\n| case | ranks | run | seconds | resume |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    return 0 if all(r[2] == "ok" and not r[4].startswith("resume FAILED") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
