"""The rank entry point: build envs, process group, algorithm, logger and checkpointer in that order, then run
collect -> update -> log -> evaluate -> save until total_steps, and write the summary."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from rlrun.algos import build_algo
from rlrun.algos.protocol import EnvSpec, Reductions
from rlrun.buffers.replay import Shards
from rlrun.checkpoint import (
    Checkpointer,
    NullCheckpointer,
    load_shard,
    rng_state,
    save_shard,
    set_rng_state,
)
from rlrun.config import ModelConfig, TrainConfig, convolutional
from rlrun.distributed import RankContext, is_peer_loss, parameter_digest, requeue_count, restart_count
from rlrun.envs import env_seeds, frame_stack, make_vector_env
from rlrun.errors import Fault, NonFiniteError
from rlrun.evaluation import Evaluator, NullEvaluator
from rlrun.fast import accelerate
from rlrun.logger import NullLogger, RunLogger
from rlrun.run_folder import list_checkpoints, newest_line, run_dir_of
from rlrun.run_record import RunRecord
from rlrun.schedule import continuation_lines, resumed_progress
from rlrun.seeding import RESUMED, TRAIN, torch_seed
from rlrun.trackers import opener

log = logging.getLogger("rlrun")


class StopNow(KeyboardInterrupt):
    """A second signal: stop at once, wherever the run is (the summary is still written)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StopSignal:
    """SIGINT/SIGTERM, and SIGUSR1/SIGUSR2 (a scheduler's warning before it preempts the job or its time runs
    out), ask the loop to stop at the next iteration boundary, where state is consistent and a final checkpoint
    can be written (an evaluation under way ends early; a checkpoint being written is finished first); a second
    signal raises StopNow wherever the run is. restore() puts back the handlers there were before. `announce`: say
    what the first signal does (the main rank)."""

    def __init__(self, announce: bool) -> None:
        self.signum: int | None = None
        self.announce = announce
        self._previous = {}
        if threading.current_thread() is threading.main_thread():  # not so in some sweep launchers' workers
            signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
            self._previous = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            raise StopNow(self.signum)
        self.signum = signum
        if self.announce:  # os.write: a handler may run while the main thread is inside a buffered stream's write
            name = signal.Signals(signum).name
            line = f"\nrlrun: {name}: stopping at the end of this step with a checkpoint; Ctrl-C again to stop now\n"
            os.write(2, line.encode())

    def requested(self) -> bool:
        return self.signum is not None

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class EpisodeLog:
    """Finished episodes between log lines, gathered from every rank when logged. metrics() is a
    collective: call it at the same iterations on all ranks."""

    def __init__(self, ctx: RankContext):
        self.ctx = ctx
        self.pending: list[tuple[float, int]] = []
        self.total = 0  # over all ranks, as logged
        self.own_total = 0  # this rank's

    def add(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        self.pending += zip(returns.tolist(), lengths.tolist())
        self.own_total += len(returns)

    def metrics(self) -> dict:
        episodes = [e for rank in self.ctx.all_gather(self.pending) for e in rank]
        self.pending = []
        self.total += len(episodes)
        if not episodes:
            return {}
        return {
            "charts/episodic_return": float(np.mean([r for r, _ in episodes])),
            "charts/episodic_length": float(np.mean([n for _, n in episodes])),
            "charts/episodes": len(episodes),
        }


class RolloutLog:
    """What each rank collected, gathered once per iteration with whether any rank was asked to stop. With
    straggler preemption it keeps each rank's env steps and rollouts cut short, between log lines and in all (the
    same figures on every rank; the main rank logs them). gather() is a collective: every rank calls it at every
    iteration."""

    def __init__(self, ctx: RankContext, full_rollout: int):
        self.ctx, self.full = ctx, full_rollout  # one rank's env steps in a rollout not cut short
        self.steps, self.cut = np.zeros(ctx.world_size, np.int64), np.zeros(ctx.world_size, np.int64)
        self.total_steps, self.total_cut = self.steps.copy(), self.cut.copy()
        self.rollouts = 0  # since the last log line
        self.seen = False  # whether rollouts could be cut: the run preempts stragglers

    def gather(self, stop_requested: bool, collected: dict) -> tuple[bool, int]:
        """(whether any rank was asked to stop, the env steps all ranks collected) for an iteration whose collect
        returned `collected` here."""
        preempting = "preempted" in collected  # on every rank alike
        own = [stop_requested, collected["env_steps"], preempting and collected["preempted"]]
        report = self.ctx.gather_all(torch.tensor(own, dtype=torch.int64)).numpy()
        if preempting:
            self.steps += report[:, 1]
            self.cut += report[:, 2]
            self.rollouts += 1
            self.seen = True
        return bool(report[:, 0].any()), int(report[:, 1].sum())

    def metrics(self) -> dict:
        out = {f"preemption/steps_rank{r}": int(n) for r, n in enumerate(self.steps)}
        out |= {f"preemption/preempted_rank{r}": int(n) for r, n in enumerate(self.cut)}
        out["preemption/preempted_steps"] = int(self.rollouts * self.full * len(self.steps) - self.steps.sum())
        self.total_steps += self.steps
        self.total_cut += self.cut
        self.steps[:], self.cut[:], self.rollouts = 0, 0, 0
        return out

    def summary(self) -> dict:
        self.metrics()  # the last interval into the totals
        return {"env_steps_per_rank": self.total_steps.tolist(), "preempted_per_rank": self.total_cut.tolist()}


def auto_threads(model: ModelConfig, local_ranks: int) -> int:
    """torch threads per rank when not configured: one for MLPs and recurrent cores on them, whose small ops
    gain nothing from more and slow down badly when the cores are contended; for CNNs, the cores split
    between this node's ranks."""
    return max(1, (os.cpu_count() or 1) // local_ranks) if convolutional(model) else 1


def crossed(before: int, after: int, every: int) -> bool:
    """Whether a multiple of `every` lies in (before, after]; never for every == 0."""
    return every > 0 and after // every > before // every


def _env_state(envs) -> list | None:
    """The envs' own state for exact resume, or None when any env cannot be restored."""
    state = envs.get_env_state()
    return None if any(s is None for s in state) else state


def _restore(state: dict, cfg: TrainConfig, ctx: RankContext, algo, envs, episodes_log: EpisodeLog) -> bool:
    """Continue from a checkpoint: shared state for all, and each rank's own RNG, envs, cursor, replay and the
    episodes it had finished but not yet logged. Returns whether this rank's replay was restored."""
    algo.load_state_dict(state["algo"])
    ranks = state["ranks"]
    mine = ranks[ctx.rank] if len(ranks) == ctx.world_size else None
    if mine:
        set_rng_state(mine, ctx.device)
    else:
        torch.manual_seed(torch_seed(cfg.seed, ctx.rank, RESUMED, state["iteration"]))
    if mine:
        episodes_log.pending = [(float(r), int(n)) for r, n in mine["episodes"]]
        episodes_log.own_total = mine["own_episodes"]
    shard = load_shard(Path(state["path"]), state["env_steps"], ctx.rank) if mine else None
    exact = mine and mine["envs"] is not None
    if exact:
        envs.set_env_state(mine["envs"])
    if exact or shard is not None:  # with a replay and reset envs, the cursor is where its open episodes end
        algo.load_rank_state(mine["cursor"])
    if shard is not None:  # this rank's replay, when it was checkpointed
        algo.load_shard_state(shard)
    if not exact:  # envs without plain-data state, or another world size: fresh episodes on a new seed stream
        seeds = env_seeds(cfg.seed, ctx.rank, cfg.env.num_envs, stream=2 + state["iteration"])
        algo.start(envs.reset(seed=seeds)[0])
    return shard is not None


def _resume(state: dict | None, cfg, ctx, algo, envs, episodes_log: EpisodeLog, record, logger, per_iteration: int):
    """(env steps, iteration, Progress) to start from: a checkpoint's, restored, or a fresh run's. A resume that
    changes the budget says where each annealed quantity continues from."""
    progress, extended = resumed_progress(state, cfg.total_steps, per_iteration)
    if state is None:
        return 0, 0, progress
    replay = _restore(state, cfg, ctx, algo, envs, episodes_log)
    episodes_log.total = record.episodes()
    logger.info("resumed from %s at %d env steps", state["path"], state["env_steps"])
    if getattr(cfg.algo, "replay", None) is not None and not replay:  # an off-policy run
        logger.info("no replay shard in the checkpoint (algo.replay.checkpoint=false): the replay starts empty")
    for line in continuation_lines(algo.annealed(), progress, state["env_steps"]) if extended else []:
        logger.info("%s", line)
    return state["env_steps"], state["iteration"], progress


def train(
    cfg: TrainConfig,
    run_dir: Path,
    ctx: RankContext,
    config_yaml: str,
    resume_state: dict | None = None,
    overrides: tuple[str, ...] = (),
) -> dict:
    """Train on this rank; returns the summary (written to run_dir/summary.json by the main rank)."""
    torch.set_num_threads(cfg.threads or auto_threads(cfg.model, ctx.local_world_size))
    # Adam's second-moment estimates of rarely-moving weights decay into denormal floats, which CPUs process
    # many times slower; flushing them to zero changes no result that matters.
    torch.set_flush_denormal(True)
    if cfg.torch_deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    # Env workers fork here, before the process group starts gloo's threads and before any threaded torch
    # op (and TensorBoard's writer thread): a fork after those can hang the child.
    _announce_envs(cfg, ctx)
    envs = make_vector_env(cfg.env, cfg.env.num_envs, True, env_seeds(cfg.seed, ctx.rank, cfg.env.num_envs))
    # What only the main rank does is decided here, once, by which objects it gets.
    evaluator = Evaluator(cfg, ctx.device) if ctx.is_main else NullEvaluator()
    start_steps = resume_state["env_steps"] if resume_state else 0
    logger = _logger(cfg, run_dir, start_steps, resume_state, config_yaml, overrides) if ctx.is_main else NullLogger()
    evaluator.logger = logger  # only now: the bar's thread must not run while eval workers fork
    checkpointer = (
        Checkpointer(run_dir / "checkpoints", cfg.checkpoint.keep_last) if ctx.is_main else NullCheckpointer()
    )
    stop: StopSignal | None = None
    record = RunRecord(list(overrides), resume_state)
    try:
        ctx.init()
        # Only now: a rank still forming the group (waiting on a peer that may be gone) must die of the SIGTERM its
        # dying launcher sends it, not turn it into a stop flag that no loop reads until the group's timeout.
        stop = StopSignal(announce=ctx.is_main)
        parts = (envs, evaluator, logger, checkpointer, stop)
        return _run(cfg, run_dir, ctx, config_yaml, resume_state, record, *parts)
    except StopNow as e:  # a second signal: no final checkpoint, but the record of why and how to continue
        resume = _resume_line(run_dir)
        summary = {"status": "interrupted", "signal": e.signum, "stopped": "at once (a second signal)"}
        if record.started or resume_state is None:  # a resume stopped before it trained leaves the record as it was
            logger.summary(summary | {"overrides": record.original} | ({"resume": resume} if resume else {}))
        logger.error("stopped at once by a second signal%s", f"; continue with: {resume}" if resume else "")
        return summary
    except Exception as e:
        # A resume that fails before it trains leaves the run's record as it was (completed, interrupted).
        if record.started or resume_state is None:
            with contextlib.suppress(Fault):  # written if the disk still takes it
                logger.failed(f"{type(e).__name__}: {e}", record.original, _resume_line(run_dir))  # a report reads it
        if isinstance(e, Fault):  # one line: the file, the error, and what is left to continue from
            raise Fault(f"{e}; {newest_line(run_dir)}") from e
        raise
    finally:
        if stop is not None:
            stop.restore()
        logger.close()
        envs.close()
        evaluator.close()
        ctx.close()


def _run(cfg, run_dir, ctx, config_yaml, resume_state, record, envs, evaluator, logger, checkpointer, stop) -> dict:
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
    # (DDP broadcast rank 0's parameters there)
    steps_per_iteration = algo.steps_per_collect * ctx.world_size  # fewer when a straggler is preempted
    num_iterations = cfg.total_steps // steps_per_iteration
    final_steps = num_iterations * steps_per_iteration  # the run ends at or after this many env steps
    algo.start(envs.reset(seed=env_seeds(cfg.seed, ctx.rank, cfg.env.num_envs))[0])
    episodes_log = EpisodeLog(ctx)
    resumed = _resume(resume_state, cfg, ctx, algo, envs, episodes_log, record, logger, steps_per_iteration)
    env_steps, iteration, progress = resumed

    def save() -> Path | None:
        # Every rank takes part (its envs, RNG and cursor are its own); only the main rank writes, except a
        # shard too large to gather (DQN's replay), which each rank writes beside the checkpoint first: the
        # gather below waits for all of them, so a checkpoint on disk always has its shards.
        _save_shard(algo, run_dir / "checkpoints", env_steps, ctx.rank, cfg.checkpoint.keep_last)
        own = {
            **rng_state(ctx.device),
            "envs": _env_state(envs),
            "cursor": algo.rank_state(),
            "episodes": [list(e) for e in episodes_log.pending],
            "own_episodes": episodes_log.own_total,
        }
        state = {"config": config_yaml, "iteration": iteration, "algo": algo.state_dict(), "ranks": ctx.all_gather(own)}
        return checkpointer.save(state | run_state(), env_steps)

    def run_state() -> dict:
        """What the run as a whole carries across sessions: its record so far."""
        record_state = record.checkpoint(
            env_steps, time.perf_counter() - start_time - evaluator.seconds, episodes_log.total
        )
        return {"record": record_state, "steps_per_iteration": steps_per_iteration, "schedule": progress.state()}

    logger.info(
        "run folder %s: %s on %s, %d env steps (%d iterations of %d, %d rank%s)",
        run_dir,
        cfg.algo.name,
        cfg.env.id,
        cfg.total_steps,
        num_iterations,
        steps_per_iteration,
        ctx.world_size,
        "s" if ctx.distributed else "",
    )
    logger.info("accelerations: %s", ", ".join(accelerations) or "none (algo.fast=false, or none applies)")
    start_time, start_steps = time.perf_counter(), env_steps
    recent: deque[float] = deque(maxlen=100)
    eval_returns = None
    recovery = Recovery(checkpointer, config_yaml, run_dir, logger, iteration, env_steps if resume_state else None)
    recovery.run_state = run_state
    rollouts = RolloutLog(ctx, algo.steps_per_collect)
    stopped: int | None = None  # the signal all ranks stop for, when one of them got one
    record.start_training()
    try:
        while env_steps < final_steps:
            torch.set_num_threads(collect_threads)
            with _nonfinite_context(f"in the iteration from env step {env_steps:,} on rank {ctx.rank}"):
                collected = algo.collect(envs, progress(env_steps))
            torch.set_num_threads(threads)
            evaluator.check_alive()
            recovery.updating = True
            with _nonfinite_context(f"in iteration {iteration + 1} (from env step {env_steps:,})"):
                stats = algo.update(progress=progress(env_steps))
                require_finite_stats(stats, cfg.algo.name)
            recovery.updating = False
            stopping, steps = rollouts.gather(stop.requested(), collected)
            before, env_steps, iteration = env_steps, env_steps + steps, iteration + 1
            episodes_log.add(collected["episode_returns"], collected["episode_lengths"])
            recent.extend(collected["episode_returns"].tolist())
            sps = (env_steps - start_steps) / (time.perf_counter() - start_time - evaluator.seconds)
            logger.progress(env_steps, sps, float(np.mean(recent)) if recent else None)
            last = env_steps >= final_steps
            eval_now = crossed(before, env_steps, cfg.eval.every_steps) and not last
            if crossed(before, env_steps, cfg.logging.every_steps) or eval_now:
                metrics = update_metrics(stats, ctx.mean_all) | {
                    "charts/iteration": iteration,
                    "charts/sps": sps,
                    **episodes_log.metrics(),
                    **(rollouts.metrics() if rollouts.seen else {}),
                }
                evaluated = evaluator(algo, stop.requested) if eval_now else None
                evaluated = _log_interval(logger, env_steps, metrics, None if stop.requested() else evaluated)
                eval_returns = eval_returns if evaluated is None else evaluated
            if crossed(before, env_steps, cfg.checkpoint.every_steps) and not last:
                save()
                recovery.saved_at = env_steps
            if stopping and not last:  # all ranks stop at the same iteration, or none does
                stopped = int(stop.signum or signal.SIGTERM)  # a rank without the signal stops as if SIGTERM
                break
        loop_seconds = time.perf_counter() - start_time - evaluator.seconds  # training's own: SPS counts it alone
        # The last episodes are logged in the final line, not carried by the checkpoint: a resume would log
        # them again.
        final_metrics = episodes_log.metrics()
        final = save()  # before the final evaluation, which may fail
        recovery.saved_at = env_steps
        evaluated, stopped = _final_evaluation(evaluator, algo, stop, stopped)
        interrupted = stopped is not None
        if evaluated is not None:
            eval_returns = evaluated
            final_metrics |= _eval_metrics(eval_returns)
    except Exception as e:
        try:
            recovery.write(e, algo, iteration, env_steps)
        except Exception as failed:  # the run's own error is the one to report
            _recovery_failed(logger, e, failed)
        raise
    logger.log(env_steps, final_metrics)
    summary = {
        "status": "interrupted" if interrupted else "completed",
        "signal": stopped,
        "algo": cfg.algo.name,
        "env_id": cfg.env.id,
        "seed": cfg.seed,
        "env_steps": env_steps,
        "iterations": iteration,
        **record.summary(env_steps, loop_seconds, episodes_log.total, _ended(stopped)),
        "eval_seconds": round(evaluator.seconds, 3),  # this session's, in its wall_seconds, not in sps
        **_eval_summary(eval_returns),
        "final_checkpoint": str(final) if final else None,
        **({"resume": _resume_line(run_dir)} if interrupted else {}),
        "resumed_from": resume_state["path"] if resume_state else None,
        "world_size": ctx.world_size,
        "restarts": restart_count(),  # torch elastic's, after failures (distributed.max_restarts)
        "requeues": requeue_count(),  # SLURM's, after preemptions or time limits
        "threads": torch.get_num_threads(),
        "episodes": episodes_log.total,
        "episodes_per_rank": ctx.all_gather(episodes_log.own_total),
        **(rollouts.summary() if rollouts.seen else {}),
        "parameter_digests": ctx.all_gather(parameter_digest(algo.model)),  # equal when DDP kept ranks in sync
    }
    if interrupted:
        logger.info("stopped by signal %d at %d env steps; checkpoint %s", stopped, env_steps, final)
        logger.info("continue with: %s", _resume_line(run_dir))
    else:
        logger.info(
            "done: %d env steps in %.1f s (%.0f sps, evaluation %.1f s); eval return %s",
            env_steps,
            summary["sessions"][-1]["wall_seconds"],
            summary["sessions"][-1]["sps"] or 0,
            summary["eval_seconds"],
            _eval_text(eval_returns),
        )
    logger.summary(summary)
    return summary


def _final_evaluation(evaluator, algo, stop: StopSignal, stopped: int | None) -> tuple[np.ndarray | None, int | None]:
    """The final evaluation's returns, and the signal the run stops for: the loop's, or one that came during the
    evaluation (on the main rank, which evaluates), which ends it early and counts as an interruption."""
    if stopped is not None:
        return None, stopped
    returns = evaluator(algo, stop.requested)
    return (None, stop.signum) if stop.requested() else (returns, None)


class Recovery:
    """When a run fails, a checkpoint of its learner as it stood at the last iteration boundary (main rank), so
    nothing trained is lost, and the line that continues the run. It holds no rank's RNG, env or cursor state
    (the envs may be what broke): the run resumes on fresh episodes, as a resume to another world size does. It
    uses no collective, since a peer may be gone. Not written when the failure came from inside an update (a bug
    there may have left the parameters broken), unless a peer was lost: then the parameters and optimizer are
    whole but may hold the minibatches stepped before the loss (a partial update, as an early target-KL stop
    makes), counted at the last boundary. Nor written when nothing was trained since the last checkpoint."""

    def __init__(self, checkpointer, config_yaml: str, run_dir: Path, logger, iteration: int, saved_at: int | None):
        self.checkpointer, self.config_yaml, self.run_dir, self.logger = checkpointer, config_yaml, run_dir, logger
        self.start_iteration, self.saved_at = iteration, saved_at
        self.updating = False
        self.run_state: Callable[[], dict] = dict

    def write(self, error: Exception, algo, iteration: int, env_steps: int) -> None:
        # A non-finite loss or gradient stopped the update before its optimizer stepped: what it leaves is finite.
        whole = not self.updating or is_peer_loss(error) or isinstance(error, NonFiniteError)
        if whole and iteration > self.start_iteration and self.saved_at != env_steps:
            state = {"config": self.config_yaml, "iteration": iteration, "algo": algo.state_dict(), "ranks": []}
            path = self.checkpointer.save(state | self.run_state() | {"recovery": True}, env_steps)
            if path is not None:
                self.saved_at = env_steps
                self.logger.error("recovery checkpoint at %d env steps: %s", env_steps, path)
        if self.saved_at is not None and not isinstance(error, Fault):  # a Fault's own line says it
            self.logger.error("continue this run with: rlrun train resume=%s", self.run_dir)


def _resume_line(run_dir: Path) -> str | None:
    """The command that continues the run in `run_dir`, when it has a checkpoint to continue from."""
    return f"rlrun train resume={run_dir}" if list_checkpoints(run_dir / "checkpoints") else None


@contextlib.contextmanager
def _nonfinite_context(where: str) -> Iterator[None]:
    """A NonFiniteError raised inside, with `where` added to its message (an env or an algorithm knows what was not
    finite; the loop knows when)."""
    try:
        yield
    except NonFiniteError as e:
        hint = "; env.check_finite=false accepts it" if e.env is not None else ""
        raise NonFiniteError(f"{e} {where}{hint}") from None


def require_finite_stats(stats: dict, algo: str) -> None:
    """Raise NonFiniteError naming the first of an update's losses that is NaN or infinite. Other stats may be
    undefined on a healthy run (explained variance of returns that do not vary)."""
    for name, value in stats.items():
        if "loss" in name and isinstance(value, float) and not math.isfinite(value):
            raise NonFiniteError(f"the {algo.upper()} {name} is {'NaN' if value != value else 'infinite'}")


def _recovery_failed(logger, error: Exception, failed: Exception) -> None:
    if not (isinstance(error, Fault) and isinstance(failed, Fault)):  # the same failing disk is told once
        logger.error("could not write a recovery checkpoint: %s: %s", type(failed).__name__, failed)


def _logger(cfg: TrainConfig, run_dir: Path, env_steps: int, resume_state: dict | None, config_yaml: str, overrides):
    """The main rank's RunLogger, with its experiment trackers. A run resumed from an older checkpoint of another run
    folder starts its metrics.jsonl with that run's lines up to the checkpoint, and says where it came from."""
    origin = run_dir_of(Path(resume_state["path"])) if resume_state else None
    moved = origin is not None and origin.resolve() != run_dir.resolve()
    c = cfg.logging
    history = origin / "metrics.jsonl" if moved else None
    trackers = opener(c, config_yaml, run_dir, overrides, cfg.total_steps, origin if moved else None)
    logger = RunLogger(
        run_dir,
        cfg.total_steps,
        env_steps,
        c.progress,
        c.tensorboard,
        history=history,
        every_seconds=c.every_seconds,
        trackers=trackers,
    )
    if moved:
        logger.info("resumed from %s, not the newest checkpoint of its run: this run goes on in %s", origin, run_dir)
    return logger


def _announce_envs(cfg: TrainConfig, ctx: RankContext) -> None:
    """The main rank says what it starts when starting it takes seconds (worker processes, Ray), before the
    logger exists: its bar must not run while env workers fork."""
    v = cfg.env.vector
    if ctx.is_main and cfg.logging.progress != "none" and v.backend != "sync":
        what = {"subproc": "env worker processes", "ray": "Ray and its env actors"}[v.backend]
        log.info("starting %s for %d envs per rank", what, cfg.env.num_envs)


def _ended(signum: int | None) -> str:
    return "completed" if signum is None else f"interrupted by signal {signum}"


def _log_interval(logger, env_steps: int, metrics: dict, returns: np.ndarray | None) -> np.ndarray | None:
    """Log one interval's metrics, with the evaluation's when it ran; returns its returns."""
    if returns is not None:
        metrics |= _eval_metrics(returns)
        logger.info("eval at %d env steps: return %.2f +- %.2f", env_steps, returns.mean(), returns.std())
    logger.log(env_steps, metrics)
    return returns


def update_metrics(stats: dict, mean_all: Callable[[Tensor], Tensor]) -> dict:
    """An update's stats as logged: each the mean over ranks (a collective: every rank calls it at the same
    iterations), algorithms name their charts ("charts/epsilon"); bare names are losses."""
    names = [k for k in stats if k != "epochs"]
    means = mean_all(torch.tensor([float(stats[k]) for k in names], dtype=torch.float64)).tolist()
    return {_METRIC_NAMES.get(k, k if "/" in k else f"losses/{k}"): v for k, v in zip(names, means)}


_METRIC_NAMES = {"learning_rate": "charts/learning_rate"}


def _save_shard(algo, directory: Path, env_steps: int, rank: int, keep_last: int) -> None:
    shard = algo.shard_state()
    if shard is not None:
        save_shard(directory, env_steps, rank, shard, keep_last)


def _eval_metrics(returns: np.ndarray) -> dict:
    return {"eval/return_mean": float(returns.mean()), "eval/return_std": float(returns.std())}


def _eval_summary(returns: np.ndarray | None) -> dict:
    if returns is None:
        return {"eval_return_mean": None, "eval_return_std": None, "eval_episodes": None}
    return {
        "eval_return_mean": float(returns.mean()),
        "eval_return_std": float(returns.std()),
        "eval_episodes": len(returns),
    }


def _eval_text(returns: np.ndarray | None) -> str:
    return "-" if returns is None else f"{returns.mean():.2f} +- {returns.std():.2f} over {len(returns)} episodes"
