"""SAC's and TD3's exploring actions without torch's per-operator overhead: the actor's forward pass in numpy, on views
of its live parameters, for the few envs of a vector step (an off-policy run acts at every env step, one observation at
a time, where each torch operator costs more than numpy's whole pass). A drop-in for the algorithms' exploration part;
the noise still comes from torch's generator, drawn as their unit_actions draws it, so seeds and checkpointed RNG states
mean the same. Checked against the reference part on its first step (selfcheck.CheckedExploration)."""

from __future__ import annotations

import numpy as np
import torch

from rlrun.fast.fused_dqn import q_forward
from rlrun.models.continuous import LOG_STD_MAX, LOG_STD_MIN, DeterministicActor, GaussianActor


class NumpyExploration:
    """TD3's clip(tanh(MLP(s)) + noise_scale N(0, 1), -1, 1), or SAC's tanh(mean + exp(clamp(log std)) N(0, 1)) (its
    log-density left out: acting does not read it), for an actor whose net is a relu_mlp (fast/continuous_steps.py)."""

    def __init__(self, actor: DeterministicActor | GaussianActor, noise_scale: float = 0.0):
        # Views, not copies: flat Adam and load_state_dict update the parameters in place. A relu_mlp's parameters are
        # its Linears' weights and biases in order, as DQN's numpy forward takes a Q-network's.
        self.params = [p.detach().numpy() for p in actor.net.parameters()]
        self.gaussian, self.noise_scale = isinstance(actor, GaussianActor), noise_scale
        self.dim = self.params[-1].shape[0] // (2 if self.gaussian else 1)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        h = q_forward(obs, self.params, relu=True)[1]  # the MLP's output, in numpy
        if self.gaussian:
            mean, log_std = h[:, : self.dim], np.clip(h[:, self.dim :], LOG_STD_MIN, LOG_STD_MAX)
            actions: np.ndarray = np.tanh(mean + np.exp(log_std) * torch.randn(len(obs), self.dim).numpy())
            return actions
        actions = np.tanh(h)
        if self.noise_scale == 0:
            return actions
        return np.clip(actions + self.noise_scale * torch.randn(actions.shape).numpy(), -1.0, 1.0)
