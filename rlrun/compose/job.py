"""Inside a running Hydra job: the typed config it trains with and the checkpoint it resumes from. What the pre-flight
of this process checked of this very config is taken as it is (rlrun/compose/handoff.py); only what needs the job's
run folder (resume=auto, a requeue) or another process's config is worked out here."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from rlrun.compose.handoff import take
from rlrun.compose.preflight import ENV_CHECK_WARNINGS, check_device_present
from rlrun.compose.resume import auto_resumed, resumed_config
from rlrun.config import TrainConfig, validate_train

log = logging.getLogger("rlrun")


def train_config(
    cfg: DictConfig, overrides: list[str], run_dir: Path, requeued: bool = False
) -> tuple[TrainConfig, dict[str, Any] | None]:
    """The typed config the run in `run_dir` trains with, and the checkpoint it resumes from (or None). With
    resume=auto, and always for a job the scheduler requeued, that is the run folder's newest checkpoint if any."""
    checked = take(cfg)
    typed = checked.typed if checked else cast(TrainConfig, OmegaConf.to_object(cfg))  # converted once in a process
    resume = typed.resume
    if resume == "auto" or requeued:
        from rlrun.run_folder import list_checkpoints

        found = list_checkpoints(run_dir / "checkpoints")
        if found and not (checked and str(found[-1]) == checked.resumed_from):
            resumed = auto_resumed(found[-1], typed, overrides)  # (a sweep's job: the pre-flight did not look)
            return _resumed(resumed.typed, resumed.state, resumed.warnings)
        resume = str(found[-1]) if found else None if resume == "auto" else resume
    if resume is None:
        typed = replace(typed, resume=None)
        _log_warnings(typed, checked.warnings if checked else tuple(validate_train(typed)))
        return typed, None
    if checked and resume == checked.resumed_from:  # the pre-flight merged this very checkpoint
        state = checked.state
        if state is None:  # a sweep's: each job loads its own
            from rlrun.checkpoint import load_checkpoint

            state = load_checkpoint(resume)
        _log_warnings(typed, checked.warnings)
        return typed, state
    resumed = resumed_config(resume, overrides)
    return _resumed(resumed.typed, resumed.state, resumed.warnings)


def _resumed(
    typed: TrainConfig, state: dict[str, Any], warnings: tuple[str, ...]
) -> tuple[TrainConfig, dict[str, Any] | None]:
    """A resume merged in the job (the pre-flight did not: resume=auto, a requeue, another process), checked
    against this machine's devices too, its warnings logged."""
    check_device_present(typed.device, typed.distributed.nproc_per_node)
    _log_warnings(typed, warnings)
    return typed, state


def _log_warnings(typed: TrainConfig, warnings: tuple[str, ...]) -> None:
    """What the checks let pass, and what gymnasium's env checker said in the pre-flight, in the run's log (the
    pre-flight ran before the log existed)."""
    for line in [*warnings, *ENV_CHECK_WARNINGS.get(typed.env.id, [])]:
        log.warning(line)


def replay_checkpoint(typed: TrainConfig, resumable: bool) -> TrainConfig:
    """An off-policy run that the machine may resume by itself (a requeue, an elastic restart, resume=auto)
    checkpoints its replay unless told otherwise: resuming on an empty one would quietly refill learning_starts
    and then train on a small recent buffer. Other runs do not, unless told to (the shards are large)."""
    replay = getattr(typed.algo, "replay", None)
    if replay is None or replay.checkpoint is not None:
        return typed
    return replace(typed, algo=replace(typed.algo, replay=replace(replay, checkpoint=resumable)))


def job_threads(typed: TrainConfig, n_jobs: int | None) -> TrainConfig:
    """Parallel sweep jobs (the joblib launcher's n_jobs) split the cores between them instead of each taking
    all."""
    if typed.threads or not n_jobs:
        return typed
    cores = os.cpu_count() or 1
    return replace(typed, threads=max(1, cores // (cores if n_jobs < 0 else n_jobs)))
