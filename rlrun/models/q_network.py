"""The action-value network DQN trains: an encoder (MLP or Nature CNN) and a Q head, plain or dueling."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from torch import Tensor, nn

from rlrun.config import ModelConfig
from rlrun.models.actor_critic import action_mask_size, image_parts
from rlrun.models.encoders import build_encoder, encoder_name
from rlrun.models.user import AsGiven, check_outputs, given_space, instantiate_network


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
        q: Tensor = self.head(x)
        if self.value is not None:
            q = self.value(x) + q - q.mean(-1, keepdim=True)
        if self.mask_size:
            q = q.masked_fill(obs[..., -self.mask_size :] < 0.5, -1e9)
        return q


class UserQNetwork(nn.Module):
    """A user's Q-network (model._target_) given Dict and Tuple observations as the env gives them (a dict of
    tensors, rlrun.models.user.AsGiven), with illegal actions' Q-values masked after it where the env gives masks."""

    def __init__(self, net: nn.Module, obs_space: gym.Space[Any]):
        super().__init__()
        self.net = net
        self.as_given = AsGiven(obs_space)
        self.mask_size = action_mask_size(obs_space)

    def forward(self, obs: Tensor) -> Tensor:
        q: Tensor = self.net(self.as_given(obs))
        if self.mask_size:
            q = q.masked_fill(obs[..., -self.mask_size :] < 0.5, -1e9)
        return q


def build_q_network(
    cfg: ModelConfig, obs_space: gym.Space[Any], action_space: gym.spaces.Discrete, dueling: bool
) -> nn.Module:
    """rlrun's QNetwork, or the user's network (model._target_), whose forward returns Q-values [B, A]: as it is
    for observations it takes as they come, in a UserQNetwork for Dict/Tuple observations and action masks."""
    if cfg._target_ is None:
        return QNetwork(cfg, obs_space, action_space, dueling)
    net = instantiate_network(cfg, given_space(obs_space), action_space)
    if AsGiven(obs_space) or action_mask_size(obs_space):
        net = UserQNetwork(net, obs_space)
    check_outputs(net, cfg._target_, obs_space, {"Q-values": (2, int(action_space.n))})
    return net
