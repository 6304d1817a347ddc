"""Replay shards across 2 real gloo ranks sample as one buffer: item frequencies, importance weights, and the
DDP-averaged gradient when ranks hold different numbers of a batch's items."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.dqn import DQNLearner
from rlrun.buffers.replay import ReplayBuffer, importance_weights
from rlrun.config import ModelConfig
from rlrun.distributed import RankContext
from rlrun.models.q_network import QNetwork
from tests.conftest import chi2, chi2_quantile, on_gloo_ranks

pytestmark = [pytest.mark.dist, pytest.mark.timeout(180)]
SIZES = (5, 13)  # rows per shard: 3 envs each, so 12 and 36 live items (the newest row is incomplete)
DRAWS, BATCH = 4000, 4


def make_shard(rank: int, alpha: float | None) -> ReplayBuffer:
    replay = ReplayBuffer(3 * 40, 3, (2,), np.float32, alpha=alpha)
    for t in range(SIZES[rank]):
        obs = np.full((3, 2), 100 * rank + t, np.float32)
        replay.add(obs, np.zeros(3, int), np.ones(3), np.zeros(3, bool), np.zeros(3, bool), None)
    if alpha is not None:  # distinct priorities, different on each rank
        items = np.arange(len(replay))
        replay.update_priorities(items, np.random.default_rng(rank).uniform(0.05, 3.0, len(items)))
    return replay


def draw_batches(ctx: RankContext, alpha: float | None) -> dict:
    torch.manual_seed(10 + ctx.rank)  # each rank its own stream for its own draws
    replay = make_shard(ctx.rank, alpha)
    shared = torch.Generator().manual_seed(1)  # alike on every rank
    items, weights, counts = [], [], []
    for _ in range(DRAWS):
        stats = ctx.gather_all(replay.stats())
        mine, w = replay.sample_global(stats, ctx.rank, BATCH, beta=0.5, generator=shared)
        items.append(mine)
        weights.append(w)
        counts.append(len(mine))
    return {
        "items": np.concatenate(items),
        "weights": np.concatenate(weights),
        "counts": np.array(counts),
        "mass": replay.mass(np.arange(len(replay))),
    }


def gradient(ctx: RankContext, counts: tuple[int, int]) -> list[np.ndarray]:
    """The gradient of one DQN loss on a fixed global batch of sum(counts) items, rank r holding counts[r]
    of them (in one process: all of them)."""
    g = torch.Generator().manual_seed(7)
    total = sum(counts)
    obs, actions = torch.randn(total, 4, generator=g), torch.randint(0, 2, (total,), generator=g)
    targets, weights = torch.randn(total, generator=g), torch.rand(total, generator=g)
    torch.manual_seed(0)
    model = QNetwork(ModelConfig(activation="relu"), gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), dueling=True)
    per_rank = total // len(counts)  # the configured batch_size: the global batch is ranks x batch_size
    learner = ctx.wrap(DQNLearner(model, per_rank if ctx.distributed else total), list(model.parameters()))
    start = sum(counts[: ctx.rank]) if ctx.distributed else 0
    mine = slice(start, start + counts[ctx.rank]) if ctx.distributed else slice(0, total)
    loss, _, _ = learner(obs[mine], actions[mine], targets[mine], weights[mine])
    loss.backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


def both_draws(ctx: RankContext) -> dict:
    return {"prioritized": draw_batches(ctx, 0.6), "uniform": draw_batches(ctx, None)}


def all_gradients(ctx: RankContext) -> dict:
    return {c: gradient(ctx, c) for c in ((5, 1), (6, 0), (3, 3))}


@pytest.mark.parametrize("kind", ["prioritized", "uniform"])
def test_two_shards_sample_exactly_as_one_buffer_holding_both(kind, shard_draws):
    ranks = [shard_draws[r][kind] for r in (0, 1)]
    mass = np.concatenate([r["mass"] for r in ranks])  # the union: shard 0's items, then shard 1's
    offset = len(ranks[0]["mass"])
    drawn = np.concatenate([ranks[0]["items"], ranks[1]["items"] + offset])
    assert len(drawn) == DRAWS * BATCH * 2  # every global batch is whole
    assert len(set(zip(ranks[0]["counts"], ranks[1]["counts"]))) > 3  # per-rank shares of a batch vary
    expected = len(drawn) * mass / mass.sum()
    counts = np.bincount(drawn, minlength=len(mass))
    assert chi2(counts, expected) < chi2_quantile(len(mass) - 1)
    weights = np.concatenate([ranks[0]["weights"], ranks[1]["weights"]])
    single = importance_weights(mass[drawn], mass.sum(), len(mass), mass.min(), 0.5)
    np.testing.assert_allclose(weights, single, rtol=1e-12)
    if kind == "prioritized":
        assert weights.min() < 0.5  # non-trivial weights


@pytest.fixture(scope="module")
def shard_draws() -> dict:
    return on_gloo_ranks(both_draws)


def test_ddp_gradient_equals_the_single_buffer_gradient_when_ranks_hold_unequal_shares():
    ranks = on_gloo_ranks(all_gradients)
    single = RankContext(0, 0, 1, 1, torch.device("cpu"))
    for counts in ((5, 1), (6, 0), (3, 3)):
        expected = gradient(single, counts)
        for rank in (0, 1):
            for a, b in zip(ranks[rank][counts], expected):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        assert any(np.abs(e).max() > 1e-3 for e in expected)
