"""DQN's update for rlrun's MLP Q-network (QNetwork on an MLP encoder, plain head, no action masks) on CPU, with the
loss's gradient written by hand: one autograd node for the loss instead of ~25, and it and the targets' forward passes
in numpy, whose calls cost a fraction of a torch operator's at these sizes. On CPU a small network's update is operator
overhead. The math is DQNLearner's and
q_targets' (rlrun/algos/dqn.py), which tests/unit/test_fast_paths.py checks; a run checks it too, on its first update
(fast/selfcheck.py), and runs the reference if a change there is not made here as well."""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard

import numpy as np
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


def q_forward(obs: np.ndarray, params: list[np.ndarray], relu: bool) -> tuple[list[np.ndarray], np.ndarray]:
    """(the input and each hidden activation [B, h], Q-values [B, A]) of obs [B, ...], as QNetwork's forward, in numpy
    on views of the parameters (weights [out, in], biases [out])."""
    acts = [obs.reshape(len(obs), -1).astype(np.float32, copy=False)]
    *hidden, w, b = params
    for wi, bi in zip(hidden[::2], hidden[1::2]):
        z = acts[-1] @ wi.T
        z += bi
        acts.append(np.maximum(z, 0, out=z) if relu else np.tanh(z, out=z))
    q = acts[-1] @ w.T
    q += b
    return acts, q


def _numpy(tensors: list[Tensor]) -> list[np.ndarray]:
    return [t.detach().numpy() for t in tensors]  # views: the optimizer updates the parameters in place


class Saved(NamedTuple):
    """What the gradient needs of the forward pass."""

    rows: np.ndarray
    taken: np.ndarray  # the actions taken [B]
    td: np.ndarray  # Q(s, a) - target [B]
    weights: np.ndarray  # the items' importance weights [B]
    acts: list[np.ndarray]  # the input and each hidden activation
    params: list[np.ndarray]
    num_actions: int


def dqn_loss(
    kind: str, relu: bool, batch_size: int, inputs: list[np.ndarray], params: list[np.ndarray]
) -> tuple[float, np.ndarray, np.ndarray, Saved]:
    """(loss, TD errors [B], Q(s, a) [B], what dqn_gradients needs) of DQNLearner's loss (`kind`: mse or huber) on
    inputs (obs, actions, targets, weights), q_params' arrays."""
    obs, taken, targets, w = inputs
    acts, q = q_forward(obs, params, relu)
    rows = np.arange(len(q))
    q_taken = q[rows, taken]
    td = q_taken - targets
    if kind == "huber":  # F.huber_loss with delta 1
        per_item = np.where(np.abs(td) < 1.0, 0.5 * np.square(td), np.abs(td) - 0.5)
    else:
        per_item = np.square(td)
    loss = float((w * per_item).sum(dtype=np.float64)) / batch_size
    return loss, td, q_taken, Saved(rows, taken, td, w, acts, params, q.shape[1])


def dqn_gradients(kind: str, relu: bool, batch_size: int, saved: Saved, g_loss: float) -> list[np.ndarray]:
    """The gradients of q_params, in their order, of g_loss times the loss dqn_loss computed."""
    rows, taken, td, w, acts, p, num_actions = saved
    d_item = np.clip(td, -1.0, 1.0) if kind == "huber" else 2.0 * td  # d per_item / d Q(s, a)
    g = np.zeros((len(td), num_actions), dtype=np.float32)
    g[rows, taken] = (g_loss / batch_size) * w * d_item
    grads: list[np.ndarray] = []
    ones = np.ones(len(td), dtype=np.float32)  # a bias's gradient as a product: 3x faster than g.sum(0) at [128, 120]
    for layer in range(len(acts) - 1, -1, -1):
        a_in = acts[layer]
        grads = [g.T @ a_in, ones @ g, *grads]
        if layer == 0:
            break
        g = g @ p[2 * layer]
        g *= (a_in > 0) if relu else (1.0 - np.square(a_in))
    return grads


class FusedDQNLoss(torch.autograd.Function):
    """DQNLearner's loss with a hand-written backward, in numpy (CPU tensors): forward(loss kind, relu, batch_size, obs,
    actions, targets, weights, *q_params) -> (loss, |TD errors| [B], Q(s, a) [B]); only the loss is differentiable."""

    @staticmethod
    def forward(
        ctx: Any, kind: str, relu: bool, batch_size: int, obs: Tensor, actions: Tensor, targets: Tensor,
        weights: Tensor, *params: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        inputs = [t.numpy() for t in (obs, actions, targets, weights)]
        loss, td, q_taken, ctx.saved = dqn_loss(kind, relu, batch_size, inputs, _numpy(list(params)))
        ctx.kind, ctx.relu, ctx.batch_size = kind, relu, batch_size
        td_abs, q = torch.from_numpy(np.abs(td)), torch.from_numpy(q_taken)
        ctx.mark_non_differentiable(td_abs, q)
        return torch.tensor(loss), td_abs, q

    @staticmethod
    def backward(ctx: Any, g_loss: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
        grads = dqn_gradients(ctx.kind, ctx.relu, ctx.batch_size, ctx.saved, float(g_loss))
        return None, None, None, None, None, None, None, *(torch.from_numpy(g) for g in grads)


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
    """q_targets with DQN's networks bound (DQNParts.targets), its forward passes as q_forward's (numpy, CPU)."""

    def __init__(self, online: QNetwork, target: nn.Module, double_q: bool):  # target: a copy of online
        self.online, self.target = _numpy(q_params(online)), _numpy(q_params(target))  # type: ignore[arg-type]
        self.relu, self.double_q = relu_encoder(online), double_q

    def choices_agree(self, next_obs: Tensor) -> bool:
        """Whether the online and target networks choose the same action on every observation (the self-check's
        cue: until they differ, double DQN's choice, and an edit to it, cannot show)."""
        x = next_obs.numpy()
        target, online = (q_forward(x, params, self.relu)[1].argmax(-1) for params in (self.target, self.online))
        return bool((target == online).all())

    def __call__(self, next_obs: Tensor, returns: Tensor, discount: Tensor) -> Tensor:
        x = next_obs.numpy()
        next_q = q_forward(x, self.target, self.relu)[1]
        best = (q_forward(x, self.online, self.relu)[1] if self.double_q else next_q).argmax(-1)
        return torch.from_numpy(returns.numpy() + discount.numpy() * next_q[np.arange(len(x)), best])
