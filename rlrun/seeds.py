"""Several seeds of one config trained side by side in one process (issue 35; `hydra/launcher=batched`): each seed's
run is built as its single run is (its envs, logger, checkpointer, evaluator and Loop, in its own run folder), and
one BatchedPPO collects and updates for all of them; then each seed's Loop logs, evaluates and checkpoints its own
iteration as it would alone, so every folder holds what a single run's holds."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch

from rlrun.algos.batched_ppo import BatchedPPO, unbatchable
from rlrun.algos.ppo import PPO
from rlrun.config.batched import LAUNCHER, SUPPORTED, batch_refusal
from rlrun.errors import UserError
from rlrun.evaluation import Evaluator, NullEvaluator
from rlrun.train import Loop, require_finite_stats
from rlrun.training.parts import LocalParts, Run, build_parts, close_parts, configure_torch, open_parts
from rlrun.training.signals import StopSignal

# The run folder of the seed the batch works for at this moment (None: the batch as a whole), which SeedLogFilter
# reads to send each seed's log lines to its own train.log.
working_for: ContextVar[Path | None] = ContextVar("working_for", default=None)


class SeedLogFilter(logging.Filter):
    """Passes the lines of the seed whose run folder is `run_dir`, the batch's own, and with `every_seed_from` (a
    level) every seed's lines at that level or above: a seed's train.log gets its own lines; the console follows the
    first seed and shows every seed's warnings and errors."""

    def __init__(self, run_dir: Path, every_seed_from: int | None = None) -> None:
        super().__init__()
        self.run_dir, self.every_seed_from = run_dir, every_seed_from

    def filter(self, record: logging.LogRecord) -> bool:
        current = working_for.get()
        if current is None or current == self.run_dir:
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


@contextlib.contextmanager
def _seed(run: Run, generator: torch.Generator | None) -> Iterator[None]:
    """Work for one seed: its log lines go to its folder, and torch's global generator holds its training stream
    (what its checkpoints save and its resume restores, as a single run's) until the block ends."""
    token = working_for.set(run.run_dir)
    if generator is not None:
        torch.set_rng_state(generator.get_state())
    try:
        yield
    finally:
        if generator is not None:
            generator.set_state(torch.get_rng_state())
        working_for.reset(token)


def train_seeds(runs: list[Run]) -> list[dict[str, Any]]:
    """Train the seeds' runs (one config but the seed, one rank each) side by side; returns each one's summary."""
    for run in runs:
        reason = batch_refusal(run.cfg)
        if reason is not None:
            raise UserError(reason)
    configure_torch(runs[0].cfg, runs[0].ctx)
    stop = _SharedStop(announce=True)
    runs = [_for_batch(run) for run in runs]
    opened: list[tuple[Run, LocalParts]] = []
    try:
        seeds, generators = [], []
        for run in runs:  # each built as its single run is, on torch's global generator seeded for it
            with _seed(run, None):
                local = replace(open_parts(run), stop=stop)
                opened.append((run, local))
                parts = build_parts(run, local)
                reason = unbatchable(parts.algo)
                if reason is not None:
                    raise UserError(f"{LAUNCHER} trains {SUPPORTED}; not {reason}")
                seeds.append(replace(parts, accelerations=[f"{len(runs)} seeds batched"]))
                generators.append(torch.Generator().set_state(torch.get_rng_state()))
        batch = BatchedPPO([cast(PPO, parts.algo) for parts in seeds], generators)  # unbatchable checked it
        loops, evaluations = [], _AllEvaluations([parts.evaluator for parts in seeds])
        for run, parts, generator in zip(runs, seeds, generators):
            with _seed(run, generator):  # a resume restores the seed's stream into the global generator
                loops.append(Loop(run, parts, evaluations))
        batch.load_seeds()
        return _train(loops, batch, generators)
    finally:
        for run, local in reversed(opened):
            with _seed(run, None):
                close_parts(run, local)


def _for_batch(run: Run) -> Run:
    """The seed's run as this process builds it: without rlrun/fast's accelerations (the batch is the seeds'
    acceleration) and without a progress bar per seed (a plain line, or none). Its checkpoints carry the config as
    given (run.config_yaml)."""
    cfg = run.cfg
    progress = "none" if cfg.logging.progress == "none" else "plain"
    cfg = replace(cfg, algo=replace(cfg.algo, fast=False), logging=replace(cfg.logging, progress=progress))
    return replace(run, cfg=cfg)


def _train(loops: list[Loop], batch: BatchedPPO, generators: list[torch.Generator]) -> list[dict[str, Any]]:
    """The iterations of every seed in step, then each one's final checkpoint, evaluation and summary."""
    first = loops[0]
    if len({(loop.at.env_steps, loop.final_steps) for loop in loops}) > 1:
        raise UserError("the seeds of a batch must start at the same env step and train as many")
    envs = [loop.parts.envs for loop in loops]
    for loop in loops:
        loop.parts.record.start_training()
    stopped: int | None = None
    while stopped is None and first.at.env_steps < first.final_steps:
        progress = first.progress(first.at.env_steps)
        with _recovering(loops):
            collected = batch.collect(envs)
            for loop in loops:
                loop.recovery.updating = True
            stats = batch.update(progress)
            for loop, st in zip(loops, stats):
                loop.recovery.updating = False
                require_finite_stats(st, loop.run.cfg.algo.name)
            for loop, gen, c, st in zip(loops, generators, collected, stats):
                with _seed(loop.run, gen):
                    done = loop.iteration_done(c, st)
                stopped = done if stopped is None else stopped
    summaries = []
    for loop, gen in zip(loops, generators):
        with _seed(loop.run, gen):
            summaries.append(loop.finish(stopped))
    return summaries


@contextlib.contextmanager
def _recovering(loops: list[Loop]) -> Iterator[None]:
    """A failure in the batch leaves each seed's recovery checkpoint, when one is due."""
    try:
        yield
    except Exception as e:
        for loop in loops:
            with _seed(loop.run, None):
                loop.recovery.leave(e, loop.at)
        raise
