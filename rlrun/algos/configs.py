"""The hyperparameters of each algorithm: the schemas Hydra checks conf/algo/*.yaml against, each with its value
checks. They live here, apart from the algorithms, because composing and checking a config must not import torch
(`rlrun train --cfg job`, `--help` and every pre-flight error stay under a second); each algorithm's module imports
its schema from here. A new algorithm adds its schema here beside its module."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlrun.config import RECURRENT_MODELS, TrainConfig, check


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
    # The accelerations of rlrun/fast/ where they apply (same algorithm; false runs this file's code only).
    fast: bool = True
    # With fast and env.vector.backend=subproc, each env worker acts for its own envs with a copy of the policy,
    # instead of the rank acting for all of them: on CPU, for feedforward policies without normalize_obs, and
    # unless env.vector.double_buffer is on. The runs differ from rank-acting ones only in the samples.
    act_in_workers: bool = True

    def validate(self, run: TrainConfig) -> None:
        """Range and consistency checks against the whole run's config; UserError with one line."""
        check(self.lr > 0, f"algo.lr={self.lr}: must be > 0")
        check(self.num_steps >= 1, f"algo.num_steps={self.num_steps}: must be >= 1")
        check(0 < self.gamma <= 1, f"algo.gamma={self.gamma}: must be in (0, 1]")
        check(0 <= self.gae_lambda <= 1, f"algo.gae_lambda={self.gae_lambda}: must be in [0, 1]")
        check(self.update_epochs >= 1, f"algo.update_epochs={self.update_epochs}: must be >= 1")
        check(self.clip_coef > 0, f"algo.clip_coef={self.clip_coef}: must be > 0")
        check(self.max_grad_norm > 0, f"algo.max_grad_norm={self.max_grad_norm}: must be > 0")
        check(self.target_kl is None or self.target_kl > 0, f"algo.target_kl={self.target_kl}: must be > 0 or null")
        num_envs, world_size = run.env.num_envs, run.distributed.nproc_per_node * run.distributed.nnodes
        batch = self.num_steps * num_envs
        check(
            self.num_minibatches >= 1 and batch % self.num_minibatches == 0,
            f"algo.num_minibatches={self.num_minibatches} must divide the batch of "
            f"algo.num_steps x env.num_envs = {self.num_steps} x {num_envs} = {batch}",
        )
        ranks = f" x {world_size} ranks" if world_size > 1 else ""
        check(
            run.total_steps >= batch * world_size,
            f"total_steps={run.total_steps} is less than one rollout (algo.num_steps x env.num_envs{ranks} = "
            f"{batch * world_size}); raise total_steps or shrink the rollout",
        )
        if run.model.name in RECURRENT_MODELS:
            check(
                num_envs % self.num_minibatches == 0,
                f"algo.num_minibatches={self.num_minibatches} must divide env.num_envs={num_envs} for "
                f"model={run.model.name} (its minibatches are whole env sequences)",
            )


OPTIMIZERS = ("rmsprop", "rmsprop_tf", "adam")


@dataclass
class A2CConfig:
    """A2C hyperparameters (names and defaults as SB3's A2C). Sizes are per rank."""

    name: str = "a2c"
    lr: float = 7e-4
    anneal_lr: bool = False  # linear decay to 0 over total_steps
    num_steps: int = 5  # unroll length per env: the steps one backward goes through
    gamma: float = 0.99
    gae_lambda: float = 1.0  # 1: n-step returns, as in the paper; below 1: GAE
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = False  # over all ranks' unrolls
    # rmsprop: torch's (SB3's default) | rmsprop_tf: as TensorFlow 1 (baselines; rl-zoo's Atari runs) | adam
    optimizer: str = "rmsprop"
    alpha: float = 0.99  # RMSprop's smoothing constant
    eps: float = 1e-5  # RMSprop's or Adam's epsilon
    # The accelerations of rlrun/fast/ where they apply (same algorithm; false runs this file's code only).
    fast: bool = True

    def validate(self, run: TrainConfig) -> None:
        """Range and consistency checks against the whole run's config; UserError with one line."""
        check(self.lr > 0, f"algo.lr={self.lr}: must be > 0")
        check(self.num_steps >= 1, f"algo.num_steps={self.num_steps}: must be >= 1")
        check(0 < self.gamma <= 1, f"algo.gamma={self.gamma}: must be in (0, 1]")
        check(0 <= self.gae_lambda <= 1, f"algo.gae_lambda={self.gae_lambda}: must be in [0, 1]")
        check(self.max_grad_norm > 0, f"algo.max_grad_norm={self.max_grad_norm}: must be > 0")
        check(self.optimizer in OPTIMIZERS, f"algo.optimizer={self.optimizer}: accepted are {', '.join(OPTIMIZERS)}")
        check(0 <= self.alpha < 1, f"algo.alpha={self.alpha}: must be in [0, 1)")
        check(self.eps > 0, f"algo.eps={self.eps}: must be > 0")
        check(
            run.model.name not in RECURRENT_MODELS,
            f"model={run.model.name} trains with algo=ppo; algo=a2c takes model=mlp or nature_cnn (or model._target_)",
        )
        world_size = run.distributed.nproc_per_node * run.distributed.nnodes
        unroll = self.num_steps * run.env.num_envs * world_size
        check(
            run.total_steps >= unroll,
            f"total_steps={run.total_steps} is less than one unroll (algo.num_steps x env.num_envs x ranks = "
            f"{unroll}); raise total_steps or shorten the unroll",
        )


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
    fast: bool = True  # the accelerations of rlrun/fast/ where they apply (false runs this file's code only)

    def validate(self, run: TrainConfig) -> None:
        """Range and consistency checks against the whole run's config; UserError with one line."""
        check(
            not (self.dueling and run.model._target_),
            "algo.dueling=true builds rlrun's dueling head; with model._target_ put it in your network instead",
        )
        world_size = run.distributed.nproc_per_node * run.distributed.nnodes
        check(
            run.model.name not in RECURRENT_MODELS,
            f"model={run.model.name} trains with algo=ppo; algo=dqn takes model=mlp or nature_cnn",
        )
        check(self.lr > 0, f"algo.lr={self.lr}: must be > 0")
        check(0 < self.gamma <= 1, f"algo.gamma={self.gamma}: must be in (0, 1]")
        check(self.batch_size >= 1, f"algo.batch_size={self.batch_size}: must be >= 1")
        check(self.n_step >= 1, f"algo.n_step={self.n_step}: must be >= 1")
        check(self.train_freq >= 1, f"algo.train_freq={self.train_freq}: must be >= 1")
        check(self.gradient_steps >= 0, f"algo.gradient_steps={self.gradient_steps}: must be >= 0")
        check(
            self.target_update_interval >= 1, f"algo.target_update_interval={self.target_update_interval}: must be >= 1"
        )
        check(0 < self.tau <= 1, f"algo.tau={self.tau}: must be in (0, 1]")
        check(self.learning_starts >= 0, f"algo.learning_starts={self.learning_starts}: must be >= 0")
        for key in ("start_e", "end_e"):
            check(0 <= getattr(self, key) <= 1, f"algo.{key}={getattr(self, key)}: must be in [0, 1]")
        check(
            0 < self.exploration_fraction <= 1,
            f"algo.exploration_fraction={self.exploration_fraction}: must be in (0, 1]",
        )
        check(self.max_grad_norm > 0, f"algo.max_grad_norm={self.max_grad_norm}: must be > 0")
        check(self.loss in ("mse", "huber"), f"algo.loss={self.loss}: accepted are mse, huber")
        r = self.replay
        check(r.alpha > 0, f"algo.replay.alpha={r.alpha}: must be > 0")
        check(0 <= r.beta_start <= 1, f"algo.replay.beta_start={r.beta_start}: must be in [0, 1]")
        check(r.priority_eps > 0, f"algo.replay.priority_eps={r.priority_eps}: must be > 0")
        check(self.buffer_size >= 1, f"algo.buffer_size={self.buffer_size}: must be >= 1")
        ranks = f" x {world_size} ranks" if world_size > 1 else ""
        check(
            self.learning_starts <= self.buffer_size * world_size,
            f"algo.learning_starts={self.learning_starts} exceeds what the replay can hold (algo.buffer_size{ranks} = "
            f"{self.buffer_size * world_size}): updates would never start",
        )
        iteration = self.train_freq * run.env.num_envs * world_size
        check(
            run.total_steps >= iteration,
            f"total_steps={run.total_steps} is less than one iteration (algo.train_freq x env.num_envs"
            f"{' x ranks' if world_size > 1 else ''} = {iteration})",
        )
