"""Typed config schema: the dataclasses Hydra validates conf/ against, and the value checks run once after
composition. Every default lives here, or, for an algorithm's section, in its module's schema (rlrun/algos/);
yaml files only override. rlrun.compose.store registers them with Hydra."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from rlrun.errors import UserError

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")  # the yaml of the config groups


@dataclass
class VectorConfig:
    # sync: in the rank's process | subproc: forked worker processes | ray: Ray actors | native: the env's own
    # vectorized implementation (CartPole, ALE games) | auto: the one measured fastest for the env (rlrun/envs)
    backend: str = "sync"
    # subproc: worker processes (0: one per core); ray: actors (0: one per CPU of the cluster); at most num_envs;
    # native ALE games: C++ threads (0: one per core)
    num_workers: int = 0
    # subproc, ray, native: half the envs step (in workers, actors or an ALE game's threads) while the rank acts for
    # the other half (for PPO on subproc, instead of act_in_workers)
    double_buffer: bool = False
    step_timeout_s: float = 60.0  # subproc, ray: a worker slower than this is reported, not waited on
    # ray: the cluster to use (auto, or host:port); unset: each rank starts a local Ray for its run and stops it
    ray_address: str | None = None
    ray_cpus_per_worker: float = 1.0  # ray: CPUs each actor reserves (its envs step one after the other)


@dataclass
class AtariConfig:
    """Standard Atari preprocessing (Mnih et al. 2015; Machado et al. 2018 for sticky actions)."""

    noop_max: int = 30
    frame_skip: int = 4
    screen_size: int = 84
    frame_stack: int = 4
    terminal_on_life_loss: bool = True  # training only
    clip_reward: bool = True  # training only; logged returns are raw game scores
    repeat_action_probability: float = 0.0


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    num_envs: int = 8  # per rank
    max_episode_steps: int | None = None  # truncate episodes after this many agent steps (None: the env's own)
    kwargs: dict[str, Any] = field(default_factory=dict)
    atari: AtariConfig | None = None  # set for ALE games; ids starting with ALE/ get the defaults
    imports: list[str] = field(default_factory=list)  # modules that register your own envs (gym.register)
    # A NaN or infinite observation or reward ends the run naming the env; false for envs that use NaN on purpose.
    check_finite: bool = True
    # Dict observations: the keys the networks see (null: all); drops what cannot be encoded (MiniGrid's mission)
    obs_keys: list[str] | None = None
    vector: VectorConfig = field(default_factory=VectorConfig)


RECURRENT_MODELS = ("lstm", "gru", "lru")
MODELS = ("mlp", "nature_cnn", *RECURRENT_MODELS)


@dataclass
class ModelConfig:
    name: str = "mlp"  # mlp | nature_cnn | lstm | gru | lru
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])  # mlp layers; nature_cnn: the last is its fc
    activation: str = "tanh"  # tanh | relu
    shared: bool = False  # actor and critic share one trunk (recurrent models always do)
    encoder: str = "mlp"  # recurrent models: what runs before the core, mlp | nature_cnn (image observations)
    core_size: int = 128  # recurrent models: LSTM/GRU hidden size, LRU state size (complex)
    lru_decay: str = "fixed"  # lru: fixed (a learned decay per channel) | input (scaled by the input each step)
    # Your own network instead (the keys above are then unused): the import path of an nn.Module class or factory,
    # called as _target_(observation_space=..., action_space=..., **kwargs) (rlrun/models/user.py). README: "Your
    # own network" says what its forward returns for each algorithm.
    _target_: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


def convolutional(model: ModelConfig) -> bool:
    """Whether the model runs the Nature CNN (as itself or as a recurrent model's encoder)."""
    return model.name == "nature_cnn" or (model.name in RECURRENT_MODELS and model.encoder == "nature_cnn")


@dataclass
class EvalConfig:
    every_steps: int = 25_000  # 0 evaluates only at the end
    episodes: int = 20
    num_envs: int = 10
    deterministic: bool = True
    # Agent steps an evaluation episode may last (an env's own shorter limit stays): 27,000 is the standard Atari
    # protocol's 108,000 frames (Machado et al. 2018) at frame_skip 4. null: only the env's own limit.
    max_episode_steps: int | None = 27_000


@dataclass
class CheckpointConfig:
    every_steps: int = 50_000  # 0 saves only the final checkpoint
    keep_last: int = 3


@dataclass
class WandbConfig:
    project: str = "rlrun"
    entity: str | None = None  # W&B's default entity of the logged-in user when unset
    group: str | None = None  # unset: a sweep's jobs are grouped by the sweep folder's name, a single run by none
    tags: list[str] = field(default_factory=list)  # beside the run's overrides, which are tags too
    mode: str | None = None  # online | offline | disabled; unset: W&B's own (WANDB_MODE, else online)


@dataclass
class MlflowConfig:
    tracking_uri: str | None = None  # unset: MLflow's own (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the cwd)
    experiment: str = "rlrun"


@dataclass
class LoggingConfig:
    every_steps: int = 5_000
    progress: str = "auto"  # auto (rich on a terminal, plain lines otherwise) | rich | plain | none
    every_seconds: float = 15.0  # plain: a progress line at least this often, whatever every_steps is
    tensorboard: bool = True
    trackers: list[str] = field(default_factory=list)  # experiment trackers beside TensorBoard: wandb, mlflow
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)


@dataclass
class DistributedConfig:
    """Ranks: nproc_per_node x nnodes. env.num_envs is per rank (global batch = world size x per-rank
    batch) and the learning rate is not rescaled."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""  # host:port of node 0, reachable from every node (nnodes > 1)
    max_restarts: int = 0  # the elastic agent restarts the whole job this often after a failure
    # DDP: let parameters go without a gradient in some updates (a branch used on some steps only). Off, a
    # parameter the loss never reaches ends the run at the first update, naming it.
    find_unused_parameters: bool = False
    sync_batchnorm: bool = True  # BatchNorm layers normalize over all ranks' batch (when world size > 1)
    start_method: str = "fork"  # fork (fast start) | spawn (fresh interpreters, some GPU setups need it)


@dataclass
class TrainConfig:
    algo: Any = MISSING
    env: EnvConfig = MISSING
    model: ModelConfig = MISSING
    seed: int = 1
    total_steps: int = 100_000  # env steps, summed over envs
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch intra-op threads per rank; 0: 1 for mlp, else cores / ranks on the node
    torch_deterministic: bool = True
    # A checkpoint file or a run folder; auto: this run folder's newest checkpoint if it has one, else a fresh start
    # (what a requeued or restarted job runs with).
    resume: str | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


@dataclass
class PlayEnvConfig:
    # Another env than the checkpoint's, with the same observation and action spaces (say another ALE game with as
    # many actions); its other settings stay the checkpoint's. null: the checkpoint's env.
    id: str | None = None


@dataclass
class PlayConfig:
    checkpoint: str = MISSING  # a checkpoint file or a run folder (its latest checkpoint)
    episodes: int = 10
    deterministic: bool = True
    seed: int | None = None  # None: a seed no training or eval env used
    render: bool = False  # a window (needs a display)
    video: bool = False  # mp4 files in the play run folder (needs the video extra)
    device: str = "cpu"
    env: PlayEnvConfig = field(default_factory=PlayEnvConfig)


def check(ok: bool, message: str) -> None:
    """Raise UserError(message) unless ok: a value check's one line."""
    if not ok:
        raise UserError(message)


@dataclass(frozen=True)
class Range:
    """The numbers a key accepts: between `low` and `high` (either may be open or absent), and None if
    `optional`. NaN is never accepted (every comparison with it is false)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if self.high is None:
            text = f"must be {'>' if self.low_open else '>='} {low}"
        else:
            text = f"must be in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        return f"{text} (or null)" if self.optional else text


def _number(x: float | None) -> str:
    """A bound as a user reads it: 2**32 rather than 4294967296."""
    if isinstance(x, int) and x >= 2**16 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class OneOf:
    """The values a key accepts, listed."""

    values: tuple[str, ...]
    optional: bool = False

    def accepts(self, value: Any) -> bool:
        return value in self.values or (value is None and self.optional)

    def __str__(self) -> str:
        return f"accepted are {', '.join(self.values)}{' (or null)' if self.optional else ''}"


POSITIVE = Range(0, low_open=True)  # rates, scales, timeouts: > 0
AT_LEAST_1 = Range(1)  # counts and sizes
NON_NEGATIVE = Range(0)  # counts where 0 means none (or "one per core", "only at the end")
PROBABILITY = Range(0, 1)
FRACTION = Range(0, 1, low_open=True)  # (0, 1]: discounts, Polyak steps, fractions of training
# A seed is a 32-bit unsigned integer, as numpy's np.random.seed and most envs' own seeding take it (rlrun's env
# seeds derive from it through SeedSequence, which refuses a negative one).
SEEDS = Range(0, 2**32, high_open=True)
Rule = Range | OneOf

# Every key of TrainConfig (outside algo, whose schema has its own table) with a range or a set of values. Keys of
# a section that is null (env.atari for a non-Atari env) are skipped.
TRAIN_RULES: dict[str, Rule] = {
    "seed": SEEDS,
    "total_steps": AT_LEAST_1,
    "threads": NON_NEGATIVE,
    "env.num_envs": AT_LEAST_1,
    "env.max_episode_steps": Range(1, optional=True),
    "env.atari.noop_max": NON_NEGATIVE,
    "env.atari.frame_skip": AT_LEAST_1,
    "env.atari.screen_size": AT_LEAST_1,
    "env.atari.frame_stack": AT_LEAST_1,
    "env.atari.repeat_action_probability": PROBABILITY,
    "env.vector.backend": OneOf(("auto", "sync", "subproc", "ray", "native")),
    "env.vector.num_workers": NON_NEGATIVE,
    "env.vector.step_timeout_s": POSITIVE,
    "env.vector.ray_cpus_per_worker": NON_NEGATIVE,
    "model.name": OneOf(MODELS),
    "model.activation": OneOf(("tanh", "relu")),
    "model.encoder": OneOf(("mlp", "nature_cnn")),
    "model.core_size": AT_LEAST_1,
    "model.lru_decay": OneOf(("fixed", "input")),
    "eval.every_steps": NON_NEGATIVE,
    "eval.episodes": AT_LEAST_1,
    "eval.num_envs": AT_LEAST_1,
    "eval.max_episode_steps": Range(1, optional=True),
    "checkpoint.every_steps": NON_NEGATIVE,
    "checkpoint.keep_last": AT_LEAST_1,
    "logging.every_steps": NON_NEGATIVE,
    "logging.every_seconds": POSITIVE,
    "logging.progress": OneOf(("auto", "rich", "plain", "none")),
    "logging.wandb.mode": OneOf(("online", "offline", "disabled"), optional=True),
    "distributed.nproc_per_node": AT_LEAST_1,
    "distributed.nnodes": AT_LEAST_1,
    "distributed.max_restarts": NON_NEGATIVE,
    "distributed.start_method": OneOf(("fork", "spawn")),
}
PLAY_RULES: dict[str, Rule] = {"episodes": AT_LEAST_1, "seed": replace(SEEDS, optional=True)}


def check_rules(section: Any, rules: dict[str, Rule], prefix: str = "") -> None:
    """Check each key of `rules` (a dotted path below `section`) against its rule; UserError naming the first key
    refused, its value and what is accepted."""
    for key, rule in rules.items():
        value, found = section, True
        for part in key.split("."):
            if value is None:  # a null section: its keys are not used
                found = False
                break
            value = getattr(value, part)
        if found:
            check(rule.accepts(value), f"{prefix}{key}={value}: {rule}")


def check_device(device: str) -> None:
    """The device's form (auto, cpu, cuda, cuda:N); whether the machine has it is compose.preflight's
    check_device_present."""
    index = device.removeprefix("cuda:")
    check(
        device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and index.isdigit()),
        f"device={device}: accepted are auto, cpu, cuda, cuda:N",
    )


def validate_train(cfg: TrainConfig) -> list[str]:
    """Range and consistency checks that a schema cannot express. Raises UserError with one line; returns what the
    checks let pass but the run's log should say (an algorithm schema's validate returns such lines, or None)."""
    check_rules(cfg, TRAIN_RULES)
    check_device(cfg.device)
    _validate_model(cfg.model)
    v = cfg.env.vector
    if v.backend == "ray":
        check(importlib.util.find_spec("ray") is not None, "env.vector.backend=ray needs Ray: pip install 'rlrun[ray]'")
    if v.double_buffer:
        check(
            v.backend in ("subproc", "ray", "native"),
            "env.vector.double_buffer=true needs env.vector.backend=subproc, ray or native",
        )
        check(
            v.num_workers != 1 and cfg.env.num_envs >= 2,
            "env.vector.double_buffer=true needs at least 2 workers and 2 envs",
        )
    _validate_distributed(cfg.distributed)
    _validate_trackers(cfg.logging.trackers)
    return list(cfg.algo.validate(cfg) or ())


TRACKERS = ("wandb", "mlflow")  # logging.trackers: each one's package and extra have its name


def _validate_trackers(trackers: list[str]) -> None:
    for name in trackers:
        check(name in TRACKERS, f"logging.trackers=[{name}]: accepted are {', '.join(TRACKERS)}")
        present = importlib.util.find_spec(name) is not None
        check(present, f"logging.trackers=[{name}] needs {name}: pip install 'rlrun[{name}]'")
    check(len(set(trackers)) == len(trackers), f"logging.trackers={list(trackers)}: each tracker once")


def _validate_model(m: ModelConfig) -> None:
    for size in m.hidden_sizes:
        check(size >= 1, f"model.hidden_sizes={list(m.hidden_sizes)}: each must be >= 1")
    check(
        m._target_ is None or m.name not in RECURRENT_MODELS,
        f"model._target_ networks are feedforward; model.name={m.name} cannot go with it (leave model=mlp)",
    )
    if m.name in RECURRENT_MODELS:
        check(m.shared, f"model.shared=false: {m.name} shares its encoder and core between actor and critic")


def _validate_distributed(d: DistributedConfig) -> None:
    check(0 <= d.node_rank < d.nnodes, f"distributed.node_rank={d.node_rank}: must be in [0, nnodes)")
    check(
        d.nnodes == 1 or ":" in d.rdzv_endpoint,
        "distributed.nnodes > 1 needs distributed.rdzv_endpoint=HOST:PORT (node 0's address)",
    )


def validate_play(cfg: PlayConfig) -> None:
    check_rules(cfg, PLAY_RULES)
    check_device(cfg.device)
