"""Config composition of every algo x env pair against the schema, and the value checks."""

import pytest

from rlrun.algos import A2CConfig, DQNConfig, PPOConfig
from rlrun.compose.store import register_configs
from rlrun.config import AtariConfig, validate_train
from tests.conftest import typed

register_configs()
ENVS = ["cartpole", "acrobot", "pendulum", "breakout", "cartpole_masked"]


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn"])
def test_every_pair_composes_and_validates(algo, env):
    cfg = typed(f"algo={algo}", f"env={env}")
    assert isinstance(cfg.algo, {"ppo": PPOConfig, "a2c": A2CConfig, "dqn": DQNConfig}[algo])
    validate_train(cfg)
    assert cfg.model.name == ("nature_cnn" if env == "breakout" else "mlp")
    assert isinstance(cfg.env.atari, AtariConfig) == (env == "breakout")


@pytest.mark.parametrize("model", ["lstm", "gru", "lru"])
@pytest.mark.parametrize("env", ENVS)
def test_recurrent_models_compose_with_every_env(model, env):
    # Pendulum's tuned 64 minibatches of single steps cannot be cut from 4 env sequences: one per env instead.
    cfg = typed(f"model={model}", f"env={env}", *(["algo.num_minibatches=4"] if env == "pendulum" else []))
    validate_train(cfg)
    assert cfg.model.name == model and cfg.model.shared
    assert cfg.model.encoder == ("nature_cnn" if env == "breakout" else "mlp")  # frames get the Nature CNN


def test_command_line_beats_env_defaults():
    cfg = typed("env=breakout", "model=mlp", "algo.lr=0.1", "env.num_envs=3")
    assert (cfg.model.name, cfg.algo.lr, cfg.env.num_envs) == ("mlp", 0.1, 3)
