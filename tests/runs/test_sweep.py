"""Sweeps through the real CLI (basic and joblib launchers, the Optuna sweeper) and `rlrun report` on them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlrun.report import curves_figure, find_runs, group_runs
from rlrun.run_folder import held
from tests.conftest import ALE_PY_INIT, children, cli_env, finish, rlrun, signalling_site

SHORT = ["total_steps=2048", "eval.episodes=2", "eval.num_envs=2", "eval.every_steps=1024", "logging.progress=none"]
FRAGILE = (
    "import gymnasium as gym\n"
    "class Fragile(gym.Wrapper):\n"
    "    def __init__(self):\n"
    "        super().__init__(gym.make('CartPole-v1'))\n"
    "        self.t = 0\n"
    "    def step(self, action):\n"
    "        self.t += 1\n"
    "        if self.t == 100:\n"
    "            raise RuntimeError('fragile env broke')\n"
    "        return self.env.step(action)\n"
    "gym.register('Fragile-v0', entry_point=Fragile)\n"
)


def run_sweep(tmp_path: Path, *args: str) -> Path:
    """`rlrun train -m ARGS` (short jobs) into tmp_path/sweep; fails the test if the sweep itself fails."""
    sweep = tmp_path / "sweep"
    out = rlrun("train", "-m", *args, *SHORT, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    # The folder `rlrun report` reads, at the start and the end; no plugin's setup noise (Optuna's alembic).
    assert out.stdout.startswith(f"sweep folder: {sweep}\n"), out.stdout[:500]
    assert out.stdout.endswith(f"sweep done; report with: rlrun report {sweep}\n"), out.stdout[-500:]
    assert "setup plugin" not in out.stdout
    return sweep


def summaries(sweep: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/summary.json")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_then_report_matches_the_runs_own_summaries(tmp_path):
    sweep = run_sweep(tmp_path, "algo.lr=1e-3,3e-4", "seed=1,2")
    runs = summaries(sweep)
    assert len(runs) == 4 and all(s["status"] == "completed" for s in runs.values())

    out = rlrun("report", str(sweep), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "algo.lr=0.001" in out.stdout and "algo.lr=0.0003" in out.stdout
    groups = {g.label: g.row("eval") for g in group_runs(find_runs([sweep]))}
    assert set(groups) == {"algo.lr=0.001", "algo.lr=0.0003"}
    for name, row in groups.items():
        lr = name.split("=")[1]
        finals = [s["eval_return_mean"] for s in runs.values() if f"algo.lr={lr}" in s["overrides"]]
        assert row["env"] == "CartPole-v1" and row["runs"] == 2 and row["failed"] == 0
        assert row["mean"] == pytest.approx(np.mean(finals)) and row["median"] == pytest.approx(np.median(finals))
        assert row["best"] == max(finals) and row["iqm"] == pytest.approx(np.mean(finals))
        assert min(finals) <= row["ci_low"] <= row["ci_high"] <= max(finals)
    markdown = (sweep / "report.md").read_text()
    assert "| algo.lr=0.001 | 2 | 0 |" in markdown
    png = (sweep / "learning_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    (ax,) = curves_figure(group_runs(find_runs([sweep])), "eval").axes
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == [
        "algo.lr=0.0003 (n=2: interval not meaningful)",
        "algo.lr=0.001 (n=2: interval not meaningful)",
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_preset_decision_reads_as_typed_in_summaries_and_the_report(tmp_path):
    """env.id=Acrobot-v1 on the cartpole group: the pre-flight adds `~tuned` (CartPole's presets do not apply), which
    Hydra's sweeper hands each job as `~tuned=null`; the summaries and the report say `~tuned`."""
    sweep = run_sweep(tmp_path, "env.id=Acrobot-v1", "algo.lr=1e-3,3e-4")
    assert [s["overrides"].count("~tuned") for s in summaries(sweep).values()] == [1, 1]
    out = rlrun("report", str(sweep), cwd=tmp_path)
    assert out.returncode == 0 and "~tuned" in out.stdout and "=null" not in out.stdout, out.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    (tmp_path / "fragile_envs.py").write_text(FRAGILE)
    sweep = run_sweep(tmp_path, "env.id=Fragile-v0,CartPole-v1", "env.imports=[fragile_envs]")
    runs = summaries(sweep)
    assert runs["0"]["status"] == "failed" and "fragile env broke" in runs["0"]["error"]
    assert runs["1"]["status"] == "completed"
    rows = {g.env_id: g.row("eval") for g in group_runs(find_runs([sweep]))}  # one group per env
    assert rows["Fragile-v0"]["failed"] == 1 and rows["CartPole-v1"]["failed"] == 0


@pytest.mark.slow  # a sweep stopped, then resumed
@pytest.mark.timeout(300)
def test_a_signal_stops_a_sweep_with_the_line_that_continues_the_sweep(tmp_path):
    """SIGINT in the first job of a basic-launcher sweep: that job stops with its checkpoint and resume line, the
    jobs after it do not start, and the console's last line continues the whole sweep, not the one job, which then
    completes as one group of runs."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "rlrun", "train", "-m", "seed=0,1", "total_steps=400000", "logging.progress=plain"]
    cmd += ["logging.every_steps=2048", "eval.episodes=1", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=cli_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        for line in proc.stdout or []:
            if line.startswith("env_steps=2048 "):
                break
        proc.send_signal(signal.SIGINT)
    finally:
        out = finish(proc, 60)[0]
    assert proc.returncode == 128 + signal.SIGINT and "Traceback" not in out, out[-3000:]
    assert out.strip().splitlines()[-1] == f"continue the sweep with: rlrun train resume={sweep}", out[-2000:]
    assert json.loads((sweep / "0" / "summary.json").read_text())["status"] == "interrupted"
    assert not (sweep / "1").exists()

    # Continued with a smaller budget: job 0 from its checkpoint, job 1 from the start. Job 1 takes the budget the
    # sweep began with into its identity, as job 0 keeps it, so the report has one group of two runs (it had two).
    out = rlrun("train", f"resume={sweep}", "total_steps=4096", cwd=tmp_path, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = summaries(sweep)
    assert [runs[j]["status"] for j in "01"] == ["completed"] * 2
    assert runs["1"]["overrides"].count("total_steps=400000") == 1, runs["1"]["overrides"]
    assert runs["1"]["sessions"][0]["overrides"].count("total_steps=4096") == 1
    (group,) = group_runs(find_runs([sweep]))
    assert len(group.runs) == 2


@pytest.mark.timeout(240)
def test_a_job_whose_folder_another_job_holds_writes_nothing_there_and_the_sweep_goes_on(tmp_path):
    """Job 0's folder held (as by a live job of another sweep in the same folder): job 0 is refused without a failed
    summary.json in that job's folder, whose own summary is still to come; job 1 runs."""
    sweep = tmp_path / "sweep"
    with held(sweep / "0"):
        out = rlrun("train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        "job 0 failed: run folder" in out.stdout + out.stderr and "is in use by another job" in out.stdout + out.stderr
    )
    assert not (sweep / "0" / "summary.json").exists()
    assert summaries(sweep)["1"]["status"] == "completed"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_joblib_jobs_run_in_parallel_and_split_the_cores(tmp_path):
    sweep = run_sweep(tmp_path, "seed=1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    runs = summaries(sweep)
    assert len(runs) == 2 and all(s["status"] == "completed" for s in runs.values())
    assert all(s["threads"] == max(1, (os.cpu_count() or 1) // 2) for s in runs.values())


def start_parallel_sweep(tmp_path: Path, seeds: str) -> tuple[subprocess.Popen, Path, list[int]]:
    """A joblib sweep of long jobs, two at a time, in a session of its own (as a terminal runs a command), returned
    once both first jobs are training (each has logged metrics), with its worker processes' pids."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "rlrun", "train", "-m", f"seed={seeds}", "hydra/launcher=joblib"]
    cmd += ["hydra.launcher.n_jobs=2", "total_steps=400000", "logging.every_steps=512", "eval.episodes=1"]
    cmd += ["logging.progress=plain", f"hydra.sweep.dir={sweep}"]
    log = (tmp_path / "sweep.out").open("w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), text=True, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not all((sweep / job / "metrics.jsonl").exists() for job in "01") and time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "sweep.out").read_text()[-3000:]
        time.sleep(0.2)
    return proc, sweep, children(proc.pid)


def alive(pids: list[int], wait: float) -> list[int]:
    """The pids of `pids` still running (not zombies) after up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        left = [
            pid for pid in pids if Path(f"/proc/{pid}").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def signal_parallel_sweep(
    tmp_path: Path, seeds: str, send: Callable[[subprocess.Popen, list[int]], None], wait: float = 60
) -> tuple[subprocess.Popen, Path, str, list[int]]:
    """start_parallel_sweep, then send(its process, its two loky workers' pids) and wait for it to end: the process,
    the sweep folder, its output, and the workers still running 10 s after it ended (killed then)."""
    proc, sweep, workers = start_parallel_sweep(tmp_path, seeds)
    try:
        loky = [pid for pid in workers if b"LokyProcess" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(loky) == 2, workers
        send(proc, loky)
        proc.wait(timeout=wait)
    finally:
        finish(proc, 10)
        left = alive(workers, 10)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    return proc, sweep, (tmp_path / "sweep.out").read_text(), left


def stopped_with_a_checkpoint(run_dir: Path, signum: int) -> dict:
    """The summary of a job a signal stopped at an iteration boundary, checked: interrupted by `signum`, not at once,
    with its checkpoint at the steps it stopped at and no partial one."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signum, summary
    assert summary.get("stopped") != "at once (a second signal)", summary
    assert (run_dir / "checkpoints" / f"ckpt_{summary['env_steps']:012d}.pt").exists()
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    return summary


@pytest.mark.slow  # two workers' start-ups, and a resume
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigterm-to-a-worker"])
def test_a_signal_stops_a_parallel_sweep_with_a_checkpoint_in_each_running_job(tmp_path, how):
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM to the sweep's process, or to one worker alone,
    while a joblib sweep runs two of its three jobs: both stop at their next iteration with a checkpoint and an
    interrupted summary (Hydra's joblib launcher killed them mid-checkpoint, or on SIGTERM left them training and
    starting the third job), the third does not start, no worker is left, and the last line continues the sweep,
    which then completes."""

    def send(proc: subprocess.Popen, loky: list[int]) -> None:
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        elif how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:  # a signal only that job got: the other one stops with it
            os.kill(loky[0], signal.SIGTERM)

    proc, sweep, out, left = signal_parallel_sweep(tmp_path, "0,1,2", send)
    signum = signal.SIGINT if how == "ctrl-c" else signal.SIGTERM
    assert proc.returncode == 128 + signum and "Traceback" not in out, out[-3000:]
    assert not left, f"workers left running: {left}"
    assert out.strip().splitlines()[-1] == f"continue the sweep with: rlrun train resume={sweep}", out[-2000:]
    steps = [stopped_with_a_checkpoint(sweep / job, signum)["env_steps"] for job in "01"]
    assert not (sweep / "2").exists()
    if how == "sigterm":  # the sweep continues from there, with the same launcher
        end = f"total_steps={max(steps) + 2048}"
        resumed = rlrun("train", f"resume={sweep}", end, "logging.progress=none", cwd=tmp_path, timeout=200)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert [json.loads((sweep / j / "summary.json").read_text())["status"] for j in "012"] == ["completed"] * 3


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("to", ["the sweep", "a worker", "all"])
def test_a_schedulers_warning_stops_a_parallel_sweep_with_a_checkpoint_in_each_job(tmp_path, to):
    """SIGUSR1 (SLURM's --signal before a time limit or preemption) to a joblib sweep's process, to one worker, or to
    every process of the job step, as SLURM sends it: each job stops at its next iteration with a checkpoint (a
    worker that gets the warning twice, from SLURM and from the sweep, takes it for one), the sweep's last line
    continues it, and the sweep process then ends by the warning's own handler (its default here), as a single run
    does. The sweep process died of it at once before, and then the workers' jobs took a second signal from their
    orphaning and stopped without their checkpoints."""

    def send(proc: subprocess.Popen, loky: list[int]) -> None:
        for pid in {"the sweep": [proc.pid], "a worker": loky[:1], "all": [proc.pid, *loky]}[to]:
            os.kill(pid, signal.SIGUSR1)

    proc, sweep, out, left = signal_parallel_sweep(tmp_path, "0,1", send)
    assert proc.returncode == -signal.SIGUSR1 and "Traceback" not in out, out[-3000:]
    assert not left, f"workers left running: {left}"
    assert out.strip().splitlines()[-1] == f"continue the sweep with: rlrun train resume={sweep}", out[-2000:]
    for job in "01":
        stopped_with_a_checkpoint(sweep / job, signal.SIGUSR1)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_signal_while_a_workers_job_loads_ale_py_stops_the_sweep_in_one_line(tmp_path):
    """SIGTERM to a joblib sweep's worker while its job's env loads ale_py, inside the C++ initialisation that makes
    its enums through Python (a sitecustomize sends it from there): the job's handler raised inside it and ended the
    worker in std::terminate ('nanobind::python_error'), so the sweep ended as if a worker had died. ale_py now loads
    with the signals held in a worker as in the CLI: the jobs stop during start-up, no worker is left, and the sweep's
    last line continues it."""
    in_a_worker = "b'LokyProcess' in open('/proc/self/cmdline', 'rb').read()"  # not the sweep's process
    (tmp_path / "sitecustomize.py").write_text(signalling_site(*ALE_PY_INIT, where=in_a_worker))
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "rlrun", "train", "-m", "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    cmd += ["env=breakout", "total_steps=2048", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**cli_env(), "PYTHONPATH": str(tmp_path)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=150)
    finally:
        finish(proc, 10)
        left = alive(children(proc.pid), 10)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert (tmp_path / "sent").exists(), out[-3000:]  # inside ale_py's initialisation, in a worker
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in out and "died" not in out, out[-3000:]
    assert not left, f"workers left running: {left}"
    assert out.strip().splitlines()[-1] == f"continue the sweep with: rlrun train resume={sweep}", out[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_workers_of_a_killed_parallel_sweep_stop_with_a_checkpoint_and_end(tmp_path):
    """SIGKILL to a joblib sweep's process (no handler runs there): its workers notice, stop their jobs as SIGTERM
    would (checkpoint, interrupted summary), and end, where loky's would train on and then wait for good."""
    proc, sweep, workers = start_parallel_sweep(tmp_path, "0,1")
    try:
        proc.kill()
        proc.wait(timeout=10)
        left = alive(workers, 60)
    finally:
        for pid in alive(workers, 0):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"workers left running: {left}"
    for job in "01":
        stopped_with_a_checkpoint(sweep / job, signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dead_worker_ends_a_parallel_sweep_after_the_jobs_beside_it_stop_with_a_checkpoint(tmp_path):
    """SIGKILL to one worker of a joblib sweep (as the OOM killer would): loky kills the other workers at once, so
    their jobs lost what they had trained since their last checkpoint. The other job now stops with a checkpoint
    and an interrupted summary first, no worker is left, the sweep ends in one line naming the death and how to
    continue, and the continued sweep completes both jobs."""
    proc, sweep, out, left = signal_parallel_sweep(
        tmp_path, "0,1", lambda proc, loky: os.kill(loky[0], signal.SIGKILL), wait=90
    )
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    assert not left, f"workers left running: {left}"
    last = out.strip().splitlines()[-1]
    assert last.startswith("rlrun: error: a worker process of the sweep died") and last.endswith(
        f"continue the sweep with: rlrun train resume={sweep}"
    ), out[-2000:]
    assert "a worker process of the sweep died: this job stops with a checkpoint" in out, out[-3000:]
    ended = [job for job in "01" if (sweep / job / "summary.json").exists()]
    assert len(ended) == 1, ended  # the killed worker's job wrote none
    summary = stopped_with_a_checkpoint(sweep / ended[0], signal.SIGTERM)
    end = f"total_steps={summary['env_steps'] + 2048}"
    resumed = rlrun("train", f"resume={sweep}", end, "logging.progress=none", cwd=tmp_path, timeout=200)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [json.loads((sweep / j / "summary.json").read_text())["status"] for j in "01"] == ["completed"] * 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_optuna_sweeper_runs_trials_and_maximizes_the_returned_eval(tmp_path):
    sweep = run_sweep(tmp_path, "+sweep=ppo_cartpole_optuna", "hydra.sweeper.n_trials=3")
    runs = summaries(sweep)
    assert len(runs) == 3
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())["best_value"]
    assert best == max(s["eval_return_mean"] for s in runs.values())


@pytest.mark.slow  # `rlrun report` in a real process
def test_report_bad_input(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = rlrun("report", str(empty), cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().startswith("rlrun: error: report: no runs under")
    assert len(out.stderr.strip().splitlines()) == 1
    good, bad = tmp_path / "runs" / "good", tmp_path / "runs" / "bad"
    for folder in (good, bad):
        folder.mkdir(parents=True)
    (good / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "eval_return_mean": 10.0,
                "env_steps": 100,
                "wall_seconds": 1.0,
                "sps": 100.0,
                "overrides": ["algo.lr=0.1"],
            }
        )
    )
    (bad / "summary.json").write_text('{"status": "compl')
    out = rlrun("report", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "unreadable summary" in out.stderr + out.stdout
    assert (tmp_path / "runs" / "report.md").exists() and "algo.lr=0.1" in out.stdout


@pytest.mark.slow  # `rlrun report` in a real process
def test_report_on_a_sweep_still_running(tmp_path):
    """A job without a summary yet counts as running; its partial learning curve is drawn while no run of its
    group has completed."""
    done, running = tmp_path / "0", tmp_path / "1"
    for folder, lr in ((done, "0.1"), (running, "0.2")):
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text(f"- algo.lr={lr}\n- seed=1\n")
        lines = [json.dumps({"env_steps": 100 * i, "charts/episodic_return": float(i)}) for i in range(1, 4)]
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n" + '{"env_steps": 4')  # mid-write
    (done / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "eval_return_mean": 3.0,
                "env_steps": 300,
                "wall_seconds": 1.0,
                "sps": 300.0,
                "overrides": ["algo.lr=0.1", "seed=1"],
            }
        )
    )
    with held(running):  # its job, live
        runs = {r.path.name: r for r in find_runs([tmp_path])}
        assert runs["0"].status == "completed" and runs["1"].status == "running"
        assert runs["1"].curve("train", "steps")[0].tolist() == [100.0, 200.0, 300.0]
        rows = {g.label: g.row("eval") for g in group_runs(list(runs.values()))}
        assert rows["algo.lr=0.1"]["mean"] == 3.0 and rows["algo.lr=0.2"]["runs"] == 1
        assert rows["algo.lr=0.2"]["failed"] == 0 and rows["algo.lr=0.2"]["scored"] == 0
        (ax,) = curves_figure(group_runs(list(runs.values())), "train").axes
        assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["algo.lr=0.1 (n=1)", "algo.lr=0.2 (n=1)"]
        out = rlrun("report", str(tmp_path), "--metric", "train", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "1 of 2 runs still running" in out.stdout
    runs = {r.path.name: r for r in find_runs([tmp_path])}  # its job gone without a summary (killed)
    assert runs["1"].status == "killed"
    out = rlrun("report", str(tmp_path), "--metric", "train", cwd=tmp_path)
    assert (
        "not in the tables: 1 killed (no summary.json, no live job)" in out.stdout and "still running" not in out.stdout
    )
