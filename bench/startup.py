"""Start-up: how long rlrun's commands take to answer, through the real CLI, median of 5 runs each, printed beside
the import time of torch alone (the floor of anything that trains). Config commands (printing the config, --help,
a typo caught by the pre-flight) import no torch; training is timed from the command to the start of its first
iteration (the "run folder" line, logged right before the loop).

    .venv/bin/python bench/startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG_COMMANDS = {
    "rlrun train --cfg job": ["train", "--cfg", "job"],
    "rlrun train --help": ["train", "--help"],
    "rlrun train algo.lrr=1 (typo)": ["train", "algo.lrr=1"],
    "rlrun train env=breakout --cfg job": ["train", "env=breakout", "--cfg", "job"],
}
TRAINING = {
    "CartPole, 1 rank": ["train"],
    "Breakout, 1 rank": ["train", "env=breakout"],
    "Breakout, 2 ranks": ["train", "env=breakout", "distributed.nproc_per_node=2"],
}
ENV = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")


def seconds(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def to_first_iteration(args: list[str], run_dir: Path) -> float:
    """Seconds from the command to its "run folder" line; the run is stopped there."""
    cmd = [sys.executable, "-m", "rlrun", *args, "logging.progress=plain", f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed = None
    for line in proc.stdout:
        if "run folder" in line:
            elapsed = time.perf_counter() - start
            proc.terminate()  # rlrun stops at the iteration boundary and writes its checkpoint: not timed
            break
    proc.stdout.close()
    proc.wait(timeout=120)
    if elapsed is None:
        raise SystemExit(f"{' '.join(cmd)} ended before its first iteration")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = [
        (
            "python -c 'import torch' (the floor)",
            [seconds([sys.executable, "-c", "import torch"]) for _ in range(args.runs)],
        )
    ]
    for name, cmd in CONFIG_COMMANDS.items():
        rows.append((name, [seconds([sys.executable, "-m", "rlrun", *cmd]) for _ in range(args.runs)]))
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in TRAINING.items():
            times = [to_first_iteration(cmd, Path(tmp) / f"run{len(rows)}-{i}") for i in range(args.runs)]
            rows.append((f"{name}: command to first iteration", times))
    floor = statistics.median(rows[0][1])
    print(f"\n{os.cpu_count()} cores, median of {args.runs} runs")
    print("| what | seconds (median) | min - max | x torch import |")
    print("|---|---|---|---|")
    for name, times in rows:
        median = statistics.median(times)
        print(f"| {name} | {median:.2f} | {min(times):.2f} - {max(times):.2f} | {median / floor:.2f} |")


if __name__ == "__main__":
    main()
