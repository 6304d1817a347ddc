"""Real training runs through the CLI: learning, run folder contents, determinism, exact resume, play."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    SMALL,
    assert_run_folder,
    assert_same_tensors,
    final_state,
    play_and_record,
    read_jsonl,
    rlrun,
    train,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SMALL run (checkpoints at 2048 and 4096 steps) that the tests below read and never change."""
    return train(tmp_path_factory.mktemp("small"), "run", *SMALL)


@pytest.mark.timeout(240)
def test_a_short_run_writes_its_folder_then_plays_and_records_a_video(tmp_path, small):
    # That the default run solves CartPole and plays it back solved: bench/learning/test_ppo.py.
    run = small
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] == 4096 and summary["eval_episodes"] == 4
    assert math.isfinite(summary["eval_return_mean"])
    assert len(list((run / "checkpoints").glob("ckpt_*.pt"))) == 2
    assert_run_folder(run, summary)
    assert math.isfinite(play_and_record(run, tmp_path))


@pytest.mark.timeout(180)
def test_short_runs_of_the_reference_alone_and_of_pendulum_complete(tmp_path):
    # That both learn (the reference solves CartPole, PPO improves on Pendulum): bench/learning/test_ppo.py.
    # algo.fast=false: rlrun/algos/ppo.py as written (autograd, torch.optim.Adam, torch acting), nothing swapped.
    reference = train(tmp_path, "reference", *SMALL, "algo.fast=false", "total_steps=2048")
    assert "accelerations: none" in (reference / "train.log").read_text()
    pendulum = train(tmp_path, "pendulum", *SMALL, "env=pendulum", "algo.num_steps=512", "total_steps=2048")
    for run in (reference, pendulum):
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and math.isfinite(summary["eval_return_mean"]), summary
        losses = [m["losses/value_loss"] for m in read_jsonl(run / "metrics.jsonl") if "losses/value_loss" in m]
        assert losses and all(math.isfinite(v) for v in losses)


@pytest.mark.timeout(180)
def test_same_seed_gives_identical_metrics(tmp_path, small):
    a = read_jsonl(small / "metrics.jsonl")
    b = read_jsonl(train(tmp_path, "b", *SMALL) / "metrics.jsonl")
    c = read_jsonl(train(tmp_path, "c", *SMALL, "seed=2") / "metrics.jsonl")
    assert len(a) >= 8 and a == b
    assert a != c


@pytest.mark.timeout(240)
def test_resume_from_mid_run_checkpoint_is_bit_exact(tmp_path, small):
    full = small
    part = tmp_path / "part"
    shutil.copytree(full, part)
    for late in sorted((part / "checkpoints").glob("ckpt_*.pt"))[1:]:
        late.unlink()  # keep only the checkpoint at 2048 steps, as if the run had died there
    (part / "summary.json").unlink()
    mid = sorted((part / "checkpoints").glob("ckpt_*.pt"))[0]
    assert torch.load(mid, weights_only=True)["env_steps"] == 2048
    out = rlrun("train", f"resume={mid}", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    a, b = final_state(full), final_state(part)
    assert a["env_steps"] == b["env_steps"] == 4096
    assert_same_tensors(a["algo"]["model"], b["algo"]["model"])
    assert read_jsonl(full / "metrics.jsonl") == read_jsonl(part / "metrics.jsonl")
    assert json.loads((part / "summary.json").read_text())["status"] == "completed"


@pytest.mark.timeout(240)
def test_n_steps_resumed_for_n_more_equals_2n_steps(tmp_path):
    fixed_lr = [*SMALL, "algo.anneal_lr=false"]
    whole = train(tmp_path, "whole", *fixed_lr)
    half = train(tmp_path, "half", *fixed_lr, "total_steps=2048")
    out = rlrun("train", f"resume={half}", "total_steps=4096", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert_same_tensors(final_state(whole)["algo"]["model"], final_state(half)["algo"]["model"])
    assert final_state(half)["env_steps"] == 4096


@pytest.mark.timeout(300)
def test_breakout_smoke_run_then_play(tmp_path):
    run = train(
        tmp_path,
        "breakout",
        "env=breakout",
        "total_steps=1024",  # 2 iterations of 128 steps x 4 envs; the CNN's updates are what costs here
        "env.num_envs=4",
        "threads=1",  # the other pytest worker has the other core (a CNN run takes them all by default),
        "eval.episodes=1",
        "eval.num_envs=1",
        "logging.progress=plain",
    )
    state = final_state(run)
    assert state["env_steps"] == 1024 and state["ranks"][0]["cursor"]["next_obs"].shape == (4, 4, 84, 84)
    out = rlrun(
        "play",
        f"checkpoint={run}",
        "episodes=1",
        "deterministic=false",
        f"hydra.run.dir={tmp_path / 'play'}",
        cwd=tmp_path,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert "ALE/Breakout-v5" in out.stdout and "mean" in out.stdout


@pytest.mark.timeout(240)
def test_resume_from_an_older_checkpoint_continues_in_a_new_run_folder(tmp_path, small):
    run = small  # checkpoints at 2048 and 4096
    before = {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()}
    out = rlrun("train", f"resume={run / 'checkpoints' / 'ckpt_000000002048.pt'}", "total_steps=6144", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()} == before  # untouched
    (branch,) = [p for p in (tmp_path / "outputs").glob("*/*") if (p / "summary.json").exists()]
    summary = json.loads((branch / "summary.json").read_text())
    assert summary["resumed_from"].endswith("ckpt_000000002048.pt") and summary["env_steps"] == 6144
    steps = [m["env_steps"] for m in read_jsonl(branch / "metrics.jsonl")]
    assert steps == sorted(steps) and steps[0] <= 2048 < steps[-1]  # the history up to the checkpoint, then on
    assert [m for m in read_jsonl(branch / "metrics.jsonl") if m["env_steps"] <= 2048] == [
        m for m in read_jsonl(run / "metrics.jsonl") if m["env_steps"] <= 2048
    ]
    out = rlrun("train", f"resume={branch}", "total_steps=8192", cwd=tmp_path)  # the branch's newest: in place
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((branch / "summary.json").read_text())["env_steps"] == 8192
