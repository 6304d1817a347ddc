"""Continuing where a job stopped: resume=auto on an empty and on a populated run folder, and torch elastic's
restarts (distributed.max_restarts) resuming from the run's newest checkpoint after a rank is killed. Real runs
through the CLI, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import children, cli_env, free_port, read_jsonl, rlrun

pytestmark = [pytest.mark.slow]
QUICK = ["logging.progress=plain", "eval.every_steps=0", "eval.episodes=2", "eval.num_envs=2"]


def _iteration_steps(run) -> list[int]:
    return [m["env_steps"] for m in read_jsonl(run / "metrics.jsonl") if "charts/iteration" in m]


@pytest.mark.timeout(180)
def test_resume_auto_starts_fresh_in_an_empty_folder_and_continues_a_populated_one(tmp_path):
    """The same command line twice (config groups chosen on it, as a requeued job's line has them): a fresh run,
    then the run continued; a line whose groups name another algorithm is refused in one line, and one with nothing
    left to train says so, both writing nothing into the folder (neither .hydra/ nor train.log)."""
    run = tmp_path / "run"
    args = [
        "train",
        "algo=ppo",
        "env=cartpole",
        "resume=auto",
        "logging.every_steps=256",
        *QUICK,
        f"hydra.run.dir={run}",
    ]
    out = rlrun(*args, "total_steps=2048", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    first = json.loads((run / "summary.json").read_text())
    assert first["resumed_from"] is None and first["env_steps"] == 2048
    out = rlrun(*args, "total_steps=4096", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    second = json.loads((run / "summary.json").read_text())
    assert second["resumed_from"].endswith("ckpt_000000002048.pt") and second["env_steps"] == 4096
    assert _iteration_steps(run) == list(range(256, 4096 + 1, 256))
    written = [*(run / ".hydra").iterdir(), run / "train.log"]
    before = {p.name: p.read_bytes() for p in written}
    out = rlrun(*[a.replace("algo=ppo", "algo=a2c") for a in args], "total_steps=8192", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "resume=auto continues" in out.stderr and "this command line gives algo=a2c" in out.stderr
    assert {p.name: p.read_bytes() for p in written} == before
    out = rlrun(*args, "total_steps=4096", cwd=tmp_path)
    assert out.returncode == 0 and "is complete at 4096 env steps (total_steps=4096); nothing to do" in out.stdout
    out = rlrun(*args, "total_steps=2048", cwd=tmp_path)  # a smaller budget than it trained
    assert out.returncode == 0 and "has trained past total_steps, at 4096 env steps (total_steps=2048)" in out.stdout
    assert {p.name: p.read_bytes() for p in written} == before


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_an_elastic_restart_after_a_killed_rank_resumes_from_the_newest_checkpoint(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlrun", "train", "distributed.nproc_per_node=2", "distributed.max_restarts=1"]
    cmd += ["total_steps=16384", "checkpoint.every_steps=4096", "logging.every_steps=512", *QUICK]
    cmd += [f"hydra.run.dir={run}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not list((run / "checkpoints").glob("ckpt_*.pt")) and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = sorted(children(proc.pid))
        assert len(ranks) == 2 and proc.poll() is None
        os.kill(ranks[-1], signal.SIGKILL)
        output = proc.communicate(timeout=180)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["env_steps"] == 16384 and summary["status"] == "completed"
    assert len(set(summary["parameter_digests"])) == 1
    assert "restart 1 of the job: resuming from" in (run / "train.log").read_text()
    # Every iteration logged once: the restarted run dropped what it had logged past its checkpoint and went on.
    assert _iteration_steps(run) == list(range(512, 16384 + 1, 512))


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_a_rank_waiting_for_a_missing_peer_dies_of_sigterm(tmp_path):
    """A rank still forming the process group (here rank 0 of 2, whose peer never comes) ends on SIGTERM, which is
    what it gets when its launcher dies, instead of waiting out the group's 30-minute timeout."""
    env = cli_env() | {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "rlrun", "train", *QUICK, f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run" / "train.log").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # past the env set-up, into the rendezvous
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM
