"""The action-value network DQN trains: an encoder (MLP or Nature CNN) and a Q head, plain or dueling."""

from __future__ import annotations

import gymnasium as gym
from torch import Tensor, nn

from rlrun.config import ModelConfig
from rlrun.config.instantiate import instantiate_network
from rlrun.models.actor_critic import action_mask_size, image_parts
from rlrun.models.encoders import build_encoder, encoder_name
from rlrun.models.user import check_outputs


class QNetwork(nn.Module):
    """obs [B, ...] -> Q-values [B, A]. The dueling head (Wang et al. 2016, eq. 9) computes
    Q = V + A - mean(A) from the shared encoder's features."""

    def __init__(self, cfg: ModelConfig, obs_space: gym.spaces.Box, action_space: gym.spaces.Discrete, dueling: bool):
        super().__init__()
        images = image_parts(obs_space)
        name = encoder_name(cfg.name, obs_space.shape, obs_space.dtype, images)
        self.encoder, features = build_encoder(name, obs_space.shape, cfg.hidden_sizes, cfg.activation, images)
        n = int(action_space.n)
        self.head = nn.Linear(features, n)  # advantages when dueling
        self.value = nn.Linear(features, 1) if dueling else None
        self.mask_size = action_mask_size(obs_space)  # illegal actions' Q at -1e9: never greedy, never the max

    def forward(self, obs: Tensor) -> Tensor:
        x = self.encoder(obs)
        q = self.head(x)
        if self.value is not None:
            q = self.value(x) + q - q.mean(-1, keepdim=True)
        if self.mask_size:
            q = q.masked_fill(obs[..., -self.mask_size :] < 0.5, -1e9)
        return q


def build_q_network(
    cfg: ModelConfig, obs_space: gym.Space, action_space: gym.spaces.Discrete, dueling: bool
) -> nn.Module:
    """rlrun's QNetwork, or the user's network (model._target_), whose forward returns Q-values [B, A]."""
    if cfg._target_ is None:
        return QNetwork(cfg, obs_space, action_space, dueling)
    net = instantiate_network(cfg, obs_space, action_space)
    check_outputs(net, cfg._target_, obs_space, {"Q-values": (2, int(action_space.n))})
    return net
