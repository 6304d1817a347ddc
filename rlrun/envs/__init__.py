"""Environments from config: one gymnasium env with its wrappers (make_env), and the batch of them a rank
steps (make_vector_env). Swapping the vector env implementation happens here and nowhere else."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlrun.config import AtariConfig, EnvConfig
from rlrun.envs.atari import AtariFrames, EpisodicLife, FireReset, needs_fire, sign_reward
from rlrun.envs.backends import choose_backend
from rlrun.envs.masked import register_envs
from rlrun.envs.spaces import encode_observations
from rlrun.errors import UserError

log = logging.getLogger("rlrun")

if TYPE_CHECKING:
    from rlrun.envs.native import NativeEnvs
    from rlrun.envs.pool import WorkerPool
    from rlrun.envs.ray_envs import RayEnvs
    from rlrun.envs.sync import SyncEnvs


def __getattr__(name: str) -> type:
    """SyncEnvs and WorkerPool, imported on first use: they need torch, which the config checks (which use this
    module's env ids and spaces) must not import."""
    if name == "SyncEnvs":
        from rlrun.envs.sync import SyncEnvs

        return SyncEnvs
    if name == "WorkerPool":
        from rlrun.envs.pool import WorkerPool

        return WorkerPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_envs()


def _register_ale() -> None:
    try:
        import ale_py
    except ImportError as e:
        raise UserError("ALE games need the atari extra: pip install 'rlrun[atari]'") from e
    gym.register_envs(ale_py)


def import_env_modules(modules: list[str]) -> None:
    """Import the modules named in env.imports, which register users' own envs (gym.register). Modules in
    the working directory count, as they do for `python -m`."""
    if modules and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise UserError(f"env.imports: cannot import '{name}': {e}") from e


# Env ids that packages register when imported: (id prefix, module to import, what to pip install).
KNOWN_PACKAGES = (
    ("MiniGrid-", "minigrid", "minigrid"),
    ("BabyAI-", "minigrid", "minigrid"),
    ("MiniWorld-", "miniworld", "miniworld"),
    ("highway-", "highway_env", "highway-env"),
    ("merge-", "highway_env", "highway-env"),
    ("roundabout-", "highway_env", "highway-env"),
    ("parking-", "highway_env", "highway-env"),
    ("intersection-", "highway_env", "highway-env"),
    ("racetrack-", "highway_env", "highway-env"),
    ("Panda", "panda_gym", "panda-gym"),
    ("Fetch", "gymnasium_robotics", "gymnasium-robotics"),
    ("PointMaze", "gymnasium_robotics", "gymnasium-robotics"),
    ("AntMaze", "gymnasium_robotics", "gymnasium-robotics"),
    ("Adroit", "gymnasium_robotics", "gymnasium-robotics"),
    ("MinAtar/", "minatar", "minatar"),
    ("Craftax", "craftax", "craftax"),
)


def _package_hint(env_id: str) -> str | None:
    """What to install or import for an id a known package registers."""
    for prefix, module, package in KNOWN_PACKAGES:
        if env_id.startswith(prefix):
            if importlib.util.find_spec(module) is None:
                return f"it is registered by the {package} package: pip install {package}, add env.imports=[{module}]"
            return f"it is registered by the {module} module: add env.imports=[{module}]"
    return None


def check_env_id(env_id: str) -> None:
    """Raise UserError naming close matches, or the package that registers it, when gymnasium does not know
    `env_id`."""
    if env_id.startswith("ALE/"):
        _register_ale()
    if env_id in gym.registry:
        return
    hint = _package_hint(env_id)
    if hint is not None:
        raise UserError(f"unknown env id '{env_id}': {hint}")
    close = close_env_ids(env_id, list(gym.registry))
    hint = f"; did you mean {', '.join(close)}?" if close else " (gymnasium ids look like CartPole-v1, ALE/Pong-v5)"
    raise UserError(f"unknown env id '{env_id}'{hint}")


def close_env_ids(env_id: str, ids: list[str]) -> list[str]:
    """Up to 3 registered ids whose names (without the version, in any case) are close to env_id's, each at the
    version asked for where it has one, else its newest. Matching whole ids let the shared `-v0` outweigh the name
    (Nope-v0 came out as Gopher-v0, Hopper-v5)."""
    versions: dict[str, dict[str, int]] = {}  # lowercased name -> {id: version}
    for registered in ids:
        name, version = _name_version(registered)
        versions.setdefault(name.lower(), {})[registered] = version
    name, version = _name_version(env_id)
    close = difflib.get_close_matches(name.lower(), list(versions), n=3, cutoff=0.75)
    return [_at_version(versions[c], version) for c in close]


def _name_version(env_id: str) -> tuple[str, int]:
    match = re.fullmatch(r"(.*)-v(\d+)", env_id)
    return (match.group(1), int(match.group(2))) if match else (env_id, -1)


def _at_version(ids: dict[str, int], version: int) -> str:
    asked = [i for i, v in ids.items() if v == version]
    return asked[0] if asked else max(ids, key=lambda i: ids[i])


def env_spaces(cfg: EnvConfig, checker_warnings: list[str] | None = None) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """(observation space, action space) of one configured env, as the algorithm sees it (wrappers applied). Given
    a list, the env also goes through gymnasium's passive env checker (built, reset and stepped once), and the list
    gets each of its warnings as one line; an API violation it asserts is a UserError."""
    import_env_modules(cfg.imports)
    if checker_warnings is None:
        env = make_env(cfg, train=False)()
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                env = make_env(cfg, train=False, check=True)()
                obs, _ = env.reset(seed=0)
                env.step(_legal_sample(env, obs))
            except AssertionError as e:
                raise UserError(f"env {cfg.id} fails gymnasium's env checker: {str(e).splitlines()[0]}") from e
        for w in caught:  # gymnasium's logger.warn: "WARN: ..." in terminal colours; the env's own warnings recur
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(w.message)).strip()
            line = f"env {cfg.id}: gymnasium's env checker: {text.removeprefix('WARN: ')}"
            if text.startswith("WARN: ") and line not in checker_warnings:
                checker_warnings.append(line)
    spaces = env.observation_space, env.action_space
    env.close()
    return spaces


def _legal_sample(env: gym.Env, obs: np.ndarray) -> Any:
    """A random action of `env`, a legal one where its observations end with action masks (an env may raise on an
    illegal action, as a board game does)."""
    size, space = getattr(env.observation_space, "mask_size", 0), env.action_space
    if not size:
        return space.sample()
    mask = np.asarray(obs[-size:], np.int8)
    if isinstance(space, gym.spaces.Discrete):
        return space.sample(mask=mask)
    return space.sample(mask=tuple(np.split(mask, np.cumsum(space.nvec.ravel())[:-1])))


def third_party(env_id: str) -> bool:
    """Whether the env comes from outside gymnasium's own envs, ale-py and rlrun (which rlrun's tests run): a user's
    or another package's, which the pre-flight puts through gymnasium's env checker once."""
    entry = gym.spec(env_id).entry_point
    module = entry.split(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")
    return not module.startswith(("gymnasium.envs.", "ale_py", "rlrun."))


def check_action_space(space: gym.Space[Any], kind: str, env_id: str, algo: str) -> None:
    """Raise UserError when the env's action space is not of the `kind` the algorithm takes: "discrete" (Discrete:
    value-based algorithms), "continuous" (a 1-D Box with finite bounds: SAC and TD3 scale actions to them) or
    "policy" (Discrete, a 1-D Box, MultiDiscrete or MultiBinary: policy gradients, one distribution for each)."""
    if kind == "discrete" and not isinstance(space, gym.spaces.Discrete):
        raise UserError(f"algo={algo} needs a discrete action space (Discrete); {env_id} has {space}")
    if kind == "policy":
        box = isinstance(space, gym.spaces.Box) and len(space.shape) == 1
        multi = isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)) and len(space.shape) == 1
        if not (box or multi or isinstance(space, gym.spaces.Discrete)):
            raise UserError(
                f"algo={algo} takes Discrete, Box, MultiDiscrete or MultiBinary actions (1-D); {env_id} has {space}"
            )
    if kind != "continuous":
        return
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise UserError(f"algo={algo} needs a continuous action space (a 1-D Box); {env_id} has {space}")
    if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        raise UserError(f"algo={algo} scales actions to the env's bounds, so they must be finite; {env_id} has {space}")


def atari_config(cfg: EnvConfig) -> AtariConfig | None:
    if cfg.atari is not None:
        return cfg.atari
    return AtariConfig() if cfg.id.startswith("ALE/") else None


def frame_stack(cfg: EnvConfig) -> int:
    """Frames stacked along the first axis of each observation (1 when observations are not stacks)."""
    atari = atari_config(cfg)
    return atari.frame_stack if atari is not None else 1


def _route_mujoco_warnings(env_id: str) -> None:
    """For gymnasium's MuJoCo envs: MuJoCo's warnings go to rlrun's log instead of stderr and a MUJOCO_LOG.TXT in the
    working directory (MuJoCo's default), deprecation notices at debug level (MuJoCo 3.17+ flags half_cheetah.xml's
    settotalmass at every env built)."""
    spec = gym.spec(env_id)
    if isinstance(spec.entry_point, str) and spec.entry_point.startswith("gymnasium.envs.mujoco"):
        try:
            import mujoco
        except ImportError as e:
            raise UserError(f"env {env_id} needs MuJoCo: pip install 'rlrun[mujoco]' ({e})") from e
        mujoco.set_mju_user_warning(_mujoco_warning)


def _mujoco_warning(message: str) -> None:
    log.log(logging.DEBUG if "deprecated" in message else logging.WARNING, "mujoco: %s", message)


class ClipToBounds(gym.ActionWrapper):
    """Continuous actions clipped to the env's bounds (a Gaussian policy's samples fall outside them). Unlike
    gymnasium's ClipAction, the action space keeps its bounds: SAC and TD3 scale their actions to them."""

    def action(self, action: np.ndarray) -> np.ndarray:
        return np.clip(action, self.action_space.low, self.action_space.high)


_OUR_KWARGS = ("disable_env_checker", "frameskip", "repeat_action_probability", "render_mode")  # make_env's own


def _gym_make(env_id: str | gym.envs.registration.EnvSpec, kwargs: dict[str, Any], **options: Any) -> gym.Env:
    """gym.make, with the two mistakes a user can fix said in one line: env.kwargs the constructor does not take,
    and a package the env needs. Any other exception is the env's own and keeps its traceback."""
    try:
        return gym.make(env_id, **options, **kwargs)
    except gym.error.DependencyNotInstalled as e:
        extra = " (pip install 'rlrun[envs]')" if "box2d" in str(e).lower() else ""
        raise UserError(f"env {_name(env_id)} needs a package that is not installed: {e}{extra}") from e
    except TypeError as e:
        if kwargs and "unexpected keyword argument" in str(e):
            theirs = {k: v for k, v in kwargs.items() if k not in _OUR_KWARGS}  # what the user's env.kwargs gave
            raise UserError(f"cannot make env {_name(env_id)} with env.kwargs={theirs}: {e}") from e
        raise


def _name(env_id: str | gym.envs.registration.EnvSpec) -> str:
    return f"'{env_id.id if isinstance(env_id, gym.envs.registration.EnvSpec) else env_id}'"


def make_env(
    cfg: EnvConfig, train: bool, render_mode: str | None = None, seed: int | None = None, check: bool = False
) -> Callable[[], gym.Env]:
    """A thunk building one env. `train` turns on the training-only Atari wrappers (life loss, reward clip).
    `seed`, when known, is the seed of the env's first reset: ALE games take it while they are made, so that reset
    need not load the game a second time (rlrun/envs/atari_seeded.py). `check` keeps gymnasium's passive env
    checker, which the pre-flight runs once (env_spaces); every env a run steps goes without it, so its warnings
    are not repeated by every env of every rank.

    RecordEpisodeStatistics sits below them, so logged returns are raw game scores over whole games. For ALE
    games the time limit (env.max_episode_steps, in agent steps) sits on the preprocessing, which makes each
    agent step frame_skip emulator frames, and below the statistics, which must see the truncation.
    """
    atari = atari_config(cfg)
    if atari is not None:
        _register_ale()

    def thunk() -> gym.Env:
        _route_mujoco_warnings(cfg.id)
        kwargs = dict(cfg.kwargs)
        options = {"disable_env_checker": not check}
        if atari is not None:
            kwargs.update(frameskip=1, repeat_action_probability=atari.repeat_action_probability)
        if render_mode is not None:  # not passed otherwise: users' envs need not accept it
            kwargs["render_mode"] = render_mode
        if atari is None:
            env = gym.wrappers.RecordEpisodeStatistics(
                _gym_make(cfg.id, kwargs, max_episode_steps=cfg.max_episode_steps, **options)
            )
            env = encode_observations(env, cfg.id, cfg.obs_keys)
        else:
            from rlrun.envs.atari_seeded import seeded_spec

            env = AtariFrames(
                _gym_make(cfg.id if seed is None else seeded_spec(cfg.id, seed), kwargs, **options),
                noop_max=atari.noop_max,
                frame_skip=atari.frame_skip,
                screen_size=atari.screen_size,
            )
            if cfg.max_episode_steps is not None:
                env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
            env = gym.wrappers.RecordEpisodeStatistics(env)
            if train and atari.terminal_on_life_loss:
                env = EpisodicLife(env)
            if needs_fire(env):
                env = FireReset(env)
            if train and atari.clip_reward:
                env = gym.wrappers.TransformReward(env, sign_reward)
            env = gym.wrappers.FrameStackObservation(env, atari.frame_stack)
        if isinstance(env.action_space, gym.spaces.Box):
            env = ClipToBounds(env)
        return env

    return thunk


def make_vector_env(
    cfg: EnvConfig, num_envs: int, train: bool = True, seeds: list[int] | None = None, arrays: bool = False
) -> SyncEnvs | WorkerPool | RayEnvs | NativeEnvs:
    """`num_envs` copies of the configured env, in-process (backend sync), in forked workers (subproc), in Ray
    actors (ray), or in the env's own vectorized implementation (native); auto picks one (vector_backend).
    `seeds`: those of the first reset, when known (make_env says why); `arrays`: as vector_backend's.
    Autoreset happens in the same step (the final observation of a finished episode is in
    info["final_obs"]), so every transition in a rollout is a real one."""
    from rlrun.envs.pool import WorkerPool
    from rlrun.envs.sync import SyncEnvs

    import_env_modules(cfg.imports)
    check_env_id(cfg.id)
    backend, _ = vector_backend(cfg, arrays)
    if backend == "native":
        from rlrun.envs.native import make_native

        return make_native(cfg, atari_config(cfg), num_envs, train)
    fns = [make_env(cfg, train, seed=s) for s in seeds or [None] * num_envs]
    v = cfg.vector
    groups = 2 if v.double_buffer and train else 1
    role = "env worker" if train else "eval env worker"
    if backend == "ray":
        from rlrun.envs.ray_envs import RayEnvs

        return RayEnvs(cfg, num_envs, train, groups, role, lazy=not train, seeds=seeds)
    if backend == "subproc":
        workers = max(v.num_workers or min(num_envs, os.cpu_count() or 1), groups)
        return WorkerPool(fns, workers, v.step_timeout_s, groups, role, lazy=not train, check_finite=cfg.check_finite)
    return SyncEnvs(fns, cfg.check_finite)


def vector_backend(cfg: EnvConfig, arrays: bool = False) -> tuple[str, str]:
    """The backend that steps `cfg`'s envs, and why (rlrun/envs/backends.py: auto's table, native's envs). `arrays`:
    whether the run's accelerations would step them as arrays in-process (auto weighs it for CartPole)."""
    atari = atari_config(cfg)
    if atari is not None:
        _register_ale()
    return choose_backend(cfg, atari, arrays)


def env_seeds(seed: int, rank: int, num_envs: int, stream: int = 0) -> list[int]:
    """Distinct seeds per (seed, rank, stream, env): training envs use stream 0, evaluation stream 1."""
    return [int(s) for s in np.random.SeedSequence([seed, rank, stream]).generate_state(num_envs)]
