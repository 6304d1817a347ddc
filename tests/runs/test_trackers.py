"""Experiment trackers beside TensorBoard, through real CLI runs and the real packages: W&B in offline mode (its
.wandb run files read back record by record), MLflow with a sqlite store and through a real `mlflow server` on
localhost (read back with MlflowClient), TensorBoard's HParams read back from the events files. A run's scalars
arrive at their env steps; Ctrl-C then resume= keeps one tracked run with strictly increasing steps, its params as
first logged and one HParams entry; a sweep's jobs are one tracked run each, grouped by the sweep, and each one
HParams session; 2 ranks log from rank 0 only; a tracker that cannot be reached, or fails mid-run, is one warning
and a completed run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import cli_env, free_port, metric_steps, read_jsonl, rlrun, wandb_run

pytest.importorskip("wandb.proto.wandb_internal_pb2")
mlflow_client = pytest.importorskip("mlflow.tracking")

pytestmark = [pytest.mark.slow]

SMALL = ["eval.episodes=2", "eval.num_envs=2", "logging.every_steps=512", "logging.progress=plain"]


class MlflowServer:
    """A real MLflow tracking server on localhost (its own process group, a sqlite store in `folder`), started at
    once and waited for at its first use: it takes tens of seconds to come up, in which other tests run. mlflow 3's
    server needs SQLAlchemy 2, which the sweep extra (optuna < 3) keeps out of the venv: the Makefile installs it
    into .venv/mlflow-server, put before the venv's packages for the server only; rlrun's client runs as users run
    it, in the venv."""

    def __init__(self, folder: Path):
        libs = Path(sys.prefix) / "mlflow-server"
        self.store = f"sqlite:///{folder / 'server.db'}"
        self.uri = f"http://127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen | None = None
        self.missing = f"{libs} is missing: `make install` puts SQLAlchemy 2 there for the MLflow server"
        if not libs.is_dir():  # the tests that use the server fail, saying so; the others run
            return
        port = self.uri.rsplit(":", 1)[1]
        paths = [str(libs), *(p for p in cli_env().get("PYTHONPATH", "").split(os.pathsep) if p)]
        env = cli_env() | {"PYTHONPATH": os.pathsep.join(paths)}
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no job runner processes beside the one worker
        mlflow = Path(sys.executable).with_name("mlflow")
        cmd = [mlflow, "server", "--backend-store-uri", self.store, "--host", "127.0.0.1", "--port", port]
        cmd += ["--workers", "1", "--default-artifact-root", str(folder / "artifacts")]
        self.log = open(folder / "server.log", "w")
        self.proc = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def url(self, timeout: float = 180) -> str:
        """The server's URI, once it answers /health."""
        assert self.proc is not None, self.missing
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, Path(self.log.name).read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self.uri
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"mlflow server not up in {timeout} s: {Path(self.log.name).read_text()[-3000:]}")

    def kill(self) -> None:
        """The whole server (the mlflow command and its uvicorn worker) at once, as a crash would end it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module", autouse=True)
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    yield server
    server.kill()


def hparams_in(tb: Path) -> tuple[list[dict], list[str]]:
    """TensorBoard's HParams in a run's tb folder, read as TensorBoard reads them: every session start written in
    any of its events files (as {name: value}), and the metrics of its experiment (the EventAccumulator's)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

    sessions = []
    for path in sorted(tb.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == metadata.SESSION_START_INFO_TAG:
                    content = value.metadata.plugin_data.content
                    info = metadata.parse_session_start_info_plugin_data(content)
                    sessions.append({k: getattr(v, v.WhichOneof("kind")) for k, v in info.hparams.items()})
    accumulator = EventAccumulator(str(tb))
    accumulator.Reload()
    experiment = accumulator.PluginTagToContent("hparams")[metadata.EXPERIMENT_TAG]
    metrics = [m.name.tag for m in metadata.parse_experiment_plugin_data(experiment).metric_infos]
    return sessions, metrics


def last_scalar(tb: Path, tag: str) -> tuple[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tb))
    accumulator.Reload()
    point = accumulator.Scalars(tag)[-1]
    return point.step, point.value


def test_a_missing_tracker_package_or_name_is_one_line(tmp_path):
    out = rlrun("train", "logging.trackers=[neptune]", cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["rlrun: error: logging.trackers=[neptune]: accepted are wandb, mlflow"]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.timeout(200)
@pytest.mark.parametrize("given", [True, False], ids=["store-given", "mlflow-default-store"])
def test_a_sweep_is_one_tracked_run_per_job_grouped_by_the_sweep(tmp_path, given):
    """A 2-job multirun with both trackers, its jobs in parallel (joblib) on a new sqlite store, given or MLflow's
    default (mlflow.db in the working folder): 2 W&B runs in the sweep's group, 2 MLflow runs tagged with the sweep,
    each named by its job's own override, with its own seed and points, and no tracker failing (the two jobs opening
    the new store at once used to: "table already exists"); and in TensorBoard alone, each job one HParams session
    with its own seed, whose metric is its final evaluation."""
    sweep, store = tmp_path / "sweep", f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*SMALL, "total_steps=1024", "logging.trackers=[wandb,mlflow]", "logging.wandb.mode=offline"]
    args += [f"logging.mlflow.tracking_uri={store}"] if given else []
    args += ["logging.mlflow.experiment=sweep", "seed=3,4"]
    args += ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    out = rlrun("train", "-m", *args, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "failed" not in out.stdout + out.stderr, out.stderr[-3000:]
    group = f"{tmp_path.name}/sweep"
    runs = [wandb_run(sweep / job) for job in ("0", "1")]
    assert [r["group"] for r in runs] == [{group}, {group}]
    assert len(runs[0]["ids"] | runs[1]["ids"]) == 2
    assert [r["config"]["seed"] for r in runs] == [3, 4]
    assert all(metric_steps(r["history"], "charts/sps") == [512, 1024] for r in runs)

    client = mlflow_client.MlflowClient(tracking_uri=store)
    mruns = client.search_runs(client.get_experiment_by_name("sweep").experiment_id)
    assert sorted(r.data.params["seed"] for r in mruns) == ["3", "4"]
    assert {r.data.tags["rlrun.sweep"] for r in mruns} == {group}
    assert sorted(r.info.run_name for r in mruns) == ["seed=3", "seed=4"]
    for r in mruns:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "charts/sps")] == [512, 1024]

    for job, seed in (("0", 3), ("1", 4)):
        (session,), metrics = hparams_in(sweep / job / "tb")
        assert session["seed"] == seed and session["algo.name"] == "ppo" and session["env.id"] == "CartPole-v1"
        config = yaml.safe_load((sweep / job / ".hydra" / "config.yaml").read_text())
        assert session["algo.lr"] == pytest.approx(config["algo"]["lr"])
        assert session["env.num_envs"] == config["env"]["num_envs"] and session["algo.gamma"] == config["algo"]["gamma"]
        assert "eval/return_mean" in metrics
        final = json.loads((sweep / job / "summary.json").read_text())["eval_return_mean"]
        assert last_scalar(sweep / job / "tb", "eval/return_mean") == (1024, pytest.approx(final))


@pytest.mark.timeout(90)
def test_an_unreachable_mlflow_server_is_one_warning_and_the_run_completes(tmp_path):
    run = tmp_path / "run"
    args = [*SMALL, "total_steps=1024", "logging.trackers=[mlflow]", "logging.mlflow.tracking_uri=http://127.0.0.1:1"]
    start = time.monotonic()
    out = rlrun("train", *args, f"hydra.run.dir={run}", cwd=tmp_path, timeout=80)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "tracker" in line]
    assert len(lines) == 1, lines
    assert "tracker mlflow failed" in lines[0] and "127.0.0.1:1" in lines[0]
    assert "the run goes on with TensorBoard and metrics.jsonl" in lines[0]
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert read_jsonl(run / "metrics.jsonl")[-1]["env_steps"] == 1024
    assert list((run / "tb").iterdir())
    assert time.monotonic() - start < 60  # no minutes of retries


@pytest.mark.timeout(300)
def test_ctrl_c_then_resume_keeps_one_tracked_run_in_wandb_and_mlflow(tmp_path, mlflow_server):
    """Both trackers at once, MLflow through the tracking server: every scalar at its env step, the config logged
    once, then Ctrl-C and resume= with a longer budget: still one W&B run and one MLflow run, steps strictly
    increasing, params as first logged and the budget's change a tag, and one HParams entry in TensorBoard; then a
    resume from an older checkpoint starts a new tracked run naming that one."""
    run, server = tmp_path / "run", mlflow_server.url()
    args = [*SMALL, "logging.trackers=[wandb,mlflow]", "logging.wandb.mode=offline"]
    args += [f"logging.mlflow.tracking_uri={server}", "checkpoint.every_steps=1024", "checkpoint.keep_last=10"]
    cmd = [sys.executable, "-m", "rlrun", "train", *args, "total_steps=200000"]
    proc = subprocess.Popen([*cmd, f"hydra.run.dir={run}"], cwd=tmp_path, env=cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        for line in proc.stdout:
            if line.startswith("env_steps=1024 "):  # two intervals logged, in every writer
                break
        proc.send_signal(signal.SIGINT)
        first, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGINT, first
    stopped = json.loads((run / "summary.json").read_text())["env_steps"]
    total = (stopped // 512 + 2) * 512  # a longer budget, ending on a logging interval
    out = rlrun("train", f"resume={run}", f"total_steps={total}", cwd=tmp_path, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warning" not in out.stderr.lower() or "tracker" not in out.stderr, out.stderr
    jsonl_steps = [line["env_steps"] for line in read_jsonl(run / "metrics.jsonl")]

    w = wandb_run(run)
    assert len(w["files"]) == 2 and len(w["ids"]) == 1  # two sessions, one tracked run
    sps = metric_steps(w["history"], "charts/sps")
    assert sps == sorted(set(sps)) and sps[0] == 512 and sps[-1] == total
    entropy = metric_steps(w["history"], "losses/entropy")
    assert entropy == sorted(set(entropy)) and set(entropy) <= set(jsonl_steps)
    assert metric_steps(w["history"], "eval/return_mean") == [total]
    assert w["config"]["total_steps"] == 200000 and w["config"]["algo"]["name"] == "ppo"  # logged once
    assert f"total_steps_resumed:200000 -> {total}" in w["tags"]
    # The resume keeps the run's name and tags (its first session's overrides), the budget's change added.
    assert len(w["names"]) >= 2 and len(set(w["names"])) == 1 and "total_steps=200000" in w["names"][0], w["names"]
    assert "total_steps=200000" in w["tags"] and f"total_steps={total}" not in w["tags"]
    assert "W&B ran offline: upload this run with  wandb sync" in out.stdout + out.stderr

    client = mlflow_client.MlflowClient(tracking_uri=server)
    (mrun,) = client.search_runs(client.get_experiment_by_name("rlrun").experiment_id)
    history = client.get_metric_history(mrun.info.run_id, "charts/sps")
    steps = [m.step for m in sorted(history, key=lambda m: m.timestamp)]
    assert steps == sorted(set(steps)) and steps[0] == 512 and steps[-1] == total
    assert mrun.data.params["total_steps"] == "200000" and mrun.data.params["algo.name"] == "ppo"
    assert mrun.data.tags["rlrun.total_steps_resumed"] == f"200000 -> {total}"
    assert mrun.info.status == "FINISHED" and mrun.data.tags["rlrun.status"] == "completed"
    assert mrun.data.metrics["summary/env_steps"] == total
    assert json.loads((run / "trackers.json").read_text())["mlflow"]["id"] == mrun.info.run_id

    sessions, metrics = hparams_in(run / "tb")
    assert len(sessions) == 1 and sessions[0]["total_steps"] == 200000  # the first session's, not re-written
    assert metrics == ["eval/return_mean", "charts/episodic_return"]
    final = json.loads((run / "summary.json").read_text())["eval_return_mean"]
    assert last_scalar(run / "tb", "eval/return_mean") == (total, pytest.approx(final))

    # A resume from the older checkpoint at 1024 goes on in a new folder: a new tracked run naming its origin.
    branch = tmp_path / "branch"
    older = run / "checkpoints" / f"ckpt_{1024:012d}.pt"
    out = rlrun("train", f"resume={older}", "total_steps=1536", f"hydra.run.dir={branch}", cwd=tmp_path, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    b = wandb_run(branch)
    assert len(b["ids"]) == 1 and b["ids"] != w["ids"] and f"branched_from:{next(iter(w['ids']))}" in b["tags"]
    assert min(metric_steps(b["history"], "charts/sps")) > 1024
    runs = client.search_runs(client.get_experiment_by_name("rlrun").experiment_id)
    (new,) = [r for r in runs if r.info.run_id != mrun.info.run_id]
    assert new.data.tags["rlrun.branched_from"] == mrun.info.run_id
    assert len(hparams_in(branch / "tb")[0]) == 1  # the new folder's own entry


@pytest.mark.timeout(240)
def test_two_ranks_log_from_rank_0_once_and_a_server_dying_mid_run_is_one_warning(tmp_path, mlflow_server):
    """A 2-rank run (gloo on CPU) with both trackers: one W&B run with each step once, one MLflow run with each step
    once until the tracking server is killed mid-run; then one warning line, and the run completes with TensorBoard
    and metrics.jsonl to its end."""
    run, server = tmp_path / "run", mlflow_server.url()
    args = [*SMALL, "total_steps=8192", "distributed.nproc_per_node=2", "logging.trackers=[wandb,mlflow]"]
    args += ["logging.wandb.mode=offline", f"logging.mlflow.tracking_uri={server}", "logging.mlflow.experiment=ranks"]
    cmd = [sys.executable, "-m", "rlrun", "train", *args, f"hydra.run.dir={run}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("env_steps=2048 "):  # rank 0 has sent the points up to here
                mlflow_server.kill()
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    output = "".join(lines) + rest
    assert proc.returncode == 0, output[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    warnings = [line for line in output.splitlines() if "tracker" in line]
    assert len(warnings) == 1 and "tracker mlflow failed (log: " in warnings[0], warnings
    assert "the run goes on with TensorBoard and metrics.jsonl" in warnings[0]
    jsonl_steps = sorted({line["env_steps"] for line in read_jsonl(run / "metrics.jsonl")})
    assert jsonl_steps[-1] == 8192
    assert last_scalar(run / "tb", "charts/sps")[0] == 8192

    w = wandb_run(run)
    assert len(w["files"]) == 1 and len(w["ids"]) == 1
    assert metric_steps(w["history"], "charts/sps") == jsonl_steps  # each once: rank 0's
    assert w["config"]["distributed"]["nproc_per_node"] == 2

    # The dead server's store, read directly: one run, each step once, up to where the server died.
    client = mlflow_client.MlflowClient(tracking_uri=mlflow_server.store)
    (mrun,) = client.search_runs(client.get_experiment_by_name("ranks").experiment_id)
    steps = [m.step for m in sorted(client.get_metric_history(mrun.info.run_id, "charts/sps"), key=lambda m: m.step)]
    assert steps == [s for s in jsonl_steps if s <= steps[-1]] and 2048 <= steps[-1] < 8192
