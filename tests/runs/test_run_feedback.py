"""What a run tells its user, through the real CLI: progress lines by time and an evaluation that says what it does
and stops at its step cap (an env that never ends), a sweep that names its folder, play's own help, its log and
its videos."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import cli_env, finish, rlrun

ENDLESS = (
    "import time\n"
    "import gymnasium as gym\n"
    "import numpy as np\n"
    "class Endless(gym.Env):\n"
    "    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)\n"
    "    action_space = gym.spaces.Discrete(2)\n"
    "    def reset(self, *, seed=None, options=None):\n"
    "        super().reset(seed=seed)\n"
    "        return np.zeros(2, np.float32), {}\n"
    "    def step(self, action):\n"
    "        time.sleep(0.001)  # slow enough that a run of a few thousand steps lasts seconds\n"
    "        return np.zeros(2, np.float32), 0.0, False, False, {}\n"
    "gym.register('Endless-v0', entry_point=Endless)\n"
)
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[rlrun\]\[INFO\] (.*)$")


def _log_lines(path: Path) -> list[tuple[float, str]]:
    """(seconds, message) of the rlrun lines of a run's train.log."""
    lines = []
    for line in path.read_text().splitlines():
        m = STAMP.match(line)
        if m:
            lines.append((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m.group(2)))
    return lines


@pytest.mark.timeout(120)
def test_progress_none_quiets_the_console_not_train_log(tmp_path):
    """logging.progress=none keeps the run's lines off the console, not out of its folder: train.log still says how
    the run started, evaluated and ended."""
    run = tmp_path / "run"
    out = rlrun(
        "train", "total_steps=300", "eval.episodes=1", "logging.progress=none", f"hydra.run.dir={run}", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    messages = [m for _, m in _log_lines(run / "train.log")]
    for start in ("run folder", "accelerations: ", "evaluating 1 episode", "eval: 1 episode in", "done: 256 env steps"):
        assert any(m.startswith(start) for m in messages), messages
    assert messages[-1].endswith("over 1 episode"), messages[-1]
    # The start says the steps the run trains: whole iterations of 256 (CartPole's preset: 128 steps x 2 envs).
    (start,) = [m for m in messages if m.startswith("run folder")]
    assert start.endswith("256 env steps (1 iteration of 256, 1 rank; total_steps=300 in whole iterations)"), start
    assert "run folder" not in out.stdout and "done: " not in out.stdout, out.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_progress_by_time_and_an_endless_env_evaluated_to_its_cap(tmp_path):
    """Off a terminal, with a metrics interval longer than the run: a progress line every logging.every_seconds;
    an evaluation of an agent that never ends an episode announces itself, says each episode hit the cap, and
    ends; the run's SPS leaves the evaluation's seconds out."""
    (tmp_path / "endless.py").write_text(ENDLESS)
    run = tmp_path / "run"
    out = rlrun(
        "train",
        "env.id=Endless-v0",
        "env.imports=[endless]",
        "env.num_envs=4",
        "algo.num_steps=32",
        "total_steps=2048",
        "logging.every_steps=1000000",
        "logging.every_seconds=1",
        "eval.every_steps=0",
        "eval.episodes=4",
        "eval.num_envs=2",
        "eval.max_episode_steps=300",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "evaluating 4 episodes on 2 envs, at most 300 steps each" in out.stdout
    assert "eval: 4 of 4 episodes hit the 300-step cap" in out.stdout
    lines = _log_lines(run / "train.log")
    training = [t for t, m in lines if m.startswith("env_steps=") and "%" in m]
    assert len(training) >= 2, out.stdout  # no metrics line is due before the end: these are the time's
    start = next(t for t, m in lines if m.startswith("run folder"))
    end = next(t for t, m in lines if m.startswith("evaluating"))
    times = [start, *training, end]
    assert max(b - a for a, b in zip(times, times[1:])) < 1 + 6  # every second, with an iteration's slack (or a few)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_episodes"] == 4 and summary["eval_seconds"] > 0
    # SPS is training's: its time is the wall time less the evaluation's (and the start-up and final save).
    assert summary["env_steps"] / summary["sps"] <= summary["wall_seconds"] - summary["eval_seconds"] + 0.01


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_play_has_its_own_help_logs_its_table_and_writes_one_whole_video_per_episode(tmp_path):
    help_ = rlrun("play", "--help", cwd=tmp_path)
    assert help_.returncode == 0 and "checkpoint: ???" in help_.stdout and "env:\n  id: null" in help_.stdout
    assert not re.search(r"^(algo|env|model|tuned|sweep): ", help_.stdout, re.M), help_.stdout  # training's groups
    run = tmp_path / "run"
    train = rlrun(
        "train", "total_steps=256", "eval.episodes=1", "logging.progress=none", f"hydra.run.dir={run}", cwd=tmp_path
    )
    assert train.returncode == 0, train.stderr[-3000:]
    before = (run / ".hydra" / "config.yaml").read_bytes()
    into = rlrun("play", f"checkpoint={run}", f"hydra.run.dir={run}", cwd=tmp_path)  # the training run's own folder
    assert into.returncode == 2 and into.stderr.count("\n") == 1 and "is a training run's folder" in into.stderr
    assert (run / ".hydra" / "config.yaml").read_bytes() == before
    refused = rlrun("play", f"checkpoint={run}", "env=pendulum", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "env.id=ID" in refused.stderr
    other = rlrun("play", f"checkpoint={run}", "env.id=Acrobot-v1", cwd=tmp_path)
    assert other.returncode == 2 and "env.id=Acrobot-v1: its spaces differ from those of CartPole-v1" in other.stderr
    # the spaces the network takes (an HWC image is channels-first there), said to be so
    assert "(as the agent takes them, after rlrun's wrappers: observations Box(6,) float32 vs Box(4,)" in other.stderr
    # Sampled actions (deterministic=false) come from the play's seed too: the same seed plays the same episodes.
    tables = [
        rlrun("play", f"checkpoint={run}", "deterministic=false", "episodes=4", f"seed={seed}", cwd=tmp_path).stdout
        for seed in (5, 5, 6)
    ]
    assert tables[0] == tables[1] != tables[2] and "mean" in tables[0], tables
    # Ctrl-C ends a play at its next step: the episodes played so far are shown, then one line, exit 130.
    cmd = [sys.executable, "-m", "rlrun", "play", f"checkpoint={run}", "episodes=1000000"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line in proc.stdout or []:
            if line.startswith("playing 1000000 episodes on CartPole-v1"):
                break
        time.sleep(1.0)  # some episodes played
        proc.send_signal(signal.SIGINT)
    finally:
        out, err, _ = finish(proc, 30)
    assert proc.returncode == 128 + signal.SIGINT and err.strip() == "rlrun: error: interrupted", err
    assert "mean" in out and re.search(r"stopped by SIGINT after \d+ of 1000000 episodes", out), out[-2000:]

    folder = tmp_path / "play"
    out = rlrun(
        "play",
        f"checkpoint={run}",
        "episodes=2",
        "video=true",
        "env.id=CartPole-v0",
        f"hydra.run.dir={folder}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "XDG_RUNTIME_DIR" not in out.stdout + out.stderr and "pygame" not in out.stdout + out.stderr
    log = (folder / "play.log").read_text()
    assert "CartPole-v0: 256 env steps of ppo" in log and "mean" in log  # what play printed, the table too
    from moviepy import VideoFileClip

    videos = sorted((folder / "videos").glob("*.mp4"))
    assert len(videos) == 2, videos
    for video in videos:
        clip = VideoFileClip(str(video))
        frames = clip.n_frames
        clip.close()
        assert frames > 1, video


def test_run_episodes_stopped_early_returns_the_finished_episodes_in_order():
    """should_stop (the hook a stop signal uses) ends the episodes at once; what finished is kept in episode order,
    the same episodes a full run gives first."""
    import numpy as np

    from rlrun.config import EnvConfig
    from rlrun.envs import make_env
    from rlrun.envs.sync import SyncEnvs
    from rlrun.evaluation import run_episodes

    def episodes(should_stop=None):
        envs = SyncEnvs([make_env(EnvConfig(), train=False)] * 3)
        act = lambda obs, starts: (obs[:, 2] > 0).astype(np.int64)  # noqa: E731  (push towards the pole's lean)
        try:
            return run_episodes(envs, act, 9, [1, 2, 3], should_stop)
        finally:
            envs.close()

    full_returns, full_lengths = episodes()
    assert len(full_returns) == 9
    assert len(episodes(lambda: True)[0]) == 0  # stopped before any step: nothing finished
    calls = iter(range(10**6))
    stop_at = int(full_lengths[:3].max()) + 1  # every env finished its first episode by then
    returns, lengths = episodes(lambda: next(calls) >= stop_at)
    assert 3 <= len(returns) < 9 and set(lengths[:3]) <= set(full_lengths)
    assert list(lengths[:3]) == list(full_lengths[:3])
