"""Typed config schema: the dataclasses Hydra validates conf/ against, and the value checks run once after
composition. Every default lives here, or, for an algorithm's section, in its module's schema (rlrun/algos/);
yaml files only override. rlrun.config.store registers them with Hydra."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from rlrun.errors import UserError

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")  # the yaml of the config groups


@dataclass
class VectorConfig:
    backend: str = "sync"  # sync: in the rank's process | subproc: forked worker processes | ray: Ray actors
    # subproc: worker processes (0: one per core); ray: actors (0: one per CPU of the cluster); at most num_envs
    num_workers: int = 0
    # subproc, ray: half the envs step while the rank acts for the other half (for PPO, instead of act_in_workers)
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
    # called as _target_(observation_space=..., action_space=..., **kwargs) by Hydra's instantiate. README: "Your
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


@dataclass
class CheckpointConfig:
    every_steps: int = 50_000  # 0 saves only the final checkpoint
    keep_last: int = 3


@dataclass
class LoggingConfig:
    every_steps: int = 5_000
    progress: str = "auto"  # auto (rich on a terminal, plain lines otherwise) | rich | plain | none
    tensorboard: bool = True


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
class PlayConfig:
    checkpoint: str = MISSING  # a checkpoint file or a run folder (its latest checkpoint)
    episodes: int = 10
    deterministic: bool = True
    seed: int | None = None  # None: a seed no training or eval env used
    render: bool = False  # a window (needs a display)
    video: bool = False  # mp4 files in the play run folder (needs the video extra)
    device: str = "cpu"


def check(ok: bool, message: str) -> None:
    """Raise UserError(message) unless ok: a value check's one line."""
    if not ok:
        raise UserError(message)


def validate_train(cfg: TrainConfig) -> None:
    """Range and consistency checks that a schema cannot express. Raises UserError with one line."""
    check(cfg.total_steps > 0, f"total_steps={cfg.total_steps}: must be > 0")
    check(cfg.env.num_envs >= 1, f"env.num_envs={cfg.env.num_envs}: must be >= 1")
    check(cfg.threads >= 0, f"threads={cfg.threads}: must be >= 0 (0 = one per core)")
    check(
        cfg.device == "auto" or cfg.device == "cpu" or cfg.device.startswith("cuda"),
        f"device={cfg.device}: accepted are auto, cpu, cuda, cuda:N",
    )
    _validate_model(cfg.model)
    v = cfg.env.vector
    check(v.backend in ("sync", "subproc", "ray"), f"env.vector.backend={v.backend}: accepted are sync, subproc, ray")
    check(v.num_workers >= 0, f"env.vector.num_workers={v.num_workers}: must be >= 0 (0 = one per core)")
    check(v.step_timeout_s > 0, f"env.vector.step_timeout_s={v.step_timeout_s}: must be > 0")
    check(v.ray_cpus_per_worker >= 0, f"env.vector.ray_cpus_per_worker={v.ray_cpus_per_worker}: must be >= 0")
    if v.backend == "ray":
        check(importlib.util.find_spec("ray") is not None, "env.vector.backend=ray needs Ray: pip install 'rlrun[ray]'")
    if v.double_buffer:
        check(v.backend != "sync", "env.vector.double_buffer=true needs env.vector.backend=subproc or ray")
        check(
            v.num_workers != 1 and cfg.env.num_envs >= 2,
            "env.vector.double_buffer=true needs at least 2 workers and 2 envs",
        )
    check(cfg.eval.episodes >= 1, f"eval.episodes={cfg.eval.episodes}: must be >= 1")
    check(cfg.eval.num_envs >= 1, f"eval.num_envs={cfg.eval.num_envs}: must be >= 1")
    check(cfg.checkpoint.keep_last >= 1, f"checkpoint.keep_last={cfg.checkpoint.keep_last}: must be >= 1")
    check(
        cfg.logging.progress in ("auto", "rich", "plain", "none"),
        f"logging.progress={cfg.logging.progress}: accepted are auto, rich, plain, none",
    )
    for key in ("eval", "checkpoint", "logging"):
        every = getattr(cfg, key).every_steps
        check(every >= 0, f"{key}.every_steps={every}: must be >= 0")
    _validate_distributed(cfg.distributed)
    cfg.algo.validate(cfg)


def _validate_model(m: ModelConfig) -> None:
    check(m.name in MODELS, f"model.name={m.name}: accepted are {', '.join(MODELS)}")
    check(m.activation in ("tanh", "relu"), f"model.activation={m.activation}: tanh or relu")
    check(
        m._target_ is None or m.name not in RECURRENT_MODELS,
        f"model._target_ networks are feedforward; model.name={m.name} cannot go with it (leave model=mlp)",
    )
    if m.name not in RECURRENT_MODELS:
        return
    check(m.shared, f"model.shared=false: {m.name} shares its encoder and core between actor and critic")
    check(m.encoder in ("mlp", "nature_cnn"), f"model.encoder={m.encoder}: accepted are mlp, nature_cnn")
    check(m.core_size >= 1, f"model.core_size={m.core_size}: must be >= 1")
    check(m.lru_decay in ("fixed", "input"), f"model.lru_decay={m.lru_decay}: accepted are fixed, input")


def _validate_distributed(d: DistributedConfig) -> None:
    check(d.nproc_per_node >= 1, f"distributed.nproc_per_node={d.nproc_per_node}: must be >= 1")
    check(d.nnodes >= 1, f"distributed.nnodes={d.nnodes}: must be >= 1")
    check(0 <= d.node_rank < d.nnodes, f"distributed.node_rank={d.node_rank}: must be in [0, nnodes)")
    check(
        d.nnodes == 1 or ":" in d.rdzv_endpoint,
        "distributed.nnodes > 1 needs distributed.rdzv_endpoint=HOST:PORT (node 0's address)",
    )
    check(d.max_restarts >= 0, f"distributed.max_restarts={d.max_restarts}: must be >= 0")
    check(d.start_method in ("fork", "spawn"), f"distributed.start_method={d.start_method}: fork or spawn")


def validate_play(cfg: PlayConfig) -> None:
    check(cfg.episodes >= 1, f"episodes={cfg.episodes}: must be >= 1")
