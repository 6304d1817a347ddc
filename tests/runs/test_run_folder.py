"""A run folder under faults: a disk that fills up mid-run, or a folder that turns read-only, ends the run with one
line and leaves every earlier checkpoint loadable and no partial file; and one job at a time holds a run folder (a
second job on it ends with one line naming the holder before writing anything, a lock left by a killed job is taken
over). Real CLI runs on real small disks (a tmpfs, a read-only bind mount: the tests run as root) and real signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlrun.checkpoint import load_checkpoint
from tests.conftest import cli_env, rlrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUN = ("logging.progress=plain", "eval.episodes=2", "eval.num_envs=2")


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here (CI runs the tests as root, where it can): {done.stderr.strip()}")


@contextlib.contextmanager
def mounted(path: Path, *args: str) -> Iterator[Path]:
    """`mount ARGS path` for the block; unmounted after it, whatever happens."""
    path.mkdir(exist_ok=True)
    _mount(*args, str(path))
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """`path` read-only for the block (root ignores file modes: a read-only bind mount of it over itself)."""
    with mounted(path, "--bind", str(path)):
        _mount("-o", "remount,ro,bind", str(path))
        yield


def one_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
    return lines[0]


def files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under `folder` with its mtime and size: what a job that writes nothing leaves as it was."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


def test_a_full_disk_or_a_read_only_folder_ends_the_run_with_one_line_and_resume_continues(tmp_path):
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as disk:
        run = disk / "run"
        run.mkdir()
        # Room for about two checkpoints of CartPole's PPO (~140 kB each) and the logs; all of them kept.
        stat = os.statvfs(disk)
        (disk / "filler").write_bytes(bytes(stat.f_bavail * stat.f_frsize - 350_000))
        train = ("train", "total_steps=8192", "checkpoint.every_steps=1024", "checkpoint.keep_last=100", *RUN)
        out = rlrun(*train, f"hydra.run.dir={run}", cwd=tmp_path, timeout=180)
        assert out.returncode == 1, out.stderr[-3000:]
        saved = sorted((run / "checkpoints").glob("ckpt_*.pt"))
        assert 1 <= len(saved) <= 3
        line = one_line(out)
        assert line.startswith(f"rlrun: error: could not write {run}/") and "No space left on device (ENOSPC)" in line
        assert line.endswith(f"newest complete checkpoint: {saved[-1]}; continue with: rlrun train resume={run}")
        assert not list(run.rglob("*.tmp")) and not (run / ".rlrun.lock").exists()
        assert [load_checkpoint(path)["env_steps"] for path in saved] == [1024 * (i + 1) for i in range(len(saved))]
        summary = json.loads((run / "summary.json").read_text())  # written: the partial file's room took it
        assert summary["status"] == "failed" and summary["resume"] == f"rlrun train resume={run}"

        (disk / "filler").unlink()
        with read_only(run / "checkpoints"):
            out = rlrun("train", f"resume={run}", cwd=tmp_path, timeout=180)
        assert out.returncode == 1
        line = one_line(out)
        next_one = f"ckpt_{1024 * (len(saved) + 1):012d}.pt"
        assert f"{next_one}: Read-only file system (EROFS)" in line and f"resume={run}" in line
        assert sorted((run / "checkpoints").glob("ckpt_*.pt")) == saved

        out = rlrun("train", f"resume={run}", "checkpoint.keep_last=2", cwd=tmp_path, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["env_steps"] == 8192
        assert summary["resumed_from"] == str(saved[-1])


def test_one_job_holds_a_run_folder_and_a_lock_left_by_a_killed_job_is_taken_over(tmp_path):
    run = tmp_path / "run"
    args = [sys.executable, "-m", "rlrun", "train", "resume=auto", f"hydra.run.dir={run}", *RUN]
    first = subprocess.Popen(
        [*args, "total_steps=10000000", "checkpoint.every_steps=2048"],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(run.glob("checkpoints/ckpt_*.pt")) and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.2)
        holder = json.loads((run / ".rlrun.lock").read_text())
        assert holder["pid"] == first.pid and holder["host"] == os.uname().nodename
        # Stopped, the first job still holds the folder and writes nothing while the second tries it.
        first.send_signal(signal.SIGSTOP)
        before = files(run)
        second = rlrun("train", "resume=auto", f"hydra.run.dir={run}", *RUN, cwd=tmp_path, timeout=120)
        assert files(run) == before
        assert second.returncode == 2
        assert one_line(second) == (
            f"rlrun: error: run folder {run} is in use by another job (host {holder['host']}, pid {first.pid}, "
            f"since {holder['since']}); wait for it to end or choose another hydra.run.dir "
            f"(lock file {run}/.rlrun.lock)"
        )
        first.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGTERM)  # stops at the next iteration with a checkpoint, and releases the folder
        first.communicate(timeout=60)
        assert first.returncode == 128 + signal.SIGTERM and not (run / ".rlrun.lock").exists()
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    stopped_at = json.loads((run / "summary.json").read_text())["env_steps"]

    # A job killed outright leaves its lock file; the next job (a requeue) takes it over and resumes.
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = {"host": os.uname().nodename, "pid": dead.pid, "since": "2026-01-01 00:00:00 UTC"}
    (run / ".rlrun.lock").write_text(json.dumps(gone))
    out = rlrun("train", "resume=auto", f"hydra.run.dir={run}", f"total_steps={stopped_at + 512}", *RUN, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.strip() == (
        f"rlrun: run folder {run} was held by host {gone['host']}, pid {dead.pid}, since {gone['since']}, "
        "which is gone: taking it over"
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"].endswith(f"ckpt_{stopped_at:012d}.pt")
    assert not (run / ".rlrun.lock").exists()
