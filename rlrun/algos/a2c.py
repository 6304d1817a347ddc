"""Synchronous advantage actor-critic (A2C: Mnih et al. 2016's A3C made synchronous, as in OpenAI baselines and
SB3), trained straight from the unroll: T steps of acting with autograd on, the envs stepping in between, the
loss built from what the unroll kept, one backward. No second forward over the rollout.

Under DDP the module whose forward IS the unroll (A2CUnroll) is the wrapped one, so that backward synchronizes
the gradients (wrapping anything whose forward is not called would sync nothing: ALF issue #913). The envs stay
in their processes (forked workers, or the rank's own); the policy acts on the rank, because the graph of every
step must be kept. This is the reference; with algo.fast, rlrun/fast/ swaps the declared part (A2CParts.learner) for
a fused unroll for rlrun's MLP (FusedA2CUnroll, the same forward) or an unroll on channels-last frames for its CNN.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.configs import A2CConfig
from rlrun.algos.finite import require_finite
from rlrun.algos.normalize import MeanAll, normalize_advantages
from rlrun.algos.protocol import Annealed, EnvSpec, Reductions, Wrap, episodes_of
from rlrun.algos.returns import compute_gae, explained_variance
from rlrun.algos.rollout_step import StepRows, step_groups
from rlrun.config import ModelConfig
from rlrun.envs.protocol import Episodes, VectorEnv
from rlrun.models import build_actor_critic, eval_mode, trainable
from rlrun.models.encoders import observation_dtype


def a2c_loss(
    log_probs: Tensor,
    entropy: Tensor,
    values: Tensor,
    advantages: Tensor,
    returns: Tensor,
    ent_coef: float,
    vf_coef: float,
) -> tuple[Tensor, Tensor]:
    """-E[A log pi(a|s)] - ent_coef H + vf_coef E[(R - V)^2] over the unroll [T, N] (the value loss without the
    1/2, as SB3, whose vf_coef values the presets take); advantages and returns carry no gradient. Returns (loss,
    stats [policy loss, value loss, entropy])."""
    policy_loss = -(advantages * log_probs).mean()
    value_loss = (returns - values).square().mean()
    entropy_mean = entropy.mean()
    loss = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss
    return loss, torch.stack([policy_loss, value_loss, entropy_mean]).detach()


STATS = ("policy_loss", "value_loss", "entropy")


class A2CUnroll(nn.Module):
    """forward(envs, obs) runs one unroll from the observations `obs` and returns (loss, stats, the observations
    after it, the episodes that ended): the module DDP wraps, since its forward is where the graph is built."""

    def __init__(
        self,
        model: nn.Module,
        cfg: A2CConfig,
        num_envs: int,
        obs_dtype: torch.dtype,
        mean_all: MeanAll,
        policy: nn.Module | None = None,
    ):
        super().__init__()
        self.model, self.cfg, self.obs_dtype, self.mean_all = model, cfg, obs_dtype, mean_all
        # What each step runs, obs -> (policy output, value), with autograd: the model, or the model placed otherwise.
        self.policy: nn.Module = model if policy is None else policy
        device = next(model.parameters()).device
        shape = (cfg.num_steps, num_envs)
        # What the envs return, as observe_step stores it (numpy, taken without a conversion); the truncation
        # bootstrap values, on the device.
        self.rewards = torch.zeros(shape)
        self.terminated = torch.zeros(shape, dtype=torch.bool)
        self.truncated = torch.zeros(shape, dtype=torch.bool)
        self.next_values = torch.zeros(shape, device=device)

    def preprocess(self, obs: np.ndarray) -> Tensor:
        return torch.as_tensor(obs, dtype=self.obs_dtype, device=self.next_values.device)

    @torch.no_grad()
    def value_of(self, obs: np.ndarray, envs: np.ndarray | slice = slice(None)) -> Tensor:
        """V of raw observations [k, ...] (the final observations of truncated episodes, the one after the unroll):
        a target, without gradient, in eval mode (some ranks only compute these: no collective may run)."""
        with eval_mode(self.model):
            value: Tensor = self.model.value(self.preprocess(obs))
            return value

    def forward(self, envs: VectorEnv, obs: np.ndarray) -> tuple[Tensor, Tensor, np.ndarray, list[Episodes]]:
        outs, values, actions, next_obs, episodes = self.run(envs, obs)
        log_probs, entropy = self.model.log_prob_entropy(outs, actions)
        advantages, returns = self.targets(values.detach(), next_obs)
        loss, stats = a2c_loss(log_probs, entropy, values, advantages, returns, self.cfg.ent_coef, self.cfg.vf_coef)
        return loss, self.with_explained_variance(stats, values.detach(), returns), next_obs, episodes

    def run(self, envs: VectorEnv, obs: np.ndarray) -> tuple[Tensor, Tensor, Tensor, np.ndarray, list[Episodes]]:
        """The unroll's steps from `obs`: (policy outputs [T, N, ...] and values [T, N], with the graph of every
        step, actions [T, N, ...], the observations after the unroll, the episodes that ended). Rewards and flags
        land in self.rewards, .terminated, .truncated, and truncation bootstraps in .next_values."""
        outs, values, actions = StepRows(), StepRows(), StepRows()
        stored = SimpleNamespace(
            rewards_np=self.rewards.numpy(),
            terminated_np=self.terminated.numpy(),
            truncated_np=self.truncated.numpy(),
            next_values=self.next_values,
        )

        def act(obs: np.ndarray, t: int, envs: slice) -> np.ndarray:
            policy_out, value = self.policy(self.preprocess(obs))
            with torch.no_grad():
                action: Tensor = self.model.sample(policy_out)[0]
            outs[t, envs], values[t, envs], actions[t, envs] = policy_out, value, action
            return action.cpu().numpy()

        next_obs, episodes, _ = step_groups(envs, obs, self.cfg.num_steps, act, self.value_of, stored)
        return outs.stacked(), values.stacked(), actions.stacked(), next_obs, episodes

    def targets(self, values: Tensor, next_obs: np.ndarray) -> tuple[Tensor, Tensor]:
        """(advantages, returns) [T, N] of the last unroll, whose values [T, N] (no gradient) are given; normalized
        advantages over all ranks if configured."""
        c, device = self.cfg, values.device
        terminated, truncated = self.terminated.to(device), self.truncated.to(device)
        # Bootstrap from the next step's value, except where the episode was truncated (set by observe_step).
        following = torch.cat([values[1:], self.value_of(next_obs).unsqueeze(0)])
        next_values = torch.where(truncated, self.next_values, following)
        done = terminated | truncated
        rewards = self.rewards.to(device)
        advantages, returns = compute_gae(rewards, values, next_values, terminated, done, c.gamma, c.gae_lambda)
        if c.norm_adv:
            advantages = normalize_advantages(advantages, self.mean_all)
        return advantages, returns

    def with_explained_variance(self, stats: Tensor, values: Tensor, returns: Tensor) -> Tensor:
        """stats with this rank's explained variance appended: logged as the mean over ranks, like the losses, with
        no collective of its own (an update is a few steps here; PPO's is over all ranks' batch)."""
        ev = explained_variance(values.flatten(), returns.flatten())
        return torch.cat([stats, torch.tensor([ev], device=stats.device)])


class RMSpropTF(torch.optim.Optimizer):
    """RMSprop as TensorFlow 1 computes it, which the A2C papers' Atari results and rl-zoo's Atari presets use: the
    mean square starts at 1 (torch: 0, which makes the first steps large) and epsilon sits inside the square root."""

    def __init__(self, params: list[nn.Parameter], lr: float, alpha: float = 0.99, eps: float = 1e-5):
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["square_avg"] = torch.ones_like(p)
                square_avg = state["square_avg"].mul_(group["alpha"]).addcmul_(p.grad, p.grad, value=1 - group["alpha"])
                p.addcdiv_(p.grad, square_avg.add(group["eps"]).sqrt_(), value=-group["lr"])


def build_optimizer(cfg: A2CConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.eps)
    if cfg.optimizer == "rmsprop_tf":
        return RMSpropTF(params, cfg.lr, cfg.alpha, cfg.eps)
    return torch.optim.RMSprop(params, lr=cfg.lr, alpha=cfg.alpha, eps=cfg.eps)


@dataclass
class A2CParts:
    """What an acceleration may replace in A2C (rlrun/algos/parts.py), with a part of the same signature."""

    # An A2CUnroll or what stands in its place (what DDP wraps):
    # forward(envs, obs) -> (loss, stats, next observations, episodes)
    learner: nn.Module


class A2C:
    """collect() runs the (DDP-wrapped) unroll, which builds the loss; update() takes its one gradient step. The
    graph lives from one to the other. Knows nothing of ranks: statistics go through `reductions.mean_all`."""

    def __init__(
        self,
        cfg: A2CConfig,
        model_cfg: ModelConfig,
        spec: EnvSpec,
        device: torch.device,
        reductions: Reductions | None = None,
    ):
        obs_space = spec.observation_space
        self.cfg, self.device, self.num_envs = cfg, device, spec.num_envs
        self.mean_all = (reductions or Reductions()).mean_all
        self.model = build_actor_critic(model_cfg, obs_space, spec.action_space).to(device)
        self.obs_dtype = observation_dtype(obs_space.shape, obs_space.dtype)
        self.parts = A2CParts(A2CUnroll(self.model, cfg, spec.num_envs, self.obs_dtype, self.mean_all))
        self.trained = trainable(self.model)  # what the optimizer trains and DDP synchronizes
        self.next_obs: np.ndarray | None = None  # the observations the next unroll starts from
        self.loss: Tensor | None = None  # the last unroll's loss, with its graph, until update()
        self.stats: Tensor | None = None  # the last unroll's [policy loss, value loss, entropy, explained variance]

    @functools.cached_property
    def optimizer(self) -> torch.optim.Optimizer:
        """The configured optimizer over the trained parameters, built on first use (torch.optim's first optimizer
        imports torch._dynamo, about a second, which then falls in the first update rather than in start-up)."""
        return build_optimizer(self.cfg, self.trained)

    @property
    def steps_per_collect(self) -> int:
        return self.cfg.num_steps * self.num_envs

    @property
    def update_shape(self) -> tuple[int, int, int]:
        """One gradient step on the whole unroll per iteration."""
        return self.steps_per_collect, 1, 1

    def wrap_learner(self, wrap: Wrap) -> None:
        self.parts.learner = wrap(self.parts.learner, self.trained)

    def start(self, obs: np.ndarray) -> None:
        self.next_obs = obs

    def collect(self, envs: VectorEnv, progress: float = 0.0) -> dict[str, Any]:
        """One unroll of num_steps x num_envs transitions, keeping its loss (and graph) for update()."""
        self.model.train()
        self.loss, self.stats, self.next_obs, episodes = self.parts.learner(envs, self.next_obs)
        return episodes_of(episodes, self.steps_per_collect)

    def annealed(self) -> list[Annealed]:
        c = self.cfg
        return [("learning rate", lambda p: c.lr * (1.0 - p), 1.0)] if c.anneal_lr else []

    def update(self, progress: float) -> dict[str, float]:
        """The gradient step on the last unroll's loss; `progress` in [0, 1) sets the annealed learning rate."""
        c = self.cfg
        lr = c.lr * (1.0 - progress) if c.anneal_lr else c.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad()
        self.loss.backward()
        self.loss = None  # frees the graph
        require_finite(nn.utils.clip_grad_norm_(self.trained, c.max_grad_norm), "the A2C gradient norm")
        self.optimizer.step()
        stats = self.stats.tolist()
        return dict(zip(STATS, stats)) | {"explained_variance": stats[-1], "learning_rate": lr}

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = True, starts: np.ndarray | None = None) -> np.ndarray:
        """Actions for a batch of raw observations [B, ...] (evaluation and play; `starts` is for policies with
        memory, which A2C does not train)."""
        self.model.eval()
        x = torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)
        return self.model.act(x, deterministic)[0].cpu().numpy()

    def state_dict(self) -> dict[str, Any]:
        """What every rank shares: the network and the optimizer."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def rank_state(self) -> dict[str, Any]:
        """What is this rank's own: the observations its envs are at."""
        return {"next_obs": torch.from_numpy(np.array(self.next_obs))}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        self.next_obs = state["next_obs"].numpy().copy()

    def shard_state(self) -> None:
        return None

    def load_shard_state(self, state: dict[str, Any]) -> None:
        raise ValueError("A2C keeps no replay shard")
