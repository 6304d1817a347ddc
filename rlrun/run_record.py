"""One record per run across its sessions: the first start, then each resume, budget extension, requeue or elastic
restart. The checkpoint carries the record up to its step, so summary.json describes the whole run (cumulative wall
time, SPS over the steps trained, episodes, the original overrides that are the run's identity) and lists each
session with its own overrides, where it resumed from and why it ended."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from rlrun.run_folder import run_dir_of

# What a resume line says that is no part of the run's identity: where it resumes from, and how long it trains.
NOT_IDENTITY = ("resume=", "total_steps=", "hydra.")


class RunRecord:
    """The sessions before this one (each up to the checkpoint the next one resumed from), and this one's."""

    before: list[dict[str, Any]]
    episodes_before: int | None  # None: not known (a checkpoint from before run records)

    def __init__(self, overrides: list[str], resume_state: dict[str, Any] | None, run_dir: Path | None = None):
        self.start_time = time.perf_counter()
        self.started = False  # whether this session has started training (a resume that fails before: no record)
        mine = [o for o in overrides if not o.startswith("resume=")]
        self.session = {"overrides": mine, "resumed_from": resume_state["path"] if resume_state else None}
        self.start_steps = resume_state["env_steps"] if resume_state else 0
        if resume_state is None:
            first = _budget_the_sweep_began_with(mine, run_dir) if "resume=auto" in overrides else mine
            self.original, self.before, self.episodes_before = first, [], 0
            return
        saved = resume_state.get("record")
        origin = run_dir_of(Path(resume_state["path"]))
        if saved is None:  # a checkpoint from before run records: what its run folder says
            self.original, self.before, self.episodes_before = _folder_overrides(origin), [], None
            return
        self.original, self.before = list(saved["overrides"]), [dict(s) for s in saved["sessions"]]
        self.episodes_before = int(saved["episodes"])
        if self.before:
            self.before[-1]["ended"] = _how_it_ended(origin, self.start_steps)

    def start_training(self) -> None:
        self.started = True

    def _current(self, env_steps: int, train_seconds: float, episodes: int | None) -> dict[str, Any]:
        steps = env_steps - self.start_steps
        return {
            **self.session,
            "start_steps": self.start_steps,
            "end_steps": env_steps,
            "wall_seconds": round(time.perf_counter() - self.start_time, 3),
            "train_seconds": round(train_seconds, 3),
            "sps": round(steps / train_seconds, 1) if train_seconds > 0 and steps > 0 else None,
            "episodes": None if episodes is None or self.episodes_before is None else episodes - self.episodes_before,
        }

    def checkpoint(self, env_steps: int, train_seconds: float, episodes: int) -> dict[str, Any]:
        """What a checkpoint at `env_steps` carries: the record with this session up to there."""
        now = self._current(env_steps, train_seconds, episodes)
        return {"overrides": self.original, "sessions": [*self.before, now], "episodes": episodes}

    def summary(self, env_steps: int, train_seconds: float, episodes: int, ended: str) -> dict[str, Any]:
        """The run's figures over all its sessions, for summary.json."""
        sessions = [*self.before, self._current(env_steps, train_seconds, episodes) | {"ended": ended}]
        trained = sum(s["end_steps"] - s["start_steps"] for s in sessions)
        seconds = sum(s["train_seconds"] for s in sessions)
        return {
            "wall_seconds": round(sum(s["wall_seconds"] for s in sessions), 3),
            "sps": round(trained / seconds, 1) if seconds > 0 else None,
            "overrides": self.original,
            "sessions": sessions,
        }

    def episodes(self) -> int:
        """Episodes logged before this session (0 when unknown: a checkpoint from before run records)."""
        return self.episodes_before or 0


def as_typed(overrides: list[str]) -> list[str]:
    """Overrides as a command line types them: Hydra's sweeper writes a deletion (`~tuned`) as `~tuned=null`, in a
    job's .hydra/ and its HydraConfig, which labels and tracker tags would show and identities would tell apart."""
    return [o.removesuffix("=null") if o.startswith("~") else o for o in overrides]


def identity(overrides: list[str]) -> list[str]:
    """The overrides that make a run what it is: without where it resumed from and its budget."""
    return [o for o in as_typed(overrides) if not o.startswith(NOT_IDENTITY)]


def _budget_the_sweep_began_with(overrides: list[str], run_dir: Path | None) -> list[str]:
    """The overrides of a job that first starts in a resumed sweep (resume=SWEEP total_steps=N gives each job
    resume=auto), with the budget its sweep began with, as the jobs that started before keep it in their identity
    (the report groups them by it): taken from the record of one of them; its own when none has one, or when the
    sweep sweeps total_steps (then a resume cannot set it)."""
    if run_dir is None or _sweeps_total_steps(run_dir.parent / "multirun.yaml"):
        return overrides
    for sibling in sorted(p for p in run_dir.parent.iterdir() if p.is_dir() and p != run_dir):
        summary = _summary(sibling)
        if summary.get("sessions") and summary.get("overrides") is not None:  # a run's record, not a failed start's
            began = [o for o in summary["overrides"] if o.startswith("total_steps=")]
            return [o for o in overrides if not o.startswith("total_steps=")] + began
    return overrides


def _sweeps_total_steps(multirun: Path) -> bool:
    """Whether the sweep whose multirun.yaml this is sweeps total_steps; True where there is no sweep to read."""
    from rlrun.compose.hydra_compat import COMPOSITION_ERRORS, parse_overrides

    try:
        hydra = yaml.safe_load(multirun.read_text())["hydra"]
        line = [o for o in hydra["overrides"]["task"] or [] if o.startswith("total_steps=")]
        searched = "total_steps" in (hydra.get("sweeper", {}).get("params") or {})  # Optuna's search space, say
        return searched or any(o.is_sweep_override() for o in parse_overrides(line))
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, *COMPOSITION_ERRORS):  # none, or unreadable
        return True


def recorded_overrides(folder: Path, summary: dict[str, Any]) -> list[str]:
    """A run folder's overrides as typed: its record's (`summary`, its summary.json read), else its Hydra job's."""
    if summary.get("overrides") is not None:
        return as_typed(list(summary["overrides"]))
    saved = folder / ".hydra" / "overrides.yaml"
    return as_typed(list(yaml.safe_load(saved.read_text()) or [])) if saved.exists() else []


def _folder_overrides(folder: Path | None) -> list[str]:
    return [] if folder is None else identity(recorded_overrides(folder, _summary(folder)))


def _summary(folder: Path | None) -> dict[str, Any]:
    try:
        summary = json.loads((folder / "summary.json").read_text()) if folder is not None else {}
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def ended_unevaluated(checkpoint: Path, env_steps: int) -> bool:
    """Whether the run that saved `checkpoint` (at `env_steps`) stopped or failed after saving it as its final one: in
    its final evaluation, which comes after the final checkpoint. Its run folder's summary says so at that step."""
    summary = _summary(run_dir_of(checkpoint))
    return summary.get("status") in ("interrupted", "failed") and summary.get("env_steps") == env_steps


def _how_it_ended(folder: Path | None, env_steps: int) -> str:
    """Why the session that wrote the checkpoint at `env_steps` ended, from its run folder's summary."""
    summary = _summary(folder)
    status = summary.get("status")
    if status is None or summary.get("env_steps") not in (None, env_steps):
        return f"resumed from its checkpoint at {env_steps} env steps"
    if status == "failed":
        return f"failed: {summary.get('error', '?')}"
    if status == "interrupted":
        return f"interrupted by signal {summary.get('signal')}"
    return str(status)
