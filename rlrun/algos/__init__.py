"""The algorithms by config name: the one place an algorithm is registered. A new algorithm is one module here
(its schema with a validate method, and a class implementing protocol.Algorithm), its entry below and one yaml
in conf/algo/."""

from __future__ import annotations

import torch

from rlrun.algos.dqn import DQN, DQNConfig
from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import Algorithm, Entry, EnvSpec, Reductions
from rlrun.config import ModelConfig

ALGORITHMS: dict[str, Entry] = {
    "ppo": Entry(PPOConfig, PPO),
    "dqn": Entry(DQNConfig, DQN, discrete_actions=True),
}


def build_algo(
    cfg, model_cfg: ModelConfig, spec: EnvSpec, device: torch.device, reductions: Reductions | None = None
) -> Algorithm:
    """The algorithm named by cfg.name, for envs of `spec`, on `device`, reaching other ranks through
    `reductions` (none: one process)."""
    return ALGORITHMS[cfg.name].build(cfg, model_cfg, spec, device, reductions or Reductions())
