"""DQN learns CartPole on one rank (then plays), on two ranks, and with CleanRL's hyperparameters. `make test`
keeps short runs of the same settings (tests/runs/test_dqn.py)."""

import json

import pytest

from tests.conftest import DQN_CLEANRL, best_eval, read_jsonl, rlrun, train

pytestmark = pytest.mark.slow


# The tuned CartPole settings (conf/tuned/dqn_cartpole.yaml: 50k steps; seeds 1-3 reach 500 by 35k steps and may
# fall back later, as DQN on CartPole does, so the best of evals every 5k steps shows learning). With 2 ranks each
# rank collects 128 steps per iteration (256 over both, as on 1 rank) and draws its share of a global batch of 128
# for 64 updates: as many samples per env step as on 1 rank in half the updates (each costs collectives).
LEARN = ["algo=dqn", "seed=1", "eval.every_steps=5000", "eval.episodes=10"]
LEARN += ["logging.progress=plain", "checkpoint.every_steps=0"]
DQN_TWO_RANKS = ["distributed.nproc_per_node=2", "algo.train_freq=128", "algo.gradient_steps=64"]
# A CPU's kernels (AVX2 here, AVX-512 elsewhere) change the float sums and so the trajectory: the two-rank run's best
# eval is 406.7 here (AMD EPYC, AVX2) and 386.1 on a 2-vCPU Xeon. A random policy scores about 20, an untrained
# greedy one about 9.
LEARNED = 250


@pytest.mark.timeout(300)
def test_dqn_learns_cartpole_on_one_rank_then_plays(tmp_path):
    run = train(tmp_path, "run", *LEARN)
    assert best_eval(run) >= LEARNED
    out = rlrun("play", f"checkpoint={run}", "episodes=2", f"hydra.run.dir={tmp_path / 'play'}", cwd=tmp_path)
    assert out.returncode == 0 and "mean" in out.stdout, out.stderr[-3000:]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_dqn_learns_cartpole_on_two_ranks(tmp_path):
    run = train(tmp_path, "run", *LEARN, *DQN_TWO_RANKS)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1
    assert best_eval(run) >= LEARNED


@pytest.mark.timeout(200)
def test_dqn_learns_cartpole_with_cleanrls_hyperparameters(tmp_path):
    run = train(tmp_path, "run", *DQN_CLEANRL, "seed=1")
    updates = [m["charts/updates"] for m in read_jsonl(run / "metrics.jsonl") if "charts/updates" in m]
    assert updates[-1] == pytest.approx((50_000 - 10_000) / 10, abs=10)  # from learning_starts on, every 10 steps
    assert best_eval(run) >= 150
