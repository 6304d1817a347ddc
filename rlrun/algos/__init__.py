"""The algorithms by config name: the one place an algorithm is registered. A new algorithm is one module here
(its schema with a validate method, and a class implementing protocol.Algorithm), its entry below and one yaml
in conf/algo/."""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from rlrun.algos.a2c import A2C, A2CConfig
from rlrun.algos.dqn import DQN, DQNConfig
from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import Algorithm, Entry, EnvSpec, Reductions
from rlrun.config import ModelConfig
from rlrun.models import build_actor_critic
from rlrun.models.q_network import build_q_network


def actor_critic(cfg, model_cfg: ModelConfig, obs_space: gym.Space, action_space: gym.Space) -> nn.Module:
    return build_actor_critic(model_cfg, obs_space, action_space)


def q_network(cfg, model_cfg: ModelConfig, obs_space: gym.Space, action_space: gym.Space) -> nn.Module:
    return build_q_network(model_cfg, obs_space, action_space, cfg.dueling)


ALGORITHMS: dict[str, Entry] = {
    "ppo": Entry(PPOConfig, PPO, actor_critic),
    "a2c": Entry(A2CConfig, A2C, actor_critic),
    "dqn": Entry(DQNConfig, DQN, q_network, discrete_actions=True),
}


def build_algo(
    cfg, model_cfg: ModelConfig, spec: EnvSpec, device: torch.device, reductions: Reductions | None = None
) -> Algorithm:
    """The algorithm named by cfg.name, for envs of `spec`, on `device`, reaching other ranks through
    `reductions` (none: one process)."""
    return ALGORITHMS[cfg.name].build(cfg, model_cfg, spec, device, reductions or Reductions())
