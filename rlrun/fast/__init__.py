"""Accelerations: faster stand-ins for parts of the reference algorithms (rlrun/algos/), each with the same
signature as the part it replaces and a test comparing the two through it (tests/unit/test_fast_paths.py).
`accelerate` is the one place that decides which apply, and says why; algos/ and models/ never import this.
With algo.fast=false none applies and the run is the reference, end to end."""

from __future__ import annotations

import torch

from rlrun.algos.a2c import A2C
from rlrun.algos.continuous import ContinuousControl
from rlrun.algos.dqn import DQN
from rlrun.algos.ppo import PPO
from rlrun.algos.protocol import Algorithm, VectorEnv
from rlrun.algos.sac import SAC
from rlrun.envs.pool import WorkerPool
from rlrun.envs.ray_envs import RayEnvs
from rlrun.fast.channels_last import ChannelsLast
from rlrun.fast.flat_adam import FlatAdam
from rlrun.fast.fused_a2c import FusedA2CUnroll
from rlrun.fast.fused_ppo import FusedPPOLearner, fusable
from rlrun.fast.numpy_policy import NumpyPolicy
from rlrun.fast.worker_acting import RayActing, WorkerActing
from rlrun.models import ActorCritic, trainable
from rlrun.models.encoders import NatureCNN


def accelerate(algo: Algorithm, envs: VectorEnv) -> list[str]:
    """Swap the accelerations that apply into `algo` (built, not yet trained or wrapped in DDP), which collects
    from `envs`; returns their names, for the log. Each with the condition it needs and why it pays:"""
    if not (isinstance(algo, (PPO, A2C, DQN, ContinuousControl)) and algo.cfg.fast):
        return []  # algo.fast=false, or an algorithm none of these accelerates
    cpu = algo.device.type == "cpu"
    if isinstance(algo, A2C):
        return _accelerate_a2c(algo, cpu)
    if isinstance(algo, ContinuousControl):
        return _accelerate_continuous(algo)
    applied = []
    if isinstance(algo, PPO) and cpu and _frames_cnn(algo):
        # oneDNN's convolution backward is faster on channels-last input: the rollout stores frames so,
        # paying the permute once per rollout, and minibatches gathered from it (take_rows) stay so.
        r = algo.rollout
        r.obs = r.obs.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
        applied.append("channels-last frames")
    if isinstance(algo, PPO) and fusable(algo.model):
        # One autograd node for the whole loss (hand-written gradient, numpy tanh on CPU) instead of ~60 ops:
        # on a small MLP the update is operator overhead.
        algo.learner = FusedPPOLearner(algo.model, algo.cfg)
        applied.append("fused PPO loss")
    # PPO and DQN alike: parameters and gradients in one flat buffer each, so zeroing, clipping and the Adam step
    # are a few calls for the whole model, not a few per parameter tensor.
    algo.optimizer = FlatAdam(algo.trained, algo.cfg.lr, algo.cfg.adam_eps)  # before the reference's is built
    algo.clip_grad_norm_ = algo.optimizer.clip_grad_norm_
    applied.append("flat Adam")
    if isinstance(algo, PPO) and cpu and fusable(algo.model):
        # Acting for a vector step in numpy on views of the live weights: a numpy call costs a fraction of a torch
        # operator at these sizes. After flat Adam, whose buffer the views see.
        algo.policy = NumpyPolicy(algo.model)
        applied.append("numpy acting")
    if isinstance(algo, PPO) and _workers_can_act(algo, envs):
        # Each env worker runs its envs' rollout with a copy of the policy: one command per rollout instead of a
        # round trip per step, acting on every core beside the envs. Over Ray that round trip is milliseconds.
        acting = RayActing(algo, envs) if isinstance(envs, RayEnvs) else WorkerActing(algo, envs)
        algo.collect_steps = acting.collect_steps
        applied.append("acting in env workers")
    return applied


def _frames_cnn(algo: PPO | A2C) -> bool:
    """A Nature CNN on frames [C, H, W] (uint8): not on encoded Dict observations (flat float32 vectors), whose image
    keys the CNN reads from slices."""
    return algo.obs_dtype == torch.uint8 and any(isinstance(m, NatureCNN) for m in algo.model.modules())


def _accelerate_a2c(algo: A2C, cpu: bool) -> list[str]:
    if fusable(algo.model):
        # Steps act without autograd, keeping their activations; the loss over the unroll is one autograd node with
        # a hand-written gradient: the reference's backward walks num_steps graphs, on a small MLP operator overhead.
        algo.learner = FusedA2CUnroll(algo.model, algo.cfg, algo.num_envs, algo.obs_dtype, algo.mean_all)
        return ["fused A2C unroll"]
    if cpu and _frames_cnn(algo):
        # As for PPO: oneDNN's convolution backward is faster on channels-last frames (one copy per step here).
        algo.learner.policy = ChannelsLast(algo.model)
        return ["channels-last frames"]
    return []


def _accelerate_continuous(algo: ContinuousControl) -> list[str]:
    # As for PPO and DQN, for each of SAC's and TD3's optimizers: parameters and gradients in one flat buffer. (Losses
    # with hand-written gradients, as PPO's, were tried and measured no faster: at SAC's sizes, 256 x 256 layers on
    # batches of 256, the update is its matrix products, not operator overhead.)
    c = algo.cfg
    algo.critic_optimizer = FlatAdam(trainable(algo.model.critic), c.lr, c.adam_eps)
    algo.actor_optimizer = FlatAdam(trainable(algo.model.actor), c.lr, c.adam_eps)
    if isinstance(algo, SAC) and c.autotune:
        algo.alpha_optimizer = FlatAdam(algo.extra_trained(), c.lr, c.adam_eps)
    return ["flat Adam"]


def _workers_can_act(algo: PPO, envs: VectorEnv) -> bool:
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
