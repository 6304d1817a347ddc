"""Which backend steps a run's envs: env.vector.backend's, or for auto the one measured fastest for the env's family;
and which envs have a vectorized implementation of their own (the native backend: rlrun/envs/native.py)."""

from __future__ import annotations

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

from rlrun.config import AtariConfig, EnvConfig
from rlrun.errors import UserError

COVERS = "CartPole-v0 and -v1 (gymnasium's CartPoleVectorEnv) and ALE games (ale-py's AtariVectorEnv)"
ALE_ENTRY = "ale_py.env:AtariEnv"
# env.kwargs the ALE's vector env takes as the Python AtariEnv does; the others (mode, difficulty, obs_type) it lacks.
ALE_KWARGS = ("full_action_space", "max_num_frames_per_episode")


def native_kind(cfg: EnvConfig, atari: AtariConfig | None) -> str | None:
    """The kind, "cartpole" or "ale", when `cfg.id` has a vectorized implementation the native backend steps, else None.
    `atari`: cfg's Atari preprocessing (rlrun.envs.atari_config)."""
    spec = gym.spec(cfg.id)
    if atari is not None and spec.entry_point == ALE_ENTRY:
        return "ale"
    entry = spec.vector_entry_point
    creator = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    if creator is CartPoleVectorEnv:
        return "cartpole"
    return None


def check_native(cfg: EnvConfig, atari: AtariConfig | None) -> str:
    """The native implementation of `cfg`'s env ("cartpole" or "ale"); UserError when it has none, or when env.kwargs
    asks for what it does not take."""
    kind = native_kind(cfg, atari)
    if kind is None:
        raise UserError(
            f"env.vector.backend=native: {cfg.id} has no vectorized implementation; native steps {COVERS} "
            "(others: env.vector.backend=sync or subproc)"
        )
    other = unsupported_kwargs(kind, cfg)
    if other:
        raise UserError(
            f"env.vector.backend=native: ale-py's AtariVectorEnv does not take env.kwargs {other}; it takes "
            f"{', '.join(ALE_KWARGS)} (others: env.vector.backend=sync or subproc)"
        )
    return kind


def unsupported_kwargs(kind: str, cfg: EnvConfig) -> list[str]:
    """The keys of env.kwargs that the native implementation `kind` does not take."""
    return sorted(k for k in cfg.kwargs if kind == "ale" and k not in ALE_KWARGS)


# env.vector.backend=auto: per family of envs, from how many envs per rank, the backend measured fastest there (README,
# "Vector env backends", has the figures; bench/env_throughput.py measures them), and why. The first row that
# matches decides.
AUTO_BACKENDS = (
    (
        "cartpole as arrays",
        1,
        "sync",
        "in-process, where the accelerations step CartPoles as arrays: from 8 to 32 envs about native's speed while "
        "episodes are short, 1.4x once they are long, and each env keeps its own episodes",
    ),
    ("cartpole", 8, "native", "numpy steps all envs in one array; below 8 envs a Python step per env costs less"),
    # ale-py's AtariVectorEnv steps 1.3-1.8x as many frames per second, but PPO acting in forked workers collects as
    # fast as it double-buffered, and its episodes differ in small ways (rlrun/envs/native.py) that no full run has
    # yet compared: native stays a choice, not auto's.
    ("ale", 1, "subproc", "forked workers, where PPO acts too"),
    ("any", 1, "sync", "in the rank's process, the default"),
)


def choose_backend(cfg: EnvConfig, atari: AtariConfig | None, arrays: bool = False) -> tuple[str, str]:
    """The backend that steps `cfg`'s envs (of Atari preprocessing `atari`), and why: env.vector.backend's, or for auto
    the one AUTO_BACKENDS gives the env's family. An explicit native is checked (UserError when the env has none).
    `arrays`: whether the run's accelerations would step these envs as arrays in-process (rlrun/fast/__init__.py,
    cartpoles_as_arrays), which makes CartPole a family of its own for auto."""
    backend = cfg.vector.backend
    if backend == "native":
        return backend, f"{check_native(cfg, atari)}'s vectorized implementation"
    if backend != "auto":
        return backend, "env.vector.backend"
    family = native_kind(cfg, atari) or "any"
    if family == "cartpole" and arrays:
        family = "cartpole as arrays"
    for name, envs, chosen, why in AUTO_BACKENDS:
        takes = chosen != "native" or not unsupported_kwargs(family, cfg)
        if name in (family, "any") and cfg.num_envs >= envs and takes:
            return chosen, why
    raise AssertionError("AUTO_BACKENDS ends with a row every env matches")
