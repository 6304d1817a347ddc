"""The rank entry point: build envs, algorithm, logger and checkpointer in order, then run
collect -> update -> log -> evaluate -> save until total_steps, and write the summary."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from rlrun.algos import build_algo
from rlrun.checkpoint import Checkpointer, NullCheckpointer
from rlrun.config import TrainConfig
from rlrun.distributed import RankContext
from rlrun.envs import env_seeds, make_vector_env
from rlrun.evaluation import run_episodes
from rlrun.logger import NullLogger, RunLogger


class StopSignal:
    """SIGINT/SIGTERM ask the loop to stop at the next iteration boundary, where state is consistent and a
    final checkpoint can be written; a second signal interrupts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _env_state(envs) -> list | None:
    """The envs' own state for exact resume, or None when any env cannot be restored."""
    state = envs.get_env_state()
    return None if any(s is None for s in state) else state


def crossed(before: int, after: int, every: int) -> bool:
    """Whether a multiple of `every` lies in (before, after]; never for every == 0."""
    return every > 0 and after // every > before // every


def train(
    cfg: TrainConfig,
    run_dir: Path,
    ctx: RankContext,
    config_yaml: str,
    resume_state: dict | None = None,
    overrides: tuple[str, ...] = (),
) -> dict:
    """Train on this rank; returns the summary (also written to run_dir/summary.json on the main rank)."""
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // ctx.world_size))
    if cfg.torch_deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    envs = make_vector_env(cfg.env, cfg.env.num_envs, train=True)
    eval_envs = make_vector_env(cfg.env, min(cfg.eval.num_envs, cfg.eval.episodes), train=False)
    stop = StopSignal()
    try:
        return _run(cfg, run_dir, ctx, config_yaml, resume_state, overrides, envs, eval_envs, stop)
    except Exception as e:
        if ctx.is_main:  # a sweep's report reads why this run failed
            failed = {"status": "failed", "error": f"{type(e).__name__}: {e}", "overrides": list(overrides)}
            (run_dir / "summary.json").write_text(json.dumps(failed, indent=2))
        raise
    finally:
        stop.restore()
        envs.close()
        eval_envs.close()


def _run(cfg, run_dir, ctx, config_yaml, resume_state, overrides, envs, eval_envs, stop) -> dict:
    torch.manual_seed(cfg.seed + ctx.rank)
    algo = build_algo(
        cfg.algo,
        cfg.model,
        envs.single_observation_space,
        envs.single_action_space,
        cfg.env.num_envs,
        ctx.device,
        ctx.mean_all,
    )
    steps_per_iteration = algo.steps_per_collect * ctx.world_size
    num_iterations = cfg.total_steps // steps_per_iteration
    env_steps = iteration = 0
    algo.next_obs, _ = envs.reset(seed=env_seeds(cfg.seed, ctx.rank, cfg.env.num_envs))
    if resume_state is not None:
        env_steps, iteration = resume_state["env_steps"], resume_state["iteration"]
        algo.load_state_dict(resume_state["algo"])
        torch.set_rng_state(resume_state["rng"]["torch"])
        if resume_state["envs"] is not None:
            envs.set_env_state(resume_state["envs"])
        else:  # envs without plain-data state continue with fresh episodes on a new seed stream
            seeds = env_seeds(cfg.seed, ctx.rank, cfg.env.num_envs, stream=2 + iteration)
            algo.next_obs, _ = envs.reset(seed=seeds)

    logger = (
        RunLogger(run_dir, cfg.total_steps, env_steps, cfg.logging.progress, cfg.logging.tensorboard)
        if ctx.is_main
        else NullLogger()
    )
    checkpointer = (
        Checkpointer(run_dir / "checkpoints", cfg.checkpoint.keep_last) if ctx.is_main else NullCheckpointer()
    )
    eval_seeds = env_seeds(cfg.seed, ctx.rank, eval_envs.num_envs, stream=1)

    def evaluate() -> np.ndarray:
        # Evaluation draws nothing from the training RNG stream, so it cannot change training.
        with torch.random.fork_rng(devices=[]):
            returns, _ = run_episodes(
                eval_envs, lambda o: algo.act(o, cfg.eval.deterministic), cfg.eval.episodes, eval_seeds
            )
        return returns

    def state() -> dict:
        return {
            "config": config_yaml,
            "iteration": iteration,
            "algo": algo.state_dict(),
            "rng": {"torch": torch.get_rng_state()},
            "envs": _env_state(envs),
        }

    logger.info(
        "run folder %s: %s on %s, %d env steps (%d iterations of %d)",
        run_dir,
        cfg.algo.name,
        cfg.env.id,
        cfg.total_steps,
        num_iterations,
        steps_per_iteration,
    )
    start_time, start_steps = time.perf_counter(), env_steps
    recent: deque[float] = deque(maxlen=100)
    interval_returns: list[float] = []
    interval_lengths: list[int] = []
    eval_returns = None
    while iteration < num_iterations and stop.signum is None:
        episodes = algo.collect(envs)
        stats = algo.update(progress=env_steps / cfg.total_steps)
        before, env_steps, iteration = env_steps, env_steps + steps_per_iteration, iteration + 1
        recent.extend(episodes["episode_returns"].tolist())
        interval_returns += episodes["episode_returns"].tolist()
        interval_lengths += episodes["episode_lengths"].tolist()
        sps = (env_steps - start_steps) / (time.perf_counter() - start_time)
        logger.progress(env_steps, sps, float(np.mean(recent)) if recent else None)
        metrics = {}
        if crossed(before, env_steps, cfg.eval.every_steps) and iteration < num_iterations:
            eval_returns = evaluate()
            metrics |= {
                "eval/return_mean": float(eval_returns.mean()),
                "eval/return_std": float(eval_returns.std()),
            }
            logger.info(
                "eval at %d env steps: return %.2f +- %.2f",
                env_steps,
                eval_returns.mean(),
                eval_returns.std(),
            )
        if crossed(before, env_steps, cfg.logging.every_steps) or metrics:
            metrics |= {f"losses/{k}": v for k, v in stats.items() if k not in ("learning_rate", "epochs")}
            metrics |= {
                "charts/learning_rate": stats["learning_rate"],
                "charts/iteration": iteration,
                "charts/sps": sps,
            }
            if interval_returns:
                metrics |= {
                    "charts/episodic_return": float(np.mean(interval_returns)),
                    "charts/episodic_length": float(np.mean(interval_lengths)),
                    "charts/episodes": len(interval_returns),
                }
                interval_returns, interval_lengths = [], []
            logger.log(env_steps, metrics)
        if crossed(before, env_steps, cfg.checkpoint.every_steps) and iteration < num_iterations:
            checkpointer.save(state(), env_steps)

    loop_seconds = time.perf_counter() - start_time
    interrupted = stop.signum is not None
    if not interrupted:
        eval_returns = evaluate()
        logger.log(
            env_steps,
            {"eval/return_mean": float(eval_returns.mean()), "eval/return_std": float(eval_returns.std())},
        )
    final = checkpointer.save(state(), env_steps)
    wall = time.perf_counter() - start_time
    summary = {
        "status": "interrupted" if interrupted else "completed",
        "signal": stop.signum,
        "algo": cfg.algo.name,
        "env_id": cfg.env.id,
        "seed": cfg.seed,
        "env_steps": env_steps,
        "iterations": iteration,
        "wall_seconds": round(wall, 3),
        "sps": round((env_steps - start_steps) / loop_seconds, 1) if loop_seconds > 0 else None,
        "eval_return_mean": None if eval_returns is None else float(eval_returns.mean()),
        "eval_return_std": None if eval_returns is None else float(eval_returns.std()),
        "eval_episodes": None if eval_returns is None else len(eval_returns),
        "final_checkpoint": str(final) if final else None,
        "overrides": list(overrides),
        "world_size": ctx.world_size,
    }
    if interrupted:
        logger.info("stopped by signal %d at %d env steps; checkpoint %s", stop.signum, env_steps, final)
    else:
        logger.info(
            "done: %d env steps in %.1f s (%.0f sps), eval return %.2f +- %.2f over %d episodes",
            env_steps,
            wall,
            summary["sps"] or 0,
            eval_returns.mean(),
            eval_returns.std(),
            len(eval_returns),
        )
    logger.summary(summary)
    logger.close()
    return summary
