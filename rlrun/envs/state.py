"""Env state as plain data, so a resumed run continues its episodes exactly where the checkpoint left them.

Captured per wrapper layer: attributes holding numbers, strings, numpy arrays, numpy RNGs and deques/lists
of those; the emulator state for ALE games. Only envs whose whole state lives in such attributes are
restorable (classic control and ALE); others resume with fresh episodes, which `restorable` tells.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
import torch

_SCALARS = (bool, int, float, str, type(None))


# The envs whose whole state this module captures: classic control's, ale-py's AtariEnv, and rlrun's AtariEnv that
# takes its seed while it loads (rlrun/envs/atari_seeded.py: training makes ALE games so; its one attribute is a seed).
_RESTORABLE = ("gymnasium.envs.classic_control", "ale_py", "rlrun.envs.atari_seeded")


def restorable(env: gym.Env) -> bool:
    return type(env.unwrapped).__module__.startswith(_RESTORABLE)


def _encode(value: Any) -> Any:
    """Plain-data form of `value`, or None when it is not state we know how to carry."""
    if isinstance(value, np.generic):  # before the scalars: np.float64 is also a float
        return {"v": value.item()}
    if isinstance(value, _SCALARS):
        return {"v": value}
    if isinstance(value, np.ndarray) and value.dtype != object:
        return {"array": torch.from_numpy(value.copy())}
    if isinstance(value, np.random.Generator):
        return {"rng": value.bit_generator.state}
    if isinstance(value, (deque, list)) and all(isinstance(x, (np.ndarray, *_SCALARS)) for x in value):
        return {"seq": [_plain(x) for x in value]}
    return None


def _plain(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x.copy())
    return x.item() if isinstance(x, np.generic) else x


def _decode_into(obj: Any, name: str, enc: dict[str, Any]) -> None:
    current = getattr(obj, name)
    if "rng" in enc:
        if not isinstance(current, np.random.Generator):  # created lazily by the first reset
            current = np.random.Generator(getattr(np.random, enc["rng"]["bit_generator"])())
            setattr(obj, name, current)
        current.bit_generator.state = enc["rng"]
    elif "array" in enc:
        setattr(obj, name, enc["array"].numpy().copy())
    elif "seq" in enc:
        items = [x.numpy().copy() if isinstance(x, torch.Tensor) else x for x in enc["seq"]]
        if isinstance(current, deque):
            current.clear()
            current.extend(items)
        else:
            setattr(obj, name, items)
    else:
        value = enc["v"]
        setattr(obj, name, type(current)(value) if isinstance(current, np.generic) else value)


def wrapper_layers(env: gym.Env) -> list[Any]:
    """`env` and each env it wraps, outermost first."""
    layers = [env]
    while hasattr(layers[-1], "env"):
        layers.append(layers[-1].env)
    return layers


def _layer_state(layer: Any) -> dict[str, Any]:
    state = {}
    for name, value in vars(layer).items():
        enc = _encode(value)
        if enc is not None:
            state[name] = enc
    ale = vars(layer).get("ale")
    if ale is not None:
        raw = ale.cloneState(include_rng=True).serialize()
        state["__ale__"] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return state


def _load_layer(layer: Any, state: dict[str, Any]) -> None:
    for name, enc in state.items():
        if name == "__ale__":
            import ale_py

            layer.ale.restoreState(ale_py.ALEState(bytes(enc.numpy().tobytes())))
        elif hasattr(layer, name):
            _decode_into(layer, name, enc)


def env_state(env: gym.Env) -> list[Any] | None:
    """Plain-data state of every wrapper layer of `env`, or None when it is not restorable."""
    return [_layer_state(layer) for layer in wrapper_layers(env)] if restorable(env) else None


def load_env_state(env: gym.Env, state: list[Any]) -> None:
    """Overwrite the state of `env` (built from the same config, already reset) with a saved one."""
    for layer, layer_state in zip(wrapper_layers(env), state, strict=True):
        _load_layer(layer, layer_state)
