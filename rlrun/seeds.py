"""Several seeds of one config trained side by side in one process (issue 35; `hydra/launcher=batched`): each seed's
run is built as its single run is (its envs, logger, checkpointer, evaluator and Loop, in its own run folder), and
one batched learner of their algorithm (rlrun/algos/batched.py) collects and updates for all of them; then each
seed's Loop logs, evaluates and checkpoints its own iteration as it would alone, so every folder holds what a single
run's holds. A seed that fails ends alone, as its single run would (summary failed, recovery checkpoint), and the
others go on; a signal stops every seed at the same iteration boundary, each with its checkpoint."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeGuard, cast

import gymnasium as gym
import numpy as np
import torch

from rlrun.algos.batched import BatchedAlgorithm, batch_of, unbatchable
from rlrun.config.batched import LAUNCHER, SUPPORTED, batch_refusal
from rlrun.envs.protocol import EndedEpisodes, StepResult, VectorEnv
from rlrun.errors import NonFiniteError, UserError
from rlrun.evaluation import Evaluator, NullEvaluator
from rlrun.fast import accelerate
from rlrun.train import Loop, nonfinite_at, record_failure, require_finite_stats, stopped_at_once
from rlrun.training.parts import LocalParts, Run, build_parts, close_parts, configure_torch, open_parts
from rlrun.training.signals import StopNow, StopSignal

log = logging.getLogger("rlrun")

# What a seed of a batch ends with: its summary (summary.json's), or the error it failed of (its summary.json says so).
Outcome = dict[str, Any] | Exception

# The run folder of the seed the batch works for at this moment (None: the batch as a whole), which SeedLogFilter
# reads to send each seed's log lines to its own train.log.
working_for: ContextVar[Path | None] = ContextVar("working_for", default=None)
# The run folder of the seed the console follows: the batch's first seed still training.
leading: ContextVar[Path | None] = ContextVar("leading", default=None)


class SeedLogFilter(logging.Filter):
    """Passes the lines of the seed whose run folder is `run_dir` (None: the leading seed's), the batch's own, and
    with `every_seed_from` (a level) every seed's lines at that level or above: a seed's train.log gets its own
    lines; the console follows the leading seed and shows every seed's warnings and errors."""

    def __init__(self, run_dir: Path | None, every_seed_from: int | None = None) -> None:
        super().__init__()
        self.run_dir, self.every_seed_from = run_dir, every_seed_from

    def filter(self, record: logging.LogRecord) -> bool:
        current = working_for.get()
        if current is None or current == (self.run_dir or leading.get()):
            return True
        return self.every_seed_from is not None and record.levelno >= self.every_seed_from


class _AllEvaluations:
    """The seconds every seed of the batch has spent evaluating: each seed's clock leaves out all of them, since the
    seeds' training waits while any one evaluates."""

    def __init__(self, evaluators: list[Evaluator | NullEvaluator]) -> None:
        self.evaluators = evaluators

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in self.evaluators)


class _SharedStop(StopSignal):
    """One StopSignal for every seed of the batch: they stop at the same iteration. It takes the signals once."""

    def listen(self) -> None:
        if not self._previous:
            super().listen()


# A seed's random streams: what its single run draws from torch's global CPU generator, and on a GPU from that device's
# default generator (its acting noise), which its checkpoints save and its resume restores.
Streams = tuple[torch.Generator, torch.Generator | None]


def streams_now(device: torch.device) -> Streams:
    """The global generators' states now (a seed's, just seeded and built) as the seed's own generators."""
    cpu = torch.Generator().set_state(torch.get_rng_state())
    if device.type != "cuda":
        return cpu, None
    return cpu, torch.Generator(device).set_state(torch.cuda.get_rng_state(device))


@contextlib.contextmanager
def _seed(run: Run, streams: Streams | None) -> Iterator[None]:
    """Work for one seed: its log lines go to its folder, and torch's global generators hold its streams (what its
    checkpoints save and its resume restores, as a single run's) until the block ends."""
    token = working_for.set(run.run_dir)
    cpu, device = streams or (None, None)
    if cpu is not None:
        torch.set_rng_state(cpu.get_state())
    if device is not None:
        torch.cuda.set_rng_state(device.get_state(), device.device)
    try:
        yield
    finally:
        if cpu is not None:
            cpu.set_state(torch.get_rng_state())
        if device is not None:
            device.set_state(torch.cuda.get_rng_state(device.device))
        working_for.reset(token)


def train_seeds(runs: list[Run]) -> list[Outcome]:
    """Train the seeds' runs (one config but the seed, one rank each) side by side; returns each one's outcome.
    Seeds that resume from different env steps (one failed before the others stopped) train as separate batches,
    one after another; a signal that stops one batch leaves the later ones untrained."""
    for run in runs:
        # A resumed seed's config names the checkpoint it resolved to; resume= of one checkpoint for every seed of
        # a batch is what the pre-flight refuses.
        reason = batch_refusal(replace(run.cfg, resume=None))
        if reason is not None:
            raise UserError(reason)
    starts: dict[int, list[int]] = {}
    for i, run in enumerate(runs):
        starts.setdefault(run.resume_state["env_steps"] if run.resume_state else 0, []).append(i)
    if len(starts) > 1:
        where = "; ".join(
            f"{', '.join(f'seed={runs[i].cfg.seed}' for i in group)} at {steps:,}" for steps, group in starts.items()
        )
        log.info("the seeds resume from different env steps (%s): each step's seeds train as one batch", where)
    outcomes: dict[int, Outcome] = {}
    for group in starts.values():
        signals = [o["signal"] for o in outcomes.values() if _interrupted(o)]
        if signals:  # the sweep stops here, as it does after an interrupted single job
            outcomes |= {i: {"status": "interrupted", "signal": signals[0]} for i in group}
            continue
        outcomes |= dict(zip(group, _train_batch([runs[i] for i in group])))
    return [outcomes[i] for i in range(len(runs))]


def _interrupted(outcome: Outcome) -> TypeGuard[dict[str, Any]]:
    return isinstance(outcome, dict) and outcome["status"] == "interrupted"


def _train_batch(runs: list[Run]) -> list[Outcome]:
    """One batch: its seeds built as their single runs are, then trained in step by one batched learner."""
    configure_torch(runs[0].cfg, runs[0].ctx)
    leading.set(runs[0].run_dir)
    stop = _SharedStop(announce=True)
    fast = runs[0].cfg.algo.fast  # the batch's parts' accelerations; the seeds' own algorithms are built without
    runs = [_for_batch(run) for run in runs]
    opened: list[tuple[Run, LocalParts]] = []
    driver: _Driver | None = None
    try:
        seeds, streams = [], []
        for run in runs:  # each built as its single run is, on torch's global generator seeded for it
            with _seed(run, None):
                local = replace(open_parts(run), stop=stop)
                opened.append((run, local))
                parts = build_parts(run, local)
                reason = unbatchable(run.cfg.algo.name, parts.algo)
                if reason is not None:
                    raise UserError(f"{LAUNCHER} trains {SUPPORTED}; not {reason}")
                seeds.append(parts)
                streams.append(streams_now(run.ctx.device))
        on_device = [d for _, d in streams if d is not None]
        algos = [parts.algo for parts in seeds]
        batch = batch_of(runs[0].cfg.algo.name, algos, [g for g, _ in streams], on_device or None, fast)
        applied = [
            f"{len(runs)} seed{'s' if len(runs) > 1 else ''} batched",
            *accelerate(batch, [p.envs for p in seeds]),
        ]
        seeds = [replace(parts, accelerations=applied) for parts in seeds]
        loops, evaluations = [], _AllEvaluations([parts.evaluator for parts in seeds])
        for run, parts, own in zip(runs, seeds, streams):
            with _seed(run, own):  # a resume restores the seed's streams into the global generators
                loops.append(Loop(run, parts, evaluations))
        batch.load_seeds()
        driver = _Driver(loops, batch, streams)
        return driver.train()
    except StopNow as e:  # a second signal: every seed not ended yet stops at once, with its summary
        ended = driver.outcomes if driver is not None else {}
        return [_stopped_at_once(i, run, opened, ended, e) for i, run in enumerate(runs)]
    finally:
        for run, local in reversed(opened):
            with _seed(run, None):
                close_parts(run, local)


def _stopped_at_once(
    i: int, run: Run, opened: list[tuple[Run, LocalParts]], ended: dict[int, Outcome], e: StopNow
) -> Outcome:
    """Seed i's outcome after a second signal: as it ended, or stopped at once (train.stopped_at_once)."""
    if i in ended:
        return ended[i]
    if i >= len(opened):  # not opened yet: nothing of it written
        return {"status": "interrupted", "signal": e.signum}
    with _seed(run, None):
        return stopped_at_once(run, opened[i][1], e)


def _for_batch(run: Run) -> Run:
    """The seed's run as this process builds it: its own algorithm without rlrun/fast's accelerations (the batch
    trains it through the batch's parts, which fast/ accelerates instead) and without a progress bar per seed (a
    plain line, or none). Its checkpoints carry the config as given (run.config_yaml)."""
    cfg = run.cfg
    progress = "none" if cfg.logging.progress == "none" else "plain"
    cfg = replace(cfg, algo=replace(cfg.algo, fast=False), logging=replace(cfg.logging, progress=progress))
    return replace(run, cfg=cfg)


class _Driver:
    """The iterations of a batch's seeds in step, then each one's final checkpoint, evaluation and summary. A seed
    that fails (its env raises, a number of its goes non-finite, its evaluation or checkpoint fails) ends there
    alone, as its single run would: its recovery checkpoint and summary; the batch never steps it again. What fails
    outside any one seed (the batched learner itself) ends every seed still training."""

    def __init__(self, loops: list[Loop], batch: BatchedAlgorithm, streams: list[Streams]) -> None:
        self.loops, self.batch, self.streams = loops, batch, streams
        self.outcomes: dict[int, Outcome] = {}  # each ended seed's
        self.envs: list[VectorEnv] = [
            Guarded(loop.parts.envs, functools.partial(self._env_failed, i)) for i, loop in enumerate(loops)
        ]

    def running(self) -> list[int]:
        return [i for i in range(len(self.loops)) if i not in self.outcomes]

    def train(self) -> list[Outcome]:
        loops = self.loops
        if len({(loop.at.env_steps, loop.final_steps) for loop in loops}) > 1:
            raise UserError("the seeds of a batch must start at the same env step and train as many")
        for loop in loops:
            loop.parts.record.start_training()
        stopped: int | None = None
        while stopped is None and self.running():
            lead = loops[self.running()[0]]  # every seed still training is where it is
            if lead.at.env_steps >= lead.final_steps:
                break
            stopped = self._iteration(lead)
        for i in self.running():
            with _seed(loops[i].run, self.streams[i]):
                try:
                    self.outcomes[i] = loops[i].finish(stopped)
                except Exception as e:  # finish left its recovery checkpoint
                    self._failed(i, e, recover=False)
        return [self.outcomes[i] for i in range(len(loops))]

    def _iteration(self, lead: Loop) -> int | None:
        """One collect and update of the seeds still training, then each one's log and checkpoint; returns the
        signal the batch stops for, or None to go on."""
        progress = lead.progress(lead.at.env_steps)
        with self._for_all():
            collected = self.batch.collect(self.envs, progress)
        if not self.running():  # every seed's envs failed, or the batch did
            return None
        for i in self.running():
            self.loops[i].recovery.updating = True
        with self._for_all():
            stats = self.batch.update(progress)
        if not self.running():
            return None
        stopped = None
        for i in self.running():
            loop, own = self.loops[i], stats[i]
            try:
                if isinstance(own, NonFiniteError):
                    raise own
                require_finite_stats(own, loop.run.cfg.algo.name)
            except NonFiniteError as e:
                self._failed(i, nonfinite_at(e, loop.updating()))
                continue
            loop.recovery.updating = False
            with _seed(loop.run, self.streams[i]):
                try:
                    done = loop.iteration_done(collected[i], own)
                except Exception as e:
                    self._failed(i, e)
                    continue
            stopped = done if stopped is None else stopped
        return stopped

    @contextlib.contextmanager
    def _for_all(self) -> Iterator[None]:
        """A failure of the batched learner itself (no one seed's) ends every seed still training."""
        try:
            yield
        except Exception as e:
            log.error("the batch failed: %s: %s", type(e).__name__, e, exc_info=e)
            for i in self.running():
                self._failed(i, e)

    def _env_failed(self, i: int, error: Exception) -> None:
        """Seed i's env failed while the batch collected (told from inside collect, at once: its recovery checkpoint
        is then what its single run's would be)."""
        if isinstance(error, NonFiniteError):
            error = nonfinite_at(error, self.loops[i].collecting())
        self._failed(i, error)

    def _failed(self, i: int, error: Exception, recover: bool = True) -> None:
        """Seed i ends failed, alone: its recovery checkpoint when one is due, its summary; the batch stops
        stepping it."""
        loop = self.loops[i]
        self.outcomes[i] = error
        leading.set(next((self.loops[j].run.run_dir for j in self.running()), None))
        cast(Guarded, self.envs[i]).stop()
        self.batch.stop_seed(i)
        with _seed(loop.run, None):
            if recover:
                loop.recovery.leave(error, loop.at)
            record_failure(loop.run, loop.parts, error)
            others = len(self.running())
            go_on = f"; the other {others} seed{'s go' if others > 1 else ' goes'} on" if others else ""
            log.error("seed=%d failed: %s: %s%s", loop.run.cfg.seed, type(error).__name__, error, go_on)


class Guarded:
    """A seed's vector env as its batch steps it: a step that raises ends the seed (fail(error), at once), and from
    then on (and after stop()) the env is never stepped again: each step stands in with zero observations, no reward
    and no episode end, which the stopped seed's rows of the batch take and nothing uses. (rlrun/fast/joined_sync.py
    steps the envs inside it the same way.)"""

    def __init__(self, envs: VectorEnv, failed: Callable[[Exception], None]) -> None:
        self.envs, self.failed, self.stopped = envs, failed, False
        self.num_envs, self.num_workers, self.groups = envs.num_envs, envs.num_workers, envs.groups
        self.single_observation_space: gym.Space[Any] = envs.single_observation_space
        self.single_action_space: gym.Space[Any] = envs.single_action_space

    def stop(self) -> None:
        self.stopped = True

    def step(self, actions: np.ndarray) -> StepResult:
        return self._stepped(lambda: self.envs.step(actions), self.num_envs)

    def send(self, group: int, actions: np.ndarray) -> None:
        if not self.stopped:
            try:
                self.envs.send(group, actions)
            except Exception as e:
                self.fail(e)

    def recv(self, group: int) -> StepResult:
        g = self.groups[group]
        return self._stepped(lambda: self.envs.recv(group), g.stop - g.start)

    def fail(self, error: Exception) -> None:
        self.stopped = True
        self.failed(error)

    def _stepped(self, step: Callable[[], StepResult], n: int) -> StepResult:
        if not self.stopped:
            try:
                return step()
            except Exception as e:
                self.fail(e)
        space = self.single_observation_space
        obs = np.zeros((n, *(space.shape or ())), dtype=space.dtype)
        return StepResult(obs, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), {}, EndedEpisodes.none(n))

    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        return self.envs.reset(seed, options)

    def check_alive(self) -> None:
        if not self.stopped:
            self.envs.check_alive()

    def get_env_state(self) -> list[Any]:
        return self.envs.get_env_state()

    def set_env_state(self, state: list[Any]) -> None:
        self.envs.set_env_state(state)

    def close(self) -> None:
        self.envs.close()
