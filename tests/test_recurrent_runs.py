"""Recurrent policies end to end through the CLI: LSTM against MLP on masked CartPole (and the LRU), play on an
LSTM checkpoint, exact resume with forked, double-buffered env workers, and two ranks."""

import json
import re

import pytest
import torch

from tests.conftest import SMALL, TWO_RANKS, assert_same_tensors, final_state, rlrun, train

pytestmark = pytest.mark.slow
QUIET = ["eval.every_steps=0", "checkpoint.every_steps=0", "logging.progress=plain"]


def eval_return(run) -> float:
    return json.loads((run / "summary.json").read_text())["eval_return_mean"]


@pytest.mark.timeout(240)
def test_lstm_beats_mlp_on_masked_cartpole_lru_learns_and_play_carries_the_state(tmp_path):
    # The tuned budget (48 x 1024 steps), seed 2. Final eval returns seen for seeds 1, 2, 3: LSTM 256, 500, 500
    # (with fused Adam and denormals flushed; 500, 500, 486 before); LRU 500, 500, 500; MLP 41, 40, 42 (without
    # the velocities it cannot balance for long).
    runs = {
        m: train(tmp_path, m, "env=cartpole_masked", f"model={m}", "seed=2", *QUIET) for m in ("lstm", "mlp", "lru")
    }
    returns = {m: eval_return(run) for m, run in runs.items()}
    # Below seed 1's 256 and far above the MLP's 40: another CPU's numerics move a trajectory as a seed does.
    assert returns["mlp"] < 100 and returns["lstm"] >= 200 and returns["lru"] >= 200, returns

    out = rlrun("play", f"checkpoint={runs['lstm']}", "episodes=3", f"hydra.run.dir={tmp_path / 'play'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    played = float(re.search(r"mean\s*│\s*([\d.]+)", out.stdout).group(1))
    assert played >= 200, out.stdout  # without memory across steps this policy fails like the MLP


@pytest.mark.timeout(240)
def test_lstm_resumed_with_worker_pool_equals_uninterrupted_run(tmp_path):
    args = [
        *SMALL,
        "env=cartpole_masked",
        "model=lstm",
        "algo.anneal_lr=false",
        "env.vector.backend=subproc",
        "env.vector.num_workers=2",
        "env.vector.double_buffer=true",  # two env groups: half steps while the policy acts for the other half
    ]
    whole = train(tmp_path, "whole", *args)
    half = train(tmp_path, "half", *args, "total_steps=2048")
    out = rlrun("train", f"resume={half}", "total_steps=4096", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    a, b = final_state(whole), final_state(half)
    assert a["env_steps"] == b["env_steps"] == 4096
    assert_same_tensors(a["algo"]["model"], b["algo"]["model"])
    cursor_a, cursor_b = a["ranks"][0]["cursor"], b["ranks"][0]["cursor"]
    assert cursor_a["core_state"].shape == (16, 256) and cursor_a["core_state"].abs().sum() > 0
    assert_same_tensors(cursor_a, cursor_b)


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_two_ranks_train_an_lstm_with_forked_env_workers_in_step(tmp_path):
    subproc = ["env.vector.backend=subproc", "env.vector.num_workers=2"]
    run = train(tmp_path, "run", *TWO_RANKS, "env=cartpole_masked", "model=lstm", *subproc, "total_steps=4096")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["status"] == "completed" and summary["env_steps"] == 4096
    assert len(set(summary["parameter_digests"])) == 1  # both ranks took the same synchronized updates
    state = torch.load(run / "checkpoints" / "ckpt_000000004096.pt", weights_only=True)
    states = [rank["cursor"]["core_state"] for rank in state["ranks"]]
    assert states[0].shape == states[1].shape == (16, 256) and not torch.equal(*states)  # each rank's own envs
