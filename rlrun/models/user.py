"""Users' own networks (model._target_): they receive Dict and Tuple observations as the env gives them (a dict of
tensors), rebuilt from the encoded vector rlrun's collectors carry; and they are checked once, when built, against
what the algorithm reads from their forward: a mismatch is one line at start-up, not a shape error inside the first
update."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlrun.config import ModelConfig
from rlrun.errors import UserError
from rlrun.models.encoders import observation_dtype


def instantiate_network(cfg: ModelConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> nn.Module:
    """`cfg._target_(observation_space=..., action_space=..., **cfg.kwargs)`, as Hydra's instantiate calls a target
    (the kwargs as plain values); modules in the working directory can be named, as for `python -m`. A target that
    cannot be imported or called, or that gives no torch module, is a UserError with one line."""
    target = str(cfg._target_)
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    module, _, name = target.rpartition(".")
    try:
        make: Any = getattr(importlib.import_module(module), name) if module else importlib.import_module(name)
    except (ImportError, AttributeError) as e:
        raise UserError(
            f"model._target_={target}: cannot import it ({e}); give my_package.MyNet, a class in a "
            "module importable from the working directory or installed"
        ) from e
    try:
        net = make(observation_space=observation_space, action_space=action_space, **cfg.kwargs)
    except Exception as e:  # the user's constructor: whatever it raises is theirs to read, in one line
        raise UserError(
            f"model._target_={target}(observation_space, action_space, **model.kwargs) failed: "
            f"{type(e).__name__}: {' '.join(str(e).split())}"
        ) from e
    if not isinstance(net, nn.Module):
        raise UserError(f"model._target_={target} returned a {type(net).__name__}, not a torch.nn.Module")
    return net


def given_space(obs_space: gym.Space[Any]) -> gym.Space[Any]:
    """The observation space a user's network is built with and reads: the env's Dict (or Tuple, as a Dict with
    keys "0", "1", ...) where rlrun encodes one (rlrun.envs.spaces.EncodedBox's `given`), else `obs_space`."""
    return getattr(obs_space, "given", None) or obs_space


def _torch_dtype(space: gym.Space[Any]) -> torch.dtype:
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return torch.int64
    if np.issubdtype(space.dtype, np.floating):
        return torch.float32  # what nn.Linear computes in, whatever float width the env uses
    return torch.from_numpy(np.zeros(0, space.dtype)).dtype


def _leaf(x: Tensor, space: gym.Space[Any]) -> Tensor:
    """One leaf of encoded observations x [..., size] as the env gives it (indices for Discrete and MultiDiscrete,
    images in the env's own layout, the space's shape and dtype)."""
    lead = x.shape[:-1]
    if isinstance(space, gym.spaces.Discrete):
        return x.argmax(-1) + int(space.start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        sizes = [int(n) for n in space.nvec.ravel()]
        index = torch.stack([part.argmax(-1) for part in torch.split(x, sizes, -1)], -1)
        return (index + torch.as_tensor(space.start.ravel(), device=x.device)).reshape(*lead, *space.shape)
    shape = tuple(space.shape)
    if len(shape) == 3 and space.dtype == np.uint8 and shape[-1] in (1, 3, 4) and shape[0] not in (1, 3, 4):
        # an image key lies channel-first in the encoded vector (rlrun.envs.spaces): back to the env's [H, W, C]
        return x.reshape(*lead, shape[2], shape[0], shape[1]).movedim(-3, -1).to(torch.uint8)
    return x.reshape(*lead, *shape).to(_torch_dtype(space))


class AsGiven:
    """Encoded observations [..., size] back into the dict of tensors the env gives (nested Dicts as nested dicts),
    for users' own networks; identity for observations rlrun passes as they are (Box, frames)."""

    def __init__(self, obs_space: gym.Space[Any]):
        self.layout = tuple(getattr(obs_space, "layout", ()))  # EncodedBox's, for Dict and Tuple observations

    def __bool__(self) -> bool:
        return bool(self.layout)

    def __call__(self, obs: Tensor) -> Tensor | dict[str, Any]:
        if not self.layout:
            return obs
        out: dict[str, Any] = {}
        for key, offset, space in self.layout:
            size = int(space.nvec.sum()) if isinstance(space, gym.spaces.MultiDiscrete) else _flat_size(space)
            *parents, name = key.split(".")
            node = out
            for parent in parents:
                node = node.setdefault(parent, {})
            node[name] = _leaf(obs[..., offset : offset + size], space)
        return out


def _flat_size(space: gym.Space[Any]) -> int:
    return int(space.n) if isinstance(space, gym.spaces.Discrete) else int(np.prod(space.shape))


def _describe(obs: Tensor | dict[str, Any]) -> str:
    """obs [2, 4] float32, or {'direction': [2] int64, 'image': [2, 7, 7, 3] uint8}, for error lines."""
    if isinstance(obs, Tensor):
        return f"{list(obs.shape)} {obs.dtype}"
    return "{" + ", ".join(f"'{k}': {_describe(v)}" for k, v in obs.items()) + "}"


def check_outputs(net: nn.Module, target: str, obs_space: gym.Space[Any], expected: dict[str, tuple[int, ...]]) -> None:
    """Run `net` (rlrun's wrapper of the user's network, which hands it the observation as the env gives it) on a
    batch of 2 sample observations (eval mode, no gradient) and check it returns tensors of the `expected` shapes
    ({name: shape}, in order; one name: a tensor, several: a tuple)."""
    obs = np.stack([obs_space.sample() for _ in range(2)])
    x = torch.as_tensor(obs, dtype=observation_dtype(obs_space.shape, obs_space.dtype))
    decode = AsGiven(obs_space)
    typed = _describe(decode(x)) if decode else f"{list(x.shape)} {x.dtype}"  # what the network gets
    shape = typed if decode else str(list(x.shape))
    wanted = ", ".join(f"{name} {list(shape)}" for name, shape in expected.items())
    if len(expected) > 1:
        wanted = f"({wanted})"
    training = net.training
    try:
        with torch.no_grad():
            out = net.eval()(x)
    except Exception as e:
        raise UserError(
            f"model._target_={target}: forward(obs {typed}) failed: {type(e).__name__}: {' '.join(str(e).split())}"
        ) from e
    finally:
        net.train(training)
    got = (out,) if isinstance(out, Tensor) else tuple(out) if isinstance(out, (tuple, list)) else (out,)
    shapes = [tuple(o.shape) if isinstance(o, Tensor) else type(o).__name__ for o in got]
    if shapes != list(expected.values()):
        described = ", ".join(str(list(s)) if isinstance(s, tuple) else s for s in shapes)
        raise UserError(
            f"model._target_={target}: forward(obs {shape}) must return {wanted} for this "
            f"env and algorithm; it returned {described}"
        )
