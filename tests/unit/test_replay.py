"""Replay memory: the batched sum tree, n-step transitions and frame stacks rebuilt from single frames
(against real envs' own observations), priorities and importance weights."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.dqn import DQN, DQNConfig
from rlrun.algos.protocol import EnvSpec
from rlrun.buffers.replay import ReplayBuffer, importance_weights
from rlrun.buffers.sum_tree import SumTree
from rlrun.config import AtariConfig, EnvConfig, ModelConfig
from rlrun.envs import make_vector_env
from tests.conftest import chi2, chi2_quantile


def test_sum_tree_samples_in_proportion_to_priorities():
    rng = np.random.default_rng(0)
    priorities = rng.uniform(0.1, 5.0, 50)
    priorities[[3, 17, 40]] = 0.0  # empty leaves are never drawn
    tree = SumTree(50)
    tree.update(np.arange(50), priorities)
    assert tree.total == pytest.approx(priorities.sum()) and tree.min == priorities[priorities > 0].min()
    draws = tree.find(rng.uniform(0, tree.total, 200_000))
    counts = np.bincount(draws, minlength=50)
    assert counts[[3, 17, 40]].sum() == 0
    live = priorities > 0
    expected = 200_000 * priorities[live] / priorities.sum()
    assert chi2(counts[live], expected) < chi2_quantile(live.sum() - 1)
    assert tree.find(np.array([np.nextafter(tree.total, 0)]))[0] == 49  # the very top lands on the last leaf


def test_batched_update_equals_one_by_one_with_repeats():
    rng = np.random.default_rng(1)
    batched, single = SumTree(37), SumTree(37)
    for _ in range(20):
        idx = rng.integers(0, 37, 16)  # with repeated indices: the last value wins
        values = rng.uniform(0, 3, 16) * (rng.uniform(size=16) > 0.2)
        batched.update(idx, values)
        for i, v in zip(idx, values):
            single.update(np.array([i]), np.array([v]))
        assert np.array_equal(batched.sums, single.sums) and np.array_equal(batched.mins, single.mins)


def record(envs, steps: int, seed: int) -> dict:
    """Roll random actions through a real vector env, keeping every observation it returned."""
    obs, _ = envs.reset(seed=[seed + i for i in range(envs.num_envs)])
    rng = np.random.default_rng(seed)
    out = {k: [] for k in ("obs", "actions", "rewards", "terminated", "truncated", "final_obs")}
    for _ in range(steps):
        actions = rng.integers(0, envs.single_action_space.n, envs.num_envs)
        nxt, rewards, terminated, truncated, info, _ = envs.step(actions)
        for k, v in zip(out, (np.array(obs), actions, rewards, terminated, truncated, info.get("final_obs"))):
            out[k].append(v if k == "final_obs" else np.array(v))
        obs = nxt
    out["next"] = np.array(obs)
    return out


def expected_transition(rec: dict, t: int, e: int, n: int, gamma: float):
    """(obs, n-step return, next obs, discount) of env e's transition at step t, from the recorded run."""
    ret, steps = 0.0, len(rec["obs"])
    for j in range(n):
        ret += gamma**j * rec["rewards"][t + j][e]
        if rec["terminated"][t + j][e]:
            return rec["obs"][t][e], ret, None, 0.0
        if rec["truncated"][t + j][e]:
            return rec["obs"][t][e], ret, rec["final_obs"][t + j][e], gamma ** (j + 1)
    nxt = rec["obs"][t + n][e] if t + n < steps else rec["next"][e]
    return rec["obs"][t][e], ret, nxt, gamma**n


def fill(rec: dict, replay: ReplayBuffer) -> None:
    for t in range(len(rec["obs"])):
        replay.add(*(rec[k][t] for k in ("obs", "actions", "rewards", "terminated", "truncated", "final_obs")))


def check_every_live_item(rec: dict, replay: ReplayBuffer, n: int, gamma: float) -> int:
    steps, num_envs = len(rec["obs"]), replay.num_envs
    items = np.flatnonzero(replay.mass(np.arange(replay.rows * num_envs)) > 0)
    batch = replay.batch(items)
    for b, item in enumerate(items):
        row, e = divmod(int(item), num_envs)
        t = steps - 1 - ((replay.pos - 1 - row) % replay.rows)  # rows count back from the newest
        obs, ret, nxt, discount = expected_transition(rec, t, e, n, gamma)
        assert np.array_equal(batch["obs"][b], obs), (t, e)
        assert batch["actions"][b] == rec["actions"][t][e]
        assert batch["returns"][b] == pytest.approx(ret, rel=1e-6)
        assert batch["discount"][b] == pytest.approx(discount, rel=1e-6)
        if nxt is not None:
            assert np.array_equal(batch["next_obs"][b], nxt), (t, e)
    return len(items)


@pytest.mark.parametrize("n", [3, 1])  # 1: batch()'s own one-step path
def test_cartpole_n_step_transitions_match_the_env_through_truncations_and_wraparound(n):
    envs = make_vector_env(EnvConfig(num_envs=3, max_episode_steps=20), 3)
    try:
        rec = record(envs, 130, seed=3)
    finally:
        envs.close()
    assert np.concatenate(rec["truncated"]).any() and np.concatenate(rec["terminated"]).any()
    replay = ReplayBuffer(3 * 50, 3, (4,), np.float32, n_step=n, gamma=0.9)
    fill(rec, replay)
    assert replay.written > replay.rows  # wrapped around
    assert check_every_live_item(rec, replay, n, 0.9) == len(replay) == 3 * 50  # full: its capacity
    batch = replay.batch(np.arange(replay.rows * 3)[replay.mass(np.arange(replay.rows * 3)) > 0])
    assert batch["returns"].dtype == batch["discount"].dtype == np.float32


def test_atari_frame_stacks_rebuilt_from_single_frames_equal_the_envs_stacks():
    cfg = EnvConfig(id="ALE/Breakout-v5", num_envs=2, max_episode_steps=40, atari=AtariConfig())
    envs = make_vector_env(cfg, 2)  # training wrappers: life loss ends episodes, the time limit truncates
    try:
        rec = record(envs, 260, seed=5)
    finally:
        envs.close()
    assert np.concatenate(rec["truncated"]).any() and np.concatenate(rec["terminated"]).any()
    replay = ReplayBuffer(2 * 120, 2, (4, 84, 84), np.uint8, frame_stack=4, n_step=2, gamma=0.99)
    # One frame per transition, not four; n + k - 1 = 5 rows more than the capacity's, for open windows and stacks.
    assert replay.frames.shape == (125, 2, 84, 84)
    fill(rec, replay)
    assert check_every_live_item(rec, replay, 2, 0.99) == len(replay) > 200


def test_new_items_enter_at_max_priority_and_weights_follow_the_formula():
    replay = ReplayBuffer(40, 2, (4,), np.float32, alpha=0.5)
    obs = np.zeros((2, 4), np.float32)
    for _ in range(6):
        replay.add(obs, np.zeros(2, int), np.ones(2), np.zeros(2, bool), np.zeros(2, bool), None)
    assert len(replay) == 10 and replay.tree.total == pytest.approx(10.0)
    replay.update_priorities(np.array([0, 1]), np.array([3.0, 0.5]))
    assert replay.max_priority == pytest.approx(3.0 + 1e-6)
    replay.add(obs, np.zeros(2, int), np.ones(2), np.zeros(2, bool), np.zeros(2, bool), None)
    assert replay.mass(np.array([10, 11])) == pytest.approx(np.sqrt(3.0 + 1e-6))  # the newest live row
    mass = replay.mass(np.arange(12))
    w = importance_weights(mass, mass.sum(), 12, mass.min(), 0.4)
    assert w.max() == pytest.approx(1.0) and w[1] == pytest.approx(1.0)  # the smallest priority weighs most
    assert w[0] == pytest.approx((mass[1] / mass[0]) ** 0.4)


def test_uniform_sampling_draws_every_live_item_equally():
    replay = ReplayBuffer(60, 3, (1,), np.float32)
    for t in range(25):
        replay.add(
            np.full((3, 1), t, np.float32), np.zeros(3, int), np.zeros(3), np.zeros(3, bool), np.zeros(3, bool), None
        )
    torch.manual_seed(0)
    items = replay.sample(60_000)
    counts = np.bincount(items, minlength=60)
    live = counts > 0
    assert live.sum() == len(replay) == 60  # its capacity, after wrapping around
    assert chi2(counts[live], np.full(live.sum(), 60_000 / live.sum())) < chi2_quantile(live.sum() - 1)


def test_replay_state_round_trips():
    replay = ReplayBuffer(30, 2, (3,), np.float32, n_step=2, alpha=0.6)
    rng = np.random.default_rng(0)
    for _ in range(20):
        done = rng.uniform(size=2) < 0.2
        finals = np.empty(2, dtype=object)
        finals[:] = [rng.normal(size=3).astype(np.float32) for _ in range(2)]
        replay.add(
            rng.normal(size=(2, 3)).astype(np.float32),
            rng.integers(0, 2, 2),
            rng.normal(size=2),
            np.zeros(2, bool),
            done,
            finals,
        )
    replay.update_priorities(np.array([2, 5]), np.array([4.0, 0.1]))
    copy = ReplayBuffer(30, 2, (3,), np.float32, n_step=2, alpha=0.6)
    copy.load_state_dict(replay.state_dict())
    items = np.flatnonzero(replay.mass(np.arange(30)) > 0)
    for k, v in replay.batch(items).items():
        assert np.array_equal(v, copy.batch(items)[k]), k
    assert np.array_equal(replay.tree.sums, copy.tree.sums) and copy.max_priority == replay.max_priority
    assert (copy.pos, copy.written, len(copy)) == (replay.pos, replay.written, len(replay))


def test_a_full_buffer_holds_its_capacity_in_sampleable_items():
    # CleanRL's dqn.py defaults: buffer 10000, learning_starts 10000, one env: updates must be able to start.
    for capacity, num_envs, n_step, k in ((10_000, 1, 1, 1), (8, 4, 3, 1), (30, 4, 2, 4)):
        replay = ReplayBuffer(capacity, num_envs, (4, 3) if k > 1 else (3,), np.float32, frame_stack=k, n_step=n_step)
        obs = np.zeros((num_envs, 4, 3) if k > 1 else (num_envs, 3), np.float32)
        flags = np.zeros(num_envs, bool)
        for _ in range(2 * replay.rows):
            replay.add(obs, np.zeros(num_envs, int), np.ones(num_envs), flags, flags, None)
        assert len(replay) >= capacity and len(replay) - capacity < num_envs
    with pytest.raises(ValueError):
        ReplayBuffer(0, 4, (4,), np.float32)


def test_a_replay_shard_of_another_layout_is_skipped_and_the_replay_refills(caplog):
    # Shards saved before the ring held its whole capacity (or for another buffer size) have other row counts.
    spec = EnvSpec(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), 2)
    algo = DQN(DQNConfig(buffer_size=64, learning_starts=8), ModelConfig(), spec, torch.device("cpu"))
    old = ReplayBuffer(40, 2, (3,), np.float32)
    for _ in range(30):
        old.add(np.ones((2, 3), np.float32), np.zeros(2, int), np.ones(2), np.zeros(2, bool), np.zeros(2, bool), None)
    algo.load_shard_state(old.state_dict())
    assert algo.replay.written == 0 and "replay shard of another layout" in caplog.text
