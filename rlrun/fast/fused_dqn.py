"""DQN's update for rlrun's MLP Q-network (QNetwork on an MLP encoder, plain head, no action masks) with the loss's
gradient written by hand: one autograd node for the loss instead of ~25, and the targets' forward passes as a few
matmuls instead of module calls. On CPU a small network's update is operator overhead. The math is DQNLearner's and
q_targets' (rlrun/algos/dqn.py), which tests/unit/test_fast_paths.py checks; a run checks it too, on its first update
(fast/selfcheck.py), and runs the reference if a change there is not made here as well."""

from __future__ import annotations

from typing import Any, TypeGuard

import torch
from torch import Tensor, nn

from rlrun.models.encoders import FlatFloat
from rlrun.models.q_network import QNetwork


def fusable_q(model: nn.Module) -> TypeGuard[QNetwork]:
    """Whether `model` is rlrun's Q-network on an MLP encoder (Linear layers with one activation, ReLU or tanh),
    with a plain head (not dueling) and no action masks: what the fused forward and backward cover."""
    if type(model) is not QNetwork or model.value is not None or model.mask_size:
        return False
    layers = list(model.encoder) if isinstance(model.encoder, nn.Sequential) else []
    if not layers or type(layers[0]) is not FlatFloat or len(layers) % 2 != 1:
        return False
    linears, activations = layers[1::2], layers[2::2]
    return (
        all(type(m) is nn.Linear for m in linears)
        and len({type(m) for m in activations}) == 1
        and type(activations[0]) in (nn.ReLU, nn.Tanh)
    )


def q_params(model: QNetwork) -> list[Tensor]:
    """The weights and biases in order: each hidden Linear's, then the head's."""
    linears = [m for m in model.encoder if isinstance(m, nn.Linear)] + [model.head]
    return [p for m in linears for p in (m.weight, m.bias)]


def relu_encoder(model: QNetwork) -> bool:
    return any(isinstance(m, nn.ReLU) for m in model.encoder)


def q_forward(obs: Tensor, params: list[Tensor], relu: bool) -> tuple[list[Tensor], Tensor]:
    """(the input and each hidden activation [B, h], Q-values [B, A]) of obs [B, ...], as QNetwork's forward."""
    acts = [obs.flatten(1).float()]
    *hidden, w, b = params
    for wi, bi in zip(hidden[::2], hidden[1::2]):
        z = torch.addmm(bi, acts[-1], wi.t())
        acts.append(z.relu_() if relu else z.tanh_())
    return acts, torch.addmm(b, acts[-1], w.t())


class FusedDQNLoss(torch.autograd.Function):
    """DQNLearner's loss with a hand-written backward: forward(loss kind, relu, batch_size, obs, actions, targets,
    weights, *q_params) -> (loss, |TD errors| [B], Q(s, a) [B]); only the loss is differentiable."""

    @staticmethod
    def forward(
        ctx: Any, kind: str, relu: bool, batch_size: int, obs: Tensor, actions: Tensor, targets: Tensor,
        weights: Tensor, *params: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        acts, q = q_forward(obs, list(params), relu)
        index = actions.unsqueeze(1)
        q_taken = q.gather(1, index).squeeze(1)
        td = q_taken - targets
        if kind == "huber":  # F.huber_loss with delta 1
            per_item = torch.where(td.abs() < 1.0, 0.5 * td.square(), td.abs() - 0.5)
        else:
            per_item = td.square()
        loss = (weights * per_item).sum() / batch_size
        ctx.save_for_backward(index, td, weights, *acts, *params)
        ctx.kind, ctx.relu, ctx.batch_size, ctx.num_actions = kind, relu, batch_size, q.shape[1]
        td_abs = td.abs()
        ctx.mark_non_differentiable(td_abs, q_taken)
        return loss, td_abs, q_taken

    @staticmethod
    def backward(ctx: Any, g_loss: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
        index, td, weights, *rest = ctx.saved_tensors
        n_layers = len(rest) // 3  # len(acts) = hidden layers + 1 = n_layers; params: 2 per layer
        acts, params = rest[:n_layers], rest[n_layers:]
        d_item = td.clamp(-1.0, 1.0) if ctx.kind == "huber" else 2.0 * td  # d per_item / d Q(s, a)
        g_taken = (g_loss / ctx.batch_size) * weights * d_item
        g = torch.zeros(len(td), ctx.num_actions, dtype=td.dtype, device=td.device)
        g.scatter_(1, index, g_taken.unsqueeze(1))
        grads: list[Tensor] = []
        for layer in range(n_layers - 1, -1, -1):
            w, a_in = params[2 * layer], acts[layer]
            grads = [g.t().mm(a_in), g.sum(0), *grads]
            if layer == 0:
                break
            g = g.mm(w)
            g = torch.ops.aten.threshold_backward(g, a_in, 0) if ctx.relu else torch.ops.aten.tanh_backward(g, a_in)
        return None, None, None, None, None, None, None, *grads


class FusedDQNLearner(nn.Module):
    """DQNLearner's drop-in (same constructor and forward) for models where fusable_q() holds."""

    def __init__(self, model: QNetwork, batch_size: int, loss: str = "mse"):
        super().__init__()
        self.model, self.batch_size, self.loss = model, batch_size, loss
        self.params, self.relu = q_params(model), relu_encoder(model)

    def forward(self, obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out: tuple[Tensor, Tensor, Tensor] = FusedDQNLoss.apply(
            self.loss, self.relu, self.batch_size, obs, actions, targets, weights, *self.params
        )
        return out


class FusedQTargets:
    """q_targets with DQN's networks bound (DQNParts.targets), its forward passes as q_forward's matmuls."""

    def __init__(self, online: QNetwork, target: nn.Module, double_q: bool):  # target: a copy of online
        self.online, self.target = q_params(online), q_params(target)  # type: ignore[arg-type]
        self.relu, self.double_q = relu_encoder(online), double_q

    @torch.no_grad()
    def choices_agree(self, next_obs: Tensor) -> bool:
        """Whether the online and target networks choose the same action on every observation (the self-check's
        cue: until they differ, double DQN's choice, and an edit to it, cannot show)."""
        target, online = (q_forward(next_obs, params, self.relu)[1].argmax(-1) for params in (self.target, self.online))
        return torch.equal(target, online)

    @torch.no_grad()
    def __call__(self, next_obs: Tensor, returns: Tensor, discount: Tensor) -> Tensor:
        next_q = q_forward(next_obs, self.target, self.relu)[1]
        best = (q_forward(next_obs, self.online, self.relu)[1] if self.double_q else next_q).argmax(-1, keepdim=True)
        return returns + discount * next_q.gather(-1, best).squeeze(-1)
