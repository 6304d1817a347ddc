"""The parts of a training run, built in the order DESIGN.md gives (env workers fork first, then the process group,
then torch work) into one typed bundle; what only the main rank does is decided here, by which objects it gets."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch
from threadpoolctl import threadpool_limits

from rlrun.algos import build_algo
from rlrun.algos.protocol import Algorithm, EnvSpec, Reductions, VectorEnv
from rlrun.buffers.replay import Shards
from rlrun.checkpoint import Checkpointer, NullCheckpointer
from rlrun.config import ModelConfig, TrainConfig, convolutional
from rlrun.distributed import RankContext
from rlrun.envs import env_seeds, frame_stack, make_vector_env, vector_backend
from rlrun.evaluation import Evaluator, NullEvaluator
from rlrun.fast import accelerate, cartpoles_as_arrays
from rlrun.logger import NullLogger, RunLogger
from rlrun.run_folder import run_dir_of
from rlrun.run_record import RunRecord
from rlrun.seeding import TRAIN, torch_seed
from rlrun.trackers import opener
from rlrun.training.signals import StopSignal

log = logging.getLogger("rlrun")


@dataclass(frozen=True)
class Run:
    """What this rank trains: the config (and its YAML text, which checkpoints carry), the run folder, the rank's
    place among the ranks, the checkpoint it resumes from (loaded), and the command line's overrides."""

    cfg: TrainConfig
    run_dir: Path
    ctx: RankContext
    config_yaml: str
    resume_state: dict[str, Any] | None = None
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class LocalParts:
    """What a rank has before it joins the process group: what it steps and writes to, and how the run ends."""

    envs: VectorEnv
    evaluator: Evaluator | NullEvaluator
    logger: RunLogger | NullLogger
    checkpointer: Checkpointer | NullCheckpointer
    record: RunRecord
    stop: StopSignal  # listening only once the rank is in the process group


@dataclass(frozen=True)
class Parts(LocalParts):
    """Everything the loop runs: the local parts, the algorithm (its learner wrapped for DDP) and the torch threads
    to collect and to update with."""

    algo: Algorithm
    accelerations: list[str]  # the names of the accelerations that apply (rlrun.fast)
    threads: int
    collect_threads: int


def configure_torch(cfg: TrainConfig, ctx: RankContext) -> None:
    """This rank's torch threads and numerics, and numpy's BLAS threads, before anything else runs."""
    torch.set_num_threads(cfg.threads or auto_threads(cfg.model, ctx.local_world_size))
    # numpy's matrix products (the CPU accelerations' acting and losses, rlrun/fast/) are small: on one BLAS thread
    # they are fastest, where OpenBLAS's default of a thread per core spins beside torch's and the envs' threads
    # (a default CartPole run on a busy 2-core machine ran 10x slower so).
    threadpool_limits(1, user_api="blas")
    # Adam's second-moment estimates of rarely-moving weights decay into denormal floats, which CPUs process
    # many times slower; flushing them to zero changes no result that matters.
    torch.set_flush_denormal(True)
    if cfg.torch_deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def auto_threads(model: ModelConfig, local_ranks: int) -> int:
    """torch threads per rank when not configured: one for MLPs and recurrent cores on them, whose small ops
    gain nothing from more and slow down badly when the cores are contended; for CNNs, the cores split
    between this node's ranks."""
    return max(1, (os.cpu_count() or 1) // local_ranks) if convolutional(model) else 1


def open_parts(run: Run) -> LocalParts:
    """The envs (their workers fork here, before the process group starts gloo's threads and before any threaded
    torch op or TensorBoard's writer thread: a fork after those can hang the child), the evaluator, the logger and
    the checkpointer: real ones on the main rank, stand-ins that do nothing on the others."""
    cfg, ctx = run.cfg, run.ctx
    arrays = cfg.env.vector.backend == "auto" and cartpoles_as_arrays(cfg)  # what auto weighs for CartPole
    _announce_envs(cfg, ctx, arrays)
    seeds = env_seeds(cfg.seed, ctx.rank, cfg.env.num_envs)
    envs = make_vector_env(cfg.env, cfg.env.num_envs, True, seeds, arrays)
    evaluator = Evaluator(cfg, ctx.device) if ctx.is_main else NullEvaluator()
    record = RunRecord(list(run.overrides), run.resume_state, run.run_dir)
    logger = open_logger(run, record.original) if ctx.is_main else NullLogger()
    evaluator.report_to(logger)  # only now: the bar's thread must not run while eval workers fork
    checkpointer = (
        Checkpointer(run.run_dir / "checkpoints", cfg.checkpoint.keep_last) if ctx.is_main else NullCheckpointer()
    )
    return LocalParts(envs, evaluator, logger, checkpointer, record, StopSignal(announce=ctx.is_main))


def build_parts(run: Run, local: LocalParts) -> Parts:
    """Join the process group, listen for signals, and build the algorithm on the envs' spaces with its
    accelerations, its learner wrapped for DDP (which broadcasts rank 0's parameters)."""
    cfg, ctx, envs = run.cfg, run.ctx, local.envs
    ctx.init()
    # Only now: a rank still forming the group (waiting on a peer that may be gone) must die of the SIGTERM its
    # dying launcher sends it, not turn it into a stop flag that no loop reads until the group's timeout.
    local.stop.listen()
    threads = torch.get_num_threads()
    # Env workers take cores while the policy acts: acting on the others only, or OpenMP threads wait on each
    # other behind the workers.
    collect_threads = max(1, threads - envs.num_workers)
    torch.manual_seed(torch_seed(cfg.seed, ctx.rank, TRAIN))
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, cfg.env.num_envs, frame_stack(cfg.env))
    reductions = Reductions(ctx.mean_all, Shards(ctx.rank, ctx.gather_all), ctx.finish_line())
    algo = build_algo(cfg.algo, cfg.model, spec, ctx.device, reductions)
    accelerations = accelerate(algo, envs)
    shapes = ctx.all_gather(algo.update_shape)
    if len(set(shapes)) > 1:  # unequal minibatch counts would hang DDP's all-reduce: fail instead
        raise RuntimeError(f"ranks disagree on (minibatch size, minibatches, epochs): {shapes}")
    d = cfg.distributed
    algo.wrap_learner(
        partial(ctx.wrap, find_unused_parameters=d.find_unused_parameters, sync_batchnorm=d.sync_batchnorm)
    )
    opened = {f.name: getattr(local, f.name) for f in fields(local)}
    return Parts(**opened, algo=algo, accelerations=accelerations, threads=threads, collect_threads=collect_threads)


def close_parts(run: Run, local: LocalParts) -> None:
    """Put back the signal handlers, close what was opened and leave the process group, whatever happened."""
    local.stop.restore()
    local.logger.close()
    local.envs.close()
    local.evaluator.close()
    run.ctx.close()


def open_logger(run: Run, original: list[str]) -> RunLogger:
    """The main rank's RunLogger, with its experiment trackers, which name and tag the run by its `original` overrides
    (its first session's: a resume keeps the tracked run's name and tags). A run resumed from an older checkpoint of
    another run folder starts its metrics.jsonl with that run's lines up to the checkpoint, and says where it came
    from."""
    cfg, run_dir, state = run.cfg, run.run_dir, run.resume_state
    origin = run_dir_of(Path(state["path"])) if state else None
    moved = origin is not None and origin.resolve() != run_dir.resolve()
    c = cfg.logging
    history = origin / "metrics.jsonl" if origin is not None and moved else None
    trackers = opener(c, run.config_yaml, run_dir, tuple(original), cfg.total_steps, origin if moved else None)
    logger = RunLogger(
        run_dir,
        cfg.total_steps,
        state["env_steps"] if state else 0,
        c.progress,
        c.tensorboard,
        history=history,
        every_seconds=c.every_seconds,
        trackers=trackers,
    )
    if moved:
        logger.info("resumed from %s, not the newest checkpoint of its run: this run goes on in %s", origin, run_dir)
    return logger


def _announce_envs(cfg: TrainConfig, ctx: RankContext, arrays: bool) -> None:
    """The main rank says which backend env.vector.backend=auto chose and why, and what it starts when starting it
    takes seconds (worker processes, Ray), before the logger exists: its bar must not run while env workers fork."""
    backend, why = vector_backend(cfg.env, arrays)
    if ctx.is_main and cfg.env.vector.backend == "auto":
        log.info("env.vector.backend=auto: %s for %s (%s)", backend, cfg.env.id, why)
    if ctx.is_main and cfg.logging.progress != "none" and backend in ("subproc", "ray"):
        what = {"subproc": "env worker processes", "ray": "Ray and its env actors"}[backend]
        log.info("starting %s for %d envs per rank", what, cfg.env.num_envs)
