"""Typed config schema: the dataclasses Hydra validates conf/ against, and the value checks run once after
composition. Every default lives here; yaml files only override."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from rlrun.errors import UserError


@dataclass
class PPOConfig:
    """PPO hyperparameters (names follow CleanRL's ppo.py). Sizes are per rank."""

    name: str = "ppo"
    lr: float = 2.5e-4
    anneal_lr: bool = True  # linear decay to 0 over total_steps
    num_steps: int = 128  # rollout length per env
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    target_kl: float | None = None  # stop the epochs of an update once approx KL exceeds this
    normalize_obs: bool = False
    normalize_reward: bool = False
    clip_obs: float = 10.0  # after normalization
    adam_eps: float = 1e-5
    # With env.vector.backend=subproc, each env worker acts for its own envs with a copy of the policy, instead
    # of the rank acting for all of them: on CPU, for feedforward policies without normalize_obs, and unless
    # env.vector.double_buffer is on. Same algorithm; the runs differ from rank-acting ones only in the samples.
    act_in_workers: bool = True


@dataclass
class ReplayConfig:
    prioritized: bool = False  # proportional prioritized replay (Schaul et al. 2016); false: uniform
    alpha: float = 0.6  # priority exponent
    beta_start: float = 0.4  # importance-weight exponent, annealed linearly to 1 over training
    priority_eps: float = 1e-6  # added to |TD error|
    checkpoint: bool = False  # each rank writes its shard beside every checkpoint (large) and resume restores it


@dataclass
class DQNConfig:
    """Double DQN (van Hasselt et al. 2016) with n-step returns, optional dueling head and prioritized replay.
    Names follow CleanRL's dqn.py / SB3. Sizes are per rank; counts of env steps are global."""

    name: str = "dqn"
    lr: float = 1e-4
    buffer_size: int = 1_000_000  # transitions per rank
    learning_starts: int = 80_000  # transitions in the replay (all ranks) before updates begin
    batch_size: int = 32  # per rank: the global batch is ranks x batch_size
    gamma: float = 0.99
    n_step: int = 1
    train_freq: int = 4  # vector-env steps per rank between training phases (one iteration)
    gradient_steps: int = 1  # updates per training phase
    target_update_interval: int = 1000  # updates between target-network syncs
    tau: float = 1.0  # 1: copy; < 1: Polyak averaging at each sync
    double_q: bool = True
    dueling: bool = False
    start_e: float = 1.0
    end_e: float = 0.01
    exploration_fraction: float = 0.1  # of total_steps, over which epsilon decays linearly
    max_grad_norm: float = 10.0
    adam_eps: float = 1e-8
    # mse (CleanRL's dqn.py and dqn_atari.py) | huber (SB3; Atari with clipped rewards): Huber diverges on
    # unclipped rewards such as CartPole's
    loss: str = "mse"
    replay: ReplayConfig = field(default_factory=ReplayConfig)


@dataclass
class VectorConfig:
    backend: str = "sync"  # sync: in the rank's process | subproc: forked worker processes
    num_workers: int = 0  # subproc: worker processes (0: one per core, at most num_envs)
    # subproc: half the envs step while the rank acts for the other half (for PPO, instead of act_in_workers)
    double_buffer: bool = False
    step_timeout_s: float = 60.0  # subproc: a worker slower than this is reported, not waited on


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
    resume: str | None = None  # a checkpoint file or a run folder
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


ALGO_CONFIGS = {"ppo": PPOConfig, "dqn": DQNConfig}


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="play_schema", node=PlayConfig)
    for name, schema in ALGO_CONFIGS.items():
        cs.store(group="algo", name=f"{name}_schema", node=schema)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


def validate_train(cfg: TrainConfig) -> None:
    """Range and consistency checks that a schema cannot express. Raises UserError with one line."""
    a = cfg.algo
    _check(cfg.total_steps > 0, f"total_steps={cfg.total_steps}: must be > 0")
    _check(cfg.env.num_envs >= 1, f"env.num_envs={cfg.env.num_envs}: must be >= 1")
    _check(cfg.threads >= 0, f"threads={cfg.threads}: must be >= 0 (0 = one per core)")
    _check(
        cfg.device == "auto" or cfg.device == "cpu" or cfg.device.startswith("cuda"),
        f"device={cfg.device}: accepted are auto, cpu, cuda, cuda:N",
    )
    _validate_model(cfg.model)
    v = cfg.env.vector
    _check(v.backend in ("sync", "subproc"), f"env.vector.backend={v.backend}: accepted are sync, subproc")
    _check(v.num_workers >= 0, f"env.vector.num_workers={v.num_workers}: must be >= 0 (0 = one per core)")
    _check(v.step_timeout_s > 0, f"env.vector.step_timeout_s={v.step_timeout_s}: must be > 0")
    if v.double_buffer:
        _check(v.backend == "subproc", "env.vector.double_buffer=true needs env.vector.backend=subproc")
        _check(
            v.num_workers != 1 and cfg.env.num_envs >= 2,
            "env.vector.double_buffer=true needs at least 2 workers and 2 envs",
        )
    _check(cfg.eval.episodes >= 1, f"eval.episodes={cfg.eval.episodes}: must be >= 1")
    _check(cfg.eval.num_envs >= 1, f"eval.num_envs={cfg.eval.num_envs}: must be >= 1")
    _check(cfg.checkpoint.keep_last >= 1, f"checkpoint.keep_last={cfg.checkpoint.keep_last}: must be >= 1")
    _check(
        cfg.logging.progress in ("auto", "rich", "plain", "none"),
        f"logging.progress={cfg.logging.progress}: accepted are auto, rich, plain, none",
    )
    for key in ("eval", "checkpoint", "logging"):
        every = getattr(cfg, key).every_steps
        _check(every >= 0, f"{key}.every_steps={every}: must be >= 0")
    _validate_distributed(cfg.distributed)
    world_size = cfg.distributed.nproc_per_node * cfg.distributed.nnodes
    if isinstance(a, PPOConfig):
        _validate_ppo(a, cfg.env.num_envs, cfg.total_steps, world_size)
        if cfg.model.name in RECURRENT_MODELS:
            _check(
                cfg.env.num_envs % a.num_minibatches == 0,
                f"algo.num_minibatches={a.num_minibatches} must divide env.num_envs={cfg.env.num_envs} for "
                f"model={cfg.model.name} (its minibatches are whole env sequences)",
            )
    if isinstance(a, DQNConfig):
        _check(
            cfg.model.name not in RECURRENT_MODELS,
            f"model={cfg.model.name} trains with algo=ppo; algo=dqn takes model=mlp or nature_cnn",
        )
        _validate_dqn(a, cfg.env.num_envs, cfg.total_steps, world_size)


def _validate_model(m: ModelConfig) -> None:
    _check(m.name in MODELS, f"model.name={m.name}: accepted are {', '.join(MODELS)}")
    _check(m.activation in ("tanh", "relu"), f"model.activation={m.activation}: tanh or relu")
    if m.name not in RECURRENT_MODELS:
        return
    _check(m.shared, f"model.shared=false: {m.name} shares its encoder and core between actor and critic")
    _check(m.encoder in ("mlp", "nature_cnn"), f"model.encoder={m.encoder}: accepted are mlp, nature_cnn")
    _check(m.core_size >= 1, f"model.core_size={m.core_size}: must be >= 1")
    _check(m.lru_decay in ("fixed", "input"), f"model.lru_decay={m.lru_decay}: accepted are fixed, input")


def _validate_distributed(d: DistributedConfig) -> None:
    _check(d.nproc_per_node >= 1, f"distributed.nproc_per_node={d.nproc_per_node}: must be >= 1")
    _check(d.nnodes >= 1, f"distributed.nnodes={d.nnodes}: must be >= 1")
    _check(0 <= d.node_rank < d.nnodes, f"distributed.node_rank={d.node_rank}: must be in [0, nnodes)")
    _check(
        d.nnodes == 1 or ":" in d.rdzv_endpoint,
        "distributed.nnodes > 1 needs distributed.rdzv_endpoint=HOST:PORT (node 0's address)",
    )
    _check(d.max_restarts >= 0, f"distributed.max_restarts={d.max_restarts}: must be >= 0")
    _check(d.start_method in ("fork", "spawn"), f"distributed.start_method={d.start_method}: fork or spawn")


def _validate_ppo(a: PPOConfig, num_envs: int, total_steps: int, world_size: int) -> None:
    _check(a.lr > 0, f"algo.lr={a.lr}: must be > 0")
    _check(a.num_steps >= 1, f"algo.num_steps={a.num_steps}: must be >= 1")
    _check(0 < a.gamma <= 1, f"algo.gamma={a.gamma}: must be in (0, 1]")
    _check(0 <= a.gae_lambda <= 1, f"algo.gae_lambda={a.gae_lambda}: must be in [0, 1]")
    _check(a.update_epochs >= 1, f"algo.update_epochs={a.update_epochs}: must be >= 1")
    _check(a.clip_coef > 0, f"algo.clip_coef={a.clip_coef}: must be > 0")
    _check(a.max_grad_norm > 0, f"algo.max_grad_norm={a.max_grad_norm}: must be > 0")
    _check(a.target_kl is None or a.target_kl > 0, f"algo.target_kl={a.target_kl}: must be > 0 or null")
    batch = a.num_steps * num_envs
    _check(
        a.num_minibatches >= 1 and batch % a.num_minibatches == 0,
        f"algo.num_minibatches={a.num_minibatches} must divide the batch of "
        f"algo.num_steps x env.num_envs = {a.num_steps} x {num_envs} = {batch}",
    )
    ranks = f" x {world_size} ranks" if world_size > 1 else ""
    _check(
        total_steps >= batch * world_size,
        f"total_steps={total_steps} is less than one rollout (algo.num_steps x env.num_envs{ranks} = "
        f"{batch * world_size}); raise total_steps or shrink the rollout",
    )


def _validate_dqn(a: DQNConfig, num_envs: int, total_steps: int, world_size: int) -> None:
    _check(a.lr > 0, f"algo.lr={a.lr}: must be > 0")
    _check(0 < a.gamma <= 1, f"algo.gamma={a.gamma}: must be in (0, 1]")
    _check(a.batch_size >= 1, f"algo.batch_size={a.batch_size}: must be >= 1")
    _check(a.n_step >= 1, f"algo.n_step={a.n_step}: must be >= 1")
    _check(a.train_freq >= 1, f"algo.train_freq={a.train_freq}: must be >= 1")
    _check(a.gradient_steps >= 0, f"algo.gradient_steps={a.gradient_steps}: must be >= 0")
    _check(a.target_update_interval >= 1, f"algo.target_update_interval={a.target_update_interval}: must be >= 1")
    _check(0 < a.tau <= 1, f"algo.tau={a.tau}: must be in (0, 1]")
    _check(a.learning_starts >= 0, f"algo.learning_starts={a.learning_starts}: must be >= 0")
    for key in ("start_e", "end_e"):
        _check(0 <= getattr(a, key) <= 1, f"algo.{key}={getattr(a, key)}: must be in [0, 1]")
    _check(0 < a.exploration_fraction <= 1, f"algo.exploration_fraction={a.exploration_fraction}: must be in (0, 1]")
    _check(a.max_grad_norm > 0, f"algo.max_grad_norm={a.max_grad_norm}: must be > 0")
    _check(a.loss in ("mse", "huber"), f"algo.loss={a.loss}: accepted are mse, huber")
    r = a.replay
    _check(r.alpha > 0, f"algo.replay.alpha={r.alpha}: must be > 0")
    _check(0 <= r.beta_start <= 1, f"algo.replay.beta_start={r.beta_start}: must be in [0, 1]")
    _check(r.priority_eps > 0, f"algo.replay.priority_eps={r.priority_eps}: must be > 0")
    _check(a.buffer_size >= 1, f"algo.buffer_size={a.buffer_size}: must be >= 1")
    ranks = f" x {world_size} ranks" if world_size > 1 else ""
    _check(
        a.learning_starts <= a.buffer_size * world_size,
        f"algo.learning_starts={a.learning_starts} exceeds what the replay can hold (algo.buffer_size{ranks} = "
        f"{a.buffer_size * world_size}): updates would never start",
    )
    iteration = a.train_freq * num_envs * world_size
    _check(
        total_steps >= iteration,
        f"total_steps={total_steps} is less than one iteration (algo.train_freq x env.num_envs"
        f"{' x ranks' if world_size > 1 else ''} = {iteration})",
    )


def from_yaml(text: str) -> TrainConfig:
    """The typed TrainConfig from its YAML text (as stored in checkpoints and handed to ranks)."""
    saved = OmegaConf.create(text)
    base = OmegaConf.structured(TrainConfig)
    base.algo = OmegaConf.structured(ALGO_CONFIGS[saved.algo.name])
    return OmegaConf.to_object(OmegaConf.merge(base, saved))


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def validate_play(cfg: PlayConfig) -> None:
    _check(cfg.episodes >= 1, f"episodes={cfg.episodes}: must be >= 1")
