"""Accelerations: faster stand-ins for the parts an algorithm declares swappable (its `parts`: rlrun/algos/parts.py,
PPOParts, A2CParts), each with the same signature as the part it replaces and a test comparing the two through it
(tests/unit/test_fast_paths.py). `accelerate` is the one place that decides which apply, and says why; algos/ and
models/ never import this. With algo.fast=false none applies and the run is the reference, end to end.

Two kinds. Layout-only ones run the reference code, placed or laid out differently: flat Adam (torch's Adam kernel on
one buffer), channels-last frames, acting in env workers with copies of the real model. Math-rewriting ones compute the
reference's math with other code: the fused PPO and DQN losses and the fused A2C unroll (hand-written gradients), PPO's
and DQN's gradient steps in numpy (those gradients without autograd), SAC's and TD3's steps without autograd (their
passes written out in torch), numpy acting (a numpy forward). Those check
themselves against the reference at their first use in every process and step aside with one line when they differ
(selfcheck.py), so an edit to algos/ or models/ is what trains."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard, cast

import torch
from torch import nn

from rlrun.algos.a2c import A2C, A2CParts, A2CUnroll
from rlrun.algos.batched import BatchedAlgorithm
from rlrun.algos.batched_ppo import BatchedPPO, BatchedPPOParts
from rlrun.algos.continuous import CriticParts
from rlrun.algos.dqn import DQN, DQNParts
from rlrun.algos.ppo import PPO, PPOLearner, PPOParts
from rlrun.algos.protocol import Algorithm, VectorEnv
from rlrun.algos.sac import SAC, SACParts
from rlrun.algos.td3 import TD3, TD3Parts
from rlrun.config import TrainConfig
from rlrun.distributed import in_process_group
from rlrun.envs import atari_config, make_env
from rlrun.envs.backends import native_kind
from rlrun.envs.pool import WorkerPool
from rlrun.envs.ray_envs import RayEnvs
from rlrun.envs.sync import SyncEnvs
from rlrun.fast.batched_numpy_policy import BatchedNumpyPolicy
from rlrun.fast.cartpole_arrays import CartPoleArrays, coverable
from rlrun.fast.cartpole_floats import CartPoleFloats
from rlrun.fast.channels_last import ChannelsLast
from rlrun.fast.continuous_steps import (
    ActorStepWithoutAutograd,
    CriticStepWithoutAutograd,
    NextActionsWithoutModules,
    SACActorStepWithoutAutograd,
    TargetActionsWithoutModules,
    TargetQWithoutModules,
    bare_mlp,
    relu_mlp,
)
from rlrun.fast.flat_adam import FlatAdam, FlatAdams
from rlrun.fast.flat_polyak import FlatPolyak, flattenable
from rlrun.fast.fused_a2c import FusedA2CUnroll
from rlrun.fast.fused_batched_ppo import FusedBatchedPPOLearner, fusable_batch
from rlrun.fast.fused_dqn import FusedDQNLearner, FusedQTargets, fusable_q
from rlrun.fast.fused_ppo import FusedPPOLearner, fusable
from rlrun.fast.joined_sync import all_cartpoles, all_in_process, join_cartpoles, join_envs
from rlrun.fast.numpy_exploration import NumpyExploration
from rlrun.fast.numpy_policy import NumpyPolicy
from rlrun.fast.numpy_q import NumpyEpsilonGreedy
from rlrun.fast.numpy_rollout import BatchedNumpyRollout, NumpyRollout
from rlrun.fast.numpy_steps import NumpyDQNStep, NumpyPPOStep
from rlrun.fast.rollout_noise import draw_noise_at_once
from rlrun.fast.selfcheck import (
    CheckedBatchedPolicy,
    CheckedDQNLearner,
    CheckedEpsilonGreedy,
    CheckedExploration,
    CheckedLearner,
    CheckedNoise,
    CheckedPolicy,
    CheckedQTargets,
    CheckedStep,
)
from rlrun.fast.stacked_adam import SeedsAdamStep
from rlrun.fast.worker_acting import RayActing, WorkerActing
from rlrun.models import ActorCritic, trainable
from rlrun.models.continuous import DeterministicActor, GaussianActor, TwinQ
from rlrun.models.encoders import NatureCNN


def accelerate(algo: Algorithm | BatchedAlgorithm, envs: VectorEnv | Sequence[VectorEnv]) -> list[str]:
    """Swap the accelerations that apply into `algo`'s parts (built, not yet trained or wrapped in DDP); `algo`
    collects from `envs` (a batched learner of several seeds, rlrun/algos/batched.py: from each seed's). Returns their
    names, for the log. Each with the condition it needs and why it pays:"""
    parts = getattr(algo, "parts", None)  # an algorithm without declared parts has nothing to swap
    cfg: Any = getattr(algo, "cfg", None)  # the algorithm's config section (algo.fast, its lr and Adam epsilon)
    if parts is None or cfg is None or not cfg.fast:
        return []
    if isinstance(envs, Sequence):  # a batch of seeds, one vector env each
        if isinstance(parts, BatchedPPOParts) and isinstance(algo, BatchedPPO):
            return _accelerate_seeds(algo, parts, envs)
        return []
    return _accelerate_one(cast(Algorithm, algo), parts, cfg, envs) + _cartpole_arrays(envs)


def _accelerate_one(algo: Algorithm, parts: object, cfg: Any, envs: VectorEnv) -> list[str]:
    # PPO's and A2C's parts come with the rest of PPO and A2C, which their accelerations read (rollout, model, cfg).
    if isinstance(parts, PPOParts) and isinstance(algo, PPO):
        return _accelerate_ppo(algo, parts, envs)
    if isinstance(parts, A2CParts) and isinstance(algo, A2C):
        return _accelerate_a2c(algo, parts)
    if isinstance(parts, DQNParts) and isinstance(algo, DQN):
        return _accelerate_dqn(algo, parts)
    if isinstance(parts, CriticParts) and isinstance(algo, (SAC, TD3)):
        return _accelerate_continuous(algo, parts)
    return []


# From how many CartPoles a step as arrays costs less than a Python step per env: its numpy calls cost about as much
# as three envs' steps, whatever the number of envs (bench/env_throughput.py's "arrays" rows).
ARRAYS_FROM = 4


def _cartpole_arrays(envs: VectorEnv) -> list[str]:
    """In-process CartPoles, from ARRAYS_FROM of them, stepped as arrays (one numpy expression for all envs instead of
    a Python step per env and wrapper), their env objects kept for every other command. Checked against the envs' own
    step on the first step and the first that ends an episode. Fewer are stepped in Python floats on their env
    objects (the steps that end no episode: the call through three wrappers and the vector step's lists around it were
    half of a step of one env). Checked against the envs' own step on the first step it takes."""
    if type(envs) is not SyncEnvs or not coverable(envs.envs):
        return []
    if envs.num_envs < ARRAYS_FROM:
        envs.run_command = CartPoleFloats(envs.envs)
        return ["CartPole stepped in floats"]
    envs.run_command = CartPoleArrays(envs.envs).rows(0, envs.num_envs)
    return ["CartPole stepped as arrays"]


def cartpoles_as_arrays(cfg: TrainConfig) -> bool:
    """Whether _cartpole_arrays would step this run's training envs were they in-process: what env.vector.backend=auto
    weighs for CartPole (rlrun/envs/backends.py), before any env exists. Builds one env, for CartPole only."""
    env_cfg = cfg.env
    if not cfg.algo.fast or env_cfg.num_envs < ARRAYS_FROM or native_kind(env_cfg, atari_config(env_cfg)) != "cartpole":
        return False
    env = make_env(env_cfg, train=True)()
    try:
        return coverable([env])
    finally:
        env.close()


def _accelerate_ppo(algo: PPO, parts: PPOParts, envs: VectorEnv) -> list[str]:
    applied, cpu = [], algo.device.type == "cpu"
    fused = algo.model if fusable(algo.model) else None  # the MLP actor-critic the fused loss covers
    if cpu and _frames_cnn(algo):
        # oneDNN's convolution backward is faster on channels-last input: the rollout stores frames so,
        # paying the permute once per rollout, and minibatches gathered from it (take_rows) stay so.
        r = algo.rollout
        r.obs = r.obs.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
        applied.append("channels-last frames")
    if fused is not None:
        # One autograd node for the whole loss (hand-written gradient, numpy tanh on CPU) instead of ~60 ops:
        # on a small MLP the update is operator overhead. Checked against PPOLearner on the first minibatch.
        fast = FusedPPOLearner(fused, algo.cfg)
        parts.learner = CheckedLearner(fast, PPOLearner(algo.model, algo.cfg), trainable(algo.model))
        applied.append("fused PPO loss")
    # Parameters and gradients in one flat buffer each, so zeroing, clipping and the Adam step are a few calls for
    # the whole model, not a few per parameter tensor.
    _flat_adam(parts, algo.cfg.lr, algo.cfg.adam_eps)
    optimizer = algo.optimizer  # built now, not on first use: numpy acting and the numpy step take views of its buffers
    applied.append("flat Adam")
    if cpu and isinstance(parts.learner, CheckedLearner) and not in_process_group() and isinstance(optimizer, FlatAdam):
        # The minibatch step around the fused loss in numpy, its gradient written into flat Adam's buffer: autograd's
        # engine and the torch calls around the loss were a third of a small network's step. One process only: DDP
        # averages the ranks' gradients in the learner's backward, which this step does not run. Checked against
        # PPO.minibatch_step on the first minibatch.
        step = NumpyPPOStep(parts.learner, optimizer, parts.minibatch_step)
        names = ("minibatch step in numpy", "algos/ppo.py (PPO.minibatch_step)")
        parts.minibatch_step = CheckedStep(step, parts.minibatch_step, [optimizer], names)
        applied.append("minibatch step in numpy")
    if cpu and fused is not None:
        # Acting for a vector step in numpy on views of the live weights: a numpy call costs a fraction of a torch
        # operator at these sizes. Checked against the model's act on the first step.
        parts.policy = policy = CheckedPolicy(NumpyPolicy(fused), fused)
        applied.append("numpy acting")
        if type(envs) is SyncEnvs and algo.obs_rms is None and algo.obs_dtype == torch.float32:
            # The rollout stays in numpy around numpy acting (and a categorical policy's noise is drawn once per
            # rollout): for a few in-process envs, the torch tensors made and stacked around acting each step cost
            # more than acting. From the second rollout, numpy acting checked on the first.
            parts.collect_steps = NumpyRollout(algo, policy, parts.collect_steps)
            applied.append("rollout kept in numpy")
    if _workers_can_act(envs, algo):
        # Each env worker runs its envs' rollout with a copy of the policy: one command per rollout instead of a
        # round trip per step, acting on every core beside the envs. Over Ray that round trip is milliseconds.
        acting = RayActing(algo, envs) if isinstance(envs, RayEnvs) else WorkerActing(algo, envs)
        parts.collect_steps = acting.collect_steps
        applied.append("acting in env workers")
    return applied


def _accelerate_dqn(algo: DQN, parts: DQNParts) -> list[str]:
    c, model = algo.cfg, algo.model
    # As for SAC and TD3 (below): zeroing, clipping and the Adam step as a few calls on flat buffers.
    _flat_adam(parts, c.lr, c.adam_eps)
    optimizer = algo.optimizer  # built now, not on first use: numpy acting and the numpy step take views of its buffers
    applied = ["flat Adam"]
    if not fusable_q(model) or algo.device.type != "cpu":
        return applied
    # One autograd node for the loss (hand-written gradient) instead of ~25, it and the targets' forward passes in
    # numpy: on a small MLP the update is operator overhead. Checked against DQNLearner and q_targets on the first
    # update (the targets again where the online and target networks' choices part).
    parts.learner = CheckedDQNLearner(FusedDQNLearner(model, c.batch_size, c.loss), parts.learner, algo.trained)
    parts.targets = CheckedQTargets(FusedQTargets(model, algo.target, c.double_q), parts.targets)
    # Acting in numpy on views of the live weights, the forward pass only for the envs that act greedily: with one
    # env, a torch forward per env step was a third of the run. Checked against DQN's acting on the first step.
    q_values = lambda obs: model(torch.as_tensor(obs, dtype=algo.obs_dtype))  # noqa: E731
    parts.epsilon_greedy = CheckedEpsilonGreedy(NumpyEpsilonGreedy(model), parts.epsilon_greedy, q_values)
    applied += ["fused DQN loss", "fused DQN targets", "numpy epsilon-greedy acting"]
    if not in_process_group() and isinstance(optimizer, FlatAdam):
        # As PPO's minibatch step in numpy (_accelerate_ppo): the loss's gradient without autograd, written into flat
        # Adam's buffer, clipped, stepped. One process only. Checked against DQN.gradient_step on the first update.
        step = NumpyDQNStep(parts.learner, optimizer, c.max_grad_norm, parts.gradient_step)
        names = ("gradient step in numpy", "algos/dqn.py (DQN.gradient_step)")
        parts.gradient_step = CheckedStep(step, parts.gradient_step, [optimizer], names)
        applied.append("gradient step in numpy")
    return applied


def _accelerate_continuous(algo: SAC | TD3, parts: CriticParts) -> list[str]:
    c, critic = algo.cfg, algo.model.critic
    assert isinstance(critic, TwinQ)  # (an nn.Module attribute, to mypy)
    # Parameters and gradients in one flat buffer per optimizer, so zeroing and the Adam step are a few calls for a
    # whole network.
    _flat_adam(parts, c.lr, c.adam_eps)
    critic_optimizer, actor_optimizer = algo.critic_optimizer, algo.actor_optimizer  # built now: used below
    applied = ["flat Adam"]
    nets = algo.model
    critic_target, actor, actor_target = nets.critic_target, nets.actor, getattr(nets, "actor_target", None)
    assert isinstance(critic_target, TwinQ) and isinstance(actor, nn.Module)
    pairs: list[tuple[nn.Module, nn.Module, object]] = [(critic_target, critic, critic_optimizer)]
    if isinstance(actor_target, nn.Module):  # TD3's
        pairs.append((actor_target, actor, actor_optimizer))
    flat = [(t, n, o) for t, n, o in pairs if isinstance(o, FlatAdam) and flattenable(t, n, o)]
    if len(flat) == len(pairs):
        # The targets laid out as flat Adam lays out their online networks: a Polyak update is one lerp a network.
        parts.polyak = FlatPolyak(flat)
        applied.append("flat targets")
    applied += _numpy_exploration(algo, parts, actor)
    if in_process_group() or algo.device.type != "cpu" or not isinstance(critic_optimizer, FlatAdam):
        return applied  # DDP averages the ranks' gradients in autograd's backward, which these steps do not run
    if all(relu_mlp(net) for net in critic_target.critics):
        # The target critics' forward on buffers allocated once, without the modules' calls and the outputs each
        # allocates. Checked against the module on the first update.
        names = ("target Q without modules", "models/continuous.py (TwinQ)")
        parts.target_q = CheckedStep(TargetQWithoutModules(critic_target), parts.target_q, [], names)
        applied.append("target Q without modules")
    critics_bare = all(bare_mlp(net) for net in critic.critics)
    if critics_bare:
        # The critics' forward and backward without autograd, on buffers allocated once, gradients written into flat
        # Adam's buffer: at 256-wide layers an update is its matrix products, and much of the rest is autograd's graph,
        # the outputs it allocates and the gradients it accumulates and zeroes. Checked against the reference step on
        # the first update.
        names = ("critic step without autograd", "algos/continuous.py (reference_critic_step)")
        scale = 0.5 if isinstance(algo, SAC) else 1.0  # SB3's: SAC halves the squared errors, TD3 does not
        fast = CriticStepWithoutAutograd(critic, critic_optimizer, scale, c.batch_size, c.name)
        parts.critic_step = CheckedStep(fast, parts.critic_step, [critic_optimizer], names)
        applied.append("critic step without autograd")
    if isinstance(parts, SACParts) and isinstance(algo, SAC):
        applied += _sac_steps(algo, parts, critic, critics_bare)
    if isinstance(parts, TD3Parts) and isinstance(algo, TD3):
        applied += _td3_steps(algo, parts, critic)
    return applied


def _sac_steps(algo: SAC, parts: SACParts, critic: TwinQ, critics_bare: bool) -> list[str]:
    c, actor, actor_optimizer, applied = algo.cfg, algo.model.actor, algo.actor_optimizer, []
    if not isinstance(actor, GaussianActor):
        return []
    if relu_mlp(actor.net):  # as TD3's target actions: the next actions' forward without the module
        names = ("next actions without modules", "models/continuous.py (GaussianActor)")
        parts.next_actions = CheckedStep(NextActionsWithoutModules(actor), parts.next_actions, [], names)
        applied.append("next actions without modules")
    alpha_optimizer, log_alpha = algo.alpha_optimizer, algo.model.log_alpha
    optimizers = [o for o in (actor_optimizer, alpha_optimizer) if o is not None]
    if critics_bare and bare_mlp(actor.net) and all(isinstance(o, FlatAdam) for o in optimizers):
        # As the critics': the actor's and temperature's losses through the smaller critic, tanh and the
        # reparameterized log-density, without autograd. Checked against SAC.actor_step on the first update.
        assert isinstance(log_alpha, nn.Parameter) and isinstance(actor_optimizer, FlatAdam)
        names = ("actor step without autograd", "algos/sac.py (SAC.actor_step)")
        temperature = (log_alpha, algo.target_entropy)
        steps = (actor_optimizer, cast(FlatAdam | None, alpha_optimizer))
        fast_sac = SACActorStepWithoutAutograd(actor, critic, *temperature, c.batch_size, steps)
        parts.actor_step = CheckedStep(fast_sac, parts.actor_step, cast(list[FlatAdam], optimizers), names)
        applied.append("actor step without autograd")
    return applied


def _td3_steps(algo: TD3, parts: TD3Parts, critic: TwinQ) -> list[str]:
    c, nets, actor_optimizer, applied = algo.cfg, algo.model, algo.actor_optimizer, []
    actor, actor_target = nets.actor, nets.actor_target
    if isinstance(actor_target, DeterministicActor) and relu_mlp(actor_target.net):  # as the target critics'
        names = ("target actions without modules", "models/continuous.py (DeterministicActor)")
        parts.target_actions = CheckedStep(TargetActionsWithoutModules(actor_target), parts.target_actions, [], names)
        applied.append("target actions without modules")
    if isinstance(actor, DeterministicActor) and isinstance(actor_optimizer, FlatAdam):
        if bare_mlp(actor.net) and bare_mlp(critic.critics[0]):
            # As the critics': the actor's loss through the first critic and tanh, without autograd. Checked against
            # TD3.actor_step on the first update.
            names = ("actor step without autograd", "algos/td3.py (TD3.actor_step)")
            fast_actor = ActorStepWithoutAutograd(actor, critic, actor_optimizer, c.batch_size)
            parts.actor_step = CheckedStep(fast_actor, parts.actor_step, [actor_optimizer], names)
            applied.append("actor step without autograd")
    return applied


def _numpy_exploration(algo: SAC | TD3, parts: CriticParts, actor: nn.Module) -> list[str]:
    """Acting for a vector step in numpy on views of the live weights (built after flat Adam laid them out): an
    off-policy run acts at every env step on a few observations, where a numpy call costs a fraction of a torch
    operator. Checked against the reference on the first step it explores."""
    if (
        algo.device.type != "cpu"
        or not isinstance(actor, (DeterministicActor, GaussianActor))
        or not relu_mlp(actor.net)
    ):
        return []
    noise_scale = algo.cfg.exploration_noise if isinstance(algo, TD3) else 0.0
    parts.exploration = CheckedExploration(NumpyExploration(actor, noise_scale), parts.exploration)
    return ["numpy exploration"]


def _accelerate_seeds(batch: BatchedPPO, parts: BatchedPPOParts, envs: Sequence[VectorEnv]) -> list[str]:
    applied, model, cfg = [], batch.model, batch.cfg
    if all_in_process(envs):
        # A step runs every seed's envs into one set of arrays and returns one result for the S x N envs, instead of
        # S vector steps and their join: the per-step calls that do not grow with the envs are made once, not S times.
        parts.join_envs = join_envs
        applied.append("seeds' envs stepped as one")
    if all_cartpoles(envs) and sum(e.num_envs for e in envs) >= ARRAYS_FROM:
        # As for one run's CartPoles (_cartpole_arrays), all seeds' at once: each env keeps its own generator, so a
        # seed's episodes are its single run's.
        parts.join_envs = join_cartpoles
        applied.append("CartPoles stepped as arrays")
    fused = fusable_batch(model)
    if fused:
        # One autograd node per minibatch for all seeds (hand-written gradient), as the fused PPO loss for one.
        # Checked against BatchedPPOLearner on the first minibatch.
        names = ("fused batched PPO loss", "algos/batched_ppo.py")
        fast = FusedBatchedPPOLearner(model, cfg)
        parts.learner = CheckedLearner(fast, parts.learner, model.seed_parameters(), names)
        applied.append("fused batched PPO loss")
    if fused and batch.device.type == "cpu":
        # Acting in numpy on views of the stacked weights: at a few envs per seed a numpy call costs a fraction of a
        # torch operator. Checked against BatchedActorCritic.act on the first step.
        parts.policy = policy = CheckedBatchedPolicy(BatchedNumpyPolicy(model), parts.policy)
        applied.append("batched numpy acting")
        if batch.seeds[0].obs_rms is None and batch.seeds[0].obs_dtype == torch.float32:
            # As for one run: the batch's rollout stays in numpy around batched numpy acting, from the second rollout.
            parts.collect_steps = BatchedNumpyRollout(batch, policy, parts.collect_steps)
            applied.append("rollout kept in numpy")
    if SeedsAdamStep.applies(batch.optimizer):
        # The seeds' Adam steps as one call of torch.optim's fused kernel over the active seeds' S x J slices,
        # without torch.optim's per-tensor bookkeeping around it: the same kernel, so the same numbers.
        parts.step_seeds = SeedsAdamStep(batch.optimizer)
        applied.append("seeds' Adam in one call")
    if model.kind == "categorical" and all(g.device.type == "cpu" for g in batch.noise_generators):
        # A rollout's noise in one draw per seed instead of one per seed and step (torch's CPU exponential kernel
        # draws element by element). Checked against the step by step draws at the first rollout.
        parts.draw_noise = CheckedNoise(draw_noise_at_once, parts.draw_noise)
        applied.append("rollout noise drawn at once")
    return applied


def _flat_adam(parts: PPOParts | CriticParts | DQNParts, lr: float, eps: float) -> None:
    """The parts' optimizers FlatAdam, and their gradient clipping (SAC and TD3 clip none) on its flat gradient."""
    adams = FlatAdams(lr, eps)
    parts.make_optimizer = adams.make
    if not isinstance(parts, CriticParts):
        parts.clip_grad_norm_ = adams.clip_grad_norm_


def _frames_cnn(algo: PPO | A2C) -> bool:
    """A Nature CNN on frames [C, H, W] (uint8): not on encoded Dict observations (flat float32 vectors), whose image
    keys the CNN reads from slices."""
    return algo.obs_dtype == torch.uint8 and any(isinstance(m, NatureCNN) for m in algo.model.modules())


def _accelerate_a2c(algo: A2C, parts: A2CParts) -> list[str]:
    model, args = algo.model, (algo.cfg, algo.num_envs, algo.obs_dtype, algo.mean_all)
    if fusable(model):
        # Steps act without autograd, keeping their activations; the loss over the unroll is one autograd node with
        # a hand-written gradient: the reference's backward walks num_steps graphs, on a small MLP operator overhead.
        # Checked against the reference on the first unroll.
        parts.learner = FusedA2CUnroll(model, *args)
        return ["fused A2C unroll"]
    if algo.device.type == "cpu" and _frames_cnn(algo):
        # As for PPO: oneDNN's convolution backward is faster on channels-last frames (one copy per step here).
        parts.learner = A2CUnroll(model, *args, policy=ChannelsLast(model))
        return ["channels-last frames"]
    return []


def _workers_can_act(envs: VectorEnv, algo: PPO) -> TypeGuard[WorkerPool | RayEnvs]:
    """algo.act_in_workers, on a worker pool or Ray actors not double-buffering (then the rank acts for one half while
    the other steps), for a feedforward CPU policy with a categorical or Gaussian distribution, without observation
    normalization (whose statistics move every step, in the rank) and without buffers (the workers' copies see the
    parameters only), and without straggler preemption (the workers run a rollout through without hearing from the
    rank, which cuts it)."""
    return (
        algo.cfg.act_in_workers
        and algo.cfg.preempt_fraction is None
        and isinstance(envs, (WorkerPool, RayEnvs))
        and len(envs.groups) == 1
        and type(algo.model) is ActorCritic  # the workers build their copies of rlrun's own networks
        and algo.model.kind in ("categorical", "gaussian")  # the samplers they draw the rank's noise for
        and not algo.cfg.normalize_obs
        and algo.device.type == "cpu"
        and not any(True for _ in algo.model.buffers())
    )
