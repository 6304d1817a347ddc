"""Hydra callbacks (conf/train.yaml's hydra.callbacks): a sweep names its folder when it starts and when it ends,
the folder `rlrun report` reads."""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SweepFolder(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        print(f"sweep folder: {config.hydra.sweep.dir}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print(f"sweep done; report with: rlrun report {config.hydra.sweep.dir}", flush=True)
