"""The algorithms by config name: the one place an algorithm is registered. A new algorithm is one module here (a
class implementing protocol.Algorithm), its schema in configs.py, its entry below and one yaml in conf/algo/.
Nothing here imports torch: composing a config reads the registry, and an algorithm's module is imported only
when a run builds it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlrun.algos.configs import A2CConfig, DQNConfig, PPOConfig, ReplayConfig, SACConfig, TD3Config
from rlrun.config import ModelConfig

__all__ = [
    "ALGORITHMS",
    "A2CConfig",
    "DQNConfig",
    "Entry",
    "PPOConfig",
    "ReplayConfig",
    "SACConfig",
    "TD3Config",
    "build_algo",
]


@dataclass(frozen=True)
class Entry:
    """An algorithm in the registry: its config schema (conf/algo/NAME.yaml is checked against it) and how to
    build it: a class, or "module:Class" imported when a run builds one. `actions` says which action spaces it
    takes, "discrete", "continuous" or "policy" (rlrun.envs.check_action_space; the config check builds an env to
    see), or None for any. `network` (its
    config section, the model config, observation space, action space) builds its network, which the config check
    does for a user's network (model._target_) to check it before a run starts; an algorithm without one takes no
    user network."""

    schema: type
    build: Callable[..., Any] | str
    network: Callable[..., Any] | None = None
    actions: str | None = None

    def algorithm(self) -> Callable[..., Any]:
        if not isinstance(self.build, str):
            return self.build
        module, name = self.build.split(":")
        return getattr(importlib.import_module(module), name)


def actor_critic(cfg, model_cfg: ModelConfig, obs_space, action_space):
    from rlrun.models import build_actor_critic

    return build_actor_critic(model_cfg, obs_space, action_space)


def q_network(cfg, model_cfg: ModelConfig, obs_space, action_space):
    from rlrun.models.q_network import build_q_network

    return build_q_network(model_cfg, obs_space, action_space, cfg.dueling)


ALGORITHMS: dict[str, Entry] = {
    "ppo": Entry(PPOConfig, "rlrun.algos.ppo:PPO", actor_critic, actions="policy"),
    "a2c": Entry(A2CConfig, "rlrun.algos.a2c:A2C", actor_critic, actions="policy"),
    "dqn": Entry(DQNConfig, "rlrun.algos.dqn:DQN", q_network, actions="discrete"),
    "sac": Entry(SACConfig, "rlrun.algos.sac:SAC", actions="continuous"),
    "td3": Entry(TD3Config, "rlrun.algos.td3:TD3", actions="continuous"),
}


def build_algo(cfg, model_cfg: ModelConfig, spec, device, reductions=None):
    """The algorithm named by cfg.name (a protocol.Algorithm), for envs of `spec` (protocol.EnvSpec), on `device`,
    reaching other ranks through `reductions` (protocol.Reductions; none: one process)."""
    from rlrun.algos.protocol import Reductions

    return ALGORITHMS[cfg.name].algorithm()(cfg, model_cfg, spec, device, reductions or Reductions())
