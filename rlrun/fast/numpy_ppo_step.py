"""PPO's minibatch step (PPO.minibatch_step) in numpy, in one process on CPU, around the fused loss in numpy
(numpy_ppo.py): the advantages' normalization, the loss, its gradient written straight into flat Adam's gradient
buffer, the clipping of its norm, then flat Adam's step. The reference runs the same loss through autograd: on a
small MLP its engine, the gradients' accumulation into each parameter and the torch calls around the loss were a
third of a minibatch's time (CartPole's 64x64 networks, 128 rows). Checked against PPO.minibatch_step on the first
minibatch (selfcheck.CheckedStep)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rlrun.algos.finite import require_finite
from rlrun.algos.normalize import MeanAll
from rlrun.algos.ppo import MinibatchStep
from rlrun.fast.flat_adam import FlatAdam
from rlrun.fast.fused_ppo import FusedPPOLearner, fused_params
from rlrun.fast.numpy_ppo import F32, gradients, loss_and_stats
from rlrun.fast.selfcheck import CheckedLearner

INPUTS = ("obs", "actions", "old_log_probs", "advantages", "returns", "old_values")  # loss_and_stats' order


def normalized(adv: np.ndarray) -> np.ndarray:
    """normalize_advantages in one process: zero mean, unit variance."""
    centered: np.ndarray = adv - adv.mean()
    std = np.sqrt((centered * centered).mean())
    centered /= std + F32(1e-8)
    return centered


class NumpyPPOStep:
    """A MinibatchStep for a model the fused loss covers, whose parameters are all fused_params and live in
    `optimizer`'s flat buffers; `learner` is the run's checked fused loss. Where that loss stepped aside (or the
    ranks' minibatches weigh unequally, which needs several ranks) the reference step runs."""

    def __init__(self, learner: CheckedLearner, optimizer: FlatAdam, reference: MinibatchStep):
        fast = learner.fast
        assert isinstance(fast, FusedPPOLearner)
        self.learner, self.optimizer, self.reference = learner, optimizer, reference
        self.cfg, self.relu, self.discrete = fast.cfg, fast.model.trunk.relu, fast.model.discrete
        params = fused_params(fast.model)
        self.params = [p.detach().numpy() for p in params]  # views of the live weights (flat Adam's buffer)
        self.grads = [p.grad.numpy() for p in params if p.grad is not None]  # views of its gradient buffer
        assert len(self.grads) == len(params), "flat Adam gives every parameter its gradient's view"
        self.flat_grads = optimizer.grads.numpy()

    def __call__(self, minibatch: dict[str, Tensor], mean_all: MeanAll, weight: float | None) -> Tensor:
        if weight is not None or self.learner.active is not self.learner.fast:
            return self.reference(minibatch, mean_all, weight)
        c = self.cfg
        inputs = [minibatch[k].numpy() for k in INPUTS]
        if c.norm_adv:
            inputs[3] = normalized(inputs[3])
        _, stats, saved = loss_and_stats(c, self.relu, self.discrete, inputs, self.params)
        for grad, g in zip(self.grads, gradients(c, self.relu, self.discrete, saved, F32(1)), strict=True):
            np.copyto(grad, g)
        g = self.flat_grads
        norm = np.sqrt(np.dot(g, g))
        require_finite(torch.from_numpy(np.asarray(norm)), "the PPO gradient norm")
        g *= min(F32(c.max_grad_norm) / (norm + F32(1e-6)), F32(1))  # as FlatAdam.clip_grad_norm_
        self.optimizer.step()
        return torch.from_numpy(stats)
