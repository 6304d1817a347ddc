"""Runs on env.vector.backend=native: CartPole resumes exactly (its envs' state is plain data), an ALE game resumes on
fresh episodes with the replay's seam closed (its emulators' state stays in C++), and auto says what it chose."""

import json

import pytest
import torch

from tests.conftest import (
    assert_replay_seam_closed,
    assert_same_tensors,
    final_state,
    read_jsonl,
    resumed_copy,
    rlrun,
    train,
)

SMALL = ["total_steps=2048", "eval.episodes=2", "eval.num_envs=2", "logging.every_steps=512", "logging.progress=plain"]


@pytest.mark.timeout(240)
def test_a_native_cartpole_run_resumes_exactly(tmp_path):
    full = train(tmp_path, "full", "env.vector.backend=native", *SMALL, "checkpoint.every_steps=1024")
    part = resumed_copy(tmp_path, full, 1024)
    a, b = final_state(full), final_state(part)
    assert a["env_steps"] == b["env_steps"] == 2048
    assert_same_tensors(a["algo"]["model"], b["algo"]["model"])
    assert read_jsonl(full / "metrics.jsonl") == read_jsonl(part / "metrics.jsonl")
    assert json.loads((full / "summary.json").read_text())["episodes"] > 10


@pytest.mark.timeout(240)
def test_a_resume_onto_another_kind_of_env_state_starts_fresh_episodes(tmp_path):
    """A sync run's checkpoint holds its Python envs' state, which CartPoleVectorEnv cannot take (nor the reverse): a
    resume that switches to native (or back) starts fresh episodes, as for envs without plain-data state."""
    run = train(tmp_path, "run", *SMALL, "checkpoint.every_steps=1024")
    for backend, to in (("native", 3072), ("sync", 4096)):
        out = rlrun("train", f"resume={run}", f"env.vector.backend={backend}", f"total_steps={to}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert final_state(run)["env_steps"] == to


@pytest.mark.timeout(180)
def test_auto_says_which_backend_it_chose_and_why(tmp_path):
    """CartPole's 8 envs: in-process where the accelerations step them as arrays, native with algo.fast=false."""
    for fast, chosen, arrays in (
        ("true", "sync for CartPole-v1 (in-process, where the accelerations step CartPoles as arrays", True),
        ("false", "native for CartPole-v1 (numpy steps all envs in one array", False),
    ):
        run = f"hydra.run.dir={tmp_path / fast}"
        out = rlrun("train", run, "env.vector.backend=auto", f"algo.fast={fast}", *SMALL, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        said = out.stdout + out.stderr
        assert f"env.vector.backend=auto: {chosen}" in said
        assert ("CartPole stepped as arrays" in said) is arrays


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_native_breakout_dqn_run_resumes_on_fresh_episodes_and_no_replay_item_spans_the_seam(tmp_path):
    run = tmp_path / "run"
    args = ["algo=dqn", "env=breakout", "env.vector.backend=native", "env.num_envs=2", "algo.buffer_size=1000"]
    args += ["algo.learning_starts=100", "algo.train_freq=4", "total_steps=400", "checkpoint.every_steps=200"]
    args += ["eval.every_steps=0", "eval.episodes=1", "eval.num_envs=1", "env.max_episode_steps=1000", "threads=1"]
    out = rlrun("train", f"hydra.run.dir={run}", "resume=auto", *args, "logging.progress=plain", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert torch.load(run / "checkpoints" / "ckpt_000000000200.pt", weights_only=True)["ranks"][0]["envs"] is None

    part = resumed_copy(tmp_path, run, 200)  # as if the job had died after its checkpoint at 200 steps
    assert_replay_seam_closed(part, 200, 400, num_envs=2, frame_stack=4)
