"""DQN through the CLI: learning CartPole on one and on two ranks, exact resume with each rank's replay shard,
an Atari smoke run with prioritized n-step replay, and play on DQN checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import DQN_CLEANRL, assert_same_tensors, final_state, read_jsonl, resumed_copy, rlrun, train

pytestmark = pytest.mark.slow
SMALL = [
    "algo=dqn",
    "env.num_envs=2",
    "algo.train_freq=16",
    "algo.gradient_steps=4",
    "algo.batch_size=16",
    "algo.learning_starts=200",
    "algo.buffer_size=2000",
    "algo.target_update_interval=8",
    "model.hidden_sizes=[32,32]",
    "logging.progress=plain",
    "logging.every_steps=256",
    "eval.every_steps=0",
    "eval.episodes=2",
    "eval.num_envs=2",
]


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_two_rank_resume_with_replay_shards_is_exact(tmp_path):
    args = [
        *SMALL,
        "distributed.nproc_per_node=2",
        "algo.replay.prioritized=true",
        "algo.replay.checkpoint=true",
        "algo.n_step=3",
        "algo.dueling=true",
        "algo.tau=0.05",  # Polyak: the target must start equal on all ranks (DDP syncs only the online network)
        "total_steps=2048",
        "checkpoint.every_steps=1024",
    ]
    full = train(tmp_path, "full", *args)
    summary = json.loads((full / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1  # the ranks stayed in sync
    names = sorted(p.name for p in (full / "checkpoints").iterdir())
    assert names == [
        "ckpt_000000001024.pt",
        "ckpt_000000002048.pt",
        "shard_000000001024_rank0.pt",
        "shard_000000001024_rank1.pt",
        "shard_000000002048_rank0.pt",
        "shard_000000002048_rank1.pt",
    ]
    shard = torch.load(full / "checkpoints" / names[2], weights_only=True)
    assert shard["written"] == 1024 // 2 // 2  # rows: one per vector step of this rank's 2 envs
    part = resumed_copy(tmp_path, full, 1024)
    a, b = final_state(full), final_state(part)
    assert a["env_steps"] == b["env_steps"] == 2048
    for key in ("model", "target"):
        assert_same_tensors(a["algo"][key], b["algo"][key])
    assert a["algo"]["updates"] == b["algo"]["updates"] > 0
    assert read_jsonl(full / "metrics.jsonl") == read_jsonl(part / "metrics.jsonl")
    assert any("losses/td_loss" in m and "charts/beta" in m for m in read_jsonl(full / "metrics.jsonl"))


@pytest.mark.timeout(240)
def test_without_its_replay_shard_a_resumed_run_refills_before_it_learns(tmp_path):
    run = train(tmp_path, "run", *SMALL, "algo.learning_starts=400", "total_steps=1024")
    assert not list((run / "checkpoints").glob("shard_*"))  # replay is not checkpointed unless asked
    out = rlrun("train", f"resume={run}", "total_steps=1536", cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    updates = {m["env_steps"]: m["charts/updates"] for m in read_jsonl(run / "metrics.jsonl") if "charts/updates" in m}
    # The replay starts empty: no updates until it holds learning_starts items again (416 steps), then updates.
    assert 0 < updates[1024] == updates[1280] < updates[1536]


@pytest.mark.timeout(300)
def test_breakout_prioritized_n_step_smoke_then_play(tmp_path):
    run = train(
        tmp_path,
        "run",
        "algo=dqn",
        "env=breakout",
        "env.num_envs=2",
        "env.max_episode_steps=1000",  # agent steps: an untrained greedy agent that never serves would play 27k
        "threads=1",  # the other pytest worker has the other core (a CNN run takes them all by default)
        "algo.buffer_size=4000",
        "algo.learning_starts=256",
        "algo.replay.prioritized=true",
        "algo.n_step=3",
        "algo.dueling=true",
        "algo.train_freq=8",
        "algo.gradient_steps=1",
        "total_steps=512",  # 32 updates of the CNN: what costs here
        "eval.episodes=1",
        "eval.num_envs=1",
        "eval.every_steps=0",
        "logging.progress=plain",
        "logging.every_steps=256",
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] == 512
    out = rlrun("play", f"checkpoint={run}", "episodes=1", f"hydra.run.dir={tmp_path / 'play'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "mean" in out.stdout


@pytest.mark.timeout(180)
def test_cleanrls_settings_start_updates_at_the_replay_size(tmp_path):
    # That DQN learns CartPole with them (50k steps), on one rank and on two: bench/learning/test_dqn.py.
    short = ["total_steps=3000", "algo.buffer_size=1000", "algo.learning_starts=1000", "eval.every_steps=0"]
    run = train(tmp_path, "run", *DQN_CLEANRL, *short, "eval.episodes=1", "logging.every_steps=500", "seed=1")
    updates = [m["charts/updates"] for m in read_jsonl(run / "metrics.jsonl") if "charts/updates" in m]
    assert updates[-1] == pytest.approx((3000 - 1000) / 10, abs=10)  # from learning_starts on, every 10 steps
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
