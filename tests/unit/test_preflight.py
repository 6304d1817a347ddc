"""The pre-flight in-process (rlrun/compose/preflight.py and hydra_compat.py): every kind of bad input to
`rlrun train` (composition errors, and the value checks of the schemas) ends in one UserError line saying what
is wrong and what is accepted. What rlrun reads of Hydra beyond its documented API (its argument parser, error
texts) is exercised here: a Hydra release that changes it fails these tests, loudly, instead of users getting
tracebacks."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from rlrun.algos import DQNConfig
from rlrun.compose.hydra_compat import args_parser, parse_overrides
from rlrun.compose.preflight import preflight
from rlrun.compose.store import from_yaml, register_configs, to_yaml
from rlrun.compose.sweep_resume import sweep_resume_args
from rlrun.config import EnvConfig, ModelConfig, TrainConfig
from rlrun.errors import UserError
from rlrun.run_folder import held
from tests.conftest import cli_env

register_configs()

BAD_TRAIN = [
    (["algo=nope"], "unknown algo 'nope'; choose one of: a2c, dqn, ppo"),
    (["algo=dqn", "algo.exploration_fraction=2"], "algo.exploration_fraction=2.0: must be in (0, 1]"),
    (["algo=dqn", "env=pendulum"], "algo=dqn needs a discrete action space"),
    (["algo=dqn", "env=pendulum", "total_steps=2048"], "algo=dqn needs a discrete action space"),  # not the budget
    (["algo=sac", "env=cartpole", "total_steps=2048"], "algo=sac needs a continuous action space"),
    (["algo=dqn", "model=lstm"], "model=lstm trains with algo=ppo"),
    (["algo=dqn", "algo.replay.alpa=1"], "unknown key 'algo.replay.alpa'; did you mean algo.replay.alpha?"),
    (["env=nope"], "unknown env 'nope'; choose one of: acrobot, ant, breakout, cartpole, cartpole_masked, frozenlake"),
    (["env=MountainCar-v0"], "walker2d, or any registered gymnasium env with env.id=MountainCar-v0"),
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
    # names matched without their versions (the shared -v0 made Nope-v0 close to Gopher-v0 and Hopper-v5)
    (["env.id=Nope-v0"], "unknown env id 'Nope-v0' (gymnasium ids look like CartPole-v1, ALE/Pong-v5)"),
    (["env.id=LunarLander-v2"], "unknown env id 'LunarLander-v2'; did you mean LunarLander-v3?"),
    (["env.id=acrobat-v1"], "unknown env id 'acrobat-v1'; did you mean Acrobot-v1?"),
    (["-m", "seed=1,2", "algo.lr=0.1,-2"], "algo.lr=-2.0: must be > 0"),
    (["resume=does/not/exist"], "checkpoint not found"),
    (["seed"], "cannot parse overrides"),
    (["-m", "seed=0,1", "--cfg", "job"], "only one of --run, --multirun (-m), --cfg, --info and --shell-completion"),
    (
        ["-m", "seed=0,1", "algo=sac,td3", "env=pendulum", "algo.learning_starts=200"],
        "-m algo=sac,td3: Hydra composes a sweep at its config groups' defaults first",
    ),
    (["algo.lr=0"], "algo.lr=0.0: must be > 0"),
    (["algo.gamma=1.5"], "algo.gamma=1.5"),
    (["model.activation=gelu"], "model.activation=gelu: accepted are tanh, relu"),
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
    # issue 39: values that ended deep inside (a torch, gymnasium or numpy traceback) or not at all
    (["seed=-1"], "seed=-1: must be in [0, 2**32)"),
    (["seed=4294967296"], "seed=4294967296: must be in [0, 2**32)"),
    (["env.max_episode_steps=0"], "env.max_episode_steps=0: must be >= 1 (or null)"),
    (["total_steps=1e-3"], "total_steps=1e-3: must be an integer"),
    (["-m", "total_steps=1e5,2.5e-1"], "total_steps=1e5,2.5e-1: must be an integer"),
    (["device=gpu"], "device=gpu: accepted are auto, cpu, cuda, cuda:N"),
    (["device=cuda:99"], "device=cuda:99: this machine has"),
    (["algo.lr=nan"], "algo.lr=nan: must be > 0"),
    (["algo.ent_coef=-0.1"], "algo.ent_coef=-0.1: must be >= 0"),
    (["model.hidden_sizes=[64,0]"], "model.hidden_sizes=[64, 0]: each must be >= 1"),
    (["env=breakout", "env.atari.repeat_action_probability=1.5"], "repeat_action_probability=1.5: must be in [0, 1]"),
    (["env=breakout", "env.atari.frame_skip=0"], "env.atari.frame_skip=0: must be >= 1"),
    (["logging.progress=fancy"], "logging.progress=fancy: accepted are auto, rich, plain, none"),
    (["algo=dqn", "algo.start_e=1.1"], "algo.start_e=1.1: must be in [0, 1]"),
    (["algo=sac", "env=pendulum", "algo.alpha=0"], "algo.alpha=0.0: must be > 0"),
    (["algo=td3", "env=pendulum", "algo.target_noise_clip=-1"], "algo.target_noise_clip=-1.0: must be >= 0"),
    (
        ["algo=dqn", "total_steps=800"],
        "total_steps=800 ends before the first update: the replay holds 765 transitions at the end, "
        "algo.learning_starts=1000; raise total_steps to 1024 or lower algo.learning_starts "
        "(or algo.allow_no_updates=true runs it anyway)",
    ),
    (["algo=dqn", "env=breakout", "total_steps=2000"], "algo.learning_starts=80000; raise total_steps to 80004"),
    (
        ["algo=dqn", "distributed.nproc_per_node=2", "algo.n_step=3", "total_steps=1000"],
        "the replay holds 506 transitions at the end, algo.learning_starts=1000; raise total_steps to 1024",
    ),
    (["algo=sac", "env=pendulum", "total_steps=100"], "raise total_steps to 101"),
    (["algo=td3", "env=pendulum", "algo.learning_starts=5000", "total_steps=4000"], "raise total_steps to 5001"),
    # the sweep launchers' values: a traceback once the sweep had started, or no keys named
    (["-m", "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0: give the jobs"),
    (["-m", "seed=0,1", "hydra/launcher=batched", "hydra.launcher.max_batch=0"], "max_batch=0: give at least 1 seed"),
    (
        ["-m", "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.verbose=1"],
        "unknown key 'hydra.launcher.verbose' (keys under hydra.launcher: n_jobs)",
    ),
    (["-m", "hydra/launcher=batched", "hydra.launcher.max_btch=2"], "did you mean hydra.launcher.max_batch?"),
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


def test_exact_integer_floats_are_written_as_integers_for_hydra():
    # OmegaConf refuses any float for an int key; the pre-flight hands Hydra the integer, so .hydra/overrides.yaml
    # and the resolved config say 1000000. Floats of float keys stay as written.
    assert preflight("train", ["total_steps=1e6", "algo.lr=1e-3"]).args == ["total_steps=1000000", "algo.lr=1e-3"]
    assert preflight("train", ["-m", "total_steps=1e5,2.5e4", "seed=0,1"]).args == [
        "-m",
        "total_steps=100000,25000",
        "seed=0,1",
    ]
    assert (
        preflight("train", ["algo=dqn", "algo.learning_starts=5e2", "--cfg", "job"]).args[1]
        == "algo.learning_starts=500"
    )


def test_the_number_that_would_just_update_is_accepted():
    # 1024 steps of DQN's CartPole preset (train_freq 256, one env, learning_starts 1000, 1-step): 4 iterations, the
    # replay holds 1023 after the last one, so one update phase runs; below that, none.
    assert preflight("train", ["algo=dqn", "total_steps=1024"]).args == ["algo=dqn", "total_steps=1024"]
    with pytest.raises(UserError, match="raise total_steps to 1024"):
        preflight("train", ["algo=dqn", "total_steps=1023"])
    assert preflight("train", ["algo=dqn", "total_steps=800", "algo.allow_no_updates=true"])
    assert preflight("train", ["algo=dqn", "total_steps=800", "algo.gradient_steps=0"])  # only collects: as asked


def test_a_device_is_looked_for_only_by_a_command_that_runs():
    # Printing a config or failing on a typo never imports torch (start-up stays under a second); a run that asks for
    # a CUDA device this machine lacks is refused before its run folder exists.
    code = (
        "import sys; from rlrun.compose.store import register_configs; from rlrun.compose.preflight import preflight;"
        "register_configs(); preflight('train', ['device=cuda:99', '--cfg', 'job']); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=cli_env())
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_good_input_passes_and_help_is_left_to_hydra():
    assert preflight("train", ["algo=dqn", "seed=3"]).args == ["algo=dqn", "seed=3"]
    assert preflight("train", ["--help"]).args == ["--help"]
    assert preflight("play", ["checkpoint=x", "--cfg", "job"]).args == ["checkpoint=x", "--cfg", "job"]


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
    # source held the ConfigStore, so every copy copied every schema (rlrun/compose/hydra_compat.py).
    from hydra._internal.config_repository import CachingConfigRepository, ConfigRepository
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.config_store import ConfigStore

    from rlrun.compose.hydra_compat import StructuredConfigSource

    path = ConfigSearchPathImpl()
    path.append("schema", "structured://")
    (source,) = CachingConfigRepository(ConfigRepository(path)).delegate.sources
    assert isinstance(source, StructuredConfigSource) and source.store is ConfigStore.instance()
    ConfigStore.instance().store(name="registered_after_the_copy", node={"x": 1})
    try:
        assert source.load_config("registered_after_the_copy").config == {"x": 1}
    finally:
        del ConfigStore.instance().repo["registered_after_the_copy.yaml"]


def test_resume_of_a_sweep_folder_is_the_sweeps_own_line_in_that_folder_each_job_from_its_newest_checkpoint(tmp_path):
    """resume=SWEEP (a folder where Hydra wrote multirun.yaml) runs the sweep's line again (its launcher and
    overrides, the resume line's own on top), in that folder, each job with resume=auto and its .hydra/ left as it
    was; resume= of anything else is left to the single-run resume."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    saved = {"hydra/launcher=batched", "hydra.sweep.dir=/elsewhere", "hydra.mode=MULTIRUN"}
    overrides = {"hydra": sorted(saved), "task": ["seed=0,1", "total_steps=1024", "eval.episodes=2"]}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": overrides}, "seed": 0}))
    args = sweep_resume_args([f"resume={sweep}", "total_steps=2048"])
    assert args[0] == "-m" and sorted(args[1:]) == sorted(
        ["hydra/launcher=batched", "seed=0,1", "eval.episodes=2", "total_steps=2048", f"hydra.sweep.dir='{sweep}'"]
        + ["hydra.output_subdir=null", "resume=auto"]
    )
    assert args.index("total_steps=2048") > args.index("seed=0,1")  # the resume line's on top
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert sweep_resume_args([f"resume={run}", "total_steps=2048"]) == [f"resume={run}", "total_steps=2048"]
    (sweep / "multirun.yaml").write_text("hydra: 3")
    with pytest.raises(UserError, match="cannot read the sweep's overrides from its multirun.yaml"):
        sweep_resume_args([f"resume={sweep}"])


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("seed=0,1,2", "seed=0,1,2 is a sweep of its own"),
        ("seed=7", "seed=7 sets seed, which the sweep sweeps"),
        ("algo.lr=0.1", "algo.lr=0.1 sets algo.lr, which the sweep sweeps"),
        ("algo=dqn", "algo=dqn chooses the sweep's algo anew"),
    ],
)
def test_a_sweep_resume_that_would_renumber_or_retarget_its_jobs_is_refused(tmp_path, given, reason):
    """Hydra numbers a sweep's jobs by its line: a resume line that sweeps, or sets what the sweep sweeps or its
    config groups, would continue each folder's checkpoint as another job. Refused in one line before anything runs
    (multirun.yaml stays as it was); overrides for every job pass."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    overrides = {"hydra": ["hydra.mode=MULTIRUN"], "task": ["algo=ppo", "seed=0,1", "algo.lr=1e-4,3e-4"]}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": overrides}}))
    with pytest.raises(UserError, match="continues the sweep's own jobs, each in its folder; " + re.escape(reason)):
        sweep_resume_args([f"resume={sweep}", given, "total_steps=2048"])
    assert "total_steps=2048" in sweep_resume_args([f"resume={sweep}", "algo=ppo", "total_steps=2048"])


def test_resuming_a_folder_of_runs_without_multirun_yaml_names_its_runs(tmp_path):
    """An Optuna sweep's folder holds no multirun.yaml: resume= of it names the runs to resume one by one."""
    for job in ("0", "1"):
        (tmp_path / "sweep" / job / "checkpoints").mkdir(parents=True)
        (tmp_path / "sweep" / job / "checkpoints" / "ckpt_000000000512.pt").write_bytes(b"")
    with pytest.raises(UserError, match=f"{tmp_path / 'sweep'} holds the runs 0, 1, not one run: resume each with"):
        preflight("train", [f"resume={tmp_path / 'sweep'}"])


def test_a_sweep_resume_while_a_job_of_it_runs_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "1").mkdir(parents=True)
    overrides = {"hydra": ["hydra.mode=MULTIRUN"], "task": ["seed=0,1"]}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": overrides}}))
    assert sweep_resume_args([f"resume={sweep}"])[0] == "-m"
    with held(sweep / "1"):  # as a live job holds its folder
        with pytest.raises(UserError, match=f"the sweep still runs \\(job folder {sweep / '1'} is held by host"):
            sweep_resume_args([f"resume={sweep}"])
