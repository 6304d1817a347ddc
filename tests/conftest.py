"""Shared helpers: run the real CLI in a subprocess (with a timeout, reaped), and check no test leaves
processes behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


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
