"""Users' own networks (model._target_), built by Hydra's instantiate with the env's spaces passed in."""

from __future__ import annotations

import importlib
import os
import sys

import gymnasium as gym
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from torch import nn

from rlrun.config import ModelConfig
from rlrun.errors import UserError


def instantiate_network(cfg: ModelConfig, observation_space: gym.Space, action_space: gym.Space) -> nn.Module:
    """`cfg._target_(observation_space=..., action_space=..., **cfg.kwargs)`; modules in the working directory
    can be named, as for `python -m`. A target that cannot be imported or called is a UserError with one line."""
    target = cfg._target_
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    module, _, name = target.rpartition(".")
    try:  # here rather than in instantiate, whose message spans lines and guesses
        getattr(importlib.import_module(module), name) if module else importlib.import_module(name)
    except (ImportError, AttributeError) as e:
        raise UserError(
            f"model._target_={target}: cannot import it ({e}); give my_package.MyNet, a class in a "
            "module importable from the working directory or installed"
        ) from e
    try:
        net = instantiate(
            {"_target_": target, **cfg.kwargs}, observation_space=observation_space, action_space=action_space
        )
    except InstantiationException as e:
        cause = e.__cause__ or e
        raise UserError(
            f"model._target_={target}(observation_space, action_space, **model.kwargs) failed: "
            f"{type(cause).__name__}: {' '.join(str(cause).split())}"
        ) from e
    if not isinstance(net, nn.Module):
        raise UserError(f"model._target_={target} returned a {type(net).__name__}, not a torch.nn.Module")
    return net
