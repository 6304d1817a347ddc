"""The actor-critic PPO trains: a trunk (two MLPs computed together, or one shared encoder), a policy head
(categorical logits or Gaussian mean with a state-independent log-std) and a value head."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import Tensor, nn

from rlrun.config import ModelConfig
from rlrun.models import distributions as D
from rlrun.models.encoders import TwinMLP, build_encoder, layer_init


class ActorCritic(nn.Module):
    def __init__(self, cfg: ModelConfig, obs_space: gym.spaces.Box, action_space: gym.Space):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete and not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"PPO supports Discrete and Box action spaces, not {action_space}")
        if cfg.shared:
            self.trunk, features = build_encoder(cfg.name, obs_space.shape, cfg.hidden_sizes, cfg.activation)
        else:  # separate actor and critic trunks (CleanRL's classic-control layout)
            self.trunk = TwinMLP(math.prod(obs_space.shape), cfg.hidden_sizes, cfg.activation)
            features = self.trunk.out_dim
        self.shared = cfg.shared
        out = int(action_space.n) if self.discrete else int(action_space.shape[0])
        self.policy_head = layer_init(nn.Linear(features, out), gain=0.01)
        self.value_head = layer_init(nn.Linear(features, 1), gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(out))

    def _heads(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        if self.shared:
            actor = critic = self.trunk(obs)
        else:
            actor, critic = self.trunk(obs)
        return self.policy_head(actor), self.value_head(critic).squeeze(-1)

    def value(self, obs: Tensor) -> Tensor:
        return self._heads(obs)[1]

    def act(self, obs: Tensor, deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(action [B] or [B, D], log-prob [B], value [B]) for a batch of observations."""
        out, value = self._heads(obs)
        if self.discrete:
            log_p = torch.log_softmax(out, -1)
            action = out.argmax(-1) if deterministic else D.categorical_sample(log_p)
            return action, D.categorical_log_prob(log_p, action), value
        action = out if deterministic else D.gaussian_sample(out, self.log_std)
        return action, D.gaussian_log_prob(out, self.log_std, action), value

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log-prob [B], entropy [B], value [B]) of given actions."""
        out, value = self._heads(obs)
        if self.discrete:
            log_p = torch.log_softmax(out, -1)
            return D.categorical_log_prob(log_p, actions), D.categorical_entropy(log_p), value
        return D.gaussian_log_prob(out, self.log_std, actions), D.gaussian_entropy(out, self.log_std), value
