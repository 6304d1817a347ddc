"""The DDP edge cases users' networks bring, on real gloo groups and real processes: A2C's unroll in the DDP
forward (gradient equivalence), parameters the loss does not reach, BatchNorm over all ranks, parameters outside
the optimizer, and spawned ranks that register an env at run time and fork their workers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import rlrun.models.distributions as D
from rlrun.algos.a2c import A2C, A2CConfig
from rlrun.algos.protocol import EnvSpec, Reductions
from rlrun.config import EnvConfig, ModelConfig
from rlrun.distributed import RankContext
from rlrun.envs import env_seeds, make_vector_env
from tests.conftest import DATA, on_gloo_ranks, rlrun

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(240)]
TWO = [
    "distributed.nproc_per_node=2",
    "total_steps=4096",
    "logging.progress=plain",
    "eval.episodes=2",
    "eval.num_envs=2",
]


def _sample_from_probabilities(log_p: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """A sampler that is a function of each row's probabilities alone: the same actions however the envs are split
    between ranks (torch's RNG streams differ per rank)."""
    p = log_p.exp()
    u = (p[..., 0] * 97.0).frac()
    return (u > p[..., 0]).long()


def a2c_one_update(ctx: RankContext, total_envs: int = 4) -> list[np.ndarray]:
    """One A2C unroll (32 steps of CartPole, with episode ends) and its update on this rank's share of `total_envs`
    envs, the envs stepped inside the DDP forward; returns the parameters after it. Runs in a process of its own
    (it swaps the sampler)."""
    D.categorical_sample = _sample_from_probabilities
    per_rank = total_envs // ctx.world_size
    envs = make_vector_env(EnvConfig(num_envs=per_rank), per_rank)
    try:
        torch.manual_seed(0)
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space, per_rank)
        algo = A2C(A2CConfig(num_steps=32), ModelConfig(), spec, ctx.device, Reductions(ctx.mean_all))
        algo.wrap_learner(ctx.wrap)
        seeds = env_seeds(1, 0, total_envs)[ctx.rank * per_rank : (ctx.rank + 1) * per_rank]
        algo.start(envs.reset(seed=seeds)[0])
        episodes = algo.collect(envs)
        assert len(episodes["episode_returns"]) > 0  # the unroll crossed episode ends
        algo.update(progress=0.0)
        return [p.detach().numpy().copy() for p in algo.model.parameters()]
    finally:
        envs.close()


def test_a2c_two_ranks_with_half_the_envs_each_equal_one_process_with_all():
    single = on_gloo_ranks(a2c_one_update, world=1, timeout=120)[0]
    ranks = on_gloo_ranks(a2c_one_update, timeout=120)
    for rank in (0, 1):
        for a, b in zip(single, ranks[rank]):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def _bn_case(ctx: RankContext) -> dict:
    g = torch.Generator().manual_seed(5)
    full_x = torch.randn(8, 3, generator=g) * 3 + 1
    full_t = torch.randn(8, 3, generator=g)
    rows = slice(ctx.rank * 8 // ctx.world_size, (ctx.rank + 1) * 8 // ctx.world_size)
    x = full_x[rows].clone().requires_grad_(True)
    model = nn.Sequential(nn.BatchNorm1d(3))
    nn.init.uniform_(model[0].weight, generator=torch.Generator().manual_seed(0))
    learner = ctx.wrap(model, list(model.parameters()))
    y = learner(x)
    # The mean over the whole batch of 8: each rank's share, DDP averaging over 2 ranks.
    loss = (y - full_t[rows]).square().sum() / (8 / ctx.world_size) / 3
    loss.backward()
    bn = model[0]
    return {
        "converted": type(bn).__name__,
        "y": y.detach().numpy(),
        "x_grad": x.grad.numpy(),
        "w_grad": bn.weight.grad.numpy(),
        "running": torch.cat([bn.running_mean, bn.running_var]).numpy(),
    }


def test_sync_batchnorm_on_two_halves_equals_batchnorm_on_the_whole_batch():
    single = _bn_case(RankContext(0, 0, 1, 1, torch.device("cpu")))
    ranks = on_gloo_ranks(_bn_case, timeout=120)
    assert single["converted"] == "BatchNorm1d" and ranks[0]["converted"] == "SyncBatchNorm"
    for rank in (0, 1):
        rows = slice(rank * 4, rank * 4 + 4)
        np.testing.assert_allclose(ranks[rank]["y"], single["y"][rows], atol=1e-5)
        # An input's gradient is that of the sum of the ranks' losses (as with torch's SyncBatchNorm): DDP's average
        # of the parameters' gradients makes it the mean's.
        np.testing.assert_allclose(ranks[rank]["x_grad"], 2 * single["x_grad"][rows], atol=1e-6)
        np.testing.assert_allclose(ranks[rank]["w_grad"], single["w_grad"], atol=1e-6)
        np.testing.assert_allclose(ranks[rank]["running"], single["running"], atol=1e-6)


def _outside_the_optimizer(ctx: RankContext) -> dict:
    """A learner holding a target copy whose parameters require gradients but belong to no optimizer (ALF's case):
    three steps of a loss that reads the target under no_grad."""
    torch.manual_seed(ctx.rank)  # different on each rank, so a synchronization would show
    online, target = nn.Linear(4, 1), nn.Linear(4, 1)
    learner_module = nn.ModuleDict({"online": online, "target": target})

    class Learner(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = learner_module

        def forward(self, x):
            with torch.no_grad():
                y = self.m["target"](x)
            return (self.m["online"](x) - y).square().mean()

    learner = ctx.wrap(Learner(), list(online.parameters()))
    started_equal = target.weight.detach().numpy().copy()  # every rank starts from rank 0's networks, targets too
    torch.manual_seed(10 + ctx.rank)
    with torch.no_grad():
        target.weight.add_(torch.randn(1, 4))  # then the ranks' targets go apart
    before = target.weight.detach().clone()
    opt = torch.optim.SGD(online.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        learner(torch.randn(16, 4)).backward()
        opt.step()
    return {
        "started": started_equal,
        "target_untouched": bool(torch.equal(before, target.weight)),
        "target": target.weight.detach().numpy(),
        "online": online.weight.detach().numpy(),
    }


def test_parameters_outside_the_optimizer_are_neither_synced_nor_waited_for():
    ranks = on_gloo_ranks(_outside_the_optimizer, timeout=120)
    np.testing.assert_array_equal(ranks[0]["started"], ranks[1]["started"])
    assert ranks[0]["target_untouched"] and ranks[1]["target_untouched"]  # no gradient step, no broadcast
    assert not np.array_equal(ranks[0]["target"], ranks[1]["target"])  # each rank's own
    np.testing.assert_allclose(ranks[0]["online"], ranks[1]["online"], atol=1e-6)  # synced (and no hang)


def _run(tmp_path: Path, name: str, *args: str, timeout: float = 120):
    shutil.copy(DATA / "user_nets.py", tmp_path / "user_nets.py")  # a module in the working directory
    run = tmp_path / name
    out = rlrun("train", f"hydra.run.dir={run}", *TWO, *args, cwd=tmp_path, timeout=timeout)
    summary = run / "summary.json"
    return out, json.loads(summary.read_text()) if summary.exists() else None


def test_a_parameter_the_loss_never_reaches_ends_the_run_at_once_naming_it(tmp_path):
    out, _ = _run(tmp_path, "unused", "algo=a2c", "model._target_=user_nets.WithEvalHead")
    assert out.returncode != 0
    line = out.stderr.strip().splitlines()[-1]
    assert "parameters the loss does not reach: model.net.eval_head.weight, model.net.eval_head.bias" in line, line
    assert "distributed.find_unused_parameters=true" in line and "Traceback" not in out.stderr
    out, summary = _run(
        tmp_path,
        "allowed",
        "algo=a2c",
        "model._target_=user_nets.WithEvalHead",
        "distributed.find_unused_parameters=true",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert summary["status"] == "completed" and len(set(summary["parameter_digests"])) == 1


def test_a_frozen_layer_needs_no_setting(tmp_path):
    out, summary = _run(tmp_path, "frozen", "algo=a2c", "model._target_=user_nets.FrozenEmbedding")
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(set(summary["parameter_digests"])) == 1


def test_a_branch_used_on_some_steps_only_is_named_or_allowed(tmp_path):
    ppo = ["algo=ppo", "algo.num_minibatches=1", "algo.update_epochs=1", "model._target_=user_nets.SometimesBranch"]
    out, _ = _run(tmp_path, "branch", *ppo)
    assert out.returncode != 0
    line = out.stderr.strip().splitlines()[-1]
    assert "parameters that got no gradient in the last update: model.net.branch.weight" in line, line
    out, summary = _run(tmp_path, "allowed", *ppo, "distributed.find_unused_parameters=true")
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(set(summary["parameter_digests"])) == 1


def test_batchnorm_statistics_stay_equal_across_ranks_when_synchronized(tmp_path):
    out, summary = _run(tmp_path, "sync", "algo=a2c", "model._target_=user_nets.BatchNormNet")
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(set(summary["parameter_digests"])) == 1  # parameters and running statistics alike
    out, summary = _run(
        tmp_path, "local", "algo=a2c", "model._target_=user_nets.BatchNormNet", "distributed.sync_batchnorm=false"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(set(summary["parameter_digests"])) == 2  # each rank's statistics of its own batches


def test_spawned_ranks_register_an_env_at_run_time_and_fork_its_workers(tmp_path):
    (tmp_path / "my_envs.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('SpawnedCartPole-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',"
        " max_episode_steps=200)\n"
    )
    out, summary = _run(
        tmp_path,
        "spawned",
        "algo=a2c",
        "distributed.start_method=spawn",
        "env.imports=[my_envs]",
        "env.id=SpawnedCartPole-v0",
        "env.vector.backend=subproc",
        "env.vector.num_workers=2",
        "env.num_envs=4",
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert summary["status"] == "completed" and summary["env_id"] == "SpawnedCartPole-v0"
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1
