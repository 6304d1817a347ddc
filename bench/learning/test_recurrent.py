"""Recurrent policies learn what an MLP cannot: LSTM and LRU against MLP on masked CartPole, and play carries the
LSTM's state. `make test` keeps short runs (tests/runs/test_recurrent_runs.py)."""

import json
import re

import pytest

from tests.conftest import rlrun, train

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
