"""MLflow as a tracker: one MLflow run per run folder in logging.mlflow.experiment, env_steps as its step, points
sent in batches (one log_batch per log interval, not one call per metric), the config as params logged once."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from rlrun.trackers import RunIdentity, flat, scalars

if TYPE_CHECKING:
    from rlrun.config import MlflowConfig

# A tracking server that stops answering must not hold training for minutes of retries (MLflow's defaults: 7
# retries with exponential back-off, 120 s per request): a few seconds, then the tracker is reported and left out.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

import mlflow  # noqa: E402  (after the settings above, which it reads)
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

_STATUS = {"completed": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}
_BATCH = 100  # MLflow takes at most 100 params (and 1000 metrics) per log_batch


class MlflowTracker:
    name = "mlflow"

    def __init__(self, settings: MlflowConfig) -> None:
        self.settings = settings  # logging.mlflow
        self.client: MlflowClient | None = None
        self.run_id: str | None = None

    def start(self, config: dict[str, Any], run: RunIdentity) -> str:
        # Unset: MLflow's own choice (MLFLOW_TRACKING_URI, else since MLflow 3 the sqlite file mlflow.db in the working
        # folder), named here so that parallel jobs opening a new sqlite store take turns as with one given.
        uri = self.settings.tracking_uri or mlflow.get_tracking_uri()
        _check_reachable(uri)
        self.run_id = run.resumed_id(self.name)
        with _store_lock(uri):  # the client opens (on first use, makes) the store
            self.client = MlflowClient(tracking_uri=uri)
            # A resumed run's experiment is its own already: only a new run looks it up (or makes it).
            experiment_id = None if self.run_id is not None else _experiment_id(self.client, self.settings.experiment)
        if self.run_id is not None:  # parameters stay as first logged
            self.client.update_run(self.run_id, status="RUNNING")
            return self.run_id
        tags = {"rlrun.run_dir": str(run.run_dir), "rlrun.overrides": " ".join(run.overrides)[:5000]}
        if run.group:
            tags["rlrun.sweep"] = run.group
        if run.origin_id(self.name):
            tags["rlrun.branched_from"] = run.origin_id(self.name)
        self.run_id = self.client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in flat(config).items()]
        for i in range(0, len(params), _BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + _BATCH])
        return self.run_id

    def log(self, metrics: dict[str, float], env_steps: int) -> None:
        now = int(time.time() * 1000)
        points = [Metric(k, float(v), now, env_steps) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=points)

    def tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, f"rlrun.{key}", value)

    def summary(self, summary: dict[str, Any]) -> None:
        now, step = int(time.time() * 1000), int(summary.get("env_steps") or 0)
        points = [Metric(f"summary/{k}", v, now, step) for k, v in scalars(summary).items()]
        tags = [RunTag("rlrun.status", str(summary.get("status")))]
        self.client.log_batch(self.run_id, metrics=points, tags=tags)

    def close(self, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=_STATUS.get(status, "FAILED"))
            self.run_id = None


def _check_reachable(uri: str | None) -> None:
    """An HTTP tracking server that refuses connections fails at once, in one line, rather than after retries."""
    parsed = urlparse(uri or "")
    if parsed.scheme not in ("http", "https") or parsed.hostname is None:
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=5).close()
    except OSError as e:
        raise ConnectionError(f"cannot reach the tracking server {uri}: {e.strerror or e}") from None


def _experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment's id, made if it does not exist yet: by this job, or by another job of a parallel sweep that
    made it first (MLflow then refuses a second one with that name)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    try:
        return str(client.create_experiment(name))
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return str(client.get_experiment_by_name(name).experiment_id)


@contextlib.contextmanager
def _store_lock(uri: str | None) -> Iterator[None]:
    """Held while a job opens a local sqlite store: its first use creates the store's tables, and the jobs of a
    parallel sweep (joblib) opening a new store at once would each try (one fails on "table already exists").
    A server serializes that itself; nothing to hold for it."""
    if not (uri or "").startswith("sqlite:///"):
        yield
        return
    lock = Path(uri.removeprefix("sqlite:///") + ".lock")
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
