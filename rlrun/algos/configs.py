"""The hyperparameters of each algorithm: the schemas Hydra checks conf/algo/*.yaml against, each with its value
checks. They live here, apart from the algorithms, because composing and checking a config must not import torch
(`rlrun train --cfg job`, `--help` and every pre-flight error stay under a second); each algorithm's module imports
its schema from here. A new algorithm adds its schema here beside its module."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from rlrun.config import (
    AT_LEAST_1,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    RECURRENT_MODELS,
    OneOf,
    Range,
    Rule,
    TrainConfig,
    check,
    check_rules,
)

# The keys with a range or a set of values, per algorithm (config/__init__.py's TRAIN_RULES has the run's others).
UNROLL_RULES: dict[str, Rule] = {  # PPO's and A2C's
    "lr": POSITIVE,
    "num_steps": AT_LEAST_1,
    "gamma": FRACTION,
    "gae_lambda": PROBABILITY,
    "ent_coef": NON_NEGATIVE,
    "vf_coef": NON_NEGATIVE,
    "max_grad_norm": POSITIVE,
}
PPO_RULES: dict[str, Rule] = {
    **UNROLL_RULES,
    "num_minibatches": AT_LEAST_1,
    "update_epochs": AT_LEAST_1,
    "clip_coef": POSITIVE,
    "target_kl": Range(0, low_open=True, optional=True),
    "clip_obs": POSITIVE,
    "adam_eps": POSITIVE,
    "preempt_fraction": Range(0, 1, low_open=True, optional=True),
    "preempt_floor": FRACTION,
}
OPTIMIZERS = ("rmsprop", "rmsprop_tf", "adam")
A2C_RULES: dict[str, Rule] = {
    **UNROLL_RULES,
    "optimizer": OneOf(OPTIMIZERS),
    "alpha": Range(0, 1, high_open=True),
    "eps": POSITIVE,
}
REPLAY_RULES: dict[str, Rule] = {  # DQN's, SAC's and TD3's
    "lr": POSITIVE,
    "gamma": FRACTION,
    "tau": FRACTION,
    "batch_size": AT_LEAST_1,
    "n_step": AT_LEAST_1,
    "train_freq": AT_LEAST_1,
    "buffer_size": AT_LEAST_1,
    "gradient_steps": NON_NEGATIVE,
    "learning_starts": NON_NEGATIVE,
    "adam_eps": POSITIVE,
    "replay.alpha": POSITIVE,
    "replay.beta_start": PROBABILITY,
    "replay.priority_eps": POSITIVE,
}
DQN_RULES: dict[str, Rule] = {
    **REPLAY_RULES,
    "target_update_interval": AT_LEAST_1,
    "start_e": PROBABILITY,
    "end_e": PROBABILITY,
    "exploration_fraction": FRACTION,
    "max_grad_norm": POSITIVE,
    "loss": OneOf(("mse", "huber")),
}
# (DQN accepts gradient_steps=0, a run that only collects; SAC and TD3 would act uniformly at random throughout.)
CONTINUOUS_RULES: dict[str, Rule] = {**REPLAY_RULES, "gradient_steps": AT_LEAST_1}
SAC_RULES: dict[str, Rule] = {
    **CONTINUOUS_RULES,
    "alpha": POSITIVE,
    "policy_frequency": AT_LEAST_1,
    "target_update_interval": AT_LEAST_1,
}
TD3_RULES: dict[str, Rule] = {
    **CONTINUOUS_RULES,
    "policy_delay": AT_LEAST_1,
    "exploration_noise": NON_NEGATIVE,
    "target_policy_noise": NON_NEGATIVE,
    "target_noise_clip": NON_NEGATIVE,
}


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
    # Straggler preemption (DD-PPO's sync_frac, Wijmans et al. 2020), with several ranks: once this fraction of the
    # ranks has finished its rollout, the others end theirs at their next step, if they have taken at least
    # preempt_floor x num_steps steps. A cut rollout bootstraps from the value where it stopped, as at a truncation,
    # and the update weighs every sample of every rank alike. null: every rank collects num_steps (as DD-PPO: 0.6).
    preempt_fraction: float | None = None
    preempt_floor: float = 0.25

    def validate(self, run: TrainConfig) -> None:
        """Range and consistency checks against the whole run's config; UserError with one line."""
        check_rules(self, PPO_RULES, "algo.")
        if self.preempt_fraction is not None:
            self._validate_preemption(run)
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

    @property
    def preempt_after(self) -> int:
        """The fewest steps a preempted rollout takes (preempt_floor x num_steps, at least 1)."""
        return max(1, math.ceil(self.preempt_floor * self.num_steps))

    def _validate_preemption(self, run: TrainConfig) -> None:
        check(
            not (self.normalize_obs or self.normalize_reward),
            "algo.preempt_fraction needs algo.normalize_obs=false and algo.normalize_reward=false: their statistics "
            "are averaged over ranks at every step, which a rollout cut short would leave unmatched",
        )
        shortest = self.preempt_after * run.env.num_envs
        check(
            run.model.name in RECURRENT_MODELS or shortest >= self.num_minibatches,
            f"algo.preempt_floor={self.preempt_floor}: the shortest rollout ({self.preempt_after} steps x "
            f"{run.env.num_envs} envs) must fill algo.num_minibatches={self.num_minibatches}",
        )


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
        check_rules(self, A2C_RULES, "algo.")
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


def check_replay_algorithm(cfg: DQNConfig | ContinuousControlConfig, run: TrainConfig) -> list[str]:
    """The consistency checks DQN, SAC and TD3 share (cfg has DQNConfig's or ContinuousControlConfig's fields),
    against the whole run's config; UserError with one line. Returns the warnings for the run's log."""
    world_size = run.distributed.nproc_per_node * run.distributed.nnodes
    ranks = f" x {world_size} ranks" if world_size > 1 else ""
    check(
        cfg.learning_starts <= cfg.buffer_size * world_size,
        f"algo.learning_starts={cfg.learning_starts} exceeds what the replay can hold (algo.buffer_size{ranks} = "
        f"{cfg.buffer_size * world_size}): updates would never start",
    )
    iteration = cfg.train_freq * run.env.num_envs * world_size
    check(
        run.total_steps >= iteration,
        f"total_steps={run.total_steps} is less than one iteration (algo.train_freq x env.num_envs"
        f"{' x ranks' if world_size > 1 else ''} = {iteration})",
    )
    message = no_updates(cfg, run) if cfg.gradient_steps > 0 else None
    check(message is None or cfg.allow_no_updates, f"{message} (or algo.allow_no_updates=true runs it anyway)")
    return [f"{message} (algo.allow_no_updates=true)"] if message else []


def no_updates(cfg: DQNConfig | ContinuousControlConfig, run: TrainConfig) -> str | None:
    """Why a replay-based run would end before its first update (None if it updates), counted as the algorithm
    counts: updates start once the replays of all ranks hold learning_starts transitions together, and a rank's
    replay holds a transition once its n-step window is written (n_step vector steps after it)."""
    world_size = run.distributed.nproc_per_node * run.distributed.nnodes
    envs = run.env.num_envs * world_size  # transitions per vector step, all ranks
    iteration = cfg.train_freq * envs
    iterations = run.total_steps // iteration  # the loop runs whole iterations (rlrun/train.py)
    held = max(0, (iterations * cfg.train_freq - cfg.n_step) * envs)
    if held >= max(cfg.learning_starts, 1):
        return None
    needed = -(-max(cfg.learning_starts, 1) // envs) + cfg.n_step  # vector steps per rank
    enough = -(-needed // cfg.train_freq) * iteration
    return (
        f"total_steps={run.total_steps} ends before the first update: the replay holds {held} transitions at the end, "
        f"algo.learning_starts={cfg.learning_starts}; raise total_steps to {enough} or lower algo.learning_starts"
    )


@dataclass
class ReplayConfig:
    prioritized: bool = False  # proportional prioritized replay (Schaul et al. 2016); false: uniform
    alpha: float = 0.6  # priority exponent
    beta_start: float = 0.4  # importance-weight exponent, annealed linearly to 1 over training
    priority_eps: float = 1e-6  # added to |TD error|
    # Each rank writes its shard beside every checkpoint (large) and resume restores it. Unset: true for a run the
    # machine may resume by itself (under SLURM, distributed.max_restarts > 0, resume=auto), false otherwise.
    checkpoint: bool | None = None


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
    # A run whose total_steps ends before learning_starts is refused (it would never update); true runs it anyway,
    # with one warning in the log (a run that only fills a replay, say).
    allow_no_updates: bool = False

    def validate(self, run: TrainConfig) -> list[str]:
        """Range and consistency checks against the whole run's config; UserError with one line. Returns the
        warnings for the run's log."""
        check(
            not (self.dueling and run.model._target_),
            "algo.dueling=true builds rlrun's dueling head; with model._target_ put it in your network instead",
        )
        check(
            run.model.name not in RECURRENT_MODELS,
            f"model={run.model.name} trains with algo=ppo; algo=dqn takes model=mlp or nature_cnn",
        )
        check_rules(self, DQN_RULES, "algo.")
        return check_replay_algorithm(self, run)


@dataclass
class ContinuousControlConfig:
    """What SAC and TD3 share (names and defaults as SB3's, learning_starts as CleanRL's). Sizes are per rank;
    counts of env steps are global."""

    name: str = ""
    lr: float = 3e-4  # actor, critics (and SAC's temperature)
    buffer_size: int = 1_000_000  # transitions per rank
    learning_starts: int = 5_000  # transitions in the replay (all ranks) before updates; uniform actions till then
    batch_size: int = 256  # per rank: the global batch is ranks x batch_size
    gamma: float = 0.99
    tau: float = 0.005  # Polyak averaging of the target networks
    n_step: int = 1
    train_freq: int = 1  # vector-env steps per rank between training phases (one iteration)
    gradient_steps: int = 1  # updates per training phase
    adam_eps: float = 1e-8
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    fast: bool = True  # the accelerations of rlrun/fast/ where they apply (false runs the algorithm's code only)
    # A run whose total_steps ends before learning_starts is refused (it would never update); true runs it anyway,
    # with one warning in the log (a run that only fills a replay, say).
    allow_no_updates: bool = False
    RULES: ClassVar[dict[str, Rule]] = CONTINUOUS_RULES

    def validate(self, run: TrainConfig) -> list[str]:
        """Range and consistency checks against the whole run's config; UserError with one line. Returns the
        warnings for the run's log."""
        name = self.name
        check(
            run.model.name == "mlp" and not run.model._target_,
            f"algo={name} builds MLP actors and critics from model.hidden_sizes and model.activation; "
            f"model={run.model.name}{' with model._target_' if run.model._target_ else ''} is not accepted",
        )
        check_rules(self, self.RULES, "algo.")
        return check_replay_algorithm(self, run)


@dataclass
class SACConfig(ContinuousControlConfig):
    """Soft actor-critic (Haarnoja et al. 2018, with the automatic temperature of the second paper)."""

    name: str = "sac"
    alpha: float = 1.0  # the entropy temperature: its starting value with autotune (SB3's "auto"), else fixed
    autotune: bool = True  # learn alpha so that the policy's entropy tracks target_entropy
    target_entropy: float | None = None  # null: -|A| (the papers' choice)
    policy_frequency: int = 1  # critic updates per actor update (CleanRL's delay; each delay runs that many)
    target_update_interval: int = 1  # updates between target-network Polyak steps

    RULES: ClassVar[dict[str, Rule]] = SAC_RULES


@dataclass
class TD3Config(ContinuousControlConfig):
    """Twin delayed DDPG (Fujimoto et al. 2018). Noise scales are in units of half the action range (actions
    are [-1, 1] inside the algorithm), as SB3's."""

    name: str = "td3"
    lr: float = 1e-3
    policy_delay: int = 2  # critic updates per actor (and target) update
    exploration_noise: float = 0.1  # std of the Gaussian added to the actor's actions while collecting
    target_policy_noise: float = 0.2  # std of the smoothing noise on the target actions
    target_noise_clip: float = 0.5
    RULES: ClassVar[dict[str, Rule]] = TD3_RULES
