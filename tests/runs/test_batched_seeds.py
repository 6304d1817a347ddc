"""`rlrun train -m seed=... hydra/launcher=batched`: seeds trained side by side in one process, each in the folder and
with the contents a single run has, which play, report and resume= take as a single run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_run_folder, read_jsonl, rlrun

SHORT = ["total_steps=512", "eval.episodes=2", "logging.every_steps=256", "logging.progress=plain"]


def batch(tmp_path: Path, name: str, seeds: str) -> Path:
    """A batched seed sweep in tmp_path/name that must succeed; returns its folder."""
    sweep = tmp_path / name
    out = rlrun(
        "train", "-m", f"seed={seeds}", "hydra/launcher=batched", f"hydra.sweep.dir={sweep}", *SHORT, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"Training {len(seeds.split(','))} seeds in one process" in out.stdout
    return sweep


def losses(run: Path) -> list[dict]:
    """metrics.jsonl without what depends on the clock."""
    return [{k: v for k, v in m.items() if k.startswith(("losses/", "charts/episodic", "env_steps"))} for m in
            read_jsonl(run / "metrics.jsonl")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_batched_seeds_write_single_runs_that_play_report_and_resume(tmp_path):
    sweep = batch(tmp_path, "a", "0,1,2")
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
    assert losses(batch(tmp_path, "b", "0,5") / "0") == losses(sweep / "0")

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
    assert "\n" not in line and "not model=lstm, env.vector.backend=subproc" in line and "PPO with model=mlp" in line
