"""The action-value network DQN trains: an encoder (MLP or Nature CNN) and a Q head, plain or dueling."""

from __future__ import annotations

import gymnasium as gym
from torch import Tensor, nn

from rlrun.config import ModelConfig
from rlrun.models.encoders import build_encoder


class QNetwork(nn.Module):
    """obs [B, ...] -> Q-values [B, A]. The dueling head (Wang et al. 2016, eq. 9) computes
    Q = V + A - mean(A) from the shared encoder's features."""

    def __init__(self, cfg: ModelConfig, obs_space: gym.spaces.Box, action_space: gym.spaces.Discrete, dueling: bool):
        super().__init__()
        self.encoder, features = build_encoder(cfg.name, obs_space.shape, cfg.hidden_sizes, cfg.activation)
        n = int(action_space.n)
        self.head = nn.Linear(features, n)  # advantages when dueling
        self.value = nn.Linear(features, 1) if dueling else None

    def forward(self, obs: Tensor) -> Tensor:
        x = self.encoder(obs)
        q = self.head(x)
        if self.value is not None:
            q = self.value(x) + q - q.mean(-1, keepdim=True)
        return q
