"""Shared helpers: run the real CLI in a subprocess (with a timeout, reaped), and check no test leaves
processes behind."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rlrun.distributed import from_env

REPO = Path(__file__).resolve().parent.parent


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", SDL_VIDEODRIVER="dummy")
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def rlrun(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m rlrun ARGS` in `cwd`; subprocess.run kills the child if it outlives `timeout`."""
    return subprocess.run(
        [sys.executable, "-m", "rlrun", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_rank(rank: int, world: int, port: int, queue, job: Callable) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    ctx = from_env("cpu")
    ctx.init()
    try:
        queue.put((rank, job(ctx)))  # numpy or plain data: no tensor fd sharing to outlive the process
    finally:
        ctx.close()


def on_gloo_ranks(job: Callable, world: int = 2, timeout: float = 150) -> dict:
    """{rank: job(ctx)} from `world` spawned processes joined in a real gloo group on a free port; they are
    reaped (killed if they linger) before this returns. `job` must be picklable (module level or a partial)."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_gloo_rank, args=(r, world, port, queue, job)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return dict(queue.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def tensors_in(state) -> list[torch.Tensor]:
    """Every tensor in a state (nested dicts, lists and tuples), as a checkpoint holds them."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in tensors_in(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in tensors_in(v)]
    return []


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True, scope="session")
def no_processes_left_behind():
    yield
    left = {pid: _cmdline(pid) for pid in children(os.getpid())}
    # multiprocessing's own resource tracker (started by spawn-context queues) lives until pytest exits
    left = {pid: cmd for pid, cmd in left.items() if "resource_tracker" not in cmd}
    assert not left, f"tests left processes running: {left}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
