"""Experiment trackers (Weights & Biases, MLflow) beside TensorBoard, on the main rank only. Each tracker is one
module implementing Tracker; Trackers runs them for RunLogger: it keeps each tracked run's id in the run folder
(trackers.json) so a resume, requeue or restart continues it, drops points at steps already logged, and turns a
tracker's failure into one warning line, after which the run goes on without it."""

from __future__ import annotations

import json
import logging
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlrun.run_folder import writing

if TYPE_CHECKING:  # annotations only: importing the schemas would bring omegaconf into every tracker's import
    from rlrun.config import LoggingConfig

log = logging.getLogger("rlrun")

STATE_FILE = "trackers.json"  # in the run folder: {tracker: {"id": ..., "total_steps": ...}}


@dataclass(frozen=True)
class RunIdentity:
    """Who the tracked run is: its folder, its name and tags (the job's overrides), its sweep's group, and, on a
    resume, the tracked run it continues or (from another folder's older checkpoint) branches from."""

    run_dir: Path
    name: str
    overrides: tuple[str, ...]
    group: str | None  # the sweep folder (DATE/TIME) of a Hydra multirun's job
    total_steps: int
    resumed: dict[str, Any]  # this folder's STATE_FILE: {tracker: {"id": ...}} of the tracked runs that already exist
    branched_from: dict[str, Any]  # the origin folder's STATE_FILE, when this run continues an older checkpoint of it

    def resumed_id(self, tracker: str) -> str | None:
        found: str | None = self.resumed.get(tracker, {}).get("id")
        return found

    def origin_id(self, tracker: str) -> str | None:
        found: str | None = self.branched_from.get(tracker, {}).get("id")
        return found


class Tracker(Protocol):
    name: str

    def start(self, config: dict[str, Any], run: RunIdentity) -> str:
        """Create or continue the tracked run (config logged only when it is new); returns its id."""

    def log(self, metrics: dict[str, float], env_steps: int) -> None: ...

    def tag(self, key: str, value: str) -> None: ...

    def summary(self, summary: dict[str, Any]) -> None: ...

    def close(self, status: str) -> None:
        """status: completed | interrupted | failed (summary.json's)."""


def tracker(name: str, c: LoggingConfig) -> Tracker:
    """The tracker `name` of logging.trackers (`c`: logging), with its section (logging.wandb, logging.mlflow).
    Imported only here: a run without trackers never imports their packages."""
    if name == "wandb":
        from rlrun.trackers.wandb_tracker import WandbTracker

        return WandbTracker(c.wandb)
    from rlrun.trackers.mlflow_tracker import MlflowTracker

    return MlflowTracker(c.mlflow)


def sweep_of(run_dir: Path) -> tuple[str | None, list[str]]:
    """(group, the sweep's own overrides) of a Hydra multirun's job, which runs in SWEEP/N beside the
    SWEEP/multirun.yaml Hydra writes: the group is the sweep folder's last two names (DATE/TIME with the default
    hydra.sweep.dir); (None, []) for a single run."""
    import yaml

    sweep = run_dir.parent
    path = sweep / "multirun.yaml"
    if not path.exists():
        return None, []
    try:
        task = yaml.safe_load(path.read_text())["hydra"]["overrides"]["task"]
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        task = []
    return f"{sweep.parent.name}/{sweep.name}", list(task or [])


class Trackers:
    """The run's trackers, each started at once; a tracker that raises is reported once and left out."""

    def __init__(self, trackers: list[Tracker], config: dict[str, Any], run: RunIdentity, logged_until: int):
        """`logged_until`: the last env step the run folder's earlier sessions logged (its trackers got it too)."""
        self.run_dir, self.logged_until = run.run_dir, logged_until
        self.hparams = hparams(config)  # for TensorBoard's HParams, which RunLogger writes beside its scalars
        self.active: list[Tracker] = []
        self._dropped_note = False
        state = dict(run.resumed)
        for t in trackers:
            try:
                tracked_id = t.start(config, run)
            except Exception as e:
                self._failed(t, "start", e)
                continue
            self.active.append(t)
            before = state.get(t.name, {})
            if before.get("id") == tracked_id and before.get("total_steps") != run.total_steps:
                self._call(t, "tag", "total_steps_resumed", f"{before.get('total_steps')} -> {run.total_steps}")
            state[t.name] = {"id": tracked_id, "total_steps": run.total_steps}
        if self.active:
            path = run.run_dir / STATE_FILE
            with writing(path):
                path.write_text(json.dumps(state, indent=2) + "\n")

    def log(self, metrics: dict[str, float], env_steps: int) -> None:
        if env_steps <= self.logged_until:  # a session after a crash repeats steps its tracked run already has
            if self.active and not self._dropped_note:
                log.info("trackers: points up to env step %d are logged already; repeated ones dropped", env_steps)
                self._dropped_note = True
            return
        for t in list(self.active):
            self._call(t, "log", metrics, env_steps)

    def summary(self, summary: dict[str, Any]) -> None:
        for t in list(self.active):
            self._call(t, "summary", summary)

    def close(self, status: str) -> None:
        for t in list(self.active):
            self._call(t, "close", status)
        self.active = []

    def _call(self, t: Tracker, method: str, *args: object) -> None:
        try:
            getattr(t, method)(*args)
        except Exception as e:
            self._failed(t, method, e)
            if t in self.active:
                self.active.remove(t)
                _close_quietly(t)

    def _failed(self, t: Tracker, what: str, error: Exception) -> None:
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        log.warning(
            "tracker %s failed (%s: %s: %s); the run goes on with TensorBoard and metrics.jsonl",
            t.name,
            what,
            type(error).__name__,
            textwrap.shorten(message, 500, placeholder=" ..."),  # whole words: a URL in it stays whole or goes
        )


def _close_quietly(t: Tracker) -> None:
    try:
        t.close("failed")
    except Exception:  # already reported once: its failure to close says nothing new
        pass


def read_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_FILE
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}


def flat(d: dict[str, Any], prefix: str = "") -> dict[str, object]:
    """A nested config as dotted keys (algo.lr), as a tracker's params."""
    out: dict[str, object] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flat(value, name + ".")
        else:
            out[name] = value
    return out


def hparams(config: dict[str, Any]) -> dict[str, float | int | str | bool]:
    """The config's scalars as dotted keys (algo.lr, env.num_envs, seed): the run's hyperparameters in TensorBoard's
    HParams (lists and unset values left out: HParams takes numbers, strings and booleans only)."""
    return {k: v for k, v in flat(config).items() if isinstance(v, (int, float, str, bool))}


def scalars(summary: dict[str, Any]) -> dict[str, float]:
    """A summary's top-level numbers (final eval, SPS, env steps), as a tracker's summary metrics."""
    return {k: float(v) for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def opener(
    c: LoggingConfig, config_yaml: str, run_dir: Path, overrides: tuple[str, ...], total_steps: int, origin: Path | None
) -> Callable[[int], Trackers]:
    """What opens logging.trackers (`c`: logging) for RunLogger, given the last env step the run folder logged
    before; without trackers it opens none but still carries the config's HParams for TensorBoard. `origin`: the
    folder whose older checkpoint this run continues in its own."""
    import yaml

    shown = tuple(o for o in overrides if not o.startswith(("resume=", "hydra.")))
    group, common = sweep_of(run_dir)
    # A sweep's job is named by what differs between its jobs: its overrides that are not the sweep's own
    # (seed=3 of seed=3,4; an Optuna sweeper's choices).
    # (Hydra escapes a job's override values, sqlite\\:///..., where multirun.yaml keeps the sweep's as typed.)
    unescaped = {o.replace("\\", "") for o in common}
    own = [o for o in shown if o.replace("\\", "") not in unescaped] if group else list(shown)
    run = RunIdentity(
        run_dir=run_dir,
        name=" ".join(own) or run_dir.name,
        overrides=shown,
        group=group,
        total_steps=total_steps,
        resumed=read_state(run_dir),
        branched_from=read_state(origin) if origin is not None else {},
    )
    config = yaml.safe_load(config_yaml)
    return lambda logged_until: Trackers([tracker(n, c) for n in c.trackers], config, run, logged_until)
