"""Action distributions as pure functions on tensors: cheaper per step than torch.distributions objects
(no argument validation, no object per call), and directly testable."""

from __future__ import annotations

import math

import torch
from torch import Tensor

LOG_2PI = math.log(2 * math.pi)


def categorical_sample(log_p: Tensor, noise: Tensor | None = None) -> Tensor:
    """Sample action indices [B] from normalized log-probabilities [B, A] with the Gumbel-max trick:
    argmax(log p - log E), E ~ Exp(1), is distributed as p. It draws the same noise as torch.multinomial(p, 1),
    which does this for one sample (so the same actions, up to rounding), in a third of its time on a batch.
    `noise`: E [B, A] drawn beforehand (by whoever owns the RNG stream, e.g. for env workers that act), instead
    of drawing it here."""
    if noise is None:
        return (log_p - torch.empty_like(log_p).exponential_().log_()).argmax(-1)
    return (log_p - noise.log()).argmax(-1)


def categorical_log_prob(log_p: Tensor, actions: Tensor) -> Tensor:
    """log pi(a|s) from normalized log-probabilities [B, A] (log_softmax of the logits) and actions [B]."""
    return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def categorical_entropy(log_p: Tensor) -> Tensor:
    """Entropy [B] from normalized log-probabilities [B, A]."""
    return -(log_p.exp() * log_p).sum(-1)


def gaussian_sample(mean: Tensor, log_std: Tensor, noise: Tensor | None = None) -> Tensor:
    """Diagonal Gaussian sample, mean [B, D], log_std broadcastable to it -> [B, D]; `noise`: standard
    normal [B, D] drawn beforehand, instead of drawing it here."""
    return mean + log_std.exp() * (torch.randn_like(mean) if noise is None else noise)


def gaussian_log_prob(mean: Tensor, log_std: Tensor, actions: Tensor) -> Tensor:
    """Sum over action dimensions of the diagonal Gaussian log density -> [B]."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - 0.5 * LOG_2PI).sum(-1)


def gaussian_entropy(mean: Tensor, log_std: Tensor) -> Tensor:
    return (log_std + 0.5 * (1.0 + LOG_2PI)).expand_as(mean).sum(-1)


def multi_categorical_sample(logits: Tensor, sizes: list[int], deterministic: bool = False) -> Tensor:
    """One action per component of a MultiDiscrete space: logits [B, sum(sizes)] -> actions [B, len(sizes)]."""
    parts = [torch.log_softmax(x, -1) for x in torch.split(logits, sizes, -1)]
    return torch.stack([x.argmax(-1) if deterministic else categorical_sample(x) for x in parts], -1)


def multi_categorical_log_prob_entropy(logits: Tensor, sizes: list[int], actions: Tensor) -> tuple[Tensor, Tensor]:
    """(log-prob [B], entropy [B]) of independent categoricals, summed over the components: logits
    [B, sum(sizes)], actions [B, len(sizes)] (any leading shape for B)."""
    parts = [torch.log_softmax(x, -1) for x in torch.split(logits, sizes, -1)]
    log_prob = sum(categorical_log_prob(x, actions[..., i]) for i, x in enumerate(parts))
    return log_prob, sum(categorical_entropy(x) for x in parts)


def bernoulli_sample(logits: Tensor, deterministic: bool = False) -> Tensor:
    """Independent bits of a MultiBinary space: logits [B, n] -> actions [B, n] in {0, 1} (int64)."""
    if deterministic:
        return (logits > 0).long()
    return (torch.rand_like(logits) < torch.sigmoid(logits)).long()


def bernoulli_log_prob_entropy(logits: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
    """(log-prob [B], entropy [B]) of independent Bernoullis, summed over the bits: log p(1) = -softplus(-x),
    log p(0) = -softplus(x)."""
    a = actions.to(logits.dtype)
    log_p1, log_p0 = -torch.nn.functional.softplus(-logits), -torch.nn.functional.softplus(logits)
    log_prob = (a * log_p1 + (1.0 - a) * log_p0).sum(-1)
    entropy = -(log_p1.exp() * log_p1 + log_p0.exp() * log_p0).sum(-1)
    return log_prob, entropy
