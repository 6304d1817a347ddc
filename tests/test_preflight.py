"""The pre-flight in-process (rlrun/config/preflight.py and hydra_compat.py): every kind of bad input to
`rlrun train` (composition errors, and the value checks of the schemas) ends in one UserError line saying what
is wrong and what is accepted. What rlrun reads of Hydra beyond its documented API (its argument parser, error
texts) is exercised here: a Hydra release that changes it fails these tests, loudly, instead of users getting
tracebacks."""

from __future__ import annotations

import pytest

from rlrun.algos import DQNConfig
from rlrun.config import EnvConfig, ModelConfig, TrainConfig
from rlrun.config.hydra_compat import args_parser, parse_overrides
from rlrun.config.preflight import preflight
from rlrun.config.store import from_yaml, register_configs, to_yaml
from rlrun.errors import UserError

register_configs()

BAD_TRAIN = [
    (["algo=nope"], "unknown algo 'nope'; choose one of: a2c, dqn, ppo"),
    (["algo=dqn", "algo.exploration_fraction=2"], "algo.exploration_fraction=2.0: must be in (0, 1]"),
    (["algo=dqn", "env=pendulum"], "algo=dqn needs a discrete action space"),
    (["algo=dqn", "model=lstm"], "model=lstm trains with algo=ppo"),
    (["algo=dqn", "algo.replay.alpa=1"], "unknown key 'algo.replay.alpa'; did you mean algo.replay.alpha?"),
    (["env=nope"], "unknown env 'nope'; choose one of: acrobot, ant, breakout, cartpole, cartpole_masked, frozenlake"),
    (["model=nope"], "unknown model 'nope'"),
    (["algo.lrr=0.1"], "unknown key 'algo.lrr'; did you mean algo.lr?"),
    (["+algo.foo=1"], "unknown key 'algo.foo'"),
    (["algo.lr=abc"], "algo.lr=abc: Value 'abc' of type 'str' could not be converted to Float"),
    (["total_steps=1.5"], "total_steps=1.5"),
    (["algo.lr=-1"], "algo.lr=-1.0: must be > 0"),
    (["env.num_envs=0"], "env.num_envs=0: must be >= 1"),
    (["total_steps=100"], "less than one rollout"),
    (["algo.num_minibatches=3"], "must divide the batch"),
    (["model=lstm", "algo.num_minibatches=16"], "algo.num_minibatches=16 must divide env.num_envs=8 for model=lstm"),
    (["model=gru", "model.shared=false"], "model.shared=false: gru shares its encoder and core"),
    (["env.id=CartPol-v1"], "unknown env id 'CartPol-v1'; did you mean CartPole-v1"),
    (["-m", "seed=1,2", "algo.lr=0.1,-2"], "algo.lr=-2.0: must be > 0"),
    (["resume=does/not/exist"], "checkpoint not found"),
    (["seed"], "cannot parse overrides"),
    (["algo.lr=0"], "algo.lr=0.0: must be > 0"),
    (["algo.gamma=1.5"], "algo.gamma=1.5"),
    (["model.activation=gelu"], "tanh or relu"),
    (["algo=dqn", "algo.tau=0"], "algo.tau=0.0: must be in (0, 1]"),
    (["algo=dqn", "algo.buffer_size=0"], "algo.buffer_size=0: must be >= 1"),
    (["algo=dqn", "algo.buffer_size=500"], "algo.learning_starts=1000 exceeds what the replay can hold"),
    (["algo=dqn", "algo.loss=l1"], "algo.loss=l1: accepted are mse, huber"),
    (["algo=dqn", "total_steps=100"], "less than one iteration"),
    (["algo=dqn", "algo.replay.alpha=0"], "algo.replay.alpha=0.0: must be > 0"),
    (["model.name=rnn"], "model.name=rnn: accepted are mlp, nature_cnn, lstm, gru, lru"),
    (["model=lru", "model.lru_decay=learned"], "model.lru_decay=learned: accepted are fixed, input"),
    (["model=lstm", "model.encoder=cnn"], "model.encoder=cnn: accepted are mlp, nature_cnn"),
    (["model=gru", "model.core_size=0"], "model.core_size=0: must be >= 1"),
    (["algo=a2c", "algo.optimizer=sgd"], "algo.optimizer=sgd: accepted are rmsprop, rmsprop_tf, adam"),
    (["algo=a2c", "model=lstm"], "model=lstm trains with algo=ppo; algo=a2c takes model=mlp or nature_cnn"),
    (["algo=a2c", "total_steps=10"], "less than one unroll"),
    (["model.kwargs.hidden=64"], "'model.kwargs.hidden' is not set yet; add it with +model.kwargs.hidden=VALUE"),
    (["model._target_=no_such_module.Net"], "model._target_=no_such_module.Net: cannot import it (No module named"),
    (["model._target_=tests.data.user_nets.Nope"], "cannot import it (module 'tests.data.user_nets' has no attribute"),
    (
        ["model._target_=tests.data.user_nets.TinyActorCritic", "+model.kwargs.width=3"],
        "failed: TypeError: TinyActorCritic.__init__() got an unexpected keyword argument 'width'",
    ),
    (
        ["model._target_=tests.data.user_nets.WrongOutputs"],
        "forward(obs [2, 4]) must return (logits [2, 2], value [2]) for this env and algorithm; it returned [2, 2]",
    ),
    (["algo=dqn", "model._target_=tests.data.user_nets.TinyActorCritic"], "must return Q-values [2, 2]"),
    (["algo=dqn", "algo.dueling=true", "model._target_=tests.data.user_nets.TinyQ"], "put it in your network"),
    (["model=lstm", "model._target_=tests.data.user_nets.TinyQ"], "model._target_ networks are feedforward"),
]


@pytest.mark.parametrize("args, message", BAD_TRAIN, ids=[" ".join(a) for a, _ in BAD_TRAIN])
def test_bad_train_input_is_one_line_naming_what_is_accepted(args, message):
    with pytest.raises(UserError) as info:
        preflight("train", args)
    text = str(info.value)
    assert "\n" not in text and message in text, text


def test_a_resume_override_the_checkpoints_algorithm_lacks_is_one_line():
    text = to_yaml(TrainConfig(algo=DQNConfig(), env=EnvConfig(), model=ModelConfig()))
    assert from_yaml(text, ["algo.lr=0.5"]).algo.lr == 0.5
    for bad in ("algo.clip_coef=0.1", "algo.lr=abc"):
        with pytest.raises(UserError, match=f"{bad}: .*the checkpoint's algo is dqn"):
            from_yaml(text, [bad])


def test_good_input_passes_and_help_is_left_to_hydra():
    assert preflight("train", ["algo=dqn", "seed=3"]) == ["algo=dqn", "seed=3"]
    assert preflight("train", ["--help"]) == ["--help"]
    assert preflight("play", ["checkpoint=x", "--cfg", "job"]) == ["checkpoint=x", "--cfg", "job"]


def test_hydra_argument_parser_and_override_parser_as_rlrun_reads_them():
    parsed = args_parser().parse_args(["-m", "seed=1,2", "--cfg", "job"])
    assert parsed.multirun and parsed.cfg == "job" and parsed.overrides == ["seed=1,2"]
    (sweep,) = parse_overrides(["seed=1,2"])
    assert (
        sweep.key_or_group == "seed"
        and sweep.is_sweep_override()
        and list(sweep.sweep_string_iterator())
        == [
            "1",
            "2",
        ]
    )


def test_hydra_composes_from_the_live_config_store_not_a_copy_per_composition():
    # Each composition wraps the config repository in a caching one, which deep-copies it; Hydra 1.3's structured
    # source held the ConfigStore, so every copy copied every schema (rlrun/config/hydra_compat.py).
    from hydra._internal.config_repository import CachingConfigRepository, ConfigRepository
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.config_store import ConfigStore

    from rlrun.config.hydra_compat import StructuredConfigSource

    path = ConfigSearchPathImpl()
    path.append("schema", "structured://")
    (source,) = CachingConfigRepository(ConfigRepository(path)).delegate.sources
    assert isinstance(source, StructuredConfigSource) and source.store is ConfigStore.instance()
    ConfigStore.instance().store(name="registered_after_the_copy", node={"x": 1})
    try:
        assert source.load_config("registered_after_the_copy").config == {"x": 1}
    finally:
        del ConfigStore.instance().repo["registered_after_the_copy.yaml"]
