"""`make gpu-check`: on a machine with CUDA, one short run of each algorithm family on the GPU (1 rank, and 2
ranks with nccl when 2 GPUs exist), each followed by an exact-resume check (a copy of the run folder without its
final checkpoint resumed from step N to 2N, its final parameters compared with the run's), printed as a table; and
two seeds of each algorithm in one batched learner, their sweep resumed alike. Where there is no GPU it says so and
exits 0.

    make gpu-check            # or: .venv/bin/python bench/gpu_check.py  (GPU_CHECK_JOBS=N: N cases at once;
                              # GPU_CHECK_ONLY=batched,lstm: the cases whose names contain one of these)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

SPACES = ["env.imports=[tests.data.spaces_envs]", "env.num_envs=4", "algo.num_steps=32"]
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
    # Any env's spaces (tests/data/spaces_envs.py): masks in a Dict observation with an LSTM, masked DQN, HWC frames
    # (the small CNN), MultiDiscrete and MultiBinary actions, a user's network reading a Dict's keys.
    "ppo masked dict lstm": [*SPACES, "env.id=Masked-v0", "model=lstm", "algo.num_minibatches=2"],
    "dqn masked": [SPACES[0], "algo=dqn", "env.id=MaskedMethod-v0", "env.num_envs=1", "algo.learning_starts=512"],
    "ppo hwc frames": [*SPACES, "env.id=Frames-v0"],
    "ppo multidiscrete": [*SPACES, "env.id=TargetMD-v0"],
    "a2c multibinary": [*SPACES, "algo=a2c", "env.id=TargetMB-v0"],
    "ppo user dict net": [*SPACES, "env.id=Compass-v0", "model._target_=tests.data.spaces_envs.CompassNet"],
}
STEPS = 4096
ONLY = os.environ.get("GPU_CHECK_ONLY", "")  # only the cases whose names contain one of these (comma-separated)
DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")  # cpu: a dry run of the cases where there is no GPU
COMMON = [f"device={DEVICE}", "logging.progress=none", "eval.every_steps=0", "eval.episodes=2", "eval.num_envs=2"]


def run(folder: Path, args: list[str], timeout: float = 900, multirun: bool = False) -> subprocess.CompletedProcess:
    repo = str(Path(__file__).resolve().parent.parent)  # tests.data.user_nets, for the user-network case
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    )
    cmd = [sys.executable, "-m", "rlrun", "train", *(["-m"] if multirun else []), *COMMON, *args]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


def wanted(name: str) -> bool:
    return not ONLY or any(part in name for part in ONLY.split(","))


def final_params(run_dir: Path) -> dict:
    last = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1]
    return torch.load(last, weights_only=True)["algo"]["model"]


def params_diff(run_dir: Path, resumed: Path) -> float:
    """The largest difference between the final parameters of a run and of its resumed copy."""
    a, b = final_params(run_dir), final_params(resumed)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def twice_with_a_checkpoint(args: list[str], steps: int) -> list[str]:
    """2 x `steps` steps with a checkpoint at `steps` to resume from (with the replay, for the off-policy cases)."""
    off_policy = any(a in args for a in ("algo=dqn", "algo=sac", "algo=td3"))
    keep = ["checkpoint.keep_last=5", *(["algo.replay.checkpoint=true"] if off_policy else [])]
    return [f"total_steps={2 * steps}", f"checkpoint.every_steps={steps}", *keep]


def check(name: str, args: list[str], ranks: int, folder: Path) -> tuple[str, str, str]:
    """(status, seconds, resume result) of one case: a run of 2N steps with a checkpoint at N, then a copy of its
    folder without the final checkpoint resumed to 2N, as tests/runs/test_distributed.py checks exact resume."""
    dist = [f"distributed.nproc_per_node={ranks}"] if ranks > 1 else []
    start = time.monotonic()
    full = folder / f"{name.replace(' ', '_')}_{ranks}_full"
    out = run(folder, [*args, *dist, *twice_with_a_checkpoint(args, STEPS * ranks), f"hydra.run.dir={full}"])
    if out.returncode != 0:
        return "FAILED: " + out.stderr.strip().splitlines()[-1], f"{time.monotonic() - start:.0f}", "-"
    seconds = f"{time.monotonic() - start:.0f}"
    last = sorted((full / "checkpoints").glob("ckpt_*.pt"))[-1]
    part = folder / f"{name.replace(' ', '_')}_{ranks}_part"
    shutil.copytree(full, part)
    (part / "checkpoints" / last.name).unlink()
    for shard in (part / "checkpoints").glob(f"shard_{last.stem[len('ckpt_') :]}_*.pt"):
        shard.unlink()
    out = run(folder, [f"resume={part}"])
    if out.returncode != 0:
        return "ok", seconds, "resume FAILED: " + out.stderr.strip().splitlines()[-1]
    diff = params_diff(full, part)
    resumed_from = sorted((part / "checkpoints").glob("ckpt_*.pt"))[0]
    if torch.load(resumed_from, weights_only=True)["ranks"][0]["envs"] is None:  # rlrun/envs/state.py: restorable
        return "ok", seconds, f"fresh episodes (the env's state is not saved), max |diff| {diff:.2e}"
    return "ok", seconds, "exact" if diff == 0 else f"max |diff| {diff:.2e}"


# Two seeds of each algorithm in one batched learner (hydra/launcher=batched, rlrun/algos/batched_*.py).
BATCHED = {
    "ppo batched seeds": ["algo=ppo", "env=cartpole"],
    "a2c batched seeds": ["algo=a2c", "env=cartpole"],
    "dqn batched seeds": ["algo=dqn", "env=cartpole", "algo.learning_starts=512"],
    "sac batched seeds": ["algo=sac", "env=pendulum", "algo.learning_starts=512"],
    "td3 batched seeds": ["algo=td3", "env=pendulum", "algo.learning_starts=512"],
}


def check_batched(name: str, args: list[str], folder: Path) -> tuple[str, str, str, str, str]:
    """Two seeds in one batched learner on the GPU for 2N steps, with checkpoints at N: both folders complete; then
    a copy of the sweep without the final checkpoints resumed (`resume=SWEEP`, the batch again) to 2N, each seed's
    final parameters compared with the run's (each seed's streams of both generators come back from its checkpoint,
    as tests/runs/test_batched_seeds.py checks on the CPU)."""
    start = time.monotonic()
    sweep = folder / name.replace(" ", "_")
    every = twice_with_a_checkpoint(args, STEPS)
    out = run(folder, [*args, "seed=0,1", "hydra/launcher=batched", *every, f"hydra.sweep.dir={sweep}"], multirun=True)
    seconds = f"{time.monotonic() - start:.0f}"
    if out.returncode != 0:
        return name, "1", "FAILED: " + out.stderr.strip().splitlines()[-1], seconds, "-"
    status = [json.loads((sweep / str(i) / "summary.json").read_text())["status"] for i in range(2)]
    if status != ["completed", "completed"]:
        return name, "1", f"FAILED: {status}", seconds, "-"
    part = folder / f"{sweep.name}_part"
    shutil.copytree(sweep, part)
    for job in ("0", "1"):
        (part / job / "summary.json").unlink()
        sorted((part / job / "checkpoints").glob("ckpt_*.pt"))[-1].unlink()
    out = run(folder, [f"resume={part}"])
    if out.returncode != 0:
        return name, "1", "ok", seconds, "resume FAILED: " + out.stderr.strip().splitlines()[-1]
    diff = max(params_diff(sweep / job, part / job) for job in ("0", "1"))
    return name, "1", "ok", seconds, "exact" if diff == 0 else f"max |diff| {diff:.2e}"


def main() -> int:
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("gpu-check: skipped: no CUDA device visible to torch (this machine has none).")
        return 0
    gpus = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0) if gpus else "none (a dry run on the CPU)"
    print(f"gpu-check: {gpus} GPU(s): {name}; torch {torch.__version__}")
    jobs = int(os.environ.get("GPU_CHECK_JOBS", "1"))  # cases run side by side (each its own processes)
    rows: list[tuple] = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(jobs) as pool:
        cases = [(name, args) for name, args in CASES.items() if wanted(name)]
        todo = [(name, args, ranks) for ranks in ([1, 2] if gpus >= 2 else [1]) for name, args in cases]
        futures = [pool.submit(lambda c: (c[0], c[2], *check(c[0], c[1], c[2], Path(tmp))), c) for c in todo]
        futures += [pool.submit(check_batched, name, args, Path(tmp)) for name, args in BATCHED.items() if wanted(name)]
        for future in futures:
            rows.append(future.result())
            print(
                f"  {rows[-1][0]:<28} ranks={rows[-1][1]}  {rows[-1][2]}  {rows[-1][3]} s  resume: {rows[-1][4]}",
                flush=True,
            )
    print("\n| case | ranks | run | seconds | resume |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    return 0 if all(r[2] == "ok" and not r[4].startswith("resume FAILED") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
