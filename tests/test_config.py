"""Config composition of every algo x env pair against the schema, and the value checks."""

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlrun.cli import CONF_DIR
from rlrun.config import AtariConfig, DQNConfig, PPOConfig, TrainConfig, register_configs, validate_train
from rlrun.errors import UserError

register_configs()
ENVS = ["cartpole", "acrobot", "pendulum", "breakout", "cartpole_masked"]


def typed(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return OmegaConf.to_object(compose("train", overrides=list(overrides)))


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_every_pair_composes_and_validates(algo, env):
    cfg = typed(f"algo={algo}", f"env={env}")
    assert isinstance(cfg.algo, {"ppo": PPOConfig, "dqn": DQNConfig}[algo])
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


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.lr=0"], "algo.lr=0.0: must be > 0"),
        (["env.num_envs=0"], "env.num_envs=0: must be >= 1"),
        (["total_steps=100"], "less than one rollout"),
        (["algo.num_minibatches=3"], "must divide the batch"),
        (["algo.gamma=1.5"], "algo.gamma=1.5"),
        (["model.activation=gelu"], "tanh or relu"),
        (["algo=dqn", "algo.tau=0"], "algo.tau=0.0: must be in (0, 1]"),
        (["algo=dqn", "algo.buffer_size=0"], "algo.buffer_size=0: must be >= 1"),
        (["algo=dqn", "algo.buffer_size=500"], "algo.learning_starts=1000 exceeds what the replay can hold"),
        (["algo=dqn", "algo.loss=l1"], "algo.loss=l1: accepted are mse, huber"),
        (["algo=dqn", "total_steps=100"], "less than one iteration"),
        (["algo=dqn", "algo.replay.alpha=0"], "algo.replay.alpha=0.0: must be > 0"),
        (["model.name=rnn"], "model.name=rnn: accepted are mlp, nature_cnn, lstm, gru, lru"),
        (["model=lstm", "algo.num_minibatches=16"], "must divide env.num_envs=8 for model=lstm"),
        (["model=lru", "model.lru_decay=learned"], "model.lru_decay=learned: accepted are fixed, input"),
        (["model=lstm", "model.encoder=cnn"], "model.encoder=cnn: accepted are mlp, nature_cnn"),
        (["model=gru", "model.core_size=0"], "model.core_size=0: must be >= 1"),
    ],
)
def test_out_of_range_values_are_refused(overrides, message):
    with pytest.raises(UserError, match=message.replace(".", r"\.").replace("(", r"\(")):
        validate_train(typed(*overrides))
