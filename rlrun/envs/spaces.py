"""Observations of every gymnasium space as the arrays rlrun's networks, rollouts and replays take: Discrete as a
one-hot, MultiDiscrete as concatenated one-hots, MultiBinary as floats, uint8 images in channel-first layout
(whatever layout the env uses; they stay bytes), Dict and Tuple as their keys' encodings concatenated into one
float32 vector (keys sorted, as gymnasium's Dict; a Tuple's as keys "0", "1", ...), image keys among them laid
flat in channel-first order, where the space (EncodedBox) says the networks find them to give each a CNN. Other
Box observations pass as they are: the MLPs flatten them. One wrapper, applied when an env is made, so every
collector, the evaluation and `rlrun play` see the same arrays."""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from rlrun.errors import UserError

ENCODED = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def is_image(space: gym.Space[Any]) -> bool:
    """uint8 with 3 axes: frames, channel-first [C, H, W] or channel-last [H, W, C]."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image's channels are its last axis: the last axis is a channel count (1, 3, 4: grey, RGB,
    RGBA) and the first is not (frame stacks are [k, H, W])."""
    return shape[-1] in (1, 3, 4) and shape[0] not in (1, 3, 4)


MASK_KEY = "action_mask"  # a Dict observation's key that holds the legal actions (PettingZoo's, torchrl's)


class EncodedBox(gym.spaces.Box):
    """Encoded observations [size] float32 with a layout the networks read. `mask_size`: where the env gives action
    masks, the last mask_size entries are the mask (1: legal), one per action (per component's action for
    MultiDiscrete, side by side). `images`: (offset, (C, H, W)) of each image key, laid flat in channel-first
    order, which gets a CNN of its own (SB3's CombinedExtractor). Being part of the observation vector, the mask
    and the images reach rollouts, replays and every collector with no change to them. `floats`: the entries that
    come from float Box keys, the only ones observation normalization rescales (not one-hots, bits, integer
    vectors, images or masks). `given`: for Dict and Tuple observations, the Dict space users' own networks
    (model._target_) receive them in (the kept keys, a Tuple's as "0", "1", ..., and the action_mask key where the
    env gives one), and `layout`, (key path, offset, space) of each leaf, from which they are rebuilt."""

    def __init__(
        self,
        size: int,
        mask_size: int = 0,
        images: tuple[tuple[int, tuple[int, int, int]], ...] = (),
        floats: tuple[tuple[int, int], ...] = (),
        given: gym.spaces.Dict | None = None,
        layout: tuple[tuple[str, int, gym.Space[Any]], ...] = (),
    ):
        super().__init__(-np.inf, np.inf, (size,), np.float32)
        self.mask_size = mask_size
        self.images = images
        self.floats = floats  # (start, end) of the float Box keys: what algo.normalize_obs rescales
        self.given = given
        self.layout = layout


def mask_size(space: gym.Space[Any]) -> int:
    """How many action-mask entries end the observations of `space` (0: none)."""
    return getattr(space, "mask_size", 0)


def _parts(space: gym.Space[Any], key: str, obs_keys: list[str] | None) -> list[tuple[str, gym.Space[Any]]]:
    """(key, space) of every leaf of a Dict/Tuple observation that is kept, keys as paths ('a.b', '0')."""
    if isinstance(space, gym.spaces.Tuple):
        space = gym.spaces.Dict({str(i): s for i, s in enumerate(space.spaces)})
    if not isinstance(space, gym.spaces.Dict):
        return [(key, space)]
    out = []
    for name, sub in space.spaces.items():
        path = f"{key}.{name}" if key else name
        if key == "" and (name == MASK_KEY or (obs_keys is not None and name not in obs_keys)):
            continue  # the mask goes last (EncodeObservation)
        out += _parts(sub, path, None)
    return out


def _size(space: gym.Space[Any]) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    return int(np.prod(space.shape))


def _encode(space: gym.Space[Any], value: Any) -> np.ndarray:
    """One leaf as a float32 vector."""
    if isinstance(space, gym.spaces.Discrete):
        out = np.zeros(space.n, np.float32)
        out[int(value) - int(space.start)] = 1.0
        return out
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec, index = space.nvec.ravel(), (np.asarray(value) - space.start).ravel()
        out = np.zeros(int(nvec.sum()), np.float32)
        out[np.concatenate(([0], np.cumsum(nvec)[:-1])) + index] = 1.0
        return out
    if is_image(space) and channels_last(space.shape):
        value = np.moveaxis(value, -1, 0)
    return np.asarray(value, np.float32).ravel()


def _is_float(space: gym.Space[Any]) -> bool:
    return isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating)


def _chw(shape: tuple[int, ...]) -> tuple[int, int, int]:
    return (shape[2], shape[0], shape[1]) if channels_last(shape) else tuple(shape)


def _leaf(value: Any, key: str) -> Any:  # the entry `key` (dotted: nested Dict and Tuple keys) of an observation
    for name in key.split(".") if key else []:
        value = value[int(name)] if isinstance(value, tuple) else value[name]
    return value


class EncodeObservation(gym.ObservationWrapper):
    """The env's observations as one array (the module's docstring says how each space is encoded)."""

    def __init__(self, env: gym.Env, env_id: str, obs_keys: list[str] | None):
        super().__init__(env)
        space = env.observation_space
        self.env_id, self.steps = env_id, 0
        self.parts = _parts(space, "", obs_keys)
        self.in_obs = isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces
        self.mask_size = _policy_size(env.action_space) if self.in_obs or hasattr(env.unwrapped, "action_masks") else 0
        self.transpose = len(self.parts) == 1 and is_image(space) and channels_last(space.shape) and not self.mask_size
        if self.transpose:
            h, w, c = space.shape
            self.observation_space = gym.spaces.Box(0, 255, (c, h, w), np.uint8)
        else:
            offsets = [int(o) for o in np.cumsum([0] + [_size(s) for _, s in self.parts])]
            images = tuple((o, _chw(s.shape)) for o, (_, s) in zip(offsets, self.parts) if is_image(s))
            floats = tuple((o, e) for o, e, (_, s) in zip(offsets, offsets[1:], self.parts) if _is_float(s))
            layout = tuple((k, o, s) for o, (k, s) in zip(offsets, self.parts))
            if self.in_obs:
                layout += ((MASK_KEY, offsets[-1], space.spaces[MASK_KEY]),)
            given = _given(space, obs_keys, self.in_obs)
            self.observation_space = EncodedBox(
                offsets[-1] + self.mask_size, self.mask_size, images, floats, given, layout if given else ()
            )

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.steps = 0
        return super().reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        self.steps += 1
        return super().step(action)

    def observation(self, observation: Any) -> np.ndarray:
        if self.transpose:
            return np.ascontiguousarray(np.moveaxis(observation, -1, 0))
        parts = [_encode(s, _leaf(observation, k)) for k, s in self.parts]
        if self.mask_size:
            mask = observation[MASK_KEY] if self.in_obs else self.env.unwrapped.action_masks()
            mask = np.asarray(mask, np.float32).ravel()
            if not mask.any():
                raise ValueError(f"{self.env_id} gave no legal action (an all-zero action mask) at step {self.steps}")
            parts.append(mask)
        return np.concatenate(parts)


def _given(space: gym.Space[Any], obs_keys: list[str] | None, with_mask: bool) -> gym.spaces.Dict | None:
    """The Dict of the kept keys of a Dict or Tuple observation (a Tuple's as "0", "1", ...), the action mask
    included where the observation holds it; None for other spaces."""
    if isinstance(space, gym.spaces.Tuple):
        space = gym.spaces.Dict({str(i): s for i, s in enumerate(space.spaces)})
    if not isinstance(space, gym.spaces.Dict):
        return None
    kept = {k: s for k, s in space.spaces.items() if obs_keys is None or k in obs_keys or (with_mask and k == MASK_KEY)}
    return gym.spaces.Dict(kept)


def _policy_size(space: gym.Space[Any]) -> int:
    """Mask entries for an action space: one per action, or per component's action side by side."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    raise UserError(f"action masks are for Discrete and MultiDiscrete actions, not {space}")


def needs_encoding(space: gym.Space[Any]) -> bool:
    """False for the arrays the networks take as they are: Box vectors, Box tensors, channel-first images."""
    if isinstance(space, gym.spaces.Box):
        return is_image(space) and channels_last(space.shape)
    return True


def check_observation_space(space: gym.Space[Any], env_id: str, obs_keys: list[str] | None) -> None:
    """UserError naming the first part of `space` that cannot be encoded (a Text mission, a Graph, a Sequence),
    or an env.obs_keys entry the observation does not have."""
    # The keys env.obs_keys picks from: a Dict's, or a Tuple's positions as '0', '1', ...
    top = dict(space.spaces) if isinstance(space, gym.spaces.Dict) else None
    if isinstance(space, gym.spaces.Tuple):
        top = {str(i): s for i, s in enumerate(space.spaces)}
    if obs_keys is not None and top is not None:
        missing = [k for k in obs_keys if k not in top]
        if missing:
            raise UserError(f"env.obs_keys: {env_id}'s observations have no key '{missing[0]}'; they have {list(top)}")
    for key, leaf in _parts(space, "", obs_keys):
        if not isinstance(leaf, ENCODED):
            where = f"key '{key}' ({type(leaf).__name__})" if key else f"space {type(leaf).__name__}"
            keep = [k for k, s in _parts(space, "", None) if isinstance(s, ENCODED) and "." not in k]
            drop = f"; drop it with env.obs_keys=[{','.join(keep)}]" if top is not None and keep else ""
            raise UserError(f"{env_id}'s observation {where} cannot be encoded for a network{drop}")
    if not _parts(space, "", obs_keys):
        raise UserError(f"env.obs_keys={obs_keys} keeps no part of {env_id}'s observations")


def encode_observations(env: gym.Env, env_id: str, obs_keys: list[str] | None) -> gym.Env:
    """`env` with its observations as the networks take them (unchanged for Box vectors and CHW images)."""
    space = env.observation_space
    if not needs_encoding(space) and obs_keys is None and not hasattr(env.unwrapped, "action_masks"):
        return env
    check_observation_space(space, env_id, obs_keys)
    return EncodeObservation(env, env_id, obs_keys)
