"""Straggler preemption (algo.preempt_fraction): rollouts of unequal length weighed so the update is the one over
all ranks' samples, a slow rank cut short in a real 3-rank run, runs that never cut equal to runs without it, and
resume. Real gloo groups, real processes, a real slow env (bench/slow_envs.py)."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import EnvSpec, Reductions
from rlrun.buffers.rollout import minibatch_slices
from rlrun.config import EnvConfig, ModelConfig, validate_train
from rlrun.distributed import RankContext
from rlrun.envs import make_vector_env
from rlrun.errors import UserError
from rlrun.fast import accelerate
from tests.conftest import REPO, on_gloo_ranks, read_jsonl, rlrun, typed

# What the update reads of a rollout, [T, N, ...] each.
ROLLOUT = ("obs", "actions", "log_probs", "values", "next_values", "rewards", "terminated", "truncated")


def test_minibatch_slices_cover_a_batch_that_does_not_divide():
    assert minibatch_slices(10, 4) == [slice(0, 3), slice(3, 6), slice(6, 8), slice(8, 10)]
    assert minibatch_slices(8, 4) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.preempt_fraction=1.5", "algo.preempt_fraction=1.5: must be in (0, 1]"),
        ("algo.preempt_floor=0", "algo.preempt_floor=0.0: must be in (0, 1]"),
        ("algo.normalize_obs=true", "needs algo.normalize_obs=false and algo.normalize_reward=false"),
        ("algo.num_minibatches=128", "the shortest rollout (8 steps x 8 envs) must fill algo.num_minibatches=128"),
    ],
)
def test_bad_preemption_settings_are_one_line(override, message):
    cfg = typed("algo.preempt_fraction=0.5", "algo.num_steps=32", override)
    with pytest.raises(UserError) as error:
        validate_train(cfg)
    assert message in str(error.value)


MLP, LSTM = ModelConfig(), ModelConfig(name="lstm", hidden_sizes=[16], shared=True, core_size=8)


def _cut_rollout(ctx: RankContext, fast: bool, model: ModelConfig = MLP) -> dict:
    """Rank 0 collects a full rollout of 16 steps x 2 CartPole envs while rank 1 waits; then rank 1 collects, sees
    half the ranks done and stops at its floor (4 steps). Both update on what they have (2 epochs of one minibatch).
    Returns the rollouts, the parameters before and after, and the lengths."""
    torch.manual_seed(0)
    cfg = PPOConfig(num_steps=16, num_minibatches=1, update_epochs=2, preempt_fraction=0.5, fast=fast)
    envs = make_vector_env(EnvConfig(num_envs=2), 2, train=True)
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 2)
    algo = PPO(cfg, model, spec, ctx.device, Reductions(ctx.mean_all, finish_line=ctx.finish_line()))
    accelerate(algo, envs)
    algo.wrap_learner(ctx.wrap)
    before = [p.detach().clone().numpy() for p in algo.model.parameters()]
    algo.start(envs.reset(seed=[10 * ctx.rank, 10 * ctx.rank + 1])[0])
    if ctx.rank == 1:
        ctx.any_all(False)  # returns once rank 0 has collected
    collected = algo.collect(envs)
    if ctx.rank == 0:
        ctx.any_all(False)
    algo.update(progress=0.0)
    envs.close()
    n = algo.length
    return {
        "rollout": {k: getattr(algo.rollout, k)[:n].clone().numpy() for k in ROLLOUT},
        "before": before,
        "after": [p.detach().clone().numpy() for p in algo.model.parameters()],
        "collected": (collected["env_steps"], collected["preempted"]),
    }


@pytest.mark.dist
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fast", [False, True])
def test_ranks_cut_short_update_as_one_process_over_all_their_samples(fast):
    ranks = on_gloo_ranks(partial(_cut_rollout, fast=fast), timeout=150)
    assert ranks[0]["collected"] == (32, False) and ranks[1]["collected"] == (8, True)
    # One process over the union: the two rollouts one after the other, the first ending as a truncation (it
    # bootstraps from its own next value, which next_values holds), 2 x 20 samples in one minibatch.
    n = 16 + 4
    cfg = PPOConfig(num_steps=n, num_minibatches=1, update_epochs=2, fast=fast)
    envs = make_vector_env(EnvConfig(num_envs=2), 2, train=True)
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 2)
    one = PPO(cfg, ModelConfig(), spec, torch.device("cpu"))
    accelerate(one, envs)
    envs.close()
    with torch.no_grad():
        for p, value in zip(one.model.parameters(), ranks[0]["before"]):
            p.copy_(torch.from_numpy(value))
    for name in ROLLOUT:
        joined = np.concatenate([ranks[0]["rollout"][name], ranks[1]["rollout"][name]])
        getattr(one.rollout, name).copy_(torch.from_numpy(joined))
    one.rollout.truncated[15] = True
    one.update(progress=0.0)
    for rank in (0, 1):
        for p, value in zip(one.model.parameters(), ranks[rank]["after"]):
            torch.testing.assert_close(torch.from_numpy(value), p.detach(), atol=1e-6, rtol=0)


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_a_recurrent_policy_is_cut_on_whole_sequences_and_ranks_stay_in_sync():
    """A recurrent rollout cut short is num_envs sequences of its length, each replayed from its initial state."""
    ranks = on_gloo_ranks(partial(_cut_rollout, fast=False, model=LSTM), timeout=150)
    assert ranks[0]["collected"] == (32, False) and ranks[1]["collected"] == (8, True)
    for a, b in zip(ranks[0]["after"], ranks[1]["after"]):
        np.testing.assert_array_equal(a, b)
    assert any((a != b).any() for a, b in zip(ranks[0]["before"], ranks[0]["after"]))


SLOW = [
    "env.id=SlowCartPole-v0",
    "tuned=ppo_cartpole",
    "env.imports=[slow_envs]",
    "+env.kwargs.step_s=0.0005",
    "env.num_envs=4",
]
COMMON = ["logging.progress=plain", "eval.every_steps=0", "eval.episodes=2", "eval.num_envs=2"]


def _slow_env_here(folder: Path) -> None:
    shutil.copy(REPO / "bench" / "slow_envs.py", folder / "slow_envs.py")


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.serial  # its straggler is made by timing: alone, so other tests do not make another
@pytest.mark.timeout(240)
def test_a_slow_rank_is_preempted_and_the_run_resumes(tmp_path):
    _slow_env_here(tmp_path)
    run = tmp_path / "run"
    args = [
        "train",
        "distributed.nproc_per_node=3",
        *SLOW,
        "+env.kwargs.slow_ranks=[2]",
        "+env.kwargs.factor=20",
        "algo.preempt_fraction=0.6",
        "total_steps=6000",
        "checkpoint.every_steps=3000",
        "logging.every_steps=1000",
        *COMMON,
        f"hydra.run.dir={run}",
    ]
    out = rlrun(*args, cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    # rank 2 (20x slower) is cut at its floor, 8 of 32 steps, whenever the two others are done; they never are cut
    steps, cut = summary["env_steps_per_rank"], summary["preempted_per_rank"]
    iterations = summary["iterations"]
    assert cut[0] == cut[1] == 0 and cut[2] >= iterations - 1, summary
    assert steps[0] == steps[1] == iterations * 32 * 4 and steps[2] < steps[0] / 2
    assert sum(steps) == summary["env_steps"] >= 6000 - 3 * 32 * 4
    assert len(set(summary["parameter_digests"])) == 1  # DDP kept the ranks in sync through the unequal rollouts
    lines = [m for m in read_jsonl(run / "metrics.jsonl") if "preemption/steps_rank2" in m]
    assert lines and all(m["preemption/preempted_rank2"] > 0 and m["preemption/preempted_steps"] > 0 for m in lines)
    # Resume from the checkpoint at 3000+ steps with more steps to go: it continues where it stopped and the counts
    # add up (where the cuts fall depends on timing, so the runs are not compared step for step).
    shutil.copytree(run, tmp_path / "part")
    part = tmp_path / "part"
    (part / "summary.json").unlink()
    checkpoints = sorted((part / "checkpoints").glob("ckpt_*.pt"))
    checkpoints[-1].unlink()  # the final one: resume from the mid-run checkpoint
    mid = int(checkpoints[-2].stem.split("_")[1])
    lines = [m for m in read_jsonl(part / "metrics.jsonl") if m["env_steps"] <= mid]
    (part / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = rlrun("train", f"resume={part}", "total_steps=9000", cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = json.loads((part / "summary.json").read_text())
    assert resumed["env_steps"] == mid + sum(resumed["env_steps_per_rank"]) >= 9000 - 3 * 32 * 4
    assert resumed["preempted_per_rank"][2] > 0 and len(set(resumed["parameter_digests"])) == 1
    logged = [m["env_steps"] for m in read_jsonl(part / "metrics.jsonl")]
    assert logged[:-1] == sorted(set(logged[:-1])) and logged[-1] == resumed["env_steps"]  # then the final eval


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_preemption_that_never_cuts_changes_nothing(tmp_path):
    """With every rank needed to finish (fraction 1), no rollout is ever cut: the run is the one without the
    feature, bit for bit (the same parameters, the same metrics but timing)."""
    runs = {}
    for name, extra in (("off", []), ("on", ["algo.preempt_fraction=1.0"])):
        runs[name] = tmp_path / name
        out = rlrun(
            "train",
            "distributed.nproc_per_node=2",
            "total_steps=5120",
            "logging.every_steps=1024",
            *COMMON,
            *extra,
            f"hydra.run.dir={runs[name]}",
            cwd=tmp_path,
            timeout=180,
        )
        assert out.returncode == 0, out.stderr[-3000:]
    summaries = {k: json.loads((v / "summary.json").read_text()) for k, v in runs.items()}
    assert summaries["on"]["parameter_digests"] == summaries["off"]["parameter_digests"]
    assert summaries["on"]["preempted_per_rank"] == [0, 0] and "preempted_per_rank" not in summaries["off"]

    def metrics(run: Path) -> list[dict]:
        return [
            {k: v for k, v in m.items() if k != "charts/sps" and not k.startswith("preemption/")}
            for m in read_jsonl(run / "metrics.jsonl")
        ]

    assert metrics(runs["on"]) == metrics(runs["off"])
    assert all(m.get("preemption/preempted_steps", 0) == 0 for m in read_jsonl(runs["on"] / "metrics.jsonl"))
