"""SAC and TD3 on real process groups and through the CLI: 2 ranks with half a global batch each equal 1 process with
all of it after an update (critics, actor, temperature, targets), Pendulum learned on 1 and 2 ranks with every rank
ending on the same parameters, exact resume with the replay shards, a HalfCheetah smoke run on forked env workers,
and play on the checkpoints."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
import torch

from rlrun.algos import SACConfig, TD3Config, build_algo
from rlrun.algos.protocol import Reductions
from rlrun.distributed import RankContext
from tests.conftest import (
    PENDULUM,
    SMALL_NET,
    assert_same_tensors,
    final_state,
    on_gloo_ranks,
    read_jsonl,
    resumed_copy,
    rlrun,
    sac_batch,
    train,
)

pytestmark = pytest.mark.slow


def updates_on_a_shared_batch(ctx: RankContext, algo: str, batch: int = 8) -> dict[str, np.ndarray]:
    """Two updates (TD3: a delayed one, then a policy step) on this rank's share of global batches of `batch` items,
    each rank holding a different number of them (5 and 3: the replay's shard counts are multinomial); returns every
    network's parameters after them."""
    torch.manual_seed(0)
    cfg = (
        SACConfig(batch_size=batch // ctx.world_size)
        if algo == "sac"
        else TD3Config(batch_size=batch // ctx.world_size)
    )
    a = build_algo(cfg, SMALL_NET, PENDULUM, ctx.device, Reductions(ctx.mean_all))
    a.wrap_learner(ctx.wrap)
    a.sync_targets()
    rows = slice(0, batch) if ctx.world_size == 1 else [slice(0, 5), slice(5, batch)][ctx.rank]
    for step in (1, 2):
        full, g = sac_batch(batch, seed=step), torch.Generator().manual_seed(10 + step)
        noise = torch.randn(2, batch, 1, generator=g) if algo == "sac" else torch.randn(batch, 1, generator=g)
        mine = {k: v[rows] for k, v in full.items()}
        a.updates = step
        a.learn(mine, torch.ones(len(mine["obs"])), noise[:, rows] if algo == "sac" else noise[rows])
    return {k: v.detach().numpy().copy() for k, v in a.model.state_dict().items()}


@pytest.mark.dist
@pytest.mark.timeout(200)
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_two_ranks_with_part_of_each_batch_equal_one_process_with_all(algo):
    single = updates_on_a_shared_batch(RankContext(0, 0, 1, 1, torch.device("cpu")), algo)  # in this process: no group
    ranks = on_gloo_ranks(partial(updates_on_a_shared_batch, algo=algo), timeout=90)
    assert "log_alpha" in single if algo == "sac" else "actor_target.net.0.weight" in single
    for name, value in single.items():
        for rank in (0, 1):
            np.testing.assert_allclose(ranks[rank][name], value, atol=1e-6, rtol=0, err_msg=f"{name} on rank {rank}")


SMALL = ["env=pendulum", "model.hidden_sizes=[32,32]", "algo.learning_starts=200", "algo.buffer_size=4000"]
SMALL += ["algo.batch_size=32", "logging.progress=plain", "logging.every_steps=256", "eval.every_steps=0"]
SMALL += ["eval.episodes=1", "eval.num_envs=1"]


# The replay shards and the two learners of the continuous family (rlrun/algos/continuous.py, off_policy.py) on two
# ranks once, with TD3, whose actor learner skips its delayed steps; SAC's own state (its temperature and optimizers)
# on one rank: its two-rank update is the gloo test above.
@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo, ranks", [("td3", 2), ("sac", 1)])
def test_resume_with_replay_shards_is_exact(tmp_path, algo, ranks):
    args = [f"algo={algo}", *SMALL, f"distributed.nproc_per_node={ranks}", "algo.replay.prioritized=true"]
    args += ["algo.replay.checkpoint=true", "algo.n_step=2", "total_steps=1024", "checkpoint.every_steps=512"]
    full = train(tmp_path, "full", *args)
    part = resumed_copy(tmp_path, full, 512)
    a, b = final_state(full), final_state(part)
    assert a["env_steps"] == b["env_steps"] == 1024
    assert_same_tensors(a["algo"]["model"], b["algo"]["model"])
    assert a["algo"]["updates"] == b["algo"]["updates"] > 0
    # Every network, targets and temperature alike on both ranks (TD3's actor learner skipped its delayed steps).
    digests = json.loads((full / "summary.json").read_text())["parameter_digests"]
    assert len(digests) == ranks and len(set(digests)) == 1
    assert read_jsonl(full / "metrics.jsonl") == read_jsonl(part / "metrics.jsonl")


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_halfcheetah_smoke_on_env_workers_then_plays(tmp_path, algo):
    pytest.importorskip("mujoco")
    run = train(
        tmp_path,
        "run",
        f"algo={algo}",
        "env=halfcheetah",
        "env.num_envs=2",
        "env.vector.backend=subproc",
        "model.hidden_sizes=[64,64]",
        "algo.learning_starts=500",
        "algo.buffer_size=5000",
        "total_steps=2000",
        "eval.every_steps=0",
        "eval.episodes=1",
        "eval.num_envs=1",
        "logging.progress=plain",
        "logging.every_steps=1000",
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] == 2000
    assert np.isfinite(summary["eval_return_mean"])
    # That SAC and TD3 learn Pendulum, on one rank and on two: bench/learning/test_sac.py.
    metrics = read_jsonl(run / "metrics.jsonl")
    losses = [m["losses/qf_loss"] for m in metrics if "losses/qf_loss" in m]
    assert losses and np.isfinite(losses).all()
    assert any("losses/qf_loss" in m and "losses/actor_loss" in m for m in metrics)
    assert algo == "td3" or any("charts/alpha" in m for m in metrics)
    out = rlrun("play", f"checkpoint={run}", "episodes=1", f"hydra.run.dir={tmp_path / 'play'}", cwd=tmp_path)
    assert out.returncode == 0 and "mean" in out.stdout, out.stderr[-3000:]
