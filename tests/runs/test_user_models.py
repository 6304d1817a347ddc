"""Users' own networks (model._target_): built by Hydra with the env's spaces for every algorithm, checked once
against what the algorithm reads from their forward, trained, checkpointed and played like rlrun's own."""

import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos import ALGORITHMS, build_algo
from rlrun.algos.protocol import EnvSpec
from rlrun.config import ModelConfig
from rlrun.models import UserActorCritic
from tests.conftest import DATA, rlrun, train

CARTPOLE = (gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2))
PENDULUM = (gym.spaces.Box(-8, 8, (3,)), gym.spaces.Box(-2, 2, (1,)))
FRAMES = (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(4))


class Frames(torch.nn.Module):
    """A small CNN for frames: what a user would bring for Atari."""

    def __init__(self, observation_space, action_space):
        super().__init__()
        self.conv = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 8, stride=8), torch.nn.ReLU(), torch.nn.Flatten())
        self.pi, self.v = torch.nn.Linear(800, action_space.n), torch.nn.Linear(800, 1)

    def forward(self, obs):
        h = self.conv(obs.float() / 255)
        return self.pi(h), self.v(h).squeeze(-1)


@pytest.mark.parametrize(
    "algo, target, spaces",
    [
        ("ppo", "tests.data.user_nets.TinyActorCritic", CARTPOLE),
        ("ppo", "tests.data.user_nets.TinyActorCritic", PENDULUM),
        ("a2c", "tests.data.user_nets.TinyActorCritic", PENDULUM),
        ("a2c", "tests.runs.test_user_models.Frames", FRAMES),
        ("dqn", "tests.data.user_nets.TinyQ", CARTPOLE),
    ],
)
def test_a_users_network_is_built_with_the_spaces_and_acts(algo, target, spaces):
    obs_space, action_space = spaces
    entry = ALGORITHMS[algo]
    cfg = entry.schema(buffer_size=64) if algo == "dqn" else entry.schema()
    model_cfg = ModelConfig(_target_=target, kwargs={"hidden": 16} if "user_nets" in target else {})
    built = build_algo(cfg, model_cfg, EnvSpec(obs_space, action_space, 2), torch.device("cpu"))
    assert type(built.model).__name__ in ("UserActorCritic", "TinyQ")
    assert isinstance(built.model, UserActorCritic) == (algo != "dqn")
    actions = built.act(np.stack([obs_space.sample() for _ in range(3)]), deterministic=False)
    assert actions.shape == (3, *action_space.shape)


def _train(tmp_path: Path, name: str, *args: str, timeout: float = 180) -> dict:
    shutil.copy(DATA / "user_nets.py", tmp_path)  # in the working directory, as `python -m` would find it
    run = train(tmp_path, name, "logging.progress=plain", *args, timeout=timeout)
    return json.loads((run / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ppo_trains_a_users_network_then_plays(tmp_path):
    # That it learns CartPole with it: bench/learning/test_user_models.py.
    summary = _train(
        tmp_path,
        "ppo",
        "model._target_=user_nets.TinyActorCritic",
        "+model.kwargs.hidden=64",
        "total_steps=2048",
        "eval.episodes=2",
    )
    assert summary["status"] == "completed" and np.isfinite(summary["eval_return_mean"]), summary
    out = rlrun("play", f"checkpoint={tmp_path / 'ppo'}", "episodes=2", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mean" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dqn_and_a2c_train_users_networks(tmp_path):
    dqn = _train(
        tmp_path,
        "dqn",
        "algo=dqn",
        "model._target_=user_nets.TinyQ",
        "total_steps=3000",
        "algo.learning_starts=500",
        "eval.episodes=2",
    )
    a2c = _train(
        tmp_path,
        "a2c",
        "algo=a2c",
        "env=pendulum",
        "model._target_=user_nets.TinyActorCritic",
        "total_steps=2000",
        "eval.episodes=2",
    )
    assert dqn["status"] == a2c["status"] == "completed"
    state = torch.load(sorted((tmp_path / "a2c" / "checkpoints").glob("*.pt"))[-1], weights_only=True)
    assert "net.pi.weight" in state["algo"]["model"] and "log_std" in state["algo"]["model"]
