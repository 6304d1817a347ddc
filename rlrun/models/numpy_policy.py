"""Acting without torch's per-operator overhead: the feedforward MLP actor-critic's forward pass and sampling
in numpy, on views of the model's live parameters (so it always acts with the current weights). For the few
envs of one vector step a numpy call costs a third of a torch operator, and acting runs once per env step.
The noise still comes from torch's generator, drawn as ActorCritic.act draws it, so seeds and checkpointed RNG
states mean the same; tests/test_fast_paths.py checks both act alike."""

from __future__ import annotations

import numpy as np
import torch

from rlrun.models.actor_critic import ActorCritic
from rlrun.models.distributions import LOG_2PI


class NumpyPolicy:
    def __init__(self, model: ActorCritic):
        # Views, not copies: the optimizer and load_state_dict update the parameters in place.
        w0, b0, *rest = [_view(p) for p in model.trunk.layer_params]
        self.first = (w0.T, b0)
        self.layers = list(zip(rest[::2], rest[1::2]))
        self.policy_head = (_view(model.policy_head.weight).T, _view(model.policy_head.bias))
        self.value_head = (_view(model.value_head.weight).T, _view(model.value_head.bias))
        self.log_std = None if model.discrete else _view(model.log_std)
        self.relu = model.trunk.relu

    def _activate(self, h: np.ndarray) -> np.ndarray:
        return np.maximum(h, 0, out=h) if self.relu else np.tanh(h, out=h)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(action [B] or [B, D], log-prob [B], value [B]) for observations [B, ...], as ActorCritic.act."""
        w, b = self.first
        h = self._activate(obs.reshape(len(obs), -1) @ w + b)
        h = h.reshape(len(obs), 2, -1).transpose(1, 0, 2)  # [2, B, h]: actor, critic
        for w, b in self.layers:
            h = self._activate(np.matmul(h, w) + b)
        out = h[0] @ self.policy_head[0] + self.policy_head[1]
        value = (h[1] @ self.value_head[0] + self.value_head[1])[:, 0]
        if self.log_std is None:  # categorical, sampled with the Gumbel-max trick as categorical_sample
            out -= out.max(1, keepdims=True)
            log_p = out - np.log(np.exp(out).sum(1, keepdims=True))
            action = (log_p - np.log(torch.empty(log_p.shape).exponential_().numpy())).argmax(1)
            return action, log_p[np.arange(len(obs)), action], value
        noise = torch.randn(out.shape).numpy()  # as gaussian_sample: mean + std * N(0, 1)
        action = out + np.exp(self.log_std) * noise
        log_prob = (-0.5 * np.square(noise) - self.log_std).sum(1) - 0.5 * LOG_2PI * out.shape[1]
        return action, log_prob, value


def _view(p: torch.Tensor) -> np.ndarray:
    return p.detach().numpy()
