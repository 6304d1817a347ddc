"""A2C trained from the unroll: its loss and optimizer against hand-worked numbers, one forward per step and none
in the update, and real runs: CartPole solved, Breakout on the worker pool, exact resume."""

import json
import math

import gymnasium as gym
import pytest
import torch

from rlrun.algos.a2c import A2C, A2CConfig, RMSpropTF, a2c_loss
from rlrun.algos.protocol import EnvSpec
from rlrun.config import EnvConfig, ModelConfig
from rlrun.envs import make_vector_env
from tests.conftest import SMALL, assert_same_tensors, final_state, read_jsonl, resumed_copy, rlrun, train


def test_a2c_loss_on_hand_worked_numbers():
    log_probs, entropy = torch.tensor([[-0.5, -1.0]]), torch.tensor([[0.6, 0.7]])
    values, advantages, returns = torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, -1.0]]), torch.tensor([[3.0, 1.0]])
    loss, stats = a2c_loss(log_probs, entropy, values, advantages, returns, ent_coef=0.01, vf_coef=0.5)
    # policy: -mean(2 x -0.5, -1 x -1) = 0; value: mean((3-1)^2, (1-2)^2) = 2.5; entropy 0.65
    torch.testing.assert_close(stats, torch.tensor([0.0, 2.5, 0.65]))
    torch.testing.assert_close(loss, torch.tensor(0.0 - 0.01 * 0.65 + 0.5 * 2.5))


def test_rmsprop_tf_starts_its_mean_square_at_one_with_eps_inside_the_root():
    p = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    opt = RMSpropTF([p], lr=0.1, alpha=0.9, eps=1e-5)
    p.grad = torch.tensor([2.0, 0.5])
    opt.step()
    square = 0.9 * 1.0 + 0.1 * torch.tensor([4.0, 0.25])
    torch.testing.assert_close(p.detach(), torch.tensor([1.0, -1.0]) - 0.1 * p.grad / (square + 1e-5).sqrt())
    assert torch.equal(opt.state_dict()["state"][0]["square_avg"], square)


def test_the_unroll_is_the_only_forward_and_the_update_needs_none():
    envs = make_vector_env(EnvConfig(num_envs=3), 3)
    try:
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 3)
        algo = A2C(A2CConfig(num_steps=7), ModelConfig(), spec, torch.device("cpu"))
        calls = []
        algo.model.register_forward_hook(lambda m, args, out: calls.append((m.training, torch.is_grad_enabled())))
        algo.start(envs.reset(seed=[1, 2, 3])[0])
        before = [p.detach().clone() for p in algo.model.parameters()]
        episodes = algo.collect(envs)
        # One forward per step with autograd on, in train mode; the others (V of the observation after the unroll,
        # of truncated episodes' final ones) are targets: eval mode, no gradient.
        assert calls.count((True, True)) == 7
        assert set(calls) - {(True, True)} == {(False, False)}
        calls.clear()
        stats = algo.update(progress=0.0)
        assert calls == []  # the loss came from the unroll: no second forward
        assert any(not torch.equal(a, b) for a, b in zip(before, algo.model.parameters()))
        assert set(stats) >= {"policy_loss", "value_loss", "entropy", "explained_variance", "learning_rate"}
        assert all(math.isfinite(v) for v in stats.values()) and len(episodes["episode_returns"]) == 0
    finally:
        envs.close()


def test_a2c_takes_continuous_actions():
    envs = make_vector_env(EnvConfig(id="Pendulum-v1", num_envs=2), 2)
    try:
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 2)
        algo = A2C(A2CConfig(), ModelConfig(), spec, torch.device("cpu"))
        algo.start(envs.reset(seed=[1, 2])[0])
        algo.collect(envs)
        algo.update(progress=0.5)
        assert algo.act(envs.reset(seed=[3, 4])[0]).shape == (2, 1)
        assert isinstance(spec.action_space, gym.spaces.Box)
    finally:
        envs.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a2c_breakout_on_the_worker_pool_then_play(tmp_path):
    run = train(
        tmp_path,
        "breakout",
        "algo=a2c",
        "env=breakout",
        "env.num_envs=4",
        "env.vector.num_workers=2",
        "threads=1",  # the other pytest worker has the other core (a CNN run takes them all by default),
        "total_steps=400",  # 20 updates of the CNN: what costs here
        "eval.episodes=1",
        "eval.num_envs=1",
        "logging.every_steps=200",
    )
    state = final_state(run)
    assert state["env_steps"] == 400 and state["ranks"][0]["cursor"]["next_obs"].shape == (4, 4, 84, 84)
    assert "square_avg" in state["algo"]["optimizer"]["state"][0]  # the preset's TF-style RMSprop
    losses = [m["losses/value_loss"] for m in read_jsonl(run / "metrics.jsonl") if "losses/value_loss" in m]
    assert losses and all(math.isfinite(v) for v in losses)
    out = rlrun("play", f"checkpoint={run}", "episodes=1", "deterministic=false", cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "ALE/Breakout-v5" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a2c_resumed_half_way_equals_the_whole_run(tmp_path):
    # (A run resumed with a larger total_steps, the same path for every algorithm: tests/runs/test_train.py.)
    args = ["algo=a2c", *SMALL, "total_steps=4000", "checkpoint.every_steps=2000", "eval.every_steps=2000"]
    whole = train(tmp_path, "whole", *args)
    a, b = final_state(whole), final_state(resumed_copy(tmp_path, whole, 2000, timeout=120))
    assert a["env_steps"] == b["env_steps"] == 4000
    assert_same_tensors(a["algo"]["model"], b["algo"]["model"])
    assert_same_tensors(a["algo"]["optimizer"]["state"][0], b["algo"]["optimizer"]["state"][0])
    # That A2C solves CartPole (200k steps): bench/learning/test_a2c.py; here its losses are logged and finite.
    assert json.loads((whole / "summary.json").read_text())["algo"] == "a2c"
    metrics = [m for m in read_jsonl(whole / "metrics.jsonl") if "losses/value_loss" in m]
    assert metrics and all(math.isfinite(m["losses/value_loss"] + m["losses/explained_variance"]) for m in metrics)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(180)
def test_a2c_on_two_ranks_stays_in_sync(tmp_path):
    # That it learns CartPole on two ranks: bench/learning/test_a2c.py.
    run = train(
        tmp_path,
        "two",
        "algo=a2c",
        "distributed.nproc_per_node=2",
        "env.num_envs=4",  # per rank: the preset's 8 envs in all
        "total_steps=4000",
        "logging.progress=plain",
        "eval.every_steps=2000",
        "eval.episodes=2",
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1
    assert summary["status"] == "completed" and math.isfinite(summary["eval_return_mean"]), summary
