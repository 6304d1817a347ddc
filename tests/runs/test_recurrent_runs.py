"""Recurrent policies end to end through the CLI: LSTM against MLP on masked CartPole (and the LRU), play on an
LSTM checkpoint, exact resume with forked, double-buffered env workers, and two ranks."""

import json
import math
import re

import pytest
import torch

from tests.conftest import SMALL, TWO_RANKS, assert_same_tensors, final_state, resumed_copy, rlrun, train

pytestmark = pytest.mark.slow


@pytest.mark.timeout(180)
def test_short_lstm_and_lru_runs_complete_and_play_on_the_lstm(tmp_path):
    # That the LSTM and the LRU learn masked CartPole where an MLP cannot, and that play carries the state to a
    # solved episode: bench/learning/test_recurrent.py.
    args = [
        "env=cartpole_masked",
        "total_steps=2048",
        "eval.every_steps=0",
        "eval.episodes=2",
        "logging.progress=plain",
    ]
    runs = {m: train(tmp_path, m, *args, f"model={m}") for m in ("lstm", "lru")}
    for run in runs.values():
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and math.isfinite(summary["eval_return_mean"]), summary
    out = rlrun("play", f"checkpoint={runs['lstm']}", "episodes=2", f"hydra.run.dir={tmp_path / 'play'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert math.isfinite(float(re.search(r"mean\s*│\s*([\d.]+)", out.stdout).group(1))), out.stdout


@pytest.mark.timeout(240)
def test_lstm_resumed_with_worker_pool_equals_uninterrupted_run(tmp_path):
    args = [
        *SMALL,  # checkpoints at 2048 and 4096
        "env=cartpole_masked",
        "model=lstm",
        "env.vector.backend=subproc",
        "env.vector.num_workers=2",
        "env.vector.double_buffer=true",  # two env groups: half steps while the policy acts for the other half
    ]
    whole = train(tmp_path, "whole", *args)
    a, b = final_state(whole), final_state(resumed_copy(tmp_path, whole, 2048, timeout=120))
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
