"""Everything between the command line and the typed config, in-process and testable without a subprocess:
compose and check every configuration a command would run before anything starts (a typo ends with one line
and no run folder), resume merging (a checkpoint's config with the command line's overrides on top), and the
threads of parallel sweep jobs."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlrun.algos import ALGORITHMS
from rlrun.config import CONF_DIR, TrainConfig, validate_play, validate_train
from rlrun.config.hydra_compat import COMPOSITION_ERRORS, args_parser, error_line, null_parent_line, parse_overrides
from rlrun.config.store import GROUPS, from_yaml
from rlrun.errors import NothingToDo, UserError


def resumed_config(resume: str, overrides: list[str]) -> tuple[TrainConfig, dict]:
    """The checkpoint's config with the command line's key=value overrides on top, checked, and the
    checkpoint itself."""
    from rlrun.checkpoint import load_checkpoint

    state = load_checkpoint(resume)
    typed = replace(from_yaml(state["config"], overrides), resume=resume)
    validate_train(typed)
    check_fits(state, typed)
    _check_not_done(state, typed)
    return typed, state


def _check_not_done(state: dict, typed: TrainConfig) -> None:
    """Resuming a run that has trained its whole budget, without a larger one, changes nothing."""
    per_iteration = state.get("steps_per_iteration")  # the checkpoint's; a resume to another world size may differ
    if not per_iteration:
        return
    if state["env_steps"] >= typed.total_steps // per_iteration * per_iteration:
        raise NothingToDo(
            f"{state['path']} is complete at {state['env_steps']} env steps (total_steps={typed.total_steps}); "
            "nothing to do: give a larger total_steps to train it longer"
        )


def check_fits(state: dict, typed: TrainConfig) -> None:
    """A config that the checkpoint's networks cannot continue in (another env's spaces, another network shape)
    ends here with one line naming the difference, before anything is written. Costs an env and a network built
    only when the resume line changes the env, model or algorithm."""
    trained = from_yaml(state["config"])
    if (trained.env, trained.model, trained.algo) == (typed.env, typed.model, typed.algo):
        return
    from rlrun.algos import build_algo
    from rlrun.algos.protocol import EnvSpec
    from rlrun.envs import env_spaces, frame_stack, import_env_modules

    import_env_modules(typed.env.imports)
    obs, actions = env_spaces(typed.env)
    if trained.env != typed.env:
        was_obs, was_actions = env_spaces(trained.env)
        changed = f"env.id={typed.env.id}" if typed.env.id != trained.env.id else _changed("env", trained, typed)
        if was_obs.shape != obs.shape:
            raise UserError(
                f"the checkpoint was trained on {trained.env.id} with a {_shape(was_obs.shape)} observation; "
                f"{changed} has {_shape(obs.shape, short=True)}"
            )
        if was_actions != actions:
            raise UserError(
                f"the checkpoint was trained on {trained.env.id} with actions {was_actions}; {changed} has {actions}"
            )
    import torch

    spec = EnvSpec(obs, actions, typed.env.num_envs, frame_stack(typed.env))
    fresh = build_algo(typed.algo, typed.model, spec, torch.device("cpu")).state_dict()["model"]
    saved = state["algo"]["model"]
    for key in [*saved, *(k for k in fresh if k not in saved)]:
        a, b = saved.get(key), fresh.get(key)
        if a is None or b is None or a.shape != b.shape:
            was = "absent" if a is None else f"of shape {tuple(a.shape)}"
            now = "absent" if b is None else f"of shape {tuple(b.shape)}"
            changes = _changed("model", trained, typed) or _changed("algo", trained, typed)
            raise UserError(
                f"the checkpoint's network does not fit {changes or 'this config'}: {key} is {was} there, {now} here"
            )


def _changed(section: str, a: TrainConfig, b: TrainConfig) -> str:
    """The keys of `section` whose values differ between two configs, as key=value of `b`."""
    x, y = OmegaConf.structured(getattr(a, section)), OmegaConf.structured(getattr(b, section))
    flat_x, flat_y = _flat(OmegaConf.to_container(x)), _flat(OmegaConf.to_container(y))
    keys = [k for k in flat_y if flat_x.get(k) != flat_y[k]]
    return " ".join(f"{section}.{k}={flat_y[k]}" for k in keys)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def _shape(shape: tuple, short: bool = False) -> str:
    if len(shape) == 1:
        return str(shape[0]) if short else f"{shape[0]}-dim"
    return str(tuple(shape))


def train_config(
    cfg: DictConfig, overrides: list[str], run_dir: Path, requeued: bool = False
) -> tuple[TrainConfig, dict | None]:
    """The typed config the run in `run_dir` trains with, and the checkpoint it resumes from (or None). With
    resume=auto, and always for a job the scheduler requeued, that is the run folder's newest checkpoint if any."""
    typed: TrainConfig = OmegaConf.to_object(cfg)
    if typed.resume == "auto" or requeued:
        from rlrun.run_folder import list_checkpoints

        found = list_checkpoints(run_dir / "checkpoints")
        typed = replace(typed, resume=str(found[-1]) if found else None if typed.resume == "auto" else typed.resume)
    if typed.resume is not None:
        return resumed_config(typed.resume, overrides)
    validate_train(typed)
    return typed, None


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


def _combinations(overrides: list[str]) -> list[list[str]]:
    """Single-valued override lists covering every value of every sweep (one sweep varied at a time), so a
    bad value anywhere in a multirun is found before its first job starts. Non-choice sweeps (Optuna
    intervals) are left to the sweeper."""
    parsed = parse_overrides(overrides)
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
    except COMPOSITION_ERRORS:
        return compose(command)


def preflight(command: str, args: list[str]) -> list[str]:
    """Compose and validate every configuration the command would run; returns the args to run with
    (a resumed run is pointed at its original run folder)."""
    parsed = args_parser().parse_args(args)
    if parsed.help or parsed.hydra_help or parsed.info or parsed.shell_completion:
        return args
    overrides = list(parsed.overrides)
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        try:
            combos = _combinations(overrides)
        except COMPOSITION_ERRORS as e:
            raise UserError(f"cannot parse overrides: {' '.join(str(e).splitlines()[:2])}") from e
        for combo in combos:
            try:
                cfg = compose(command, overrides=combo)
            except COMPOSITION_ERRORS as e:
                raise UserError(error_line(e, _reference(command, combo))) from e
            except AssertionError as e:  # OmegaConf's way of refusing a key below a null node
                raise UserError(null_parent_line(combo, _reference(command, combo))) from e
            try:
                typed = OmegaConf.to_object(cfg)
            except OmegaConfBaseException as e:  # a required key left unset (e.g. play checkpoint=...)
                key = getattr(e, "full_key", "") or "?"
                raise UserError(f"missing value for '{key}': give {key}=...") from e
            unknown = _unknown_keys(cfg, OmegaConf.structured(typed))
            if unknown:
                raise UserError(f"unknown key '{unknown[0]}' (added with +); the schema has no such key")
            if command == "train":
                _preflight_train(typed)
            else:
                validate_play(typed)
    if command == "train":
        return _resume_args(overrides, args)
    return args


def _preflight_train(typed: TrainConfig) -> None:
    from rlrun.envs import check_action_space, check_env_id, env_spaces, import_env_modules

    if typed.resume in (None, "auto"):  # auto: the command line's config is checked (its checkpoint's, when found)
        validate_train(typed)
        import_env_modules(typed.env.imports)
        check_env_id(typed.env.id)
        entry, user_network = ALGORITHMS[typed.algo.name], typed.model._target_ is not None
        if not (entry.actions or user_network):
            return
        obs_space, action_space = env_spaces(typed.env)  # one env built, for both checks
        if entry.actions:
            check_action_space(action_space, entry.actions, typed.env.id, typed.algo.name)
        if user_network:  # the user's network, built and run once on sample observations
            if entry.network is None:
                raise UserError(f"algo={typed.algo.name} builds its own network; it takes no model._target_")
            entry.network(typed.algo, typed.model, obs_space, action_space)


def _resume_args(overrides: list[str], args: list[str]) -> list[str]:
    """Resuming from a run's newest checkpoint continues in its run folder and keeps that folder's .hydra/ as it
    was. Resuming from an older one starts a new run folder (which records where it came from): continuing in
    the old one would leave the abandoned later checkpoints there, which outrank the new ones by step."""
    resume = [o for o in parse_overrides(overrides) if o.key_or_group == "resume"]
    if not resume or resume[0].value() in (None, "auto"):  # auto is resolved in the run folder Hydra makes
        return args
    from rlrun.run_folder import is_newest, resolve_checkpoint, run_dir_of

    path = resolve_checkpoint(resume[0].value())
    resumed_config(str(path), overrides)  # a bad checkpoint or override fails here, before any run folder
    run_dir = run_dir_of(path)
    if run_dir is None or not is_newest(path) or any(a.startswith("hydra.run.dir=") for a in args):
        return args
    return [*args, f"hydra.run.dir='{run_dir}'", "hydra.output_subdir=null"]
