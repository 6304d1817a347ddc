"""Weights & Biases as a tracker: one W&B run per run folder, env_steps as its step, written under the run folder
(run_dir/wandb/); offline mode (logging.wandb.mode=offline or WANDB_MODE=offline) is honoured and told how to sync."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import wandb

from rlrun.trackers import RunIdentity, scalars

log = logging.getLogger("rlrun")

_EXIT_CODES = {"completed": 0, "interrupted": 130, "failed": 1}


class WandbTracker:
    name = "wandb"

    def __init__(self, settings):
        self.settings = settings  # logging.wandb
        self.run = None

    def start(self, config: dict[str, Any], run: RunIdentity) -> str:
        s = self.settings
        resumed = run.resumed_id(self.name)
        tags = [*s.tags, *(o[:64] for o in run.overrides)]  # W&B refuses a tag over 64 characters
        origin = run.origin_id(self.name)
        if origin and not resumed:
            tags.append(f"branched_from:{origin}"[:64])
        self.run = wandb.init(
            project=s.project,
            entity=s.entity,
            group=s.group or run.group,
            tags=tags,
            name=run.name,
            mode=s.mode,
            dir=str(run.run_dir),
            id=resumed or uuid.uuid4().hex[:12],
            resume="allow",
            config=None if resumed else config,  # logged once: a resume's changes are tags
            settings=wandb.Settings(silent=True, console="off"),
            reinit="create_new",  # one run per job even when a launcher runs several jobs in one process
        )
        if origin and not resumed:
            self.run.config.update({"branched_from": origin})
        return self.run.id

    def log(self, metrics: dict[str, float], env_steps: int) -> None:
        self.run.log(dict(metrics), step=env_steps)

    def tag(self, key: str, value: str) -> None:
        self.run.tags = (*self.run.tags, f"{key}:{value}"[:64])

    def summary(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(scalars(summary) | {"status": summary.get("status")})

    def close(self, status: str) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        offline = run.settings.mode == "offline"
        folder = Path(run.dir).parent  # wandb/offline-run-DATE-ID, what `wandb sync` uploads
        run.finish(exit_code=_EXIT_CODES.get(status, 1))
        if offline:
            log.info("W&B ran offline: upload this run with  wandb sync %s", folder)
