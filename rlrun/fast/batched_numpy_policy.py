"""Acting for S seeds without torch's per-operator overhead: BatchedActorCritic's forward and sampling in numpy on
views of the stacked parameters (so it acts with the current weights), as numpy_policy.py does for one seed. A
drop-in for the model as BatchedPPO's `policy` (act, value on CPU tensors); the noise is the caller's (each seed's
own stream, drawn as its single run draws it). tests/unit/test_batched_ppo.py checks both act alike, and a run checks
it on its first step (fast/selfcheck.py), stepping aside for the model when they differ."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.batched_ppo import BatchedActorCritic
from rlrun.models.distributions import LOG_2PI


class BatchedNumpyPolicy:
    def __init__(self, model: BatchedActorCritic):
        # Views, not copies: the optimizer and read_from update the stacked parameters in place. (Build it after
        # anything that moves their data: the flat Adam.)
        p = {name: model.get_parameter(name).detach().numpy() for name, _, _ in model.layouts}
        depth = len(model.hidden_w)
        self.first = (p["first_w"], p["first_b"])  # [S, in, 2h], [S, 1, 2h]
        self.layers = [(p[f"hidden_w.{i}"], p[f"hidden_b.{i}"]) for i in range(depth)]  # [S, 2, h, h], [S, 2, 1, h]
        self.policy_head = (p["policy_w"], p["policy_b"])
        self.value_head = (p["value_w"], p["value_b"])
        self.log_std = p.get("log_std")  # [S, 1, D], Gaussian only
        self.relu = isinstance(model.activation, nn.ReLU)

    def _activate(self, h: np.ndarray) -> np.ndarray:
        activated: np.ndarray = np.maximum(h, 0, out=h) if self.relu else np.tanh(h, out=h)
        return activated

    def _trunks(self, obs: np.ndarray) -> np.ndarray:
        """The actor's and critic's last activations [S, 2, B, h] for observations [S, B, ...]."""
        S, B = obs.shape[:2]
        w, b = self.first
        h = self._activate(np.matmul(obs.reshape(S, B, -1), w) + b)
        h = h.reshape(S, B, 2, -1).transpose(0, 2, 1, 3)  # [S, 2, B, h]: actor, critic
        for w, b in self.layers:
            h = self._activate(np.matmul(h, w) + b)
        return h

    def _value(self, h: np.ndarray) -> np.ndarray:
        w, b = self.value_head
        value: np.ndarray = (np.matmul(h[:, 1], w) + b)[..., 0]
        return value

    def value(self, obs: Tensor) -> Tensor:
        """V [S, B] of observations [S, B, ...]."""
        return torch.from_numpy(self._value(self._trunks(obs.numpy())))

    def act(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(actions, log-probs [S, B], values [S, B]) with each seed's noise [S, B, P], as BatchedActorCritic.act."""
        action, log_prob, value = self.act_arrays(obs.numpy(), noise.numpy())
        return torch.from_numpy(action), torch.from_numpy(log_prob), torch.from_numpy(value)

    def act_arrays(self, obs: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """act in numpy."""
        h = self._trunks(obs)
        w, b = self.policy_head
        out = np.matmul(h[:, 0], w) + b  # [S, B, P]
        if self.log_std is None:  # categorical, sampled with the Gumbel-max trick as categorical_sample
            out -= out.max(-1, keepdims=True)
            log_p = out - np.log(np.exp(out).sum(-1, keepdims=True))
            action = (log_p - np.log(e)).argmax(-1)
            # each row's entry at its action, by flat index (np.take_along_axis builds index grids on every call)
            P = log_p.shape[-1]
            log_prob = log_p.reshape(-1)[np.arange(0, log_p.size, P) + action.reshape(-1)].reshape(action.shape)
        else:  # as gaussian_sample: mean + std * N(0, 1)
            action = out + np.exp(self.log_std) * e
            log_prob = (-0.5 * np.square(e) - self.log_std).sum(-1) - 0.5 * LOG_2PI * out.shape[-1]
        return action, log_prob, self._value(h)
