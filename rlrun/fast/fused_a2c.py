"""A2C's acceleration for rlrun's MLP actor-critic (separate trunks): the unroll's steps act without autograd,
keeping each layer's activations, and the loss over the whole unroll is one autograd node with a hand-written
gradient (the PPO fused loss's network and distribution parts). The reference keeps a graph of a dozen operators
per step, and its backward walks num_steps of them: on a small MLP that is operator overhead. Nothing is
recomputed: the gradient is taken at the activations the unroll acted with. A drop-in for A2CUnroll."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlrun.algos.a2c import A2CConfig, A2CUnroll
from rlrun.fast.fused_ppo import (
    _heads_forward,
    distribution_backward,
    distribution_forward,
    fused_params,
    network_backward,
    twin_mlp_forward,
)
from rlrun.models import ActorCritic


class FusedA2CUnroll(A2CUnroll):
    """A2CUnroll with the same constructor and forward, for models where fast.fused_ppo.fusable() holds."""

    def __init__(self, model: ActorCritic, *args, **kwargs):
        super().__init__(model, *args, **kwargs)
        self.params = fused_params(model)
        self.policy = _Recorded(model, self.params)

    @torch.no_grad()
    def value_of(self, obs, envs=slice(None)) -> Tensor:
        """As the reference's, without the mode switch (rlrun's MLP behaves the same in both modes)."""
        return self.policy(self.preprocess(obs), keep=False)[1]

    def forward(self, envs, obs):
        self.policy.steps.clear()
        with torch.no_grad():
            outs, values, actions, next_obs, episodes = self.run(envs, obs)
        advantages, returns = self.targets(values, next_obs)
        # The steps' rows in the unroll's [T, N] order: steps come in order, each step's groups in env order.
        x = torch.cat([x for x, _ in self.policy.steps])
        acts = [torch.cat([a[i] for _, a in self.policy.steps], dim=1) for i in range(len(self.policy.steps[0][1]))]
        m = self.model
        flat = (outs.flatten(0, 1), values.flatten(), actions.flatten(0, 1), advantages.flatten(), returns.flatten())
        loss, stats = _FusedA2CLoss.apply(self.cfg, m.trunk.relu, x, acts, *flat, *self.params)
        return loss, self.with_explained_variance(stats, values, returns), next_obs, episodes


class _Recorded(nn.Module):
    """model(obs) without autograd, keeping the input and every trunk activation of each call."""

    def __init__(self, model: ActorCritic, params: list[Tensor]):
        """`params` as fused_params(model): trunk, the four head tensors, log-std if Gaussian."""
        super().__init__()
        self.model, self.steps = model, []
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
    def forward(ctx, cfg: A2CConfig, relu: bool, x, acts, out, values, actions, adv, returns, *params):
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
    def backward(ctx, grad_loss, _grad_stats):
        cfg = ctx.cfg
        x, acts, actions, adv, error, trunk, head = ctx.saved
        scale = grad_loss / len(x)  # every term is a mean over the unroll
        g_out, g_log_std = distribution_backward(ctx.dist, actions, adv * -scale, cfg.ent_coef * grad_loss)
        g_value = (2 * cfg.vf_coef * scale) * error  # d/dV of vf_coef mean((V - R)^2)
        g_trunk, g_head = network_backward(g_out, g_value, x, acts, trunk, head, ctx.relu)
        return None, None, None, None, None, None, None, None, None, *g_trunk, *g_head, *g_log_std
