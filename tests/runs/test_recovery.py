"""Nothing trained is lost when a run fails: a worker's env raising, an eval worker dying and a failing final
evaluation each leave a checkpoint of the last completed iteration and say how to continue, and the run
continues from it. Real CLI runs, real forked workers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import DATA, children, cli_env, read_jsonl, rlrun

# Not serial: no outcome here rests on timing (a dead worker is found within 10 s).
pytestmark = [pytest.mark.slow, pytest.mark.dist, pytest.mark.timeout(240)]

COMMON = ["env.imports=[recovery_envs]", "logging.progress=plain", "checkpoint.every_steps=0", "eval.episodes=2"]


def checkpoints(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("ckpt_*.pt"))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shutil.copy(DATA / "recovery_envs.py", tmp_path)  # Flaky-v0 and BadEval-v0
    return tmp_path


def test_worker_env_failure_leaves_a_recovery_checkpoint_the_run_continues_from(folder):
    run = folder / "run"
    (folder / "BREAK").touch()
    args = ["env.id=Flaky-v0", "env.vector.backend=subproc", "env.num_envs=4", "env.vector.num_workers=2"]
    out = rlrun("train", *COMMON, *args, "total_steps=20000", f"hydra.run.dir={run}", cwd=folder)
    assert out.returncode == 1 and "flaky env gave up" in out.stderr
    assert f"continue this run with: rlrun train resume={run}" in out.stdout
    (saved,) = checkpoints(run)  # no scheduled checkpoint yet: the recovery one
    state = torch.load(saved, weights_only=True)
    assert state["recovery"] and state["ranks"] == [] and 0 < state["env_steps"] < 300 * 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["resume"] == f"rlrun train resume={run}"

    # The episodes that ended before the boundary and were not logged yet (no log line before the failure) are
    # carried: the resume logs them, and each rank's count goes on (both were lost).
    unlogged = state["run_log"]["episodes"]
    assert unlogged > 0 and state["run_log"]["episodes_per_rank"] == [unlogged]

    (folder / "BREAK").unlink()
    out = rlrun("train", f"resume={run}", "total_steps=4096", cwd=folder)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    metrics = read_jsonl(run / "metrics.jsonl")
    steps = [m["env_steps"] for m in metrics]
    assert steps == sorted(steps) and steps[-1] == 4096
    logged = sum(m.get("charts/episodes", 0) for m in metrics)
    assert logged == summary["episodes"] == summary["episodes_per_rank"][0] > unlogged


def test_failing_final_evaluation_keeps_the_final_checkpoint(folder):
    run = folder / "run"
    args = ["env.id=BadEval-v0", "env.num_envs=2", "total_steps=2048", "eval.every_steps=0", "eval.num_envs=1"]
    out = rlrun("train", *COMMON, *args, f"hydra.run.dir={run}", cwd=folder)
    assert out.returncode == 1 and "eval env broke" in out.stderr
    (saved,) = checkpoints(run)
    assert torch.load(saved, weights_only=True)["env_steps"] == 2048  # written before the evaluation
    assert f"continue this run with: rlrun train resume={run}" in out.stdout


def test_a_dead_eval_worker_ends_the_run_at_once_with_a_recovery_checkpoint(folder):
    run = folder / "run"
    args = ["env.vector.backend=subproc", "env.vector.num_workers=1", "eval.num_envs=1", "logging.every_steps=256"]
    cmd = [sys.executable, "-m", "rlrun", "train", *COMMON, *args, "total_steps=10000000", f"hydra.run.dir={run}"]
    proc = subprocess.Popen(cmd, cwd=folder, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if "env_steps=" in line:  # training runs: the training worker and the eval worker are up
                break
        workers = sorted(children(proc.pid), key=_start_time)
        assert len(workers) == 2
        os.kill(workers[-1], signal.SIGKILL)  # the eval pool's worker, forked after the training one
        killed = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        assert time.monotonic() - killed < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert "eval env worker 0" in stderr and "SIGKILL" in stderr and "while idle" in stderr
    assert checkpoints(run) and torch.load(checkpoints(run)[-1], weights_only=True)["recovery"]
    assert f"continue this run with: rlrun train resume={run}" in stdout


def _start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
