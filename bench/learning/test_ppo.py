"""PPO learns: the default run solves CartPole (then plays it back and records a video), the reference alone
(algo.fast=false) solves it too, and Pendulum improves. `make test` keeps short runs of the same machinery
(tests/runs/test_train.py)."""

import json

import pytest

from tests.conftest import SOLVED, assert_run_folder, play_and_record, read_jsonl, train

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_default_run_solves_cartpole_then_plays(tmp_path):
    run = train(tmp_path, "run")  # the default config: PPO on CartPole-v1, 100k steps
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] <= 100_000
    # 500 here (AVX2); the bound leaves room for another CPU's numerics, far above a random policy's 20
    assert summary["eval_return_mean"] >= SOLVED and summary["eval_episodes"] == 20
    assert len(list((run / "checkpoints").glob("ckpt_*.pt"))) >= 1
    assert_run_folder(run, summary)
    assert play_and_record(run, tmp_path) >= SOLVED


@pytest.mark.timeout(300)
def test_the_reference_alone_solves_cartpole(tmp_path):
    # algo.fast=false: rlrun/algos/ppo.py as written (autograd, torch.optim.Adam, torch acting), nothing swapped.
    # The default run (accelerated) solves it too: test_default_run_solves_cartpole_then_plays.
    run = train(tmp_path, "run", "algo.fast=false", "logging.progress=plain")
    assert "accelerations: none" in (run / "train.log").read_text()
    assert json.loads((run / "summary.json").read_text())["eval_return_mean"] >= SOLVED


@pytest.mark.timeout(240)
def test_pendulum_learns(tmp_path):
    run = train(
        tmp_path,
        "pendulum",
        "env=pendulum",
        "total_steps=61440",
        "algo.num_minibatches=16",
        "eval.every_steps=8192",
        "eval.episodes=10",
    )
    evals = [m["eval/return_mean"] for m in read_jsonl(run / "metrics.jsonl") if "eval/return_mean" in m]
    # untrained policy about -1290 at the first evaluation; about -800 after 61k steps here. The best of the later
    # evaluations, not the last one alone: one trajectory moves with the CPU's numerics.
    assert max(evals[1:]) > evals[0] + 250 and max(evals[1:]) > -1000, evals
