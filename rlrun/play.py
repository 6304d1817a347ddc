"""`rlrun play`: rebuild env and agent from a checkpoint, run episodes, print a table of returns."""

from __future__ import annotations

import io
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from rlrun.algos import build_algo
from rlrun.algos.protocol import EnvSpec
from rlrun.config import EnvConfig, PlayConfig, TrainConfig
from rlrun.distributed import resolve_device
from rlrun.envs import check_env_id, env_seeds, env_spaces, import_env_modules, make_env
from rlrun.envs.sync import SyncEnvs
from rlrun.errors import Interrupted, UserError
from rlrun.evaluation import run_episodes
from rlrun.seeding import PLAY, torch_seed
from rlrun.training.signals import StopSignal

log = logging.getLogger("rlrun")


def _video_env(thunk: Callable[[], gym.Env], folder: Path, episodes: int) -> Callable[[], gym.Env]:
    try:
        import moviepy  # noqa: F401
    except ImportError as e:
        raise UserError("video=true needs the video extra: pip install 'rlrun[video]'") from e

    def wrapped() -> gym.Env:
        # Only the episodes played: the reset after the last one starts an episode that no step follows, which
        # would be a one-frame video.
        return gym.wrappers.RecordVideo(
            thunk(), str(folder), episode_trigger=lambda i: i < episodes, disable_logger=True
        )

    return wrapped


def _quiet_sdl() -> None:
    """pygame (which classic-control envs render with) initializes SDL's sound too, which play never uses; without
    a sound server SDL prints 'XDG_RUNTIME_DIR is invalid or not set'. A user's own SDL settings stay."""
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def play_env(cfg: PlayConfig, trained: EnvConfig) -> EnvConfig:
    """The env to play: the checkpoint's, or with env.id another one whose spaces are the same (the agent's
    network takes those); raises UserError naming the difference otherwise."""
    import_env_modules(trained.imports)
    check_env_id(trained.id)
    if cfg.env.id is None or cfg.env.id == trained.id:
        return trained
    check_env_id(cfg.env.id)
    other = replace(trained, id=cfg.env.id)
    (obs, actions), (other_obs, other_actions) = env_spaces(trained), env_spaces(other)
    if obs != other_obs or actions != other_actions:
        raise UserError(
            f"env.id={cfg.env.id}: its spaces differ from those of {trained.id}, which the agent was trained on "
            f"(as the agent takes them, after rlrun's wrappers: observations {_space(other_obs)} vs {_space(obs)}, "
            f"actions {_space(other_actions)} vs {_space(actions)})"
        )
    return other


def _space(space: gym.Space[Any]) -> str:
    """A space in a few words: a Box's shape and dtype (its bounds can be long), others as they print."""
    return f"Box{space.shape} {space.dtype}" if isinstance(space, gym.spaces.Box) else str(space)


def play(cfg: PlayConfig, train_cfg: TrainConfig, state: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Run cfg.episodes episodes of the checkpointed agent; returns returns/lengths and prints a table (into the
    play folder's play.log too)."""
    torch.set_num_threads(1)
    _quiet_sdl()
    env_cfg = play_env(cfg, train_cfg.env)
    render_mode = "human" if cfg.render else "rgb_array" if cfg.video else None
    thunk = make_env(env_cfg, train=False, render_mode=render_mode)
    if cfg.video:
        thunk = _video_env(thunk, run_dir / "videos", cfg.episodes)
    envs = SyncEnvs([thunk], check_finite=False)  # plays what the env gives, as gymnasium's SyncVectorEnv did
    try:
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space)
        algo = build_algo(train_cfg.algo, train_cfg.model, spec, resolve_device(cfg.device))
        algo.load_state_dict(state["algo"])
        seed = cfg.seed if cfg.seed is not None else train_cfg.seed
        torch.manual_seed(torch_seed(seed, 0, PLAY))  # the same seed plays the same episodes, sampled actions too
        act = lambda o, starts: algo.act(o, cfg.deterministic, starts)  # noqa: E731
        stop = StopSignal(announce=False)  # Ctrl-C ends the play at the next step: the episodes played are shown
        stop.listen()
        log.info("playing %d episode%s on %s", cfg.episodes, "" if cfg.episodes == 1 else "s", env_cfg.id)
        try:
            returns, lengths = run_episodes(envs, act, cfg.episodes, env_seeds(seed, 0, 1, stream=3), stop.requested)
        finally:
            stop.restore()
    finally:
        envs.close()
    if len(returns):
        log.info("%s", _table_text(env_cfg.id, state, train_cfg.algo.name, returns, lengths))
    if cfg.video:
        log.info("videos in %s", run_dir / "videos")
    if stop.signum is not None:
        log.info("stopped by %s after %d of %d episodes", signal.Signals(stop.signum).name, len(returns), cfg.episodes)
        raise Interrupted(stop.signum)
    return {"returns": returns.tolist(), "lengths": lengths.tolist(), "mean": float(np.mean(returns))}


def _table_text(env_id: str, state: dict[str, Any], algo: str, returns: np.ndarray, lengths: np.ndarray) -> str:
    """The table of returns as text: logged, so it reaches the console and play.log alike."""
    table = Table(title=f"{env_id}: {state['env_steps']} env steps of {algo}", min_width=len(env_id) + 30)
    table.add_column("episode", justify="right")
    table.add_column("return", justify="right")
    table.add_column("length", justify="right")
    for i, (r, n) in enumerate(zip(returns, lengths)):
        table.add_row(str(i), f"{r:.2f}", str(n))
    table.add_section()
    table.add_row("mean", f"{returns.mean():.2f}", f"{lengths.mean():.1f}")
    table.add_row("std", f"{returns.std():.2f}", f"{lengths.std():.1f}")
    text = io.StringIO()
    Console(file=text, width=80).print(table)
    return text.getvalue().rstrip("\n")
