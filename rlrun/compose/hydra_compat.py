"""What rlrun takes from Hydra beyond its documented API, in one place: the argument parser of a Hydra app, the
parsed form of overrides, the text of composition errors, turned into one line for the user, a fix of Hydra 1.3's
config sources that makes composing cheap, and a Hydra app's single run on a config composed already.
tests/unit/test_preflight.py fails loudly when a Hydra release changes any of it."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable
from typing import Any

from hydra._internal.core_plugins.structured_config_source import (
    StructuredConfigSource as HydrasStructuredConfigSource,
)
from hydra._internal.sources_registry import SourcesRegistry
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, IntegerNode, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlrun.config import CONF_DIR

COMPOSITION_ERRORS = (ConfigCompositionException, OverrideParseException, OmegaConfBaseException)


def args_parser() -> argparse.ArgumentParser:
    """The parser a Hydra app reads its command line with (--help, --cfg, -m, overrides)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def runs_nothing(args: list[str]) -> bool:
    """Whether a Hydra app's command line only prints (--help, --hydra-help, --cfg, --info, shell completion)."""
    parsed = args_parser().parse_args(args)
    return bool(parsed.help or parsed.hydra_help or parsed.cfg or parsed.info or parsed.shell_completion)


class StructuredConfigSource(HydrasStructuredConfigSource):
    """Hydra 1.3's `structured://` config source keeps the ConfigStore as an attribute, and every composition, and
    every config group `--help` lists (80 of them), deep-copies the source with it: all of rlrun's schemas, 70% of
    `rlrun train --help`. Hydra's main branch reads the store live instead (facebookresearch/hydra#2928, not in a
    1.3 release), as this one does. Same class name, so Hydra's plugin scan keeps it; at module level, so Hydra's
    launchers can pickle the registry holding it."""

    store = property(lambda self: ConfigStore.instance(), lambda self, value: None)


def read_config_store_live() -> None:
    SourcesRegistry.instance().types[StructuredConfigSource.scheme()] = StructuredConfigSource


def parse_overrides(overrides: list[str]) -> list[Override]:
    return OverridesParser.create().parse_overrides(list(overrides))


def override_values(override: Override) -> list[Any]:
    """The values an override gives its key, as the override parser types them (1e6 is a float): one, or each of a
    sweep of choices (a=1,2); a range or interval sweep gives its sweep object, left to the sweeper."""
    value = override.value()
    return list(value.list) if isinstance(value, ChoiceSweep) else [value]


def integer_key(cfg: DictConfig, key: str) -> bool:
    """Whether the dotted `key` of a composed structured config is an int (or optional int) field of its schema:
    the node type says so even where the value is null."""
    parent, _, leaf = key.rpartition(".")
    section = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(section, DictConfig) and leaf in section and isinstance(section._get_node(leaf), IntegerNode)


def error_line(ex: Exception, defaults: DictConfig) -> str:
    """One line for a composition error: what was wrong and what is accepted (`defaults` is the config
    composed without overrides, to list the keys that exist)."""
    cause = ex.__cause__
    if isinstance(ex, MissingConfigException) and ex.missing_cfg_file and "/" in ex.missing_cfg_file:
        group, name = ex.missing_cfg_file.rsplit("/", 1)
        options = [o for o in (ex.options or []) if not o.endswith("_schema")]
        # env= names a config in conf/env/, not a gymnasium id: a new user's first try is often env=MountainCar-v0
        other = f", or any registered gymnasium env with env.id={name}" if group == "env" else ""
        return f"unknown {group} '{name}'; choose one of: {', '.join(options)}{other}"
    if isinstance(ex, OverrideParseException):
        return f"cannot parse override: {str(ex).splitlines()[0]}"
    text = str(ex).splitlines()[0]
    if text.startswith("Could not override '") and isinstance(cause, OmegaConfBaseException):
        key = text.split("'")[1]
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(defaults, parent) if parent else defaults
        # Not the hydra node among the run's keys, nor a launcher's _target_ among what may be set.
        known = (
            [k for k in node.keys() if k != "_target_" and (parent or k != "hydra")]
            if isinstance(node, DictConfig)
            else []
        )
        if parent.endswith("kwargs"):  # a free-form dict (env.kwargs, model.kwargs): new keys take a +
            return f"'{key}' is not set yet; add it with +{key}=VALUE"
        close = difflib.get_close_matches(leaf, known, n=1)
        hint = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
        where = f"keys under {parent}" if parent else "top-level keys"
        return f"unknown key '{key}'{hint} ({where}: {', '.join(known)})"
    if text.startswith("Error merging override") and isinstance(cause, OmegaConfBaseException):
        override = text.removeprefix("Error merging override").strip()
        return f"{override}: {str(cause.msg).splitlines()[0]}"
    if isinstance(ex, ConfigCompositionException) and isinstance(cause, OmegaConfBaseException):
        return f"{text} {str(cause.msg).splitlines()[0]}"
    return text


def job_overrides(hc: Any) -> list[str]:
    """The overrides of this Hydra job (hc: its HydraConfig) as typed (run_record.as_typed): what its summary and
    trackers record."""
    from rlrun.run_record import as_typed

    return as_typed(list(hc.overrides.task))


def override_key(line: str) -> str:
    """The key or config group an override line sets: algo.lr of `+algo.lr=1`, tuned of `~tuned`."""
    return line.split("=", 1)[0].lstrip("+~")


def null_parent_line(overrides: list[str], defaults: DictConfig) -> str:
    for line in overrides:
        key = override_key(line)
        parent = key.rpartition(".")[0]
        if parent and OmegaConf.select(defaults, parent) is None:
            return f"cannot set '{key}': '{parent}' is null in this config"
    return f"cannot apply overrides {' '.join(overrides)}"


def run_composed(config_name: str, config: DictConfig, task: Callable[[DictConfig], Any]) -> Any:
    """Run `task` on `config` as a Hydra app's single run does (Hydra.run in hydra/_internal/hydra.py: its logging, the
    run folder and .hydra/, callbacks, and a failure reported as Hydra reports it), on a config composed already
    (with its hydra node, from the command line's overrides) instead of composing it twice more (Hydra's app
    composes once to learn the run mode, once to run). Returns what `task` returns."""
    from hydra import initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import run_and_report
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext, RunMode

    def run() -> Any:
        configure_log(config.hydra.hydra_logging, config.hydra.verbose)
        if config.hydra.mode is None:  # as Hydra's app chooses the mode, and records it
            config.hydra.mode = RunMode.RUN
            config.hydra.overrides.hydra.append("hydra.mode=RUN")
        callbacks = Callbacks(config)
        callbacks.on_run_start(config=config, config_name=config_name)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        ran = run_job(
            hydra_context=context, task_function=task, config=config, job_dir_key="hydra.run.dir", job_subdir_key=None
        )
        callbacks.on_run_end(config=config, config_name=config_name, job_return=ran)
        return ran.return_value  # raises the task's exception

    # The job may compose (a sweep job's presets do) and instantiate, as inside Hydra's app.
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return run_and_report(run)
