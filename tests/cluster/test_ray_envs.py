"""env.vector.backend=ray with a real Ray: a two-node cluster on this machine (ray.cluster_utils, started by this
module, its driver work all in rlrun subprocesses) and a Ray the run starts itself. The same seed trains the same
model on sync, subproc and ray; a run spreads its actors over both nodes and learns; an env's exception, a killed
actor, actors that cannot be placed and Ctrl-C end the run promptly with a clear message and nothing left running."""

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

from tests.conftest import DATA, assert_same_tensors, cli_env, final_state, on_ray, rlrun, train

pytest.importorskip("ray.cluster_utils", reason="the ray extra is not installed")
pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.serial]

SHORT = ["total_steps=2048", "eval.episodes=2", "logging.progress=plain", "checkpoint.every_steps=0"]
TWO_ACTORS = [*SHORT, "env.vector.num_workers=2", "env.num_envs=4"]


@pytest.fixture(scope="module")
def fast_ray(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose two actors act for their envs (the fast path), made once for the two tests that read it."""
    return train(tmp_path_factory.mktemp("fast_ray"), "run", *TWO_ACTORS, *on_ray(ray_cluster))


def test_same_seed_trains_the_same_model_on_sync_subproc_and_ray(tmp_path, ray_cluster, fast_ray):
    # The reference (the rank acts, each step a round trip to the actors) and the fast path (each actor acts for
    # its envs, one call per rollout, with the rank's noise and weights) alike.
    def model(name: str, *backend: str) -> dict:
        return final_state(train(tmp_path, name, *TWO_ACTORS, "algo.fast=false", *backend))["algo"]["model"]

    sync = model("sync", "env.vector.backend=sync")
    assert_same_tensors(sync, model("subproc", "env.vector.backend=subproc"))
    assert_same_tensors(sync, model("ray", *on_ray(ray_cluster)))
    # Double-buffered, the policy acts for one half of the envs at a time: other draws, the same on both backends.
    double = "env.vector.double_buffer=true"
    assert_same_tensors(
        model("subproc_halves", "env.vector.backend=subproc", double), model("ray_halves", *on_ray(ray_cluster, double))
    )
    fast_subproc = final_state(train(tmp_path, "fast_subproc", *TWO_ACTORS, "env.vector.backend=subproc"))
    assert "acting in env workers" in (fast_ray / "train.log").read_text()
    assert_same_tensors(fast_subproc["algo"]["model"], final_state(fast_ray)["algo"]["model"])


def test_actors_on_both_nodes_train_cartpole(fast_ray):
    # That this run solves CartPole at full length: bench/learning/test_env_workers.py.
    assert "2 Ray env workers on 2 nodes" in (fast_ray / "train.log").read_text()
    summary = json.loads((fast_ray / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] == 2048, summary


def test_two_ranks_each_with_actors_of_their_own_stay_in_sync(tmp_path, ray_cluster):
    args = on_ray(ray_cluster, "env.vector.num_workers=2", "distributed.nproc_per_node=2", "env.num_envs=4", *SHORT)
    summary = json.loads((train(tmp_path, "run", *args) / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert len(set(summary["parameter_digests"])) == 1


def test_without_ray_installed_the_backend_says_how_to_get_it(tmp_path):
    (tmp_path / "no_ray").mkdir()
    (tmp_path / "no_ray" / "ray.py").write_text("raise ImportError('No module named ray')\n")  # as if not installed
    out = subprocess.run(
        [sys.executable, "-m", "rlrun", "train", "env.vector.backend=ray", *SHORT, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env={**cli_env(), "PYTHONPATH": str(tmp_path / "no_ray")}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert "env.vector.backend=ray needs Ray: pip install 'rlrun[ray]'" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("fast", [True, False])
def test_env_exception_in_an_actor_names_it_and_leaves_a_recovery_checkpoint(tmp_path, ray_cluster, fast):
    # Flaky-v0: CartPole whose 300th step raises while the file BREAK exists; imported by the actors from the rank's
    # working directory
    shutil.copy(DATA / "recovery_envs.py", tmp_path / "flaky_envs.py")
    (tmp_path / "BREAK").touch()
    run = tmp_path / "run"
    args = ["env.id=Flaky-v0", "env.imports=[flaky_envs]", "env.num_envs=4", f"algo.fast={fast}", *SHORT]
    out = rlrun("train", *on_ray(ray_cluster, "env.vector.num_workers=2"), *args, f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 1
    assert "Ray env worker 0 (node " in out.stderr and "raised in env 0 during " in out.stderr
    assert out.stderr.count("RuntimeError: flaky env gave up") == 1  # the actor's traceback, once
    assert f"continue this run with: rlrun train resume={run}" in out.stdout
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


def test_killed_actor_ends_the_run_within_seconds(tmp_path, ray_cluster):
    before = set(_actor_pids())
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlrun", "train", *on_ray(ray_cluster, "env.vector.num_workers=2"),
         "total_steps=10000000", "logging.progress=plain", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run" / "metrics.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        training = sorted(set(_actor_pids()) - before)
        assert training, "no actors came up"
        os.kill(training[0], signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - killed < 10
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1
    assert "died during " in stderr and "Ray env worker" in stderr
    assert list((tmp_path / "run" / "checkpoints").glob("ckpt_*.pt"))  # the recovery checkpoint


def test_actors_the_cluster_cannot_place_are_reported(tmp_path, ray_cluster):
    out = rlrun(
        "train", *on_ray(ray_cluster, "env.vector.ray_cpus_per_worker=3", "env.vector.step_timeout_s=5"), *SHORT,
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1
    assert "Ray env workers started within 5 s" in out.stderr and "env.vector.ray_cpus_per_worker" in out.stderr


def test_ctrl_c_stops_at_the_iteration_end_and_shuts_down_its_own_ray(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlrun", "train", "env.vector.backend=ray", "env.vector.num_workers=2",
         "total_steps=10000000", "logging.progress=plain", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "run" / "metrics.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and "stopped by signal 2" in out, out[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "interrupted"
    time.sleep(1)
    left = [cmd for pid, cmd in _processes() if _session_of(pid) == proc.pid]  # what the run started: its session
    assert not left, f"Ray processes outlived the run that started them: {left}"


def _actor_pids() -> list[int]:
    return [pid for pid, cmd in _processes() if cmd.startswith("ray::EnvActor")]


def _session_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def _processes() -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
            except OSError:
                continue
    return found
