"""A run's checkpoints: what one carries and writing it at an iteration boundary (every rank takes part), resuming
from one, and the recovery checkpoint a failed run leaves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlrun.algos.protocol import VectorEnv
from rlrun.checkpoint import load_shard, rng_state, save_shard, set_rng_state
from rlrun.distributed import is_peer_loss
from rlrun.envs import env_seeds
from rlrun.envs.native import NativeEnvs
from rlrun.errors import Fault, NonFiniteError
from rlrun.run_folder import resume_command
from rlrun.schedule import Progress, continuation_lines, resumed_progress
from rlrun.seeding import RESUMED, torch_seed
from rlrun.training.parts import Parts, Run
from rlrun.training.run_log import Clock, RunLog


@dataclass
class Position:
    """Where the run is at an iteration boundary: env steps over all ranks, and iterations done."""

    env_steps: int = 0
    iteration: int = 0


class Checkpoints:
    """Writes the run's checkpoints: the algorithm's shared state, each rank's own (RNG, envs, cursor), the run
    log's, and what the run as a whole carries across sessions (its record, its schedule)."""

    def __init__(self, run: Run, parts: Parts, run_log: RunLog, progress: Progress, clock: Clock, per_iteration: int):
        self.run, self.parts, self.run_log = run, parts, run_log
        self.progress, self.clock, self.per_iteration = progress, clock, per_iteration

    def save(self, at: Position) -> Path | None:
        """A checkpoint at `at` (the main rank's path). Every rank takes part (its envs, RNG and cursor are its own);
        only the main rank writes, except a shard too large to gather (DQN's replay), which each rank writes beside
        the checkpoint first: the gather below waits for all of them, so a checkpoint on disk always has its
        shards."""
        run, algo, ctx = self.run, self.parts.algo, self.run.ctx
        shard = algo.shard_state()
        if shard is not None:
            save_shard(run.run_dir / "checkpoints", at.env_steps, ctx.rank, shard, run.cfg.checkpoint.keep_last)
        envs = self.parts.envs
        own = {
            **rng_state(ctx.device),
            "envs": _env_state(envs),
            "envs_kind": _state_kind(envs),
            "cursor": algo.rank_state(),
        }
        state = {"config": run.config_yaml, "iteration": at.iteration, "algo": algo.state_dict()}
        state |= {"ranks": ctx.all_gather(own)}
        return self.parts.checkpointer.save(state | self.run_state(at.env_steps), at.env_steps)

    def run_state(self, env_steps: int) -> dict[str, Any]:
        """What the run as a whole carries across sessions (the same on every rank, so a recovery checkpoint has it
        too): its record so far, its iteration size and schedule, and the run log's episodes not logged yet."""
        record = self.parts.record.checkpoint(env_steps, self.clock.seconds(), self.run_log.episodes)
        return {
            "record": record,
            "steps_per_iteration": self.per_iteration,
            "schedule": self.progress.state(),
            "run_log": self.run_log.state(),
        }


def resume(run: Run, parts: Parts, run_log: RunLog, per_iteration: int) -> tuple[Position, Progress]:
    """Where to start from, and the schedules' progress: a checkpoint's, restored, or a fresh run's. A resume that
    changes the budget says where each annealed quantity continues from."""
    state, logger = run.resume_state, parts.logger
    progress, extended = resumed_progress(state, run.cfg.total_steps, per_iteration)
    if state is None:
        return Position(), progress
    replay = _restore(state, run, parts, run_log)
    run_log.episodes = parts.record.episodes()
    logger.info("resumed from %s at %d env steps", state["path"], state["env_steps"])
    if getattr(run.cfg.algo, "replay", None) is not None and not replay:  # an off-policy run
        logger.info("no replay shard in the checkpoint (algo.replay.checkpoint=false): the replay starts empty")
    for line in continuation_lines(parts.algo.annealed(), progress, state["env_steps"]) if extended else []:
        logger.info("%s", line)
    return Position(state["env_steps"], state["iteration"]), progress


def _restore(state: dict[str, Any], run: Run, parts: Parts, run_log: RunLog) -> bool:
    """Continue from a checkpoint: shared state for all, and each rank's own RNG, envs, cursor and replay, and the
    run log's episodes not logged yet. Returns whether this rank's replay was restored."""
    cfg, ctx, algo = run.cfg, run.ctx, parts.algo
    algo.load_state_dict(state["algo"])
    ranks = state["ranks"]
    run_log.load_state(state.get("run_log"), ranks)
    # This rank's own state, in a checkpoint of this world size (a recovery checkpoint holds none).
    mine: dict[str, Any] | None = (ranks[ctx.rank] if len(ranks) == ctx.world_size else None) or None
    if mine is None:  # another world size, or a recovery checkpoint: fresh episodes on a new seed stream
        torch.manual_seed(torch_seed(cfg.seed, ctx.rank, RESUMED, state["iteration"]))
        _fresh_episodes(run, parts, state["iteration"])
        return False
    set_rng_state(mine, ctx.device)
    shard = load_shard(Path(state["path"]), state["env_steps"], ctx.rank)
    # Env state of the kind these envs hold (a resume may change env.vector.backend: native's is another kind).
    exact = mine["envs"] is not None and mine.get("envs_kind", "wrappers") == _state_kind(parts.envs)
    if exact:
        parts.envs.set_env_state(mine["envs"])
    if exact or shard is not None:  # with a replay and reset envs, the cursor is where its open episodes end
        algo.load_rank_state(mine["cursor"])
    if shard is not None:  # this rank's replay, when it was checkpointed
        algo.load_shard_state(shard)
    if not exact:  # envs without plain-data state
        _fresh_episodes(run, parts, state["iteration"])
    return shard is not None


def _fresh_episodes(run: Run, parts: Parts, iteration: int) -> None:
    """Reset the envs on the seed stream of a resume at `iteration` and start collecting from there."""
    seeds = env_seeds(run.cfg.seed, run.ctx.rank, run.cfg.env.num_envs, stream=2 + iteration)
    parts.algo.start(parts.envs.reset(seed=seeds)[0])


def _state_kind(envs: VectorEnv) -> str:
    """Whose env state `envs` save and load: the native backend's vectorized implementations', or the Python wrapper
    stacks' that every other backend steps."""
    return "native" if isinstance(envs, NativeEnvs) else "wrappers"


def _env_state(envs: VectorEnv) -> list[Any] | None:
    """The envs' own state for exact resume, or None when any env cannot be restored."""
    state = envs.get_env_state()
    return None if any(s is None for s in state) else state


class Recovery:
    """When a run fails, a checkpoint of its learner as it stood at the last iteration boundary (main rank), so
    nothing trained is lost, and the line that continues the run. It holds no rank's RNG, env or cursor state
    (the envs may be what broke): the run resumes on fresh episodes, as a resume to another world size does. It
    uses no collective, since a peer may be gone. Not written when the failure came from inside an update (a bug
    there may have left the parameters broken), unless a peer was lost: then the parameters and optimizer are
    whole but may hold the minibatches stepped before the loss (a partial update, as an early target-KL stop
    makes), counted at the last boundary. Nor written when nothing was trained since the last checkpoint."""

    def __init__(self, run: Run, parts: Parts, start: Position, run_state: Callable[[int], dict[str, Any]]) -> None:
        self.checkpointer, self.logger, self.algo = parts.checkpointer, parts.logger, parts.algo
        self.config_yaml, self.run_dir, self.run_state = run.config_yaml, run.run_dir, run_state
        self.start_iteration = start.iteration
        self.saved_at = start.env_steps if run.resume_state else None  # the newest checkpoint's env steps
        self.updating = False  # whether the loop is inside an update

    def leave(self, error: Exception, at: Position) -> None:
        """The recovery checkpoint for `error` at the boundary `at`, when one is due; its own failure is said in
        one line, the run's error being the one to report (the same failing disk is told once)."""
        try:
            self._write(error, at)
        except Exception as failed:
            if not (isinstance(error, Fault) and isinstance(failed, Fault)):
                self.logger.error("could not write a recovery checkpoint: %s: %s", type(failed).__name__, failed)

    def _write(self, error: Exception, at: Position) -> None:
        # A non-finite loss or gradient stopped the update before its optimizer stepped: what it leaves is finite.
        whole = not self.updating or is_peer_loss(error) or isinstance(error, NonFiniteError)
        if whole and at.iteration > self.start_iteration and self.saved_at != at.env_steps:
            state = {"config": self.config_yaml, "iteration": at.iteration, "algo": self.algo.state_dict(), "ranks": []}
            path = self.checkpointer.save(state | self.run_state(at.env_steps) | {"recovery": True}, at.env_steps)
            if path is not None:
                self.saved_at = at.env_steps
                self.logger.error("recovery checkpoint at %d env steps: %s", at.env_steps, path)
        if self.saved_at is not None and not isinstance(error, Fault):  # a Fault's own line says it
            self.logger.error("continue this run with: %s", resume_command(self.run_dir))
