"""The fused PPO loss (fused_ppo.py: one autograd node, the gradient written by hand) computed in numpy, on CPU: the
same math as FusedPPOLoss, step for step, on views of the tensors. At a small MLP's sizes a numpy call costs a
fraction of a torch operator's dispatch, and the loss and its gradient are ~100 calls. FusedPPOLearner runs it on
CPU tensors; tests/unit/test_fast_paths.py checks it against PPOLearner, as a run does on its first minibatch."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from rlrun.algos.configs import PPOConfig
from rlrun.models.distributions import LOG_2PI

F32 = np.float32
# stats = OFFSET + sums * SCALE / n, as fused_ppo._constants says; loss = stats[:3] . weights
OFFSET, SCALE = np.array([0, 0, 0, -1, 0], F32), np.array([-1, 0.5, -1, 1, 1], F32)


def _activate(z: np.ndarray, relu: bool) -> np.ndarray:
    """In place on a fresh matmul output."""
    activated: np.ndarray = np.maximum(z, 0, out=z) if relu else np.tanh(z, out=z)
    return activated


def _activation_backward(g: np.ndarray, a: np.ndarray, relu: bool) -> np.ndarray:
    """The gradient before the activation, from the gradient g after it and its output a (in a fresh array: the
    products are g * (a > 0) and g * (1 - a * a))."""
    if relu:
        return g * (a > 0)
    d: np.ndarray = np.multiply(a, a)
    np.subtract(1, d, out=d)
    d *= g
    return d


def _clip(x: np.ndarray, low: np.float32, high: np.float32) -> np.ndarray:
    """np.clip's values (NaN stays NaN) without its Python-level checks, which cost more than its pass here."""
    clipped: np.ndarray = np.minimum(np.maximum(x, low), high)
    return clipped


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x @ w + b with the bias added in place of a second array."""
    z: np.ndarray = np.matmul(x, w)
    z += b
    return z


def _network_forward(x: np.ndarray, trunk: list[np.ndarray], relu: bool) -> list[np.ndarray]:
    """TwinMLP's activations after every layer, [2, B, h] each (actor, critic), as fused_ppo.twin_mlp_forward."""
    w0, b0, *layers = trunk
    acts = [_activate(_linear(x, w0.T, b0), relu).reshape(len(x), 2, -1).transpose(1, 0, 2)]
    for w, b in zip(layers[::2], layers[1::2]):
        acts.append(_activate(_linear(acts[-1], w, b), relu))
    return acts


def _network_backward(
    g_out: np.ndarray, g_value: np.ndarray, x: np.ndarray, acts: list[np.ndarray], params: list[np.ndarray], relu: bool
) -> list[np.ndarray]:
    """Gradients of fused_params' trunk and heads (not log_std), from those of the policy head's output [B, A] and of
    the values [B], as fused_ppo.network_backward."""
    n_trunk = 2 * len(acts)
    trunk, (wp, _, wv, _) = params[:n_trunk], params[n_trunk : n_trunk + 4]
    actor, critic = acts[-1]
    head = [g_out.T @ actor, g_out.sum(0), g_value[None] @ critic, g_value.sum(0, keepdims=True)]
    g = np.empty((2, len(x), wp.shape[1]), F32)  # [2, B, h]: the actor's and the critic's
    np.matmul(g_out, wp, out=g[0])
    np.multiply(g_value[:, None], wv, out=g[1])
    grads: list[np.ndarray] = []
    for i in range(len(acts) - 1, 0, -1):
        g = _activation_backward(g, acts[i], relu)
        grads = [np.matmul(acts[i - 1].transpose(0, 2, 1), g), g.sum(1, keepdims=True), *grads]
        g = np.matmul(g, trunk[2 * i].transpose(0, 2, 1))
    g = _activation_backward(g, acts[0], relu)  # layer 0: one Linear, both trunks' rows stacked
    return [np.matmul(g.transpose(0, 2, 1), x).reshape(-1, x.shape[1]), g.sum(1).reshape(-1), *grads, *head]


class Saved(NamedTuple):
    """What the gradient needs of the forward pass."""

    x: np.ndarray
    actions: np.ndarray
    acts: list[np.ndarray]
    params: list[np.ndarray]
    surrogate_used: np.ndarray  # the surrogate where the unclipped one is the minimum, else 0
    error: np.ndarray  # the value error the loss's gradient goes through
    dist: tuple[np.ndarray, ...]  # categorical: (log_p, p, neg_entropy); Gaussian: (zs, 1 / std)


def loss_and_stats(
    cfg: PPOConfig, relu: bool, discrete: bool, inputs: list[np.ndarray], params: list[np.ndarray]
) -> tuple[np.float32, np.ndarray, Saved]:
    """(loss, stats [5], what gradients() needs) of a minibatch: inputs are (obs, actions, old_log_probs, advantages,
    returns, old_values), params fused_params' arrays."""
    x, actions, old_log_probs, adv, returns, old_values = inputs
    x = x.reshape(len(x), -1).astype(F32, copy=False)
    n, rows, n_head = len(x), np.arange(len(x)), 4 if discrete else 5
    acts = _network_forward(x, params[:-n_head], relu)
    wp, bp, wv, bv = params[-n_head:][:4]
    out, values = acts[-1][0] @ wp.T + bp, (acts[-1][1] @ wv.T + bv)[:, 0]
    dist: tuple[np.ndarray, ...]
    if discrete:
        z = out - out.max(1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
        p = np.exp(log_p)
        neg_entropy = (p * log_p).sum(1)
        log_prob, neg_entropy_sum, dist = log_p[rows, actions], neg_entropy.sum(), (log_p, p, neg_entropy)
    else:
        log_std = params[-1]
        zs = (actions - out) * np.exp(-log_std)
        log_prob = (-0.5 * zs * zs - log_std).sum(1) - F32(0.5 * LOG_2PI * out.shape[1])
        neg_entropy_sum = (log_std.sum() + F32(0.5 * (1.0 + LOG_2PI) * out.shape[1])) * -n
        dist = (zs, np.exp(-log_std))
    log_ratio = log_prob - old_log_probs
    ratio = np.exp(log_ratio)
    clamped = _clip(ratio, F32(1 - cfg.clip_coef), F32(1 + cfg.clip_coef))
    surrogate, surrogate_clipped = adv * ratio, adv * clamped
    error = values - returns
    loss_error = error
    if cfg.clip_vloss:  # as FusedPPOLoss: the larger error, and no gradient where the clamp is active
        moved = values - old_values
        clipped_error = old_values + _clip(moved, F32(-cfg.clip_coef), F32(cfg.clip_coef)) - returns
        use_clipped = clipped_error * clipped_error > error * error
        loss_error = np.where(use_clipped, clipped_error, error)
        error = np.where(use_clipped, clipped_error * (np.abs(moved) <= cfg.clip_coef), error)
    sums = [
        np.minimum(surrogate, surrogate_clipped).sum(),
        (loss_error * loss_error).sum(),
        neg_entropy_sum,
        (ratio - log_ratio).sum(),
        (clamped != ratio).sum(),
    ]
    stats = OFFSET + np.array(sums, F32) * SCALE / F32(n)
    loss = stats[:3] @ np.array([1.0, cfg.vf_coef, -cfg.ent_coef], F32)
    return loss, stats, Saved(x, actions, acts, params, surrogate * (surrogate <= surrogate_clipped), error, dist)


def gradients(cfg: PPOConfig, relu: bool, discrete: bool, saved: Saved, g_loss: np.float32) -> list[np.ndarray]:
    """The gradients of fused_params, in their order, of g_loss times the loss loss_and_stats computed."""
    x, actions, acts, params, surrogate_used, error, dist = saved
    scale = g_loss / F32(len(x))  # every term is a mean over the minibatch
    g_log_prob = surrogate_used * -scale
    g_entropy = F32(cfg.ent_coef) * g_loss
    g_log_std: list[np.ndarray] = []
    if discrete:  # as fused_ppo.distribution_backward
        log_p, p, neg_entropy = dist
        g_out = p * ((g_entropy / len(p)) * (log_p - neg_entropy[:, None]) - g_log_prob[:, None])
        g_out[np.arange(len(x)), actions] += g_log_prob
    else:
        zs, inv_std = dist
        g_out = g_log_prob[:, None] * zs * inv_std
        g_log_std = [g_log_prob @ (zs * zs - 1) - g_entropy]
    g_value = (F32(cfg.vf_coef) * scale) * error
    return _network_backward(g_out, g_value, x, acts, params, relu) + g_log_std


class NumpyPPOLoss(torch.autograd.Function):
    """loss, stats = NumpyPPOLoss.apply(cfg, relu, discrete, obs, actions, old_log_probs, advantages, returns,
    old_values, *params): FusedPPOLoss's signature and results, for CPU tensors."""

    @staticmethod
    def forward(
        ctx: Any,  # autograd's context: forward leaves what backward needs on it as attributes
        cfg: PPOConfig,
        relu: bool,
        discrete: bool,
        *tensors: Tensor,
    ) -> tuple[Tensor, Tensor]:
        arrays = [t.detach().numpy() for t in tensors]
        loss, stats, ctx.saved = loss_and_stats(cfg, relu, discrete, arrays[:6], arrays[6:])
        ctx.cfg, ctx.relu, ctx.discrete = cfg, relu, discrete
        stats_t = torch.from_numpy(stats)
        ctx.mark_non_differentiable(stats_t)
        return torch.from_numpy(np.asarray(loss)), stats_t

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_stats: Tensor) -> tuple[Tensor | None, ...]:
        grads = gradients(ctx.cfg, ctx.relu, ctx.discrete, ctx.saved, F32(grad_loss.item()))
        return None, None, None, None, None, None, None, None, None, *(torch.from_numpy(g) for g in grads)
