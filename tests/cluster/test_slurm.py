"""rlrun on a real SLURM (a single-node cluster on this machine, tests/slurm_cluster.py) through Hydra's submitit
launcher and the conf/hydra/launcher/slurm.yaml preset: a job of 2 tasks trains as 2 ranks, and a job warned of
its end (`scancel --signal=USR2`, what SLURM sends signal_delay_s before a time limit) checkpoints, is requeued and
finishes where it stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import slurm_cluster
from tests.conftest import cli_env, read_jsonl

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.serial]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if slurm_cluster.missing() is not None:
        pytest.skip(f"no local SLURM: {slurm_cluster.missing()}")
    folder = tmp_path_factory.mktemp("slurm")
    try:
        env = slurm_cluster.start(folder)
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        pytest.skip(f"the local SLURM did not start: {e}")
    try:
        yield env
    finally:
        slurm_cluster.stop(folder, env)


def sweep(slurm: dict | None, folder: Path, *overrides: str) -> subprocess.Popen:
    """`rlrun train -m hydra/launcher=slurm` of one job of 2 tasks (one CPU each) into folder/sweep; submitit's
    local executor instead when `slurm` is None."""
    local = ["hydra/launcher=submitit_local"]
    launcher = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1"] if slurm else local
    cmd = [sys.executable, "-m", "rlrun", "train", "-m", *launcher, "hydra.launcher.tasks_per_node=2"]
    cmd += [f"hydra.sweep.dir={folder / 'sweep'}", "logging.progress=plain"]
    cmd += ["eval.every_steps=0", "eval.episodes=2", "eval.num_envs=2", *overrides]
    env = cli_env() | ({"SLURM_CONF": slurm["SLURM_CONF"]} if slurm else {})
    return subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(params=[pytest.param("slurm", marks=pytest.mark.slurm), "submitit_local"])
def cluster(request):
    return request.getfixturevalue("slurm") if request.param == "slurm" else None


@pytest.mark.timeout(240)
def test_a_two_task_job_trains_as_two_ranks_with_rank_zero_writing(cluster, tmp_path):
    out = finish(sweep(cluster, tmp_path, "total_steps=4096", "seed=3"), 180)
    run = tmp_path / "sweep" / "0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2, out[-3000:]
    assert summary["env_steps"] == 4096 and len(set(summary["parameter_digests"])) == 1
    assert len(summary["episodes_per_rank"]) == 2
    files = {".hydra", "checkpoints", "metrics.jsonl", "summary.json", "tb", "train.log"}
    assert {p.name for p in run.iterdir()} == files
    assert len(list((run / "tb").iterdir())) == 1  # one TensorBoard stream: rank 0's


@pytest.mark.slurm
@pytest.mark.timeout(360)
def test_a_warned_job_checkpoints_is_requeued_and_finishes_where_it_stopped(slurm, tmp_path):
    total = 49152
    proc = sweep(slurm, tmp_path, f"total_steps={total}", "checkpoint.every_steps=8192", "logging.every_steps=2048")
    run = tmp_path / "sweep" / "0"
    try:
        deadline = time.monotonic() + 120
        while not list((run / "checkpoints").glob("ckpt_*.pt")) and time.monotonic() < deadline:
            time.sleep(0.1)
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm, capture_output=True, text=True, timeout=30)
        job = jobs.stdout.split()[0]
        subprocess.run(["scancel", "--signal=USR2", job], env=slurm, check=True, timeout=30)
    finally:
        out = finish(proc, 300)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["requeues"] == 1, out[-3000:]
    assert summary["env_steps"] == total and len(set(summary["parameter_digests"])) == 1
    assert "/checkpoints/ckpt_" in summary["resumed_from"]
    log = (run / "train.log").read_text()
    assert "Requeued job" in log and f"resumed from {summary['resumed_from']}" in log
    steps = [m["env_steps"] for m in read_jsonl(run / "metrics.jsonl") if "charts/iteration" in m]
    assert steps == list(range(2048, total + 1, 2048))  # no step lost or logged twice across the requeue
