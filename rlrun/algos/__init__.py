"""Algorithms by config name. A new algorithm is one module here, its entry below, its schema in
rlrun/config.py and one yaml in conf/algo/."""

from __future__ import annotations

import gymnasium as gym
import torch

from rlrun.algos.normalize import MeanAll, identity
from rlrun.algos.ppo import PPO
from rlrun.config import ModelConfig

ALGOS = {"ppo": PPO}


def build_algo(
    cfg,
    model_cfg: ModelConfig,
    obs_space: gym.Space,
    action_space: gym.Space,
    num_envs: int,
    device: torch.device,
    mean_all: MeanAll = identity,
) -> PPO:
    return ALGOS[cfg.name](cfg, model_cfg, obs_space, action_space, num_envs, device, mean_all)
