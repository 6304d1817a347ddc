"""A2C's acceleration for rlrun's MLP actor-critic (separate trunks): the unroll's steps act without autograd,
keeping each layer's activations, and the loss over the whole unroll is one autograd node with a hand-written
gradient (the PPO fused loss's network and distribution parts). The reference keeps a graph of a dozen operators
per step, and its backward walks num_steps of them: on a small MLP that is operator overhead. Nothing is
recomputed: the gradient is taken at the activations the unroll acted with. A drop-in for A2CUnroll.

It checks itself on its first unroll (fast/selfcheck.py): before acting, its forward against the model's on the
unroll's first observations; after it, its loss, stats and gradients against the reference's (the model's forward,
log_prob_entropy and a2c_loss on the same rows, actions and targets). If either differs, it steps aside: the unroll
in hand takes the reference's loss (its actions were the reference sampler's, on outputs that agreed, or the
reference ran it whole) and every later one runs A2CUnroll.forward."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos import a2c as reference
from rlrun.algos.a2c import A2CUnroll
from rlrun.algos.configs import A2CConfig
from rlrun.algos.normalize import MeanAll
from rlrun.envs.protocol import Episodes, VectorEnv
from rlrun.fast.fused_ppo import (
    _heads_forward,
    distribution_backward,
    distribution_forward,
    fused_params,
    network_backward,
    twin_mlp_forward,
)
from rlrun.fast.selfcheck import difference, gradient_difference, gradients, steps_aside
from rlrun.models import ActorCritic, trainable

NAME, REFERENCE = "fused A2C unroll", "algos/a2c.py"


class FusedA2CUnroll(A2CUnroll):
    """A2CUnroll with the same constructor and forward, for models where fast.fused_ppo.fusable() holds."""

    model: ActorCritic  # as A2CUnroll's, narrowed: the MLP actor-critic whose layers it fuses

    def __init__(self, model: ActorCritic, cfg: A2CConfig, num_envs: int, obs_dtype: torch.dtype, mean_all: MeanAll):
        super().__init__(model, cfg, num_envs, obs_dtype, mean_all)
        self.params = fused_params(model)
        self.policy = self.recorded = _Recorded(model, self.params)
        self.fused, self.checked = True, False  # whether it runs fused; whether it has checked itself

    @torch.no_grad()
    def value_of(self, obs: np.ndarray, envs: np.ndarray | slice = slice(None)) -> Tensor:
        """As the reference's, without the mode switch (rlrun's MLP behaves the same in both modes)."""
        if not self.fused:
            return super().value_of(obs, envs)
        value: Tensor = self.recorded(self.preprocess(obs), keep=False)[1]  # the policy, while fused
        return value

    def forward(self, envs: VectorEnv, obs: np.ndarray) -> tuple[Tensor, Tensor, np.ndarray, list[Episodes]]:
        if not self.checked and self._steps_aside(self._forward_difference(obs)):
            self.checked = True  # before it acted: the reference runs this unroll whole, and every later one
        if not self.fused:
            return super().forward(envs, obs)
        steps = self.recorded.steps  # the policy's, while fused
        steps.clear()
        with torch.no_grad():
            outs, values, actions, next_obs, episodes = self.run(envs, obs)
        advantages, returns = self.targets(values, next_obs)
        # The steps' rows in the unroll's [T, N] order: steps come in order, each step's groups in env order.
        x = torch.cat([x for x, _ in steps])
        acts = [torch.cat([a[i] for _, a in steps], dim=1) for i in range(len(steps[0][1]))]
        m = self.model
        flat = (outs.flatten(0, 1), values.flatten(), actions.flatten(0, 1), advantages.flatten(), returns.flatten())
        loss: Tensor
        stats: Tensor
        loss, stats = _FusedA2CLoss.apply(self.cfg, m.trunk.relu, x, acts, *flat, *self.params)
        if not self.checked:
            self.checked = True
            loss, stats, values = self._checked(loss, stats, values, x, *flat[2:])
        return loss, self.with_explained_variance(stats, values, returns), next_obs, episodes

    def _checked(
        self, loss: Tensor, stats: Tensor, values: Tensor, x: Tensor, *rows: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(loss, stats, values [T, N]): the fused ones, or the reference's on the same rows x [T * N, ...], with the
        same `rows` (actions, advantages, returns), if they differ in loss, stats or gradients."""
        ref_loss, ref_stats, ref_values = self._reference_loss(x, *rows)
        params = trainable(self.model)
        diff = max(
            difference(loss, ref_loss),
            difference(stats, ref_stats),
            gradient_difference(gradients(loss, params, keep=True), gradients(ref_loss, params, keep=True)),
        )
        if self._steps_aside(diff):
            return ref_loss, ref_stats, ref_values.detach().view_as(values)
        return loss, stats, values

    @torch.no_grad()
    def _forward_difference(self, obs: np.ndarray) -> float:
        """How far the fused forward is from the model's on the observations `obs` (before it acts on any)."""
        x = self.preprocess(obs)
        out, value = self.recorded(x, keep=False)
        ref_out, ref_value = self.model(x)
        return max(difference(out, ref_out), difference(value, ref_value))

    def _reference_loss(
        self, x: Tensor, actions: Tensor, advantages: Tensor, returns: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(loss, stats, values) of the reference on the unroll's rows x [T * N, ...], with its actions and targets."""
        out, values = self.model(x)
        log_probs, entropy = self.model.log_prob_entropy(out, actions)
        c = self.cfg
        loss, stats = reference.a2c_loss(log_probs, entropy, values, advantages, returns, c.ent_coef, c.vf_coef)
        return loss, stats, values

    def _steps_aside(self, diff: float) -> bool:
        """Whether it steps aside at this difference (saying so, once); from then on the reference runs."""
        if self.fused and steps_aside(NAME, REFERENCE, diff):
            self.fused, self.policy = False, self.model
        return not self.fused


class _Recorded(nn.Module):
    """model(obs) without autograd, keeping the input and every trunk activation of each call."""

    def __init__(self, model: ActorCritic, params: list[Tensor]):
        """`params` as fused_params(model): trunk, the four head tensors, log-std if Gaussian."""
        super().__init__()
        self.model = model
        self.steps: list[tuple[Tensor, list[Tensor]]] = []  # (input [B, ...], trunk activations) of each call
        self.trunk = params[: len(params) - (4 if model.discrete else 5)]
        self.head = params[len(self.trunk) : len(self.trunk) + 4]

    def forward(self, obs: Tensor, keep: bool = True) -> tuple[Tensor, Tensor]:
        acts = twin_mlp_forward(obs, self.trunk, self.model.trunk.relu)
        if keep:
            self.steps.append((obs, acts))
        return _heads_forward(acts[-1], self.head)


class _FusedA2CLoss(torch.autograd.Function):
    """loss, stats [policy loss, value loss, entropy] = apply(cfg, relu, x, acts, out, values, actions, advantages,
    returns, *fused_params), every tensor over the unroll's T x N rows: A2C's loss (a2c_loss) and its gradient."""

    @staticmethod
    def forward(
        ctx: Any,  # autograd's context: forward leaves what backward needs on it as attributes
        cfg: A2CConfig,
        relu: bool,
        x: Tensor,
        acts: list[Tensor],
        out: Tensor,
        values: Tensor,
        actions: Tensor,
        adv: Tensor,
        returns: Tensor,
        *params: Tensor,
    ) -> tuple[Tensor, Tensor]:
        n, discrete = len(x), len(params) % 2 == 0  # a Gaussian's log-std makes the count odd
        log_prob, neg_entropy_sum, ctx.dist = distribution_forward(out, actions, None if discrete else params[-1])
        error = values - returns
        stats = torch.stack([-(adv * log_prob).sum() / n, error.square().sum() / n, -neg_entropy_sum / n])
        loss = stats[0] - cfg.ent_coef * stats[2] + cfg.vf_coef * stats[1]
        trunk_size = len(params) - (4 if discrete else 5)
        ctx.cfg, ctx.relu = cfg, relu
        ctx.saved = (x, acts, actions, adv, error, list(params[:trunk_size]), list(params[trunk_size:]))
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_stats: Tensor) -> tuple[Tensor | None, ...]:
        cfg = ctx.cfg
        x, acts, actions, adv, error, trunk, head = ctx.saved
        scale = grad_loss / len(x)  # every term is a mean over the unroll
        g_out, g_log_std = distribution_backward(ctx.dist, actions, adv * -scale, cfg.ent_coef * grad_loss)
        g_value = (2 * cfg.vf_coef * scale) * error  # d/dV of vf_coef mean((V - R)^2)
        g_trunk, g_head = network_backward(g_out, g_value, x, acts, trunk, head, ctx.relu)
        return None, None, None, None, None, None, None, None, None, *g_trunk, *g_head, *g_log_std
