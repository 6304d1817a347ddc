"""SAC's and TD3's gradient steps without autograd: the twin critics' step (continuous.py's CriticStep), TD3's actor
step and SAC's actor and temperature step; and their target networks' forward passes (and SAC's next actions) without
the modules. Their forward and backward passes are written out for rlrun's ReLU MLPs on activation buffers allocated
once, each gradient written by its matrix product straight into flat Adam's buffer: the same products as autograd's (the
update's cost at 256-wide layers), without the graph, the outputs autograd allocates, the gradients it accumulates and
zeroes, and ReLU's backward as a new tensor. Checked against the reference steps on the first update
(selfcheck.CheckedStep), as are the forward passes."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlrun.algos.finite import require_finite
from rlrun.fast.flat_adam import FlatAdam
from rlrun.models.continuous import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    DeterministicActor,
    GaussianActor,
    TwinQ,
    squashed_gaussian,
)


def relu_mlp(net: nn.Module) -> bool:
    """Whether `net` is one of rlrun's MLPs (models/continuous.py's mlp) with ReLUs: Linear layers with a ReLU between
    each two, and no other module or parameter, which is all the passes below compute."""
    layers = list(net.children()) if isinstance(net, nn.Sequential) else []
    kinds = [type(m) for m in layers]
    return (
        len(layers) % 2 == 1
        and kinds[0::2] == [nn.Linear] * (len(layers) // 2 + 1)
        and kinds[1::2] == [nn.ReLU] * (len(layers) // 2)
        and all(m.bias is not None for m in layers[0::2])
    )


def bare_mlp(net: nn.Module) -> bool:
    """A relu_mlp whose passes backward may take: all its parameters trained (a frozen layer's weights have no
    gradient buffer to write into)."""
    return relu_mlp(net) and all(p.requires_grad for p in net.parameters())


class BareMLP:
    """A bare_mlp's forward and backward passes on buffers kept from one batch size to the next. backward writes the
    weights' gradients into their .grad (flat Adam's views)."""

    def __init__(self, net: nn.Module):
        # The layers' parameters themselves (each a Module attribute lookup otherwise, a few per layer and pass); their
        # values change in place (the optimizer, load_state_dict), the Parameter objects stay.
        self.params: list[tuple[Tensor, Tensor]] = [
            (m.weight, m.bias) for m in net.children() if isinstance(m, nn.Linear)
        ]
        self.size = 0

    def _buffers(self, x: Tensor) -> None:
        if len(x) != self.size:
            self.size = len(x)
            self.outputs = [x.new_empty(self.size, w.shape[0]) for w, _ in self.params]
            self.input_grads = [x.new_empty(self.size, w.shape[1]) for w, _ in self.params]
            self.ones = x.new_ones(1, self.size)  # a bias's gradient is ones @ g

    def forward(self, x: Tensor) -> Tensor:
        """The output [B, out] of x [B, in]; the activations stay for backward (until the next forward)."""
        self._buffers(x)
        self.x, h = x, x
        last = len(self.params) - 1
        for i, ((weight, bias), out) in enumerate(zip(self.params, self.outputs)):
            if i < last:  # the product, then bias and ReLU in one pass: addmm would first copy the bias into `out`
                torch.mm(h, weight.t(), out=out)
                torch.ops.aten._add_relu_(out, bias)
            else:
                torch.addmm(bias, h, weight.t(), out=out)
            h = out
        return h

    def backward(self, grad: Tensor, weights: bool) -> Tensor | None:
        """From grad = d loss / d output [B, out], through the last forward's activations: with `weights`, the
        weights' and biases' gradients written into their .grad (and None: nobody reads the data's gradient); else
        (a critic read through detached weights) d loss / d x [B, in] alone."""
        for i in reversed(range(len(self.params))):
            (weight, bias), below = self.params[i], self.x if i == 0 else self.outputs[i - 1]
            if weights:
                assert weight.grad is not None and bias.grad is not None  # flat Adam's views
                torch.mm(grad.t(), below, out=weight.grad)
                torch.mm(self.ones, grad, out=bias.grad.view(1, -1))
            if i == 0 and weights:
                return None
            torch.mm(grad, weight, out=self.input_grads[i])
            if i > 0:  # ReLU's backward, in place: zero where the unit was off
                torch.ops.aten.threshold_backward.grad_input(
                    self.input_grads[i], below, 0.0, grad_input=self.input_grads[i]
                )
            grad = self.input_grads[i]
        return grad


def twin_q(critics: list[BareMLP], x: Tensor) -> Tensor:
    """TwinQ's Q-values [2, B] of its critics' bare passes on x = (obs, actions) [B, D + A]."""
    return torch.cat([critic.forward(x) for critic in critics], -1).t()


class TargetQWithoutModules:
    """The target critics' Q-values (continuous.py's TargetQ: TwinQ's forward) as BareMLP passes, on buffers kept from
    one update to the next instead of the outputs the modules allocate at each call."""

    def __init__(self, critic: TwinQ):
        self.critics = [BareMLP(net) for net in critic.critics]

    @torch.no_grad()
    def __call__(self, obs: Tensor, actions: Tensor) -> Tensor:
        return twin_q(self.critics, torch.cat([obs.flatten(1).float(), actions], -1))


class TargetActionsWithoutModules:
    """TD3's target actions mu'(s') (DeterministicActor's forward), as TargetQWithoutModules."""

    def __init__(self, actor: DeterministicActor):
        self.actor = BareMLP(actor.net)

    @torch.no_grad()
    def __call__(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.actor.forward(obs.flatten(1).float()))


class NextActionsWithoutModules:
    """SAC's next actions and their log-densities (GaussianActor's forward, on the online actor: SACParts.next_actions),
    as TargetQWithoutModules."""

    def __init__(self, actor: GaussianActor):
        self.actor = BareMLP(actor.net)

    @torch.no_grad()
    def __call__(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        mean, raw_log_std = self.actor.forward(obs.flatten(1).float()).chunk(2, -1)
        return squashed_gaussian(mean, raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX), noise)


class CriticStepWithoutAutograd:
    """CriticStep (continuous.py): CriticLearner's loss, scale x sum_k sum_i w_i (Q_k(s_i, a_i) - y_i)^2 / batch_size,
    its gradient d loss / d Q_k(s_i, a_i) = 2 scale w_i (Q_k - y_i) / batch_size taken back through both critics, and
    the optimizer's step."""

    def __init__(self, critic: TwinQ, optimizer: FlatAdam, scale: float, batch_size: int, name: str):
        self.critics = [BareMLP(net) for net in critic.critics]
        self.optimizer, self.scale, self.batch_size, self.name = optimizer, scale, batch_size, name

    @torch.no_grad()
    def __call__(self, obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = torch.cat([obs.flatten(1).float(), actions], -1)
        q = twin_q(self.critics, x)
        td = q - targets
        loss = self.scale * (weights * td.square().sum(0)).sum() / self.batch_size
        require_finite(loss, f"the {self.name.upper()} critic loss")
        grads = td * weights * (2.0 * self.scale / self.batch_size)
        for critic, grad in zip(self.critics, grads):
            critic.backward(grad[:, None], weights=True)
        self.optimizer.step()
        return loss, td.abs().mean(0), q


class ActorStepWithoutAutograd:
    """TD3's actor step (TD3.actor_step): -Q_1(s, mu(s)) summed / batch_size, mu(s) = tanh(MLP(s)), its gradient taken
    back through the first critic's current weights (no gradient of theirs) and tanh into the actor's, and the actor
    optimizer's step."""

    def __init__(self, actor: DeterministicActor, critic: TwinQ, optimizer: FlatAdam, batch_size: int):
        self.actor, self.critic = BareMLP(actor.net), BareMLP(critic.critics[0])
        self.optimizer, self.batch_size = optimizer, batch_size

    @torch.no_grad()
    def __call__(self, obs: Tensor) -> Tensor:
        x = obs.flatten(1).float()
        actions = torch.tanh(self.actor.forward(x))
        q = self.critic.forward(torch.cat([x, actions], -1))
        loss = -q.sum() / self.batch_size
        require_finite(loss, "the TD3 actor loss")
        through_critic = self.critic.backward(torch.full_like(q, -1.0 / self.batch_size), weights=False)
        assert through_critic is not None
        grad = through_critic[:, x.shape[1] :]  # the actions' part of the critic's input
        self.actor.backward(grad * (1.0 - actions * actions), weights=True)  # tanh' = 1 - tanh^2
        self.optimizer.step()
        return loss


class SACActorStepWithoutAutograd:
    """SAC's actor and temperature step (SAC.actor_step): SACActorLearner's losses, alpha log pi(a|s) - min_k Q_k(s, a)
    and -log alpha (log pi + H_target), each summed / batch_size, a = tanh(u), u = mean + std noise. Their gradients:
    into the actor's through the smaller critic's current weights (per item, as min's backward), tanh, the
    reparameterization and the log-density (d log pi / du = 2 tanh(u), d log pi / d log std = -1 at fixed noise), the
    log-std's clamp passing them only inside its bounds; into log alpha, -(log pi + H_target) summed / batch_size. Then
    the actor's and (when tuned) the temperature's optimizer steps."""

    def __init__(
        self,
        actor: GaussianActor,
        critic: TwinQ,
        log_alpha: nn.Parameter,
        target_entropy: float,
        batch_size: int,
        optimizers: tuple[FlatAdam, FlatAdam | None],
    ):
        self.actor, self.critics = BareMLP(actor.net), [BareMLP(net) for net in critic.critics]
        self.log_alpha, self.target_entropy, self.batch_size = log_alpha, target_entropy, batch_size
        self.actor_optimizer, self.alpha_optimizer = optimizers

    @torch.no_grad()
    def __call__(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        n = self.batch_size
        x = obs.flatten(1).float()
        mean, raw_log_std = self.actor.forward(x).chunk(2, -1)
        log_std = raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        actions, log_prob = squashed_gaussian(mean, log_std, noise)
        critic_x = torch.cat([x, actions], -1)
        q, smaller = twin_q(self.critics, critic_x).min(0)
        alpha = self.log_alpha.exp()
        actor_loss = (alpha * log_prob - q).sum() / n
        alpha_loss = -(self.log_alpha * (log_prob + self.target_entropy)).sum() / n
        loss = actor_loss + alpha_loss
        require_finite(loss, "the SAC actor loss")
        grad_actions = torch.zeros_like(actions)
        for k, critic in enumerate(self.critics):
            through = critic.backward(torch.where(smaller == k, -1.0 / n, 0.0)[:, None], weights=False)
            assert through is not None
            grad_actions += through[:, x.shape[1] :]  # the actions' part of the critic's input
        grad_log_prob = alpha / n
        grad_u = grad_actions * (1.0 - actions * actions) + grad_log_prob * 2.0 * actions
        inside = (raw_log_std >= LOG_STD_MIN) & (raw_log_std <= LOG_STD_MAX)  # clamp's gradient, as torch's
        grad_log_std = (grad_u * log_std.exp() * noise - grad_log_prob) * inside
        self.actor.backward(torch.cat([grad_u, grad_log_std], -1), weights=True)
        self.actor_optimizer.step()
        if self.alpha_optimizer is not None:
            assert self.log_alpha.grad is not None  # flat Adam's view
            self.log_alpha.grad.copy_(-(log_prob + self.target_entropy).sum() / n)
            self.alpha_optimizer.step()
        return loss, actor_loss, alpha_loss, -log_prob.sum() / n
