"""Many seeds in one process learn as single runs do (issue 35): the default PPO CartPole run (tuned/ppo_cartpole,
100k steps) for seeds 1-8, trained side by side in one batch (hydra/launcher=batched) and as 8 single runs (a plain
sweep, one job after another); at the final evaluation, and at the one halfway, where runs still differ, the
interquartile means' 95% stratified-bootstrap intervals (rlrun/stats.py, as `rlrun report` computes them) overlap.
`make test` keeps short batched runs (tests/runs/test_batched_seeds.py) and each seed's first update against its
single run's to 1e-5 (tests/unit/test_batched_ppo.py)."""

import json
from pathlib import Path

import numpy as np
import pytest

from rlrun.stats import bootstrap_ci, interquartile_mean
from tests.conftest import read_jsonl, rlrun

pytestmark = pytest.mark.slow

SEEDS = "1,2,3,4,5,6,7,8"
RUN = ["eval.every_steps=10000", "eval.episodes=20", "checkpoint.every_steps=0", "logging.progress=none"]


def evaluations(sweep: Path) -> dict[int, list[float]]:
    """Each evaluation's env steps -> the 8 runs' mean eval returns there (the final one's from summary.json)."""
    found: dict[int, list[float]] = {}
    for job in range(8):
        for line in read_jsonl(sweep / str(job) / "metrics.jsonl"):
            if "eval/return_mean" in line:
                found.setdefault(line["env_steps"], []).append(line["eval/return_mean"])
        summary = json.loads((sweep / str(job) / "summary.json").read_text())
        assert summary["status"] == "completed", summary
    return {steps: returns for steps, returns in found.items() if len(returns) == 8}


def iqm_ci(returns: list[float]) -> tuple[float, float, float]:
    low, high = bootstrap_ci(
        [np.array(returns)], lambda x: interquartile_mean(x, axis=-1), np.random.default_rng(0), reps=5000
    )
    return float(interquartile_mean(np.array(returns))), float(low), float(high)


@pytest.mark.timeout(2400)
def test_eight_seeds_batched_learn_as_eight_single_runs(tmp_path):
    sweeps = {"batched": tmp_path / "batched", "single": tmp_path / "single"}
    for name, extra in (("batched", ["hydra/launcher=batched"]), ("single", [])):
        out = rlrun("train", "-m", f"seed={SEEDS}", *extra, *RUN, f"hydra.sweep.dir={sweeps[name]}", cwd=tmp_path,
                    timeout=1100)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
    batched, single = evaluations(sweeps["batched"]), evaluations(sweeps["single"])
    assert batched.keys() == single.keys()
    lines = ["env steps | batched IQM [95% CI] | single IQM [95% CI]"]
    for steps in sorted(batched):
        b, s = iqm_ci(batched[steps]), iqm_ci(single[steps])
        lines.append(f"{steps:>9,} | {b[0]:6.1f} [{b[1]:6.1f}, {b[2]:6.1f}] | {s[0]:6.1f} [{s[1]:6.1f}, {s[2]:6.1f}]")
    table = "\n".join(lines)
    print(table)
    final, half = max(batched), sorted(batched)[len(batched) // 2 - 1]
    for steps in (half, final):
        b, s = iqm_ci(batched[steps]), iqm_ci(single[steps])
        assert b[1] <= s[2] and s[1] <= b[2], f"the intervals at {steps} env steps do not overlap:\n{table}"
