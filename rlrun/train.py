"""The rank entry point: build the run's parts in order (rlrun/training/parts.py), then the loop, collect -> update
-> log -> evaluate -> save until total_steps or a stop, then the final checkpoint, evaluation and summary."""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlrun.config import TrainConfig
from rlrun.distributed import RankContext
from rlrun.envs import env_seeds
from rlrun.errors import Fault, NonFiniteError
from rlrun.run_folder import newest_line, resume_line
from rlrun.training.parts import LocalParts, Parts, Run, build_parts, close_parts, configure_torch, open_parts
from rlrun.training.resume import Checkpoints, Recovery, resume
from rlrun.training.run_log import Clock, Ending, Evaluations, RunLog, eval_metrics, log_end, log_interval, summary
from rlrun.training.signals import StopNow


def train(
    cfg: TrainConfig,
    run_dir: Path,
    ctx: RankContext,
    config_yaml: str,
    resume_state: dict[str, Any] | None = None,
    overrides: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Train on this rank; returns the summary (written to run_dir/summary.json by the main rank)."""
    run = Run(cfg, run_dir, ctx, config_yaml, resume_state, tuple(overrides))
    configure_torch(cfg, ctx)
    local = open_parts(run)
    try:
        return Loop(run, build_parts(run, local)).train()
    except StopNow as e:  # a second signal: no final checkpoint, but the record of why and how to continue
        return stopped_at_once(run, local, e)
    except Exception as e:
        record_failure(run, local, e)
        if isinstance(e, Fault):  # one line: the file, the error, and what is left to continue from
            raise Fault(f"{e}; {newest_line(run_dir)}") from e
        raise
    finally:
        close_parts(run, local)


def record_failure(run: Run, local: LocalParts, e: Exception) -> None:
    """summary.json of a run that failed of `e`: why, and the line that continues it. A resume that fails before it
    trains leaves the run's record as it was (completed, interrupted)."""
    if local.record.started or run.resume_state is None:
        with contextlib.suppress(Fault):  # written if the disk still takes it
            local.logger.failed(f"{type(e).__name__}: {e}", local.record.original, resume_line(run.run_dir))


def stopped_at_once(run: Run, local: LocalParts, e: StopNow) -> dict[str, Any]:
    """The summary of a run that a second signal stopped at once (written, but not over a resume's record when the
    resume had not trained yet)."""
    resume = resume_line(run.run_dir)
    stopped = {"status": "interrupted", "signal": e.signum, "stopped": "at once (a second signal)"}
    if local.record.started or run.resume_state is None:  # a resume stopped before it trained leaves it as it was
        local.logger.summary(stopped | {"overrides": local.record.original} | ({"resume": resume} if resume else {}))
    local.logger.error("stopped at once by a second signal%s", f"; continue with: {resume}" if resume else "")
    return stopped


class Loop:
    """The training loop over the parts, every rank alike: the iterations, then the final checkpoint, evaluation
    and summary. Starting it resets the envs and restores a checkpoint when the run resumes."""

    def __init__(self, run: Run, parts: Parts, evaluations: Evaluations | None = None) -> None:
        """`evaluations`: what the clock leaves out of training's seconds (by default this run's evaluations; in a
        batch of seeds, every seed's)."""
        cfg, ctx, algo = run.cfg, run.ctx, parts.algo
        self.run, self.parts = run, parts
        self.per_iteration = algo.steps_per_collect * ctx.world_size  # fewer when a straggler is preempted
        iterations = cfg.total_steps // self.per_iteration
        self.final_steps = iterations * self.per_iteration  # the run ends at or after this many env steps
        with _nonfinite_context(f"at its first reset on rank {ctx.rank}"):
            algo.start(parts.envs.reset(seed=env_seeds(cfg.seed, ctx.rank, cfg.env.num_envs))[0])
        self.run_log = RunLog(ctx, algo.steps_per_collect)
        self.at, self.progress = resume(run, parts, self.run_log, self.per_iteration)
        # The steps the run trains: whole iterations, so total_steps rounded down to a multiple of an iteration's.
        rounded = "" if self.final_steps == cfg.total_steps else f"; total_steps={cfg.total_steps} in whole iterations"
        parts.logger.info(
            "run folder %s: %s on %s, %d env steps (%d iteration%s of %d, %d rank%s%s)",
            run.run_dir,
            cfg.algo.name,
            cfg.env.id,
            self.final_steps,
            iterations,
            "" if iterations == 1 else "s",
            self.per_iteration,
            ctx.world_size,
            "s" if ctx.distributed else "",
            rounded,
        )
        parts.logger.info(
            "accelerations: %s", ", ".join(parts.accelerations) or "none (algo.fast=false, or none applies)"
        )
        self.clock = Clock(self.at.env_steps, evaluations or parts.evaluator)
        self.checkpoints = Checkpoints(run, parts, self.run_log, self.progress, self.clock, self.per_iteration)
        self.recovery = Recovery(run, parts, self.at, self.checkpoints.run_state)
        self.eval_returns: np.ndarray | None = None  # the last evaluation's

    def train(self) -> dict[str, Any]:
        """Train to the end or a stop; returns the summary."""
        self.parts.record.start_training()
        with self._recovering():
            stopped = self._iterations()
        return self.finish(stopped)

    @contextlib.contextmanager
    def _recovering(self) -> Iterator[None]:
        """A failure inside leaves the recovery checkpoint, when one is due."""
        try:
            yield
        except Exception as e:
            self.recovery.leave(e, self.at)
            raise

    def finish(self, stopped: int | None) -> dict[str, Any]:
        """The final checkpoint, evaluation and summary of a run that ended (`stopped`: the signal it stopped for);
        returns the summary."""
        with self._recovering():
            end, final_metrics = self._finish(stopped)
        self.parts.logger.log(end.env_steps, final_metrics)
        done = summary(self.run, self.parts, self.run_log, end)
        log_end(self.parts.logger, done, self.run.run_dir, end)
        self.parts.logger.summary(done)
        return done

    def _iterations(self) -> int | None:
        """Iterations until the final step, or a stop all ranks agree on; returns the signal the run stops for."""
        while self.at.env_steps < self.final_steps:
            stopped = self.iteration_done(*self._collect_and_update())
            if stopped is not None:
                return stopped
        return None

    def iteration_done(self, collected: dict[str, Any], stats: dict[str, float]) -> int | None:
        """What follows an iteration's collect and update (`collected`, `stats`: what they returned): the gather,
        the log, a checkpoint when one is due; returns the signal the run stops for, or None to go on."""
        at, stop, every = self.at, self.parts.stop, self.run.cfg.checkpoint.every_steps
        gathered = self.run_log.gather(stop.requested(), collected, stats)
        before = at.env_steps
        at.env_steps, at.iteration = before + gathered.env_steps, at.iteration + 1
        last = at.env_steps >= self.final_steps
        self._log(before, last)
        if crossed(before, at.env_steps, every) and not last:
            self._save()
        if gathered.stop and not last:  # all ranks stop at the same iteration, or none does
            return int(stop.signum or signal.SIGTERM)  # a rank without the signal stops as if SIGTERM
        return None

    def _collect_and_update(self) -> tuple[dict[str, Any], dict[str, float]]:
        parts, progress = self.parts, self.progress(self.at.env_steps)
        torch.set_num_threads(parts.collect_threads)
        with _nonfinite_context(self.collecting()):
            collected = parts.algo.collect(parts.envs, progress)
        torch.set_num_threads(parts.threads)
        parts.evaluator.check_alive()
        self.recovery.updating = True
        with _nonfinite_context(self.updating()):
            stats = parts.algo.update(progress=progress)
            require_finite_stats(stats, self.run.cfg.algo.name)
        self.recovery.updating = False
        return collected, stats

    def collecting(self) -> str:
        """Where a non-finite value met while collecting this iteration was, for its error."""
        return f"in the iteration from env step {self.at.env_steps:,} on rank {self.run.ctx.rank}"

    def updating(self) -> str:
        """Where a non-finite value met while updating this iteration was, for its error."""
        return f"in iteration {self.at.iteration + 1} (from env step {self.at.env_steps:,})"

    def _log(self, before: int, last: bool) -> None:
        """The progress line; at a logging step, or an evaluation's (not at the last), the interval's metrics and
        the evaluation's, unless a stop was asked for (the evaluation then ended early)."""
        cfg, parts, env_steps = self.run.cfg, self.parts, self.at.env_steps
        sps, recent = self.clock.sps(env_steps), self.run_log.recent
        parts.logger.progress(env_steps, sps, sum(recent) / len(recent) if recent else None)  # (np.mean: 10 us)
        eval_now = crossed(before, env_steps, cfg.eval.every_steps) and not last
        if crossed(before, env_steps, cfg.logging.every_steps) or eval_now:
            metrics = self.run_log.metrics(self.at.iteration, sps)
            evaluated = parts.evaluator(parts.algo, parts.stop.requested) if eval_now else None
            evaluated = None if parts.stop.requested() else evaluated
            log_interval(parts.logger, env_steps, metrics, evaluated)
            self.eval_returns = self.eval_returns if evaluated is None else evaluated

    def _save(self) -> Path | None:
        path = self.checkpoints.save(self.at)
        self.recovery.saved_at = self.at.env_steps
        return path

    def _finish(self, stopped: int | None) -> tuple[Ending, dict[str, float]]:
        """The final checkpoint and evaluation; how the run ended, and its final log line's metrics."""
        train_seconds = self.clock.seconds()
        # The last episodes are logged in the final line, not carried by the checkpoint: a resume would log
        # them again.
        final_metrics = self.run_log.episode_metrics()
        final = self._save()  # before the final evaluation, which may fail
        evaluated, stopped = _final_evaluation(self.parts, stopped)
        if evaluated is not None:
            self.eval_returns = evaluated
            final_metrics |= eval_metrics(evaluated)
        at = self.at
        return Ending(at.env_steps, at.iteration, train_seconds, stopped, final, self.eval_returns), final_metrics


def _final_evaluation(parts: Parts, stopped: int | None) -> tuple[np.ndarray | None, int | None]:
    """The final evaluation's returns, and the signal the run stops for: the loop's, or one that came during the
    evaluation (on the main rank, which evaluates), which ends it early and counts as an interruption."""
    if stopped is not None:
        return None, stopped
    returns = parts.evaluator(parts.algo, parts.stop.requested)
    return (None, parts.stop.signum) if parts.stop.requested() else (returns, None)


def crossed(before: int, after: int, every: int) -> bool:
    """Whether a multiple of `every` lies in (before, after]; never for every == 0."""
    return every > 0 and after // every > before // every


@contextlib.contextmanager
def _nonfinite_context(where: str) -> Iterator[None]:
    """A NonFiniteError raised inside, with `where` added to its message."""
    try:
        yield
    except NonFiniteError as e:
        raise nonfinite_at(e, where) from None


def nonfinite_at(e: NonFiniteError, where: str) -> NonFiniteError:
    """`e` with `where` added to its message (an env or an algorithm knows what was not finite; the loop knows
    when)."""
    hint = "; env.check_finite=false accepts it" if e.env is not None else ""
    return NonFiniteError(f"{e} {where}{hint}")


def require_finite_stats(stats: dict[str, float], algo: str) -> None:
    """Raise NonFiniteError naming the first of an update's losses that is NaN or infinite. Other stats may be
    undefined on a healthy run (explained variance of returns that do not vary)."""
    for name, value in stats.items():
        if "loss" in name and isinstance(value, float) and not math.isfinite(value):
            raise NonFiniteError(f"the {algo.upper()} {name} is {'NaN' if value != value else 'infinite'}")
