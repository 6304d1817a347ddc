"""`rlrun <command> [hydra overrides]`: checks the overrides once (so a typo ends with one clear line and no
run folder), then runs the command's Hydra app, which converts the config to typed objects and calls down."""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlrun.config import (
    DQNConfig,
    PlayConfig,
    TrainConfig,
    from_yaml,
    register_configs,
    to_yaml,
    validate_play,
    validate_train,
)
from rlrun.errors import UserError

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
COMMANDS = {
    "train": "train an agent:  rlrun train algo=ppo env=breakout seed=3 [key=value ...]",
    "play": "run a trained agent:  rlrun play checkpoint=PATH [episodes=10 video=true]",
    "report": "summarize a sweep or a folder of runs:  rlrun report outputs/multirun/DATE/TIME",
}
GROUPS = ("algo", "env", "model", "tuned")
USAGE = (
    "usage: rlrun <command> [--help] [hydra overrides]\n\ncommands:\n"
    + "\n".join(f"  {name:<7}{text}" for name, text in COMMANDS.items())
    + "\n\n`rlrun <command> --help` lists the config groups and keys; `--cfg job` prints the composed config."
)

register_configs()


def fail(message: str, code: int = 2) -> None:
    print(f"rlrun: error: {message}", file=sys.stderr)
    sys.exit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """User mistakes end with one line (exit 2); a failed env worker with its own traceback, once (exit 1)."""
    try:
        yield
    except Exception as e:
        known = _known_error(e)
        if known is None:
            raise
        fail(*known)


def typed_from_saved(saved_yaml: str, overrides: list[str] = ()) -> TrainConfig:
    """The TrainConfig stored in a checkpoint, with `key=value` overrides applied on top (resume)."""
    merged = OmegaConf.structured(from_yaml(saved_yaml))
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if key == "resume" or key.startswith("hydra"):
            continue
        if key in GROUPS:
            raise UserError(f"resume keeps the checkpoint's {key}; override its keys ({key}.x=...) instead")
        OmegaConf.update(merged, key, override.value(), merge=True)
    return OmegaConf.to_object(merged)


def resumed_config(resume: str, overrides: list[str]) -> tuple[TrainConfig, dict]:
    """The checkpoint's config with the command line's key=value overrides on top, checked, and the
    checkpoint itself."""
    from rlrun.checkpoint import load_checkpoint

    state = load_checkpoint(resume)
    typed = replace(typed_from_saved(state["config"], overrides), resume=resume)
    validate_train(typed)
    return typed, state


def _train_config(cfg: DictConfig, overrides: list[str]) -> tuple[TrainConfig, dict | None]:
    typed: TrainConfig = OmegaConf.to_object(cfg)
    if typed.resume is not None:
        return resumed_config(typed.resume, overrides)
    validate_train(typed)
    return typed, None


def _job_threads(typed: TrainConfig, hc) -> TrainConfig:
    """Parallel sweep jobs (joblib launcher) split the cores between them instead of each taking all."""
    n_jobs = OmegaConf.select(hc.launcher, "n_jobs", default=None)
    if typed.threads or not n_jobs:
        return typed
    cores = os.cpu_count() or 1
    return replace(typed, threads=max(1, cores // (cores if n_jobs < 0 else n_jobs)))


def _train_job(cfg: DictConfig, hc, overrides: list[str], run_dir: Path) -> dict | None:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from rlrun.distributed import from_env, launched_externally
    from rlrun.launch import launch
    from rlrun.train import train

    typed, state = _train_config(cfg, overrides)
    typed = _job_threads(typed, hc)
    config_yaml = to_yaml(replace(typed, resume=None))
    d = typed.distributed
    if d.nproc_per_node * d.nnodes > 1 and not launched_externally():
        try:
            return launch(typed, run_dir, config_yaml, typed.resume, overrides)
        except SignalException as e:
            sys.exit(128 + int(e.sigval))
    return train(typed, run_dir, from_env(typed.device), config_yaml, state, tuple(overrides))


def _known_error(e: BaseException) -> tuple[str, int] | None:
    """(message, exit code) for errors rlrun explains itself; None for a bug, which keeps its traceback."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from rlrun.envs.pool import EnvWorkerError
    from rlrun.launch import root_cause

    if isinstance(e, UserError):
        return str(e), 2
    if isinstance(e, EnvWorkerError):
        return str(e), 1
    if isinstance(e, ChildFailedError):
        return root_cause(e), 1
    return None


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="train")
def train_app(cfg: DictConfig) -> float | None:
    from hydra.types import RunMode

    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    run_dir = Path(hc.runtime.output_dir)
    try:
        summary = _train_job(cfg, hc, overrides, run_dir)
    except Exception as e:
        known = _known_error(e)
        if hc.mode != RunMode.MULTIRUN:
            if known is None:
                raise
            fail(*known)
        # One job of a sweep: record why it failed and let the sweep go on (a sweeper sees nan).
        message = known[0] if known else f"{type(e).__name__}: {e}"
        logging.getLogger("rlrun").error("job %s failed: %s", hc.job.num, message)
        failed = {"status": "failed", "error": message, "overrides": overrides}
        (run_dir / "summary.json").write_text(json.dumps(failed, indent=2))
        return float("nan")
    if summary is None:  # a node without rank 0
        return None
    if summary["status"] == "interrupted":
        sys.exit(128 + summary["signal"])
    return summary["eval_return_mean"]  # what a Hydra sweeper optimizes


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="play")
def play_app(cfg: DictConfig) -> float:
    from rlrun.checkpoint import load_checkpoint
    from rlrun.play import play

    with user_errors():
        typed: PlayConfig = OmegaConf.to_object(cfg)
        validate_play(typed)
        state = load_checkpoint(typed.checkpoint)
        result = play(typed, typed_from_saved(state["config"]), state, Path(HydraConfig.get().runtime.output_dir))
    return result["mean"]


APPS = {"train": train_app, "play": play_app}


def _combinations(overrides: list[str]) -> list[list[str]]:
    """Single-valued override lists covering every value of every sweep (one sweep varied at a time), so a
    bad value anywhere in a multirun is found before its first job starts. Non-choice sweeps (Optuna
    intervals) are left to the sweeper."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    base, sweeps = [], []
    for o in parsed:
        if not o.is_sweep_override():
            base.append(o.input_line)
            continue
        left = o.input_line.split("=", 1)[0]
        try:
            values = [f"{left}={v}" for v in o.sweep_string_iterator()]
        except Exception:
            continue
        sweeps.append(values)
    first = [values[0] for values in sweeps if values]
    combos = [base + first]
    for i, values in enumerate(sweeps):
        for v in values[1:]:
            combos.append(base + first[:i] + [v] + first[i + 1 :])
    return combos


def _error_line(ex: Exception, defaults: DictConfig) -> str:
    """One line for a composition error: what was wrong and what is accepted (`defaults` is the config
    composed without overrides, to list the keys that exist)."""
    cause = ex.__cause__
    if isinstance(ex, MissingConfigException) and ex.missing_cfg_file and "/" in ex.missing_cfg_file:
        group, name = ex.missing_cfg_file.rsplit("/", 1)
        options = [o for o in (ex.options or []) if not o.endswith("_schema")]
        return f"unknown {group} '{name}'; choose one of: {', '.join(options)}"
    if isinstance(ex, OverrideParseException):
        return f"cannot parse override: {str(ex).splitlines()[0]}"
    text = str(ex).splitlines()[0]
    if text.startswith("Could not override '") and isinstance(cause, OmegaConfBaseException):
        key = text.split("'")[1]
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(defaults, parent) if parent else defaults
        known = list(node.keys()) if isinstance(node, DictConfig) else []
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


def _null_parent_line(overrides: list[str], defaults: DictConfig) -> str:
    for line in overrides:
        key = line.split("=", 1)[0].lstrip("+~")
        parent = key.rpartition(".")[0]
        if parent and OmegaConf.select(defaults, parent) is None:
            return f"cannot set '{key}': '{parent}' is null in this config"
    return f"cannot apply overrides {' '.join(overrides)}"


def _unknown_keys(cfg: DictConfig, schema: DictConfig, prefix: str = "") -> list[str]:
    """Keys in the composed config that the typed schema does not have (Hydra's `+key=` adds them)."""
    found = []
    for key in cfg:
        path = f"{prefix}{key}"
        if key not in schema:
            found.append(path)
        elif isinstance(cfg[key], DictConfig) and isinstance(schema[key], DictConfig):
            found += _unknown_keys(cfg[key], schema[key], path + ".")
    return found


def _reference(command: str, combo: list[str]) -> DictConfig:
    """The config the command line's group choices give, without its other overrides: the keys that exist for
    this run (algo=dqn has algo.replay.*, the default algo does not). Plain defaults if a choice is the error."""
    choices = [o for o in combo if o.split("=", 1)[0] in GROUPS]
    try:
        return compose(command, overrides=choices)
    except (ConfigCompositionException, OverrideParseException, OmegaConfBaseException):
        return compose(command)


def preflight(command: str, args: list[str]) -> list[str]:
    """Compose and validate every configuration the command would run; returns the args to run with
    (a resumed run is pointed at its original run folder)."""
    from hydra._internal.utils import get_args_parser

    parsed = get_args_parser().parse_args(args)
    if parsed.help or parsed.hydra_help or parsed.info or parsed.shell_completion:
        return args
    overrides = list(parsed.overrides)
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        try:
            combos = _combinations(overrides)
        except OverrideParseException as e:
            raise UserError(f"cannot parse overrides: {' '.join(str(e).splitlines()[:2])}") from e
        for combo in combos:
            try:
                cfg = compose(command, overrides=combo)
            except (ConfigCompositionException, OverrideParseException, OmegaConfBaseException) as e:
                raise UserError(_error_line(e, _reference(command, combo))) from e
            except AssertionError as e:  # OmegaConf's way of refusing a key below a null node
                raise UserError(_null_parent_line(combo, _reference(command, combo))) from e
            try:
                typed = OmegaConf.to_object(cfg)
            except OmegaConfBaseException as e:  # a required key left unset (e.g. play checkpoint=...)
                key = getattr(e, "full_key", "") or "?"
                raise UserError(f"missing value for '{key}': give {key}=...") from e
            unknown = _unknown_keys(cfg, OmegaConf.structured(typed))
            if unknown:
                raise UserError(f"unknown key '{unknown[0]}' (added with +); the schema has no such key")
            if command == "train":
                _preflight_train(typed, overrides, args)
            else:
                validate_play(typed)
    if command == "train":
        return _resume_args(overrides, args)
    return args


def _preflight_train(typed: TrainConfig, overrides: list[str], args: list[str]) -> None:
    from rlrun.envs import check_discrete_actions, check_env_id, import_env_modules

    if typed.resume is None:
        validate_train(typed)
        import_env_modules(typed.env.imports)
        check_env_id(typed.env.id)
        if isinstance(typed.algo, DQNConfig):
            check_discrete_actions(typed.env, typed.algo.name)


def _resume_args(overrides: list[str], args: list[str]) -> list[str]:
    """Resuming from a run's newest checkpoint continues in its run folder and keeps that folder's .hydra/ as it
    was. Resuming from an older one starts a new run folder (which records where it came from): continuing in
    the old one would leave the abandoned later checkpoints there, which outrank the new ones by step."""
    from rlrun.checkpoint import is_newest, resolve_checkpoint, run_dir_of

    resume = [o for o in OverridesParser.create().parse_overrides(overrides) if o.key_or_group == "resume"]
    if not resume or resume[0].value() is None:
        return args
    path = resolve_checkpoint(resume[0].value())
    resumed_config(str(path), overrides)  # a bad checkpoint or override fails here, before any run folder
    run_dir = run_dir_of(path)
    if run_dir is None or not is_newest(path) or any(a.startswith("hydra.run.dir=") for a in args):
        return args
    return [*args, f"hydra.run.dir='{run_dir}'", "hydra.output_subdir=null"]


def _torchrun_args(args: list[str]) -> list[str]:
    """Under torchrun every rank runs this CLI. They must share ONE run folder (named by the rendezvous
    run id, not by each process's clock), and only rank 0 may create files in it."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return args
    if not any(a.startswith("hydra.run.dir=") for a in args):
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        if run_id == "none":
            run_id = f"{os.environ.get('MASTER_ADDR', 'local')}-{os.environ.get('MASTER_PORT', '0')}"
        args = [*args, f"hydra.run.dir=outputs/torchrun/{run_id}"]
    if os.environ["RANK"] != "0":
        args = [*args, "hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    return args


def _report(args: list[str]) -> None:
    import argparse

    from rlrun.report import report

    parser = argparse.ArgumentParser(prog="rlrun report", description=COMMANDS["report"])
    parser.add_argument("path", type=Path, help="a multirun folder, or any folder holding run folders")
    with user_errors():
        report(parser.parse_args(args).path)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # a usage error, as git and argparse treat a missing command
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    if argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, args = argv[0], argv[1:]
    if command not in COMMANDS:
        fail(f"unknown command '{command}'; choose one of: {', '.join(COMMANDS)}")
    if command == "report":
        _report(args)
        return
    with user_errors():
        args = preflight(command, args)
    if command == "train":
        args = _torchrun_args(args)
    sys.argv = [f"rlrun {command}", *args]
    APPS[command]()


if __name__ == "__main__":
    main()
