"""`python counted_cli.py ARGS`: rlrun's CLI, with three kinds of real calls counted as they run (each still runs):
Hydra composing a config (its config loader, which the compose API, a Hydra app and its launchers all use),
rlrun checking a training config's values (validate_train), and torch.load. One line per call is appended to the
file $RLRUN_COUNTS, `pid kind detail`; ranks forked by the launcher inherit the counting."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra._internal.config_loader_impl import ConfigLoaderImpl

import rlrun.config


def counted(kind: str, fn: Callable[..., Any], detail: Callable[..., str] = lambda *a, **k: "-") -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        with open(os.environ["RLRUN_COUNTS"], "a") as f:  # one short append per line: whole even from two ranks
            f.write(f"{os.getpid()} {kind} {detail(*args, **kwargs)}\n")
        return fn(*args, **kwargs)

    return call


ConfigLoaderImpl.load_configuration = counted("compose", ConfigLoaderImpl.load_configuration)
# Before rlrun's modules that take it by name are imported (the CLI imports them when a command runs).
rlrun.config.validate_train = counted("validate", rlrun.config.validate_train)
torch.load = counted("load", torch.load, lambda f, *a, **k: Path(str(f)).name)

from rlrun.cli import main  # noqa: E402

main(sys.argv[1:])
