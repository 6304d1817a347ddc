"""Acting without torch's per-operator overhead: the feedforward MLP actor-critic's forward pass and sampling
in numpy, on views of the model's live parameters (so it always acts with the current weights). For the few
envs of one vector step a numpy call costs a fraction of a torch operator, and acting runs once per env step.
A drop-in for the model as PPO's `policy` (act, value on CPU tensors); the noise still comes from torch's
generator, drawn as ActorCritic.act draws it, so seeds and checkpointed RNG states mean the same.
tests/unit/test_fast_paths.py checks both act alike, and a run checks it on its first step (fast/selfcheck.py): a layer
or an activation the mirror does not know, or an edited distribution, makes it step aside for the model."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rlrun.fast.fused_ppo import fused_params
from rlrun.models.actor_critic import ActorCritic
from rlrun.models.distributions import LOG_2PI


class NumpyPolicy:
    def __init__(self, model: ActorCritic):
        # Views, not copies: the optimizer and load_state_dict update the parameters in place.
        params = [p.detach().numpy() for p in fused_params(model)]
        n_trunk = 2 + 2 * len(model.trunk.weights)
        (w0, b0, *rest), head = params[:n_trunk], params[n_trunk:]
        self.first = (w0.T, b0)
        self.layers = list(zip(rest[::2], rest[1::2]))
        self.policy_head = (head[0].T, head[1])
        self.value_head = (head[2].T, head[3])
        self.log_std = None if model.discrete else head[4]
        self.outputs = head[0].shape[0]  # logits (categorical) or action dimensions (Gaussian)
        self.relu = model.trunk.relu

    def _activate(self, h: np.ndarray) -> np.ndarray:
        activated: np.ndarray = np.maximum(h, 0, out=h) if self.relu else np.tanh(h, out=h)
        return activated

    def _forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w, b = self.first
        h = self._activate(obs.reshape(len(obs), -1) @ w + b)
        h = h.reshape(len(obs), 2, -1).transpose(1, 0, 2)  # [2, B, h]: actor, critic
        for w, b in self.layers:
            h = self._activate(np.matmul(h, w) + b)
        return h[0] @ self.policy_head[0] + self.policy_head[1], (h[1] @ self.value_head[0] + self.value_head[1])[:, 0]

    def value(self, obs: Tensor) -> Tensor:
        return torch.from_numpy(self.values(obs.numpy()))

    def values(self, obs: np.ndarray) -> np.ndarray:
        """V [B] of observations [B, ...], in numpy."""
        return self._forward(obs)[1]

    def act(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(action [B] or [B, D], log-prob [B], value [B]) for observations [B, ...], as ActorCritic.act."""
        action, log_prob, value = self.act_arrays(obs.numpy(), self.draw(len(obs)))
        return torch.from_numpy(action), torch.from_numpy(log_prob), torch.from_numpy(value)

    def draw(self, n: int) -> np.ndarray:
        """The noise ActorCritic.act draws for n observations, from torch's generator: Exp(1) per logit
        (categorical_sample), or N(0, 1) per action dimension (gaussian_sample)."""
        shape = (n, self.outputs)
        return (torch.empty(shape).exponential_() if self.log_std is None else torch.randn(shape)).numpy()

    def act_arrays(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """act in numpy, with the noise drawn (as draw draws it)."""
        out, value = self._forward(obs)
        if self.log_std is None:  # categorical, sampled with the Gumbel-max trick as categorical_sample
            out -= out.max(1, keepdims=True)
            log_p = out - np.log(np.exp(out).sum(1, keepdims=True))
            action = (log_p - np.log(noise)).argmax(1)
            log_prob = log_p[np.arange(len(out)), action]
        else:  # as gaussian_sample: mean + std * N(0, 1)
            action = out + np.exp(self.log_std) * noise
            log_prob = (-0.5 * np.square(noise) - self.log_std).sum(1) - 0.5 * LOG_2PI * out.shape[1]
        return action, log_prob, value
