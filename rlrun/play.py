"""`rlrun play`: rebuild env and agent from a checkpoint, run episodes, print a table of returns."""

from __future__ import annotations

import logging
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from rich.console import Console
from rich.table import Table

from rlrun.algos import build_algo
from rlrun.algos.protocol import EnvSpec
from rlrun.config import PlayConfig, TrainConfig
from rlrun.distributed import resolve_device
from rlrun.envs import check_env_id, env_seeds, import_env_modules, make_env
from rlrun.errors import UserError
from rlrun.evaluation import run_episodes

log = logging.getLogger("rlrun")


def _video_env(thunk, folder: Path):
    try:
        import moviepy  # noqa: F401
    except ImportError as e:
        raise UserError("video=true needs the video extra: pip install 'rlrun[video]'") from e

    def wrapped() -> gym.Env:
        return gym.wrappers.RecordVideo(thunk(), str(folder), episode_trigger=lambda _: True, disable_logger=True)

    return wrapped


def play(cfg: PlayConfig, train_cfg: TrainConfig, state: dict, run_dir: Path) -> dict:
    """Run cfg.episodes episodes of the checkpointed agent; returns returns/lengths and prints a table."""
    torch.set_num_threads(1)
    import_env_modules(train_cfg.env.imports)  # the modules that registered the run's env, as training did
    check_env_id(train_cfg.env.id)
    render_mode = "human" if cfg.render else "rgb_array" if cfg.video else None
    thunk = make_env(train_cfg.env, train=False, render_mode=render_mode)
    if cfg.video:
        thunk = _video_env(thunk, run_dir / "videos")
    envs = SyncVectorEnv([thunk], autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space)
        algo = build_algo(train_cfg.algo, train_cfg.model, spec, resolve_device(cfg.device))
        algo.load_state_dict(state["algo"])
        seed = cfg.seed if cfg.seed is not None else train_cfg.seed
        act = lambda o, starts: algo.act(o, cfg.deterministic, starts)  # noqa: E731
        returns, lengths = run_episodes(envs, act, cfg.episodes, env_seeds(seed, 0, 1, stream=3))
    finally:
        envs.close()
    table = Table(title=f"{train_cfg.env.id}: {state['env_steps']} env steps of {train_cfg.algo.name}")
    table.add_column("episode", justify="right")
    table.add_column("return", justify="right")
    table.add_column("length", justify="right")
    for i, (r, n) in enumerate(zip(returns, lengths)):
        table.add_row(str(i), f"{r:.2f}", str(n))
    table.add_section()
    table.add_row("mean", f"{returns.mean():.2f}", f"{lengths.mean():.1f}")
    table.add_row("std", f"{returns.std():.2f}", f"{lengths.std():.1f}")
    Console().print(table)
    if cfg.video:
        log.info("videos in %s", run_dir / "videos")
    return {"returns": returns.tolist(), "lengths": lengths.tolist(), "mean": float(np.mean(returns))}
