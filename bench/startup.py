"""Start-up: how long rlrun's commands take to answer, through the real CLI, median of 5 runs each, printed beside
the import time of torch alone (the floor of anything that trains). Config commands (printing the config, --help,
a typo caught by the pre-flight) import no torch; training is timed from the command to the start of its first
iteration (the "run folder" line, logged right before the loop). Beside the seconds each takes, the CPU seconds
its processes used (user + system, children included), which other work on the machine changes far less.

    .venv/bin/python bench/startup.py [--runs 5] [--against DIR]

--against DIR times another checkout of rlrun too (its package on PYTHONPATH, e.g. `git worktree add /tmp/main
main`), each run of it right after one of this one, and prints the ratios (this / that) of their medians.
"""

from __future__ import annotations

import argparse
import os
import resource
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
HERE = str(Path(__file__).resolve().parent.parent)


def seconds(cmd: list[str], tree: str, cwd: Path) -> tuple[float, float]:
    """(seconds, CPU seconds) of a command that runs to its end. `cwd`: outside both trees (`python -m` looks in the
    working directory first)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = dict(ENV, PYTHONPATH=tree)
    subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by process `root` and every process under it (those already reaped included)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))  # ppid; utime..cstime
    mine, grew = {root}, True
    while grew:
        more = {pid for pid, (ppid, _) in stats.items() if ppid in mine} - mine
        mine, grew = mine | more, bool(more)
    return sum(stats[pid][1] for pid in mine if pid in stats) / os.sysconf("SC_CLK_TCK")


def to_first_iteration(args: list[str], run_dir: Path, tree: str) -> tuple[float, float]:
    """(seconds, CPU seconds) from the command to its "run folder" line; the run is stopped there."""
    cmd = [sys.executable, "-m", "rlrun", *args, "logging.progress=plain", f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    env = dict(ENV, PYTHONPATH=tree)
    proc = subprocess.Popen(
        cmd, env=env, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    took = None
    for line in proc.stdout:
        if "run folder" in line:
            took = time.perf_counter() - start, tree_cpu(proc.pid)
            proc.terminate()  # rlrun stops at the iteration boundary and writes its checkpoint: not timed
            break
    proc.stdout.close()
    proc.wait(timeout=120)
    if took is None:
        raise SystemExit(f"{' '.join(cmd)} ended before its first iteration")
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another checkout of rlrun to time beside this one")
    args = parser.parse_args()
    trees = [HERE] + ([str(args.against.resolve())] if args.against else [])
    rows: list[tuple[str, list[list[tuple[float, float]]]]] = []

    def timed(name: str, once) -> None:  # each run of every tree in turn, so both see the same load
        times: list[list[tuple[float, float]]] = [[] for _ in trees]
        for i in range(args.runs):
            for t, tree in enumerate(trees):
                times[t].append(once(tree, i))
        rows.append((name, times))

    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        floor = [sys.executable, "-c", "import torch"]
        timed("python -c 'import torch' (the floor)", lambda t, i: seconds(floor, t, cwd))
        for name, cmd in CONFIG_COMMANDS.items():
            timed(name, lambda t, i, cmd=cmd: seconds([sys.executable, "-m", "rlrun", *cmd], t, cwd))
        for name, cmd in TRAINING.items():
            run = f"run{len(rows)}"
            timed(
                f"{name}: command to first iteration",
                lambda t, i, c=cmd, r=run: to_first_iteration(c, cwd / f"{r}-{i}-{trees.index(t)}", t),
            )
    torch_wall = statistics.median(w for w, _ in rows[0][1][0])
    against = f"; against {trees[1]}" if args.against else ""
    print(f"\n{os.cpu_count()} cores, median of {args.runs} runs{against}; load average {os.getloadavg()[0]:.1f}")
    print("| what | seconds | min - max | x torch import | CPU seconds |" + (" ratio | CPU ratio |" if against else ""))
    print("|---|---|---|---|---|" + ("---|---|" if against else ""))
    for name, times in rows:
        wall, cpu = (statistics.median(x[k] for x in times[0]) for k in (0, 1))
        walls = [w for w, _ in times[0]]
        line = f"| {name} | {wall:.2f} | {min(walls):.2f} - {max(walls):.2f} | {wall / torch_wall:.2f} | {cpu:.2f} |"
        if against:
            peer_wall, peer_cpu = (statistics.median(x[k] for x in times[1]) for k in (0, 1))
            line += f" {wall / peer_wall:.2f} | {cpu / peer_cpu:.2f} |"
        print(line)


if __name__ == "__main__":
    main()
