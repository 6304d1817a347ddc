"""SAC and TD3 learn Pendulum on one rank (then play), SAC on two ranks with identical networks. `make test` keeps
short runs (tests/runs/test_sac_runs.py)."""

import json

import pytest

from tests.conftest import best_eval, read_jsonl, rlrun, train

pytestmark = pytest.mark.slow


# Pendulum with SB3's SAC settings (conf/tuned/sac_pendulum.yaml) on 64x64 networks, which learn as the preset's
# 256x256 do on Pendulum in a fraction of the time; eval >= -200 is solved (a random policy scores about -1200). The
# tests ask for -400: learned beyond doubt, with room for another CPU's numerics (TD3's best here is -205).
PENDULUM_RUN = ["env=pendulum", "model.hidden_sizes=[64,64]", "total_steps=8000", "eval.every_steps=2000"]
LEARNED = -400
PENDULUM_RUN += ["eval.episodes=10", "logging.progress=plain", "checkpoint.every_steps=0", "seed=1"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_learns_pendulum_on_one_rank_then_plays(tmp_path, algo):
    # seed 1, evals every 2k steps: SAC -151 at 4k; TD3 -939, -280, -205 at 4k, 6k, 8k (its warm-up is 1k steps).
    run = train(tmp_path, "run", f"algo={algo}", *PENDULUM_RUN, f"total_steps={6000 if algo == 'sac' else 12000}")
    assert best_eval(run) >= LEARNED
    metrics = read_jsonl(run / "metrics.jsonl")
    assert any("losses/qf_loss" in m and "losses/actor_loss" in m for m in metrics)
    assert algo == "td3" or any("charts/alpha" in m for m in metrics)
    out = rlrun("play", f"checkpoint={run}", "episodes=2", f"hydra.run.dir={tmp_path / 'play'}", cwd=tmp_path)
    assert out.returncode == 0 and "mean" in out.stdout, out.stderr[-3000:]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_sac_learns_pendulum_on_two_ranks_with_identical_networks(tmp_path):
    # Each rank steps one env and makes an update per iteration: half the updates of one rank per env step, each on
    # a global batch twice as large.
    run = train(tmp_path, "run", "algo=sac", *PENDULUM_RUN, "distributed.nproc_per_node=2")
    summary = json.loads((run / "summary.json").read_text())
    # The digests cover every network, targets and the temperature included.
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1
    assert best_eval(run) >= LEARNED
