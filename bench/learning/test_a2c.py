"""A2C learns CartPole on one rank (200k steps) and on two. `make test` keeps short runs (tests/runs/test_a2c.py)."""

import json

import pytest

from tests.conftest import read_jsonl, train

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_a2c_solves_cartpole_within_200k_steps(tmp_path):
    run = train(tmp_path, "a2c", "algo=a2c", "logging.progress=plain", "eval.every_steps=50000")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 200_000 and summary["algo"] == "a2c"
    assert summary["eval_return_mean"] >= 400, summary  # seeds 1-5 all end at 500 here; margin for other CPUs
    metrics = read_jsonl(run / "metrics.jsonl")
    assert any("losses/value_loss" in m and "losses/explained_variance" in m for m in metrics)


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_a2c_learns_cartpole_on_two_ranks(tmp_path):
    run = train(
        tmp_path,
        "two",
        "algo=a2c",
        "distributed.nproc_per_node=2",
        "env.num_envs=4",  # per rank: the preset's 8 envs in all
        "total_steps=100000",
        "logging.progress=plain",
        "eval.every_steps=50000",
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1
    # The best of its evaluations (at 50k and at the end): A2C may collapse late in a run, and where depends on
    # the CPU's numerics and the seed's streams (seed 1: 399 at 50k, 92 at the end; seeds 2, 3: 454, 500 at the end).
    evals = [m["eval/return_mean"] for m in read_jsonl(run / "metrics.jsonl") if "eval/return_mean" in m]
    assert max([*evals, summary["eval_return_mean"]]) >= 300, (evals, summary)
