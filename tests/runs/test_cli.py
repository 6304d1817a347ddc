"""The CLI as a user meets it, in real subprocesses: help, composed config, and one clear line (exit 2, no
traceback, no run folder) for every kind of bad input."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import cli_env, rlrun

pytestmark = pytest.mark.slow  # real processes of the CLI; the pre-flight's logic is tested in-process too


def test_help_lists_commands(tmp_path):
    out = rlrun("--help", cwd=tmp_path)
    assert out.returncode == 0 and "train" in out.stdout and "play" in out.stdout
    script = Path(sys.executable).parent / "rlrun"  # the console script behaves the same
    import subprocess

    same = subprocess.run([str(script), "--help"], capture_output=True, text=True, env=cli_env(), timeout=60)
    assert same.stdout == out.stdout


def test_train_help_shows_groups_and_options(tmp_path):
    out = rlrun("train", "--help", cwd=tmp_path)
    assert out.returncode == 0
    envs = "acrobot, ant, breakout, cartpole, cartpole_masked, frozenlake, halfcheetah, hopper, humanoid, lunarlander"
    assert f"env: {envs}" in out.stdout
    assert "model: gru, lru, lstm, mlp, nature_cnn" in out.stdout


def test_cfg_job_prints_composed_config(tmp_path):
    out = rlrun("train", "--cfg", "job", "env=breakout", "algo.lr=0.001", cwd=tmp_path)
    assert out.returncode == 0
    assert "id: ALE/Breakout-v5" in out.stdout and "name: nature_cnn" in out.stdout and "lr: 0.001" in out.stdout
    assert not (tmp_path / "outputs").exists()


# The whole list runs in-process (tests/unit/test_preflight.py); these few go through a real process: one line on
# stderr, exit 2, no run folder.
BAD_TRAIN = [
    (["algo.lrr=0.1"], "unknown key 'algo.lrr'; did you mean algo.lr?"),
    (["env=nope"], "unknown env 'nope'; choose one of: acrobot, ant, breakout, cartpole, cartpole_masked, frozenlake"),
    (["algo.lr=-1"], "algo.lr=-1.0: must be > 0"),
    (["-m", "seed=1,2", "algo.lr=0.1,-2"], "algo.lr=-2.0: must be > 0"),
    (["resume=does/not/exist"], "checkpoint not found"),
]


@pytest.mark.parametrize("args, message", BAD_TRAIN, ids=[" ".join(a) for a, _ in BAD_TRAIN])
def test_bad_train_input_gets_one_line(tmp_path, args, message):
    out = rlrun("train", *args, cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlrun: error: "), out.stderr
    assert message in lines[0]
    assert not (tmp_path / "outputs").exists()  # nothing was started


def _bad_checkpoint(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "c.pt"
    if kind == "truncated":
        torch.save({"rlrun_format": 1, "w": torch.zeros(1000)}, path)
        path.write_bytes(path.read_bytes()[:200])
    elif kind == "not_rlrun":
        torch.save({"weights": torch.zeros(2)}, path)
    elif kind == "future_version":
        torch.save({"rlrun_format": 99}, path)
    return path


@pytest.mark.parametrize("command", ["play", "train"])
@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing", "checkpoint not found"),
        ("truncated", "not a readable"),
        ("not_rlrun", "not an rlrun checkpoint"),
        ("future_version", "format version 99"),
    ],
)
def test_bad_checkpoints_get_one_line(tmp_path, command, kind, message):
    key = "checkpoint" if command == "play" else "resume"
    out = rlrun(command, f"{key}={_bad_checkpoint(tmp_path, kind)}", cwd=tmp_path, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


def test_no_command_is_a_usage_error(tmp_path):
    out = rlrun(cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("usage: rlrun <command>") and "train" in out.stderr


def test_play_without_checkpoint_and_unknown_command(tmp_path):
    out = rlrun("play", cwd=tmp_path)
    assert out.returncode == 2 and "missing value for 'checkpoint'" in out.stderr
    out = rlrun("trian", cwd=tmp_path)
    assert out.returncode == 2 and "unknown command 'trian'; choose one of: train, play" in out.stderr


@pytest.mark.parametrize(
    "args, code",
    [
        (["train", "--cfg", "job"], 0),
        (["train", "env=breakout", "--cfg", "job"], 0),
        (["train", "--help"], 0),
        (["play", "--help"], 0),
        (["train", "algo.lrr=1"], 2),
        (["train", "env.id=CartPol-v1"], 2),
        (["train", "algo=dqn", "env=pendulum"], 2),
        (["train", "resume=does/not/exist"], 2),
    ],
)
def test_config_commands_and_preflight_errors_import_no_torch(tmp_path, args, code):
    """What only composes, checks or prints a config answers without torch (a second and a half of imports)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rlrun", *args],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == code, out.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "rlrun.compose.preflight" in imported  # the composition and checks really ran
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, "torch was imported"
