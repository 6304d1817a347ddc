"""Gradient steps without autograd, in one process on CPU, around the fused losses in numpy: PPO's minibatch step
(PPO.minibatch_step: the advantages' normalization, the loss, its gradient, the clipping of its norm, the Adam step)
and DQN's (DQN.gradient_step: the loss, its gradient, clipping, the Adam step). The losses' numpy forward and
hand-written gradient (numpy_ppo.py, fused_dqn.py) write straight into flat Adam's gradient buffer. The reference steps
run the same losses through autograd: on a small MLP its engine, the gradients' accumulation into each parameter and
the torch calls around the loss were a third of a PPO minibatch's time (CartPole's 64x64 networks, 128 rows). Each is
checked against its reference step on its first call (selfcheck.CheckedStep). Not under a process group: DDP averages
the ranks' gradients in the learner's backward, which these steps do not run."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from rlrun.algos.dqn import GradientStep
from rlrun.algos.finite import nonfinite_error
from rlrun.algos.normalize import MeanAll
from rlrun.algos.ppo import MinibatchStep
from rlrun.fast.flat_adam import FlatAdam
from rlrun.fast.fused_dqn import FusedDQNLearner, dqn_gradients, dqn_loss, q_params
from rlrun.fast.fused_ppo import FusedPPOLearner, fused_params
from rlrun.fast.numpy_ppo import F32, gradients, loss_and_stats
from rlrun.fast.selfcheck import CheckedDQNLearner, CheckedLearner

INPUTS = ("obs", "actions", "old_log_probs", "advantages", "returns", "old_values")  # loss_and_stats' order


def normalized(adv: np.ndarray) -> np.ndarray:
    """normalize_advantages in one process: zero mean, unit variance."""
    centered: np.ndarray = adv - adv.mean()
    std = np.sqrt((centered * centered).mean())
    centered /= std + F32(1e-8)
    return centered


class _NumpyStep:
    """What both steps share: numpy views of the parameters (the live weights in flat Adam's buffer) and of their
    gradients, and the gradient's clipping and the optimizer's step after it is written."""

    def __init__(self, params: list[Tensor], optimizer: FlatAdam, max_norm: float, what: str):
        self.optimizer, self.max_norm, self.what = optimizer, F32(max_norm), what
        self.params = [p.detach().numpy() for p in params]
        self.grads = [p.grad.numpy() for p in params if p.grad is not None]  # views of its gradient buffer
        assert len(self.grads) == len(params), "flat Adam gives every parameter its gradient's view"
        self.flat_grads = optimizer.grads.numpy()

    def apply(self, grads: list[np.ndarray]) -> None:
        """Write `grads` (the parameters', in their order), clip their norm as FlatAdam.clip_grad_norm_, step."""
        for grad, g in zip(self.grads, grads, strict=True):
            np.copyto(grad, g)
        flat = self.flat_grads
        norm = np.sqrt(np.dot(flat, flat))
        if not math.isfinite(norm):
            raise nonfinite_error(float(norm), self.what)
        flat *= min(self.max_norm / (norm + F32(1e-6)), F32(1))
        self.optimizer.step()


class NumpyPPOStep(_NumpyStep):
    """A MinibatchStep for a model the fused PPO loss covers, whose parameters are all fused_params and live in
    `optimizer`'s flat buffers; `learner` is the run's checked fused loss. Where that loss stepped aside (or the
    ranks' minibatches weigh unequally, which needs several ranks) the reference step runs."""

    def __init__(self, learner: CheckedLearner, optimizer: FlatAdam, reference: MinibatchStep):
        fast = learner.fast
        assert isinstance(fast, FusedPPOLearner)
        super().__init__(fused_params(fast.model), optimizer, fast.cfg.max_grad_norm, "the PPO gradient norm")
        self.learner, self.reference = learner, reference
        self.cfg, self.relu, self.discrete = fast.cfg, fast.model.trunk.relu, fast.model.discrete

    def __call__(self, minibatch: dict[str, Tensor], mean_all: MeanAll, weight: float | None) -> Tensor:
        if weight is not None or self.learner.active is not self.learner.fast:
            return self.reference(minibatch, mean_all, weight)
        c = self.cfg
        inputs = [minibatch[k].numpy() for k in INPUTS]
        if c.norm_adv:
            inputs[3] = normalized(inputs[3])
        _, stats, saved = loss_and_stats(c, self.relu, self.discrete, inputs, self.params)
        self.apply(gradients(c, self.relu, self.discrete, saved, F32(1)))
        return torch.from_numpy(stats)


class NumpyDQNStep(_NumpyStep):
    """A GradientStep for a Q-network the fused DQN loss covers, its parameters all q_params in `optimizer`'s flat
    buffers; `learner` is the run's checked fused loss. Where that loss stepped aside the reference step runs."""

    def __init__(self, learner: CheckedDQNLearner, optimizer: FlatAdam, max_norm: float, reference: GradientStep):
        fast = learner.fast
        assert isinstance(fast, FusedDQNLearner)
        super().__init__(q_params(fast.model), optimizer, max_norm, "the DQN gradient norm")
        self.learner, self.reference = learner, reference
        self.kind, self.relu, self.batch_size = fast.loss, fast.relu, fast.batch_size

    def __call__(self, obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.learner.active is not self.learner.fast:
            return self.reference(obs, actions, targets, weights)
        inputs = [t.numpy() for t in (obs, actions, targets, weights)]
        loss, td, q_taken, saved = dqn_loss(self.kind, self.relu, self.batch_size, inputs, self.params)
        self.apply(dqn_gradients(self.kind, self.relu, self.batch_size, saved, 1.0))
        return torch.tensor(loss), torch.from_numpy(np.abs(td)), torch.from_numpy(q_taken)
