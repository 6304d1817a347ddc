"""PPOLearner for the feedforward MLP actor-critic (TwinMLP trunks, linear heads) with the loss's gradient
written by hand: one autograd node for the whole minibatch instead of ~60. On CPU a small network's update is
all operator overhead, so this is where PPO's time goes. The math is PPOLearner's (rlrun/algos/ppo.py), which
tests/unit/test_fast_paths.py checks; a run checks it too, on its first minibatch (fast/selfcheck.py), and runs the
reference if a change there is not made here as well."""

from __future__ import annotations

import functools
from typing import Any, TypeGuard

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.configs import PPOConfig
from rlrun.fast.numpy_ppo import NumpyPPOLoss
from rlrun.models.actor_critic import ActorCritic
from rlrun.models.distributions import LOG_2PI
from rlrun.models.encoders import TwinMLP


def fusable(model: nn.Module) -> TypeGuard[ActorCritic]:
    """Whether the fused loss covers `model`: a feedforward actor-critic on separate MLP trunks, with a categorical
    or Gaussian policy (not MultiDiscrete's or MultiBinary's, whose gradients it does not write), without masks."""
    return (
        isinstance(model, ActorCritic)
        and isinstance(model.trunk, TwinMLP)
        and model.kind in ("categorical", "gaussian")
        and not model.mask_size  # its logits come from the weights alone, without the observations' action masks
    )


def fused_params(model: ActorCritic) -> list[Tensor]:
    """The parameters in the order the fused loss takes them: trunk layers, heads, log-std if Gaussian."""
    t = model.trunk
    trunk = [t.first.weight, t.first.bias, *(p for wb in zip(t.weights, t.biases) for p in wb)]
    head = [model.policy_head.weight, model.policy_head.bias, model.value_head.weight, model.value_head.bias]
    return trunk + head + ([] if model.discrete else [model.log_std])


class FusedPPOLearner(nn.Module):
    """PPOLearner's drop-in (same constructor and forward) for models where fusable() holds."""

    def __init__(self, model: ActorCritic, cfg: PPOConfig):
        super().__init__()
        self.model, self.cfg = model, cfg
        self.params = fused_params(model)

    def forward(self, **minibatch: Tensor) -> tuple[Tensor, Tensor]:
        """(loss, stats) of a minibatch passed as PPOLearner.forward takes it (PPO.update passes keywords)."""
        m, b = self.model, minibatch
        inputs = (b["obs"], b["actions"], b["old_log_probs"], b["advantages"], b["returns"], b["old_values"])
        # On CPU the same math in numpy (numpy_ppo.py): its calls cost a fraction of a torch operator's.
        args = (self.cfg, m.trunk.relu, m.discrete, *inputs, *self.params)
        loss_stats: tuple[Tensor, Tensor]
        if b["obs"].device.type == "cpu":
            loss_stats = NumpyPPOLoss.apply(*args)
        else:
            loss_stats = FusedPPOLoss.apply(*args)
        return loss_stats


def twin_mlp_forward(x: Tensor, params: list[Tensor], relu: bool) -> list[Tensor]:
    """TwinMLP's activations after every layer, [2, B, h] each (actor, critic), from fused_params' trunk
    part; the fused loss keeps them for its backward."""
    w0, b0, *layers = params
    a = _activate(torch.addmm(b0, x.flatten(1), w0.t()), relu)  # [B, 2h]: both trunks' first layers in one
    acts = [a.view(len(x), 2, -1).transpose(0, 1)]
    for w, b in zip(layers[::2], layers[1::2]):
        acts.append(_activate(torch.baddbmm(b, acts[-1], w), relu))
    return acts


# From how many entries the CPU tanh below is 2 sigmoid(2z) - 1 (four torch calls) rather than numpy's tanh (one): a
# batch of seeds' activations (8 seeds' [2, 128, 64], timed alone: 200 us against 390). On one seed's [128, 128] the
# two were within noise timed alone, and the sigmoid made the single-seed numpy loss 1.19x slower timed in it.
SIGMOID_TANH_FROM = 32768


def _activate(z: Tensor, relu: bool) -> Tensor:
    """In place on a fresh matmul output (the fused forward runs outside autograd). On CPU, tanh goes through numpy,
    whose tanh is several times faster than torch's CPU kernel on one seed's sizes; on larger ones (a batch of seeds')
    both take 3-5 ns an entry, over twice a sigmoid and its three cheap passes, within 2e-7 of tanh."""
    if relu:
        return z.relu_()
    if z.device.type != "cpu":
        return z.tanh_()
    if z.numel() < SIGMOID_TANH_FROM:
        np.tanh(z.numpy(), out=z.numpy())
        return z
    return torch.sigmoid(z.mul_(2), out=z).mul_(2).sub_(1)


def _activation_backward(g: Tensor, a: Tensor, relu: bool) -> Tensor:
    """The gradient before the activation, from the gradient g after it and its output a."""
    g_in: Tensor = torch.ops.aten.threshold_backward(g, a, 0) if relu else torch.ops.aten.tanh_backward(g, a)
    return g_in


def _heads_forward(features: Tensor, head: list[Tensor]) -> tuple[Tensor, Tensor]:
    """(policy head output [B, A], value [B]) from the last trunk activations [2, B, h]."""
    wp, bp, wv, bv = head[:4]
    return torch.addmm(bp, features[0], wp.t()), torch.addmm(bv, features[1], wv.t()).squeeze(-1)


def _trunk_backward(g: Tensor, x: Tensor, acts: list[Tensor], params: list[Tensor], relu: bool) -> list[Tensor]:
    """Gradients of the trunk's parameters, given the gradient g [2, B, h] of its last activations."""
    _, _, *layers = params
    grads: list[Tensor] = []
    for i in range(len(acts) - 1, 0, -1):
        g = _activation_backward(g, acts[i], relu)
        grads = [torch.bmm(acts[i - 1].transpose(1, 2), g), g.sum(1, keepdim=True), *grads]
        g = torch.bmm(g, layers[2 * i - 2].transpose(1, 2))
    # Layer 0 is one Linear with both trunks' rows stacked: its [2h, in] gradient is the two trunks' [h, in].
    g = _activation_backward(g, acts[0], relu)
    x = x.flatten(1)
    return [torch.bmm(g.transpose(1, 2), x.expand(2, *x.shape)).view(-1, x.shape[1]), g.sum(1).view(-1), *grads]


def distribution_forward(
    out: Tensor, actions: Tensor, log_std: Tensor | None
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """(log pi(a|s) [..., B], sum over the B rows of sum(p log p) (the negative entropy) [...], what
    distribution_backward needs) from the policy head's output [..., B, A] (categorical logits; a Gaussian mean when
    log_std is given, [A] or [..., 1, A]). One seed's [B, A], or a batch of seeds' [S, B, A]."""
    if log_std is None:
        log_p = out.log_softmax(-1)
        p = log_p.exp()
        neg_entropy = (p * log_p).sum(-1)
        log_prob = log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return log_prob, neg_entropy.sum(-1), (log_p, p, neg_entropy)
    inv_std = torch.exp(-log_std)
    z = (actions - out) * inv_std
    n, dims = out.shape[-2], out.shape[-1]
    log_prob = (-0.5 * z.square() - log_std).sum(-1) - 0.5 * LOG_2PI * dims
    neg_entropy_sum = (log_std.reshape(*out.shape[:-2], -1).sum(-1) + 0.5 * (1.0 + LOG_2PI) * dims) * -n
    return log_prob, neg_entropy_sum, (z, inv_std)


def distribution_backward(
    dist: tuple[Tensor, ...], actions: Tensor, g_log_prob: Tensor, g_entropy: Tensor
) -> tuple[Tensor, list[Tensor]]:
    """(gradient of the policy head's output [..., B, A], [gradient of log_std] if Gaussian) of a loss whose gradient
    is g_log_prob [..., B] with respect to each log pi(a|s) and -g_entropy [...] with respect to the mean entropy."""
    if len(dist) == 3:
        log_p, p, neg_entropy = dist
        per_entry = g_entropy.reshape(*g_entropy.shape, 1, 1) / p.shape[-2]  # [..., 1, 1]: a mean over the rows
        # d log pi(a) / d logits = onehot(a) - p;  d sum(p log p) / d logits = p (log p - sum(p log p))
        g_out = p * (per_entry * (log_p - neg_entropy.unsqueeze(-1)) - g_log_prob.unsqueeze(-1))
        return g_out.scatter_add_(-1, actions.unsqueeze(-1), g_log_prob.unsqueeze(-1)), []
    z, inv_std = dist
    # d log pi / d log_std = z^2 - 1 per dimension; the entropy grows by 1 per unit of log_std.
    g_log_std = (g_log_prob.unsqueeze(-1) * (z.square() - 1)).sum(-2).view_as(inv_std)
    g_log_std -= g_entropy.reshape(*g_entropy.shape, *[1] * (inv_std.dim() - g_entropy.dim()))
    return g_log_prob.unsqueeze(-1) * z * inv_std, [g_log_std]


def network_backward(
    g_out: Tensor, g_value: Tensor, x: Tensor, acts: list[Tensor], trunk: list[Tensor], head: list[Tensor], relu: bool
) -> tuple[list[Tensor], list[Tensor]]:
    """(trunk gradients, head gradients) of fused_params' order, from the gradients of the policy head's output
    [B, A] and of the values [B]."""
    actor, critic = acts[-1][0], acts[-1][1]
    wp, _, wv, _ = head[:4]
    g_head = [g_out.t().mm(actor), g_out.sum(0), g_value.unsqueeze(0).mm(critic), g_value.sum(0, keepdim=True)]
    g_features = torch.stack([g_out.mm(wp), g_value.unsqueeze(1) * wv])
    return _trunk_backward(g_features, x, acts, trunk, relu), g_head


def loss_sums(
    log_prob: Tensor,
    neg_entropy_sum: Tensor,
    values: Tensor,
    old_log_probs: Tensor,
    adv: Tensor,
    returns: Tensor,
    old_values: Tensor,
    cfg: PPOConfig,
) -> tuple[Tensor, Tensor, Tensor]:
    """The PPO loss's five terms summed over the last dim [..., 5] (the clipped surrogate, the squared value error,
    the negative entropy, the approx KL, the clipped count), from log pi(a|s) and V [..., B] and the sum of sum(p log p)
    [...]; and what the backward needs: the surrogate where its gradient flows and the value error whose gradient
    flows, [..., B]. One seed's minibatch [B], or a batch of seeds' [S, B] (rlrun/fast/fused_batched_ppo.py)."""
    log_ratio = log_prob - old_log_probs
    ratio = log_ratio.exp()
    clamped = ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)
    surrogate, surrogate_clipped = adv * ratio, adv * clamped
    error = values - returns
    if cfg.clip_vloss:  # as OpenAI baselines: the larger of the errors of V and of V clipped to old_V +- clip
        clipped_error = old_values + (values - old_values).clamp(-cfg.clip_coef, cfg.clip_coef) - returns
        use_clipped = clipped_error.square() > error.square()
        loss_error = torch.where(use_clipped, clipped_error, error)
        # d/dV of the clipped branch is zero where the clamp is active.
        in_range = (values - old_values).abs() <= cfg.clip_coef
        error = torch.where(use_clipped, clipped_error * in_range, error)
    else:
        loss_error = error
    sums = torch.stack(
        [
            torch.min(surrogate, surrogate_clipped).sum(-1),
            loss_error.square().sum(-1),
            neg_entropy_sum,
            (ratio - log_ratio).sum(-1),  # approx KL: the k3 estimator E[(r - 1) - log r] (Schulman 2020)
            clamped.ne(ratio).sum(-1, dtype=torch.float32),
        ],
        dim=-1,
    )
    # The policy term's gradient flows through the ratio where the unclipped surrogate is the smaller one.
    return sums, surrogate * (surrogate <= surrogate_clipped), error


def stats_and_loss(sums: Tensor, n: int, cfg: PPOConfig) -> tuple[Tensor, Tensor]:
    """(stats [..., 5], loss [...]) from loss_sums' sums over n rows: each a mean, weighed into the loss by one dot
    product (_constants)."""
    offset, scale, weights = _constants(sums.device, cfg.vf_coef, cfg.ent_coef)
    stats = torch.addcmul(offset, sums, scale, value=1 / n)
    return stats, stats[..., :3] @ weights


class FusedPPOLoss(torch.autograd.Function):
    """loss, stats = FusedPPOLoss.apply(cfg, relu, discrete, obs, actions, old_log_probs, advantages, returns,
    old_values, *params); advantages already normalized if configured, params as ActorCritic.fused_params().
    stats = [policy loss, value loss, entropy, approx KL, clip fraction], as PPOLearner's.

    Every term is a sum over the minibatch until one multiply-add turns the five sums into the stats, and one
    dot product weighs the first three into the loss: each operator call costs as much as its arithmetic here.
    """

    @staticmethod
    def forward(
        ctx: Any,  # autograd's context: forward leaves what backward needs on it as attributes
        cfg: PPOConfig,
        relu: bool,
        discrete: bool,
        x: Tensor,
        actions: Tensor,
        old_log_probs: Tensor,
        adv: Tensor,
        returns: Tensor,
        old_values: Tensor,
        *params: Tensor,
    ) -> tuple[Tensor, Tensor]:
        n, n_trunk = len(x), len(params) - (4 if discrete else 5)
        trunk, head = list(params[:n_trunk]), list(params[n_trunk:])
        acts = twin_mlp_forward(x, trunk, relu)
        out, values = _heads_forward(acts[-1], head)
        log_prob, neg_entropy_sum, ctx.dist = distribution_forward(out, actions, head[4] if not discrete else None)
        sums, surrogate_used, error = loss_sums(
            log_prob, neg_entropy_sum, values, old_log_probs, adv, returns, old_values, cfg
        )
        stats, loss = stats_and_loss(sums, n, cfg)
        ctx.cfg, ctx.relu, ctx.discrete = cfg, relu, discrete
        ctx.saved = (x, actions, acts, trunk, head, surrogate_used, error)
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_stats: Tensor) -> tuple[Tensor | None, ...]:
        cfg = ctx.cfg
        x, actions, acts, trunk, head, surrogate_used, error = ctx.saved
        scale = grad_loss / len(x)  # every term is a mean over the minibatch
        # d(-surrogate) / d log pi(a|s) = -A r where it counts.
        g_log_prob = surrogate_used * -scale
        g_out, g_log_std = distribution_backward(ctx.dist, actions, g_log_prob, cfg.ent_coef * grad_loss)
        g_value = (cfg.vf_coef * scale) * error
        g_trunk, g_head = network_backward(g_out, g_value, x, acts, trunk, head, ctx.relu)
        return None, None, None, None, None, None, None, None, None, *g_trunk, *g_head, *g_log_std


@functools.cache
def _constants(device: torch.device, vf_coef: float, ent_coef: float) -> tuple[Tensor, Tensor, Tensor]:
    """(offset, scale, weights): stats = offset + sums * scale / n, that is policy loss -mean(min surrogate),
    value loss 0.5 mean(error^2), entropy -mean(sum p log p), approx KL mean(r - log r) - 1, clip fraction
    mean(r was clipped); loss = stats[:3] . weights. Made once: building a tensor costs as much as an op."""
    offset = torch.tensor([0.0, 0.0, 0.0, -1.0, 0.0], device=device)
    scale = torch.tensor([-1.0, 0.5, -1.0, 1.0, 1.0], device=device)
    return offset, scale, torch.tensor([1.0, vf_coef, -ent_coef], device=device)
