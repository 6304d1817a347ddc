"""Every value checked before start (issue 39), through the CLI: a bad value is one line, exit 2, and an existing run
folder left as it was; what the checks let through (exact-integer floats, a run told to go on without updates, a
third-party env's API slips) runs, and says so in its log once."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import rlrun

# A third-party env (not gymnasium's, ale-py's or rlrun's) that breaks gymnasium's API softly: float64 observations
# outside its float32 Box. Registered by its own module, as a user's env is (env.imports).
DRIFTING = """
import gymnasium as gym
import numpy as np


class Drifting(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.full(2, 5.0), {}

    def step(self, action):
        self.t += 1
        return np.full(2, 5.0), 1.0, self.t >= 20, False, {}


gym.register("Drifting-v0", entry_point=Drifting)
"""

BAD = {
    "seed": (["seed=-1"], "seed=-1: must be in [0, 2**32)"),
    "max_episode_steps": (["env.max_episode_steps=0"], "env.max_episode_steps=0: must be >= 1 (or null)"),
    "device": (["device=cuda:99"], "device=cuda:99: this machine has"),
    "not_an_integer": (["total_steps=1.5"], "total_steps=1.5: must be an integer"),
    "no_updates": (["algo=dqn", "total_steps=800"], "total_steps=800 ends before the first update"),
    "play_text_checkpoint": (["checkpoint=TEXT"], "is not a readable checkpoint"),
    "resume_text_checkpoint": (["resume=TEXT"], "is not a readable checkpoint"),
}


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_value_is_one_line_and_leaves_the_run_folder_as_it_was(tmp_path, case):
    args, message = BAD[case]
    text = tmp_path / "notes.pt"  # a text file named like a checkpoint (it ended in KeyError: 101, its "e")
    text.write_text("hello from my notes, not a checkpoint\n")
    args = [a.replace("TEXT", str(text)) for a in args]
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "train.log").write_text("an earlier job's log\n")
    before = _contents(run)
    command = "play" if case.startswith("play") else "train"
    out = rlrun(command, *args, f"hydra.run.dir={run}", cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [f"rlrun: error: {out.stderr.strip().removeprefix('rlrun: error: ')}"]
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert _contents(run) == before


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_exact_integers_a_run_without_updates_and_a_third_party_envs_checker_warnings(tmp_path):
    (tmp_path / "drifting_env.py").write_text(textwrap.dedent(DRIFTING))
    run = tmp_path / "run"
    out = rlrun(
        "train",
        "algo=dqn",  # its CartPole preset: one env, 256 steps per iteration, learning_starts 1000
        "env.id=Drifting-v0",
        "env.imports=[drifting_env]",
        "total_steps=8e2",
        "algo.allow_no_updates=true",
        "eval.every_steps=0",
        "eval.episodes=1",
        "eval.num_envs=1",
        "logging.progress=plain",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        timeout=150,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # 8e2 is the integer 800, as the run folder records it
    assert "total_steps=800" in (run / ".hydra" / "overrides.yaml").read_text()
    assert "total_steps: 800\n" in (run / ".hydra" / "config.yaml").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and 0 < summary["env_steps"] <= 800  # whole iterations, within 8e2
    log = (run / "train.log").read_text().splitlines()
    # the flag lets it run, with one warning saying why it will not learn
    assert sum("ends before the first update" in line for line in log) == 1, log
    # gymnasium's passive checker ran once, in the pre-flight: each warning one line, not Python's warnings format
    checker = [line for line in log if "gymnasium's env checker" in line]
    assert len(checker) == len(set(checker)) >= 2, log
    assert any("is not within the observation space" in line for line in checker), checker
    assert "UserWarning" not in out.stderr and "WARN:" not in out.stdout + out.stderr, out.stderr[-2000:]
