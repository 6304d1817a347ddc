"""`rlrun train -m seed=... hydra/launcher=batched`: seeds trained side by side in one process, each in the folder and
with the contents a single run has, which play, report and resume= take as a single run's; a seed that fails ends
alone, a signal stops every seed with its checkpoint, and `rlrun train resume=SWEEP` continues each seed exactly."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlrun.envs import env_seeds
from tests.conftest import (
    DATA,
    assert_run_folder,
    cli_env,
    final_state,
    finish,
    metric_steps,
    read_jsonl,
    rlrun,
    tensors_in,
    wandb_run,
)

mlflow_tracking = pytest.importorskip("mlflow.tracking")

SHORT = ["total_steps=512", "eval.episodes=2", "logging.every_steps=256", "logging.progress=plain"]


def batch(tmp_path: Path, name: str, seeds: str, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    """A batched seed sweep in tmp_path/name (of `args`, SHORT by default) that must succeed; its folder and
    output."""
    sweep = tmp_path / name
    args = args or tuple(SHORT)
    out = rlrun(
        "train", "-m", f"seed={seeds}", "hydra/launcher=batched", f"hydra.sweep.dir={sweep}", *args, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"Training {len(seeds.split(','))} seeds in one process" in out.stdout
    return sweep, out


def losses(run: Path) -> list[dict]:
    """metrics.jsonl without what depends on the clock."""
    return [{k: v for k, v in m.items() if k.startswith(("losses/", "charts/episodic", "env_steps"))} for m in
            read_jsonl(run / "metrics.jsonl")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_batched_seeds_write_single_runs_that_play_report_and_resume(tmp_path):
    sweep, _ = batch(tmp_path, "a", "0,1,2")
    for job, seed in enumerate((0, 1, 2)):
        run = sweep / str(job)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["seed"] == seed and summary["env_steps"] == 512
        assert_run_folder(run, summary)
        assert Path(summary["final_checkpoint"]).parent == run / "checkpoints"
        log = (run / "train.log").read_text()
        assert f"run folder {run}:" in log and "3 seeds batched" in log
        assert all(f"run folder {sweep / str(other)}:" not in log for other in {0, 1, 2} - {job})
    assert losses(sweep / "0") != losses(sweep / "1")  # the seeds trained apart
    # Seed 0 beside other seeds (and fewer of them) trains to the same numbers.
    assert losses(batch(tmp_path, "b", "0,5")[0] / "0") == losses(sweep / "0")

    out = rlrun("play", f"checkpoint={sweep / '1'}", "episodes=2", f"hydra.run.dir={tmp_path / 'play'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    out = rlrun("report", str(sweep), cwd=tmp_path)
    assert out.returncode == 0 and "3 runs in 1 group" in out.stdout, out.stderr[-2000:]
    out = rlrun("train", f"resume={sweep / '2'}", "total_steps=1024", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((sweep / "2" / "summary.json").read_text())
    assert summary["status"] == "completed" and [s["end_steps"] for s in summary["sessions"]] == [512, 1024]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_what_a_batch_does_not_train_is_refused_in_one_line_before_any_folder(tmp_path):
    out = rlrun(
        "train", "-m", "seed=0,1", "hydra/launcher=batched", "model=lstm", "env.vector.backend=subproc", cwd=tmp_path
    )
    assert out.returncode == 2 and not (tmp_path / "outputs").exists()
    line = out.stderr.strip()
    assert "\n" not in line and "not model=lstm, env.vector.backend=subproc" in line
    assert "PPO and A2C with model=mlp" in line
    out = rlrun("train", "-m", "seed=0,1", "hydra/launcher=batched", f"resume={tmp_path / 'ckpt.pt'}", cwd=tmp_path)
    assert out.returncode == 2 and not (tmp_path / "outputs").exists()
    assert (
        "not resume=PATH (run those without it; a batch continues with rlrun train resume=SWEEP_FOLDER)" in out.stderr
    )


FAILING = ["env.imports=[seed_envs]", "env.id=FailsForSeeds-v0", "env.num_envs=2", "logging.progress=plain"]


def failing_for(tmp_path: Path, fails: dict[int, str]) -> None:
    """The test env in tmp_path, failing as `fails` says for env 0 of each seed ({seed: "MODE STEP"})."""
    shutil.copy(DATA / "seed_envs.py", tmp_path)
    (tmp_path / "FAILS").write_text("".join(f"{env_seeds(seed, 0, 2)[0]} {how}\n" for seed, how in fails.items()))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_seed_that_fails_ends_alone_and_the_others_train_as_if_it_had_not_been_there(tmp_path):
    """Seeds 1, 2 and 3 of a batch of five fail, each as its single run would: a reward that overflows float32 (its
    gradient norm goes NaN in the update), an env that raises, a NaN observation (the env check). Each ends alone:
    its summary failed with the reason and its resume line, a finite recovery checkpoint at the iteration boundary
    before the failure (2 envs x 128 steps an iteration). Seeds 0 and 4 complete with the metrics and parameters they
    have in the same batch when no seed fails. (Against a batch of another size they agree to float rounding only:
    torch's batched kernels may sum in another order for another batch size.)"""
    failing_for(tmp_path, {1: "huge 600", 2: "raise 400", 3: "nan 900"})
    args = [*FAILING, "total_steps=2048", "logging.every_steps=256", "eval.every_steps=1024", "eval.episodes=2"]
    args += ["checkpoint.every_steps=0"]
    sweep, out = batch(tmp_path, "a", "0,1,2,3,4", *args)
    assert "seed=2 failed: RuntimeError: env gave up at its step 400; the other 4 seeds go on" in out.stdout
    expected = {
        1: ("the PPO gradient norm is NaN in iteration 5 (from env step 1,024)", 1024),
        2: ("RuntimeError: env gave up at its step 400", 768),
        3: ("env 0 returned a NaN observation in the iteration from env step 1,792 on rank 0", 1792),
    }
    for job, (error, steps) in expected.items():
        summary = json.loads((sweep / str(job) / "summary.json").read_text())
        assert summary["status"] == "failed" and error in summary["error"], summary
        assert summary["resume"] == f"rlrun train resume={sweep / str(job)}"
        (saved,) = (sweep / str(job) / "checkpoints").glob("ckpt_*.pt")
        state = torch.load(saved, weights_only=True)
        assert state["recovery"] and state["env_steps"] == steps
        assert all(torch.isfinite(t).all() for t in tensors_in(state["algo"]) if t.is_floating_point())
    (tmp_path / "FAILS").unlink()
    healthy, _ = batch(tmp_path, "b", "0,1,2,3,4", *args)
    for job in ("0", "4"):
        assert json.loads((sweep / job / "summary.json").read_text())["status"] == "completed"
        assert read_jsonl(sweep / job / "metrics.jsonl") == read_jsonl(healthy / job / "metrics.jsonl")
        a, b = tensors_in(final_state(sweep / job)["algo"]), tensors_in(final_state(healthy / job)["algo"])
        assert a and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert read_jsonl(sweep / "1" / "metrics.jsonl") != read_jsonl(healthy / "1" / "metrics.jsonl")


def start_batch(tmp_path: Path, sweep: Path, seeds: str, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rlrun", "train", "-m", f"seed={seeds}", "hydra/launcher=batched", *args]
    return subprocess.Popen([*cmd, f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_signal_stops_every_seed_with_its_checkpoint_and_the_sweep_resumes_with_one_tracked_run_each(tmp_path):
    """SIGTERM stops every seed at the same iteration boundary with its checkpoint, each summary `interrupted` with
    its own resume line, exit 143, the console's last line the sweep's; `rlrun train resume=SWEEP` continues every
    seed in its folder, and each seed is one W&B run and one MLflow run (several in one process), its own steps
    strictly increasing over both sessions."""
    sweep, store = tmp_path / "sweep", f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["eval.episodes=2", "logging.every_steps=512", "logging.progress=plain", "checkpoint.every_steps=1024"]
    args += ["logging.trackers=[wandb,mlflow]", "logging.wandb.mode=offline", f"logging.mlflow.tracking_uri={store}"]
    proc = start_batch(tmp_path, sweep, "0,1", *args, "total_steps=200000")
    try:
        for line in proc.stdout:
            if line.startswith("env_steps=1024 "):  # two intervals logged, in every writer
                break
        proc.send_signal(signal.SIGTERM)
    finally:
        out = finish(proc, 60)[0]
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in out, out[-3000:]
    assert out.strip().splitlines()[-1] == f"continue the sweep with: rlrun train resume={sweep}"
    summaries = [json.loads((sweep / str(job) / "summary.json").read_text()) for job in range(2)]
    for job, summary in enumerate(summaries):
        assert summary["status"] == "interrupted" and summary["signal"] == signal.SIGTERM
        assert summary["resume"] == f"rlrun train resume={sweep / str(job)}"
        assert summary["final_checkpoint"].endswith(f"ckpt_{summaries[0]['env_steps']:012d}.pt")
    stopped = summaries[0]["env_steps"]
    total = (stopped // 512 + 2) * 512  # a longer budget, ending on a logging interval

    out = rlrun("train", f"resume={sweep}", f"total_steps={total}", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "failed" not in out.stdout + out.stderr, out.stderr[-3000:]  # no tracker failed
    client = mlflow_tracking.MlflowClient(tracking_uri=store)
    mruns = {r.data.params["seed"]: r for r in client.search_runs(client.get_experiment_by_name("rlrun").experiment_id)}
    assert sorted(mruns) == ["0", "1"]
    ids = set()
    for job in range(2):
        summary = json.loads((sweep / str(job) / "summary.json").read_text())
        assert summary["status"] == "completed" and [s["end_steps"] for s in summary["sessions"]] == [stopped, total]
        w = wandb_run(sweep / str(job))
        assert len(w["files"]) == 2 and len(w["ids"]) == 1 and w["config"]["seed"] == job
        ids |= w["ids"]
        sps = metric_steps(w["history"], "charts/sps")
        assert sps == sorted(set(sps)) and sps[0] == 512 and sps[-1] == total
        mrun = mruns[str(job)]
        history = client.get_metric_history(mrun.info.run_id, "charts/sps")
        steps = [m.step for m in sorted(history, key=lambda m: m.timestamp)]
        assert steps == sorted(set(steps)) and steps[0] == 512 and steps[-1] == total
        assert mrun.info.status == "FINISHED" and mrun.data.metrics["summary/env_steps"] == total
    assert len(ids) == 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_second_signal_stops_every_seed_at_once_with_its_summary(tmp_path):
    """Two SIGINTs inside one rollout (seed 0's env is slow): every seed stops at once, each summary `interrupted`
    and saying so, exit 130, no traceback."""
    failing_for(tmp_path, {0: "slow 1"})
    sweep = tmp_path / "sweep"
    proc = start_batch(tmp_path, sweep, "0,1", *FAILING, "total_steps=200000", "checkpoint.every_steps=0")
    try:
        for line in proc.stdout:
            if "accelerations:" in line:  # training starts: a rollout of seed 0's takes about 0.5 s
                break
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
    finally:
        out = finish(proc, 60)[0]
    assert proc.returncode == 128 + signal.SIGINT and "Traceback" not in out, out[-3000:]
    for job in ("0", "1"):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["stopped"] == "at once (a second signal)"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_batch_resumed_from_its_sweep_folder_continues_each_seed_exactly(tmp_path):
    """A batch whose job died after its checkpoints at 1024 env steps (a copy with the later ones gone), resumed
    with `rlrun train resume=SWEEP`, ends with each seed's metrics and parameters those of the batch that ran on.
    The sweep's line chose a config group and got a preset from the pre-flight (~tuned: the env.id is not the
    group's), which the resumed jobs keep from their checkpoints."""
    failing_for(tmp_path, {})  # the test env, failing for no seed
    args = ["algo=ppo", *FAILING, "total_steps=2048", "checkpoint.every_steps=1024", "logging.every_steps=256"]
    full, out = batch(tmp_path, "full", "0,1", *args, "eval.every_steps=1024", "eval.episodes=2")
    assert "~tuned" in out.stdout
    part = tmp_path / "part"
    shutil.copytree(full, part)
    for job in ("0", "1"):
        (part / job / "summary.json").unlink()
        (part / job / "checkpoints" / f"ckpt_{2048:012d}.pt").unlink()
    out = rlrun("train", f"resume={part}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for job in ("0", "1"):
        assert read_jsonl(part / job / "metrics.jsonl") == read_jsonl(full / job / "metrics.jsonl")
        a, b = final_state(part / job), final_state(full / job)
        assert a["env_steps"] == 2048 and [s["end_steps"] for s in a["record"]["sessions"]] == [1024, 2048]
        assert all(torch.equal(x, y) for x, y in zip(tensors_in(a["algo"]), tensors_in(b["algo"]), strict=True))
        assert torch.equal(a["ranks"][0]["rng"], b["ranks"][0]["rng"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a2c_dqn_sac_and_td3_seeds_batch_into_single_runs_folders(tmp_path):
    """Each of the other algorithms trains its seeds in a batch (one sweep, a batch per algorithm) into folders that
    hold a single run's, with each seed's own learning; a seed's checkpoint resumes as a single run (its optimizers'
    states, three Adams for SAC, in torch.optim's format)."""
    discrete, continuous = tmp_path / "discrete", tmp_path / "continuous"
    for sweep, args in (
        (discrete, ["algo=a2c,dqn", "total_steps=1536"]),  # DQN's tuned CartPole: 128 updates per 256 steps from 1k
        # updates from 100 and 1000 transitions (the presets'), 4 at a time
        (continuous, ["algo=sac,td3", "env=pendulum", "env.num_envs=4", "total_steps=1024"]),
    ):
        out = rlrun(
            "train", "-m", "seed=0,1", *args, "model.hidden_sizes=[32,32]", "hydra/launcher=batched",
            f"hydra.sweep.dir={sweep}", "eval.episodes=1", "logging.every_steps=64", "checkpoint.every_steps=0",
            cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-4000:]
        assert out.stdout.count("Training 2 seeds in one process") == 2
    folders = {}  # (algo, seed) -> its run folder
    for run in [*discrete.iterdir(), *continuous.iterdir()]:
        if run.is_dir() and (run / "summary.json").exists():
            summary = json.loads((run / "summary.json").read_text())
            algo = next(o.split("=")[1] for o in summary["overrides"] if o.startswith("algo="))
            assert summary["status"] == "completed" and "2 seeds batched" in (run / "train.log").read_text()
            assert any(k.startswith("losses/") for m in read_jsonl(run / "metrics.jsonl") for k in m)
            folders[algo, summary["seed"]] = run
    assert sorted(folders) == [(a, s) for a in ("a2c", "dqn", "sac", "td3") for s in (0, 1)]
    for algo in ("a2c", "dqn", "sac", "td3"):  # the two seeds of each batch trained apart
        assert losses(folders[algo, 0]) != losses(folders[algo, 1])
    out = rlrun("train", f"resume={folders['sac', 1]}", "total_steps=1088", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((folders["sac", 1] / "summary.json").read_text())
    assert summary["status"] == "completed" and [s["end_steps"] for s in summary["sessions"]] == [1024, 1088]
