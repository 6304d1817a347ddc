"""BatchedPPOLearner (rlrun/algos/batched_ppo.py: S seeds' PPO losses on their stacked networks) with the gradient
written by hand, as fused_ppo.py does for one seed: one autograd node per minibatch for all seeds instead of ~60, each
seed's terms summed over its own rows. tests/unit/test_batched_ppo.py compares the two; a run checks it on its first
minibatch (fast/selfcheck.py) and runs the reference if they differ."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.batched_ppo import BatchedActorCritic
from rlrun.algos.configs import PPOConfig
from rlrun.fast.fused_ppo import (
    _activate,
    _activation_backward,
    distribution_backward,
    distribution_forward,
    loss_sums,
    stats_and_loss,
)


def fusable_batch(model: BatchedActorCritic) -> bool:
    """Whether the fused loss covers the batch's networks: categorical or Gaussian policies without action masks (the
    cases fused_ppo.fusable covers for one seed)."""
    return model.kind in ("categorical", "gaussian") and not model.mask_size


class FusedBatchedPPOLearner(nn.Module):
    """BatchedPPOLearner's drop-in (same forward) for batches where fusable_batch() holds."""

    def __init__(self, model: BatchedActorCritic, cfg: PPOConfig):
        super().__init__()
        self.model, self.cfg = model, cfg
        self.params = model.seed_parameters()

    def forward(self, **minibatch: Tensor) -> tuple[Tensor, Tensor]:
        """(loss [S], stats [S, 5]) of a minibatch [S, B, ...] passed as BatchedPPOLearner.forward takes it."""
        m, b = self.model, minibatch
        inputs = (b["obs"], b["actions"], b["old_log_probs"], b["advantages"], b["returns"], b["old_values"])
        relu, discrete = isinstance(m.activation, nn.ReLU), m.kind == "categorical"
        loss_stats: tuple[Tensor, Tensor] = FusedBatchedPPOLoss.apply(self.cfg, relu, discrete, *inputs, *self.params)
        return loss_stats


def _trunk_major(w: Tensor, S: int) -> Tensor:
    """A stacked trunk parameter [S, 2, ...] (seed-major, as TwinMLP's [2, ...] per seed) as [2S, ...], trunk-major:
    the actors' S first, then the critics'. That order keeps each trunk's activations one contiguous block."""
    return w.transpose(0, 1).reshape(2 * S, *w.shape[2:])


def _seed_major(g: Tensor, S: int) -> Tensor:
    """A gradient [2S, ...] of _trunk_major's order back as the parameter's [S, 2, ...]."""
    return g.view(2, S, *g.shape[1:]).transpose(0, 1)


def _head_bmm(a: Tensor, b: Tensor) -> Tensor:
    """torch.bmm(a, b) for the heads' products, whose outputs or inner dimension are a few columns wide: on the CPU
    through numpy's matmul (a BLAS call per seed), which takes a fifth of torch's bmm at these sizes (timed alone on
    this 2-core machine: 8 seeds' [128, 64] x [64, 2] in 18 us against 115)."""
    if a.device.type != "cpu":
        return torch.bmm(a, b)
    return torch.from_numpy(np.matmul(a.detach().numpy(), b.detach().numpy()))


def stacked_forward(x: Tensor, params: list[Tensor], relu: bool) -> tuple[list[Tensor], list[Tensor], Tensor, Tensor]:
    """BatchedActorCritic.forward keeping what the backward needs: (the trunks' activations [2S, B, h] after each
    layer (trunk-major: actors then critics), the trunk weights laid out so [2S, in, h], policy head output [S, B, P],
    values [S, B]), from observations [S, B, in] and the stacked parameters in seed_parameters' order."""
    S = x.shape[0]
    depth = (len(params) - 6) // 2
    first_w, first_b, hidden, head = params[0], params[1], params[2 : 2 + 2 * depth], params[2 + 2 * depth :]
    h = first_w.shape[-1] // 2
    # The first layer's [in, 2h] per seed is both trunks' [in, h] side by side: split into the trunk-major stack.
    weights = [_trunk_major(first_w.view(S, -1, 2, h).transpose(1, 2), S)]
    biases = [_trunk_major(first_b.view(S, 1, 2, h).transpose(1, 2), S)]
    weights += [_trunk_major(w, S) for w in hidden[:depth]]
    biases += [_trunk_major(b, S) for b in hidden[depth:]]
    # x for both trunks: torch.cat([x, x]), not x.repeat(2, 1, 1), whose CPU kernel takes several times a cat's
    acts = [_activate(torch.baddbmm(biases[0], torch.cat([x, x]), weights[0]), relu)]
    for w, b in zip(weights[1:], biases[1:]):
        acts.append(_activate(torch.baddbmm(b, acts[-1], w), relu))
    policy_w, policy_b, value_w, value_b = head[:4]
    out = _head_bmm(acts[-1][:S], policy_w).add_(policy_b)
    return acts, weights, out, _head_bmm(acts[-1][S:], value_w).add_(value_b).squeeze(-1)


def stacked_backward(
    g_out: Tensor, g_value: Tensor, x: Tensor, acts: list[Tensor], weights: list[Tensor], head: list[Tensor], relu: bool
) -> list[Tensor]:
    """The gradients of the stacked parameters but log_std (seed_parameters' order), from those of the policy head's
    output [S, B, P] and of the values [S, B]; `acts`, `weights` as stacked_forward keeps them, `head` the heads'
    parameters."""
    S = x.shape[0]
    policy_w, _, value_w, _ = head[:4]
    actor, critic = acts[-1][:S], acts[-1][S:]
    g_head = [
        _head_bmm(actor.transpose(1, 2), g_out),
        g_out.sum(1, keepdim=True),
        _head_bmm(critic.transpose(1, 2), g_value.unsqueeze(-1)),
        g_value.sum(1).view(S, 1, 1),
    ]
    g = torch.empty_like(acts[-1])  # the actors' and critics' halves written in place, not stacked
    torch.bmm(g_out, policy_w.transpose(1, 2), out=g[:S])
    torch.mul(g_value.unsqueeze(-1), value_w.transpose(1, 2), out=g[S:])
    g_weights: list[Tensor] = []
    g_biases: list[Tensor] = []
    for i in range(len(acts) - 1, 0, -1):
        g = _activation_backward(g, acts[i], relu)
        g_weights.insert(0, _seed_major(torch.bmm(acts[i - 1].transpose(1, 2), g), S))
        g_biases.insert(0, _seed_major(g.sum(1, keepdim=True), S))
        g = torch.bmm(g, weights[i].transpose(1, 2))
    # The first layer is one [in, 2h] matrix per seed: its gradient takes the trunks' halves side by side again.
    g = _activation_backward(g, acts[0], relu)
    h = g.shape[-1]
    x_t = x.transpose(1, 2)
    g_first_w = torch.bmm(torch.cat([x_t, x_t]), g).view(2, S, -1, h).permute(1, 2, 0, 3)
    g_first_b = g.sum(1).view(2, S, 1, h).permute(1, 2, 0, 3)
    return [g_first_w.reshape(S, -1, 2 * h), g_first_b.reshape(S, 1, 2 * h), *g_weights, *g_biases, *g_head]


class FusedBatchedPPOLoss(torch.autograd.Function):
    """loss, stats = FusedBatchedPPOLoss.apply(cfg, relu, discrete, obs, actions, old_log_probs, advantages, returns,
    old_values, *params): BatchedPPOLearner's (loss [S], stats [S, 5]) on a minibatch [S, B, ...], advantages already
    normalized if configured, params in BatchedActorCritic.seed_parameters' order. The terms as FusedPPOLoss's, each a
    sum over one seed's rows."""

    @staticmethod
    def forward(
        ctx: Any,  # autograd's context: forward leaves what backward needs on it as attributes
        cfg: PPOConfig,
        relu: bool,
        discrete: bool,
        obs: Tensor,
        actions: Tensor,
        old_log_probs: Tensor,
        adv: Tensor,
        returns: Tensor,
        old_values: Tensor,
        *params: Tensor,
    ) -> tuple[Tensor, Tensor]:
        n = obs.shape[1]
        x = obs.flatten(2).float()
        acts, trunk_w, out, values = stacked_forward(x, list(params), relu)
        log_std = None if discrete else params[-1]  # [S, 1, D]
        log_prob, neg_entropy_sum, ctx.dist = distribution_forward(out, actions, log_std)
        sums, surrogate_used, error = loss_sums(
            log_prob, neg_entropy_sum, values, old_log_probs, adv, returns, old_values, cfg
        )
        stats, loss = stats_and_loss(sums, n, cfg)
        ctx.cfg, ctx.relu, ctx.discrete = cfg, relu, discrete
        head = list(params[len(trunk_w) * 2 : len(trunk_w) * 2 + 4])
        ctx.saved = (x, actions, acts, trunk_w, head, surrogate_used, error)
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_stats: Tensor) -> tuple[Tensor | None, ...]:
        cfg = ctx.cfg
        x, actions, acts, weights, head, surrogate_used, error = ctx.saved
        n = x.shape[1]
        scale = (grad_loss / n).unsqueeze(1)  # [S, 1]: every term is a mean over the seed's rows
        g_log_prob = surrogate_used * -scale  # d(-surrogate) / d log pi(a|s) = -A r where it counts
        g_out, g_log_std = distribution_backward(ctx.dist, actions, g_log_prob, cfg.ent_coef * grad_loss)
        g_value = (cfg.vf_coef * scale) * error
        g_params = stacked_backward(g_out, g_value, x, acts, weights, head, ctx.relu)
        return None, None, None, None, None, None, None, None, None, *g_params, *g_log_std
