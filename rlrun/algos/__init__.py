"""Algorithms by config name. A new algorithm is one module here, its case in build_algo, its schema in
rlrun/config.py and one yaml in conf/algo/."""

from __future__ import annotations

import gymnasium as gym
import torch

from rlrun.algos.dqn import DQN
from rlrun.algos.normalize import MeanAll, identity
from rlrun.algos.ppo import PPO
from rlrun.buffers.replay import ONE_SHARD, Shards
from rlrun.config import ModelConfig


def build_algo(
    cfg,
    model_cfg: ModelConfig,
    obs_space: gym.Space,
    action_space: gym.Space,
    num_envs: int,
    device: torch.device,
    mean_all: MeanAll = identity,
    shards: Shards = ONE_SHARD,
    frame_stack: int = 1,
) -> PPO | DQN:
    """The algorithm named by cfg.name. On-policy ones average statistics with `mean_all`; off-policy ones
    keep a replay shard (`shards`: this rank's index and a gather over ranks; `frame_stack`: frames per
    observation, stored once)."""
    if cfg.name == "dqn":
        return DQN(cfg, model_cfg, obs_space, action_space, num_envs, device, shards, frame_stack)
    return PPO(cfg, model_cfg, obs_space, action_space, num_envs, device, mean_all)
