"""Many seeds in one process (hydra/launcher=batched) against the same seeds run one after another as single
processes, through the real CLI, for one algorithm on its benchmark env: PPO on CartPole at CleanRL's settings
(rlrun's PPO defaults, `~tuned`, 4 envs), SAC and TD3 on Pendulum (rlrun's presets: rl-zoo3's, SB3's 256x256 networks
and batch 256; TD3's updates from 100 transitions, as SAC's), DQN and A2C on CartPole (rlrun's presets, rl-zoo3's).
For each S: aggregate env steps per second of the S seeds over their training seconds (each run's own clock, which
leaves out start-up and evaluation) and over the wall time of the whole command(s), their ratio batched/sequential,
and the peak memory (max RSS) per seed. The single runs keep their own accelerations (algo.fast, the default), as
does the batch (its own: rlrun/fast/).

    .venv/bin/python bench/many_seeds.py [--algo ppo|sac|td3|dqn|a2c] [--seeds 1,2,4,8,16] [--steps N] [KEY=VALUE ...]

KEY=VALUE overrides go to every run, batched and single (`threads=2`, say).
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

# algorithm -> (its overrides, default env steps per seed, what it is)
ALGOS = {
    "ppo": (["~tuned", "algo=ppo", "env=cartpole", "env.num_envs=4"], 100_000, "PPO CartPole-v1, CleanRL's settings"),
    "sac": (
        ["algo=sac", "env=pendulum"],
        1_100,
        "SAC Pendulum-v1, rlrun's preset (256x256, batch 256, updates from 100)",
    ),
    "td3": (
        ["algo=td3", "env=pendulum", "algo.learning_starts=100"],
        1_100,
        "TD3 Pendulum-v1, rlrun's preset (256x256, batch 256), updates from 100",
    ),
    "dqn": (["algo=dqn"], 8_192, "DQN CartPole-v1, rlrun's preset (rl-zoo3's: 128 updates per 256 steps from 1k)"),
    "a2c": (["algo=a2c"], 50_000, "A2C CartPole-v1, rlrun's preset (rl-zoo3's: 8 envs x 5 steps)"),
}
QUIET = [
    "eval.every_steps=0",
    "eval.episodes=1",
    "checkpoint.every_steps=0",
    "logging.progress=none",
    "logging.tensorboard=false",
]


def command(args: list[str]) -> tuple[float, int]:
    """Run `rlrun ARGS`; (its wall seconds, its peak RSS in bytes)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rlrun", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"rlrun {' '.join(args)} failed:\n{proc.stderr.read().decode()[-3000:]}")
    return time.perf_counter() - start, usage.ru_maxrss * 1024


def train_seconds(run: Path) -> float:
    return json.loads((run / "summary.json").read_text())["sessions"][-1]["train_seconds"]


def batched(seeds: int, steps: int, folder: Path, config: list[str]) -> tuple[float, float, int]:
    """(training seconds, wall seconds, peak RSS) of S seeds in one batched process."""
    sweep = ["-m", f"seed={','.join(map(str, range(seeds)))}", "hydra/launcher=batched", f"hydra.sweep.dir={folder}"]
    sweep.append(f"hydra.launcher.max_batch={seeds}")  # all S in one batch (its default cap is 8)
    wall, rss = command(["train", *sweep, f"total_steps={steps}", *config, *QUIET])
    return max(train_seconds(folder / str(i)) for i in range(seeds)), wall, rss


def sequential(seeds: int, steps: int, folder: Path, config: list[str]) -> tuple[float, float, int]:
    """The same for the S seeds as single runs, one after another (seconds summed, the largest RSS)."""
    train, wall, rss = 0.0, 0.0, 0
    for seed in range(seeds):
        run = folder / str(seed)
        w, r = command(["train", f"seed={seed}", f"hydra.run.dir={run}", f"total_steps={steps}", *config, *QUIET])
        train, wall, rss = train + train_seconds(run), wall + w, max(rss, r)
    return train, wall, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="ppo", choices=sorted(ALGOS), help="the algorithm and its benchmark env")
    parser.add_argument("--seeds", default="1,2,4,8,16", help="the S to measure, comma-separated")
    parser.add_argument("--steps", type=int, help="env steps per seed (default: the algorithm's)")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for every run")
    args = parser.parse_args()
    config, default_steps, what = ALGOS[args.algo]
    config, steps = [*config, *args.overrides], args.steps or default_steps
    print(f"{what}, {steps:,} env steps per seed, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    header = (
        f"{'S':>3} {'batched sps':>12} {'sequential sps':>15} {'ratio':>6} {'ratio (wall)':>13} {'MB/seed b/s':>12}"
    )
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for s in (int(x) for x in args.seeds.split(",")):
            b_train, b_wall, b_rss = batched(s, steps, Path(tmp) / f"batched{s}", config)
            q_train, q_wall, q_rss = sequential(s, steps, Path(tmp) / f"sequential{s}", config)
            total = s * steps
            memory = f"{b_rss / s / 2**20:.0f}/{q_rss / 2**20:.0f}"
            print(
                f"{s:>3} {total / b_train:>12.0f} {total / q_train:>15.0f} {q_train / b_train:>6.2f}"
                f" {q_wall / b_wall:>13.2f} {memory:>12}  (load {os.getloadavg()[0]:.2f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
