"""The run log: what every rank did in an iteration, gathered in one collective per iteration (a stop request, the env
steps, a rollout cut short, the episodes that ended, the update's stats), the metrics logged from it (the same on
every rank; the main rank's logger writes them), and the run's summary."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from rlrun.distributed import RankContext, parameter_digest
from rlrun.job_env import requeue_count, restart_count
from rlrun.logger import NullLogger, RunLogger
from rlrun.run_folder import resume_line
from rlrun.training.parts import Parts, Run

# The columns of a rank's report for an iteration; the update's stats follow them.
_STOP, _STEPS, _CUT, _EPISODES, _RETURNS, _LENGTHS, _STATS = range(7)
_METRIC_NAMES = {"learning_rate": "charts/learning_rate"}


@dataclass(frozen=True)
class Gathered:
    """An iteration as all ranks saw it."""

    stop: bool  # whether any rank was asked to stop
    env_steps: int  # what all ranks collected


@dataclass(frozen=True)
class Episodes:
    """Episodes that ended, over all ranks: how many, their returns' and their lengths' sums."""

    count: int = 0
    return_sum: float = 0.0
    length_sum: int = 0


class Evaluations(Protocol):
    """What took time that is not training's: `seconds` spent evaluating (an Evaluator's, or a batch of seeds')."""

    @property
    def seconds(self) -> float: ...


class Clock:
    """Training's own seconds since the loop started, evaluations left out (SPS counts them alone)."""

    def __init__(self, start_steps: int, evaluator: Evaluations) -> None:
        self.start, self.start_steps, self.evaluator = time.perf_counter(), start_steps, evaluator

    def seconds(self) -> float:
        return time.perf_counter() - self.start - self.evaluator.seconds

    def sps(self, env_steps: int) -> float:
        return (env_steps - self.start_steps) / self.seconds()


class RunLog:
    """The metrics every rank holds alike, from one gather() per iteration: the episodes since the last log line
    and each rank's count, the last update's stats averaged over ranks, and with straggler preemption each rank's
    env steps and rollouts cut short, between log lines and in all. A log line from it needs no collective, so
    evaluating or writing on the main rank alone cannot hang the others (every rank still makes each line, which
    keeps their episode counts equal)."""

    def __init__(self, ctx: RankContext, full_rollout: int) -> None:
        w = ctx.world_size
        self.ctx, self.full = ctx, full_rollout  # one rank's env steps in a rollout not cut short
        self.pending = Episodes()  # since the last log line
        self.episodes = 0  # logged, over all ranks
        self.episodes_per_rank = np.zeros(w, np.int64)
        self.recent: deque[float] = deque(maxlen=100)  # this rank's last episodes' returns (its progress line)
        self.update: dict[str, float] = {}  # the last update's stats as logged: each the mean over ranks
        self.preempting = False  # whether rollouts can be cut short: the run preempts stragglers
        self.steps, self.cut = np.zeros(w, np.int64), np.zeros(w, np.int64)
        self.total_steps, self.total_cut = self.steps.copy(), self.cut.copy()
        self.rollouts = 0  # since the last log line

    def gather(self, stop_requested: bool, collected: dict[str, Any], stats: dict[str, float]) -> Gathered:
        """The iteration's one collective: each rank's report (whether it was asked to stop, what its collect
        returned, the stats its update returned) on every rank. Every rank calls it at every iteration, with stats
        of the same names (an update's are the same on every rank)."""
        returns, lengths = collected["episode_returns"], collected["episode_lengths"]
        self.recent.extend(returns.tolist())
        preempting = "preempted" in collected  # on every rank alike
        names = [k for k in stats if k != "epochs"]
        own = [stop_requested, collected["env_steps"], preempting and collected["preempted"], len(returns)]
        sums = (returns.sum(), lengths.sum()) if len(returns) else (0.0, 0)  # (most iterations end no episode)
        own += [*sums, *(stats[k] for k in names)]
        # Each rank's row as Python floats: a handful of numbers per rank, where numpy's calls cost more than the sums.
        # One process has its own row alone (a tensor made and read back for it cost more than its off-policy step's
        # acting).
        row = [float(x) for x in own]
        rows = self.ctx.gather_all(torch.tensor(row, dtype=torch.float64)).tolist() if self.ctx.distributed else [row]
        counts = [int(r[_EPISODES]) for r in rows]
        self.episodes_per_rank += counts
        p = self.pending
        added = (sum(counts), sum(r[_RETURNS] for r in rows), int(sum(r[_LENGTHS] for r in rows)))
        self.pending = Episodes(p.count + added[0], p.return_sum + added[1], p.length_sum + added[2])
        means = [sum(column) / len(rows) for column in zip(*(r[_STATS:] for r in rows))]  # an all-reduce's sum, divided
        self.update = {_metric_name(k): v for k, v in zip(names, means)}
        if preempting:
            self.steps += [int(r[_STEPS]) for r in rows]
            self.cut += [int(r[_CUT]) for r in rows]
            self.rollouts += 1
            self.preempting = True
        return Gathered(any(r[_STOP] for r in rows), int(sum(r[_STEPS] for r in rows)))

    def metrics(self, iteration: int, sps: float) -> dict[str, float]:
        """A log line: the last update's stats, the iteration, SPS, the episodes since the last line and, with
        straggler preemption, each rank's env steps and rollouts cut short since then."""
        line = self.update | {"charts/iteration": iteration, "charts/sps": sps, **self.episode_metrics()}
        return line | (self._preemption_metrics() if self.preempting else {})

    def episode_metrics(self) -> dict[str, float]:
        """The episodes since the last log line (none: no metrics), counted as logged."""
        p, self.pending = self.pending, Episodes()
        self.episodes += p.count
        if not p.count:
            return {}
        return {
            "charts/episodic_return": p.return_sum / p.count,
            "charts/episodic_length": p.length_sum / p.count,
            "charts/episodes": p.count,
        }

    def _preemption_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {f"preemption/steps_rank{r}": int(n) for r, n in enumerate(self.steps)}
        out |= {f"preemption/preempted_rank{r}": int(n) for r, n in enumerate(self.cut)}
        out["preemption/preempted_steps"] = int(self.rollouts * self.full * len(self.steps) - self.steps.sum())
        self.total_steps += self.steps
        self.total_cut += self.cut
        self.steps[:], self.cut[:], self.rollouts = 0, 0, 0
        return out

    def preemption_summary(self) -> dict[str, list[int]]:
        self._preemption_metrics()  # the last interval into the totals
        return {"env_steps_per_rank": self.total_steps.tolist(), "preempted_per_rank": self.total_cut.tolist()}

    def state(self) -> dict[str, Any]:
        """What a checkpoint carries of the run log (the same on every rank): the episodes not logged yet, and how
        many each rank has had."""
        p = self.pending
        return {
            "episodes": p.count,
            "return_sum": p.return_sum,
            "length_sum": p.length_sum,
            "episodes_per_rank": self.episodes_per_rank.tolist(),
        }

    def load_state(self, saved: dict[str, Any] | None, ranks: list[dict[str, Any]]) -> None:
        """Continue from a checkpoint's run log (`ranks`: each rank's own state in it): its episodes not logged yet
        (the next line logs them), and each rank's count where the world size is the same (after another, each
        rank counts from this session on). One from before the run log kept each rank's episodes not logged yet,
        and its count, in the rank's own state (and a recovery checkpoint then had none)."""
        if saved is None:
            episodes = [e for r in ranks for e in r["episodes"]]
            returns, lengths = sum(float(r) for r, _ in episodes), sum(int(n) for _, n in episodes)
            saved = {"episodes": len(episodes), "return_sum": returns, "length_sum": lengths}
            saved["episodes_per_rank"] = [r["own_episodes"] for r in ranks]
        self.pending = Episodes(int(saved["episodes"]), float(saved["return_sum"]), int(saved["length_sum"]))
        if len(saved["episodes_per_rank"]) == len(self.episodes_per_rank):
            self.episodes_per_rank = np.array(saved["episodes_per_rank"], np.int64)


@dataclass(frozen=True)
class Ending:
    """How the loop ended."""

    env_steps: int
    iterations: int
    train_seconds: float  # training's own, without evaluations: SPS counts it alone
    signal: int | None  # the signal the run stopped for (None: it completed)
    checkpoint: Path | None  # the final checkpoint (the main rank's)
    eval_returns: np.ndarray | None  # the last evaluation's


def summary(run: Run, parts: Parts, run_log: RunLog, end: Ending) -> dict[str, Any]:
    """summary.json: the run over all its sessions. Its one collective, the parameters' digests, ends the run."""
    cfg, ctx, interrupted = run.cfg, run.ctx, end.signal is not None
    ended = "completed" if end.signal is None else f"interrupted by signal {end.signal}"
    return {
        "status": "interrupted" if interrupted else "completed",
        "signal": end.signal,
        "algo": cfg.algo.name,
        "env_id": cfg.env.id,
        "seed": cfg.seed,
        "env_steps": end.env_steps,
        "iterations": end.iterations,
        **parts.record.summary(end.env_steps, end.train_seconds, run_log.episodes, ended),
        "eval_seconds": round(parts.evaluator.seconds, 3),  # this session's, in its wall_seconds, not in sps
        **_eval_summary(end.eval_returns),
        "final_checkpoint": str(end.checkpoint) if end.checkpoint else None,
        **({"resume": resume_line(run.run_dir)} if interrupted else {}),
        "resumed_from": run.resume_state["path"] if run.resume_state else None,
        "world_size": ctx.world_size,
        "restarts": restart_count(),  # torch elastic's, after failures (distributed.max_restarts)
        "requeues": requeue_count(),  # SLURM's, after preemptions or time limits
        "threads": torch.get_num_threads(),
        "episodes": run_log.episodes,
        "episodes_per_rank": run_log.episodes_per_rank.tolist(),
        **(run_log.preemption_summary() if run_log.preempting else {}),
        "parameter_digests": ctx.all_gather(parameter_digest(parts.algo.model)),  # equal when DDP kept ranks in sync
    }


def log_end(logger: RunLogger | NullLogger, summary: dict[str, Any], run_dir: Path, end: Ending) -> None:
    """The run's last lines: how to continue it, or what it did."""
    if end.signal is not None:
        logger.info("stopped by signal %d at %d env steps; checkpoint %s", end.signal, end.env_steps, end.checkpoint)
        logger.info("continue with: %s", resume_line(run_dir))
        return
    logger.info(
        "done: %d env steps in %.1f s (%.0f sps, evaluation %.1f s); eval return %s",
        end.env_steps,
        summary["sessions"][-1]["wall_seconds"],
        summary["sessions"][-1]["sps"] or 0,
        summary["eval_seconds"],
        _eval_text(end.eval_returns),
    )


def log_interval(
    logger: RunLogger | NullLogger, env_steps: int, metrics: dict[str, float], returns: np.ndarray | None
) -> None:
    """Log one interval's metrics, with the evaluation's when it ran."""
    if returns is not None:
        metrics |= eval_metrics(returns)
        logger.info("eval at %d env steps: return %.2f +- %.2f", env_steps, returns.mean(), returns.std())
    logger.log(env_steps, metrics)


def eval_metrics(returns: np.ndarray) -> dict[str, float]:
    return {"eval/return_mean": float(returns.mean()), "eval/return_std": float(returns.std())}


def _metric_name(stat: str) -> str:
    """An update's stat as logged: algorithms name their charts ("charts/epsilon"); bare names are losses."""
    return _METRIC_NAMES.get(stat, stat if "/" in stat else f"losses/{stat}")


def _eval_summary(returns: np.ndarray | None) -> dict[str, Any]:
    if returns is None:
        return {"eval_return_mean": None, "eval_return_std": None, "eval_episodes": None}
    return {
        "eval_return_mean": float(returns.mean()),
        "eval_return_std": float(returns.std()),
        "eval_episodes": len(returns),
    }


def _eval_text(returns: np.ndarray | None) -> str:
    if returns is None:
        return "-"
    return f"{returns.mean():.2f} +- {returns.std():.2f} over {len(returns)} episode{'' if len(returns) == 1 else 's'}"
