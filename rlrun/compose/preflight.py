"""Everything between the command line and the typed config, in-process and testable without a subprocess:
compose and check every configuration a command would run before anything starts (a typo ends with one line
and no run folder), resume merging (a checkpoint's config with the command line's overrides on top), and the
threads of parallel sweep jobs."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from rlrun.algos import ALGORITHMS
from rlrun.compose.hydra_compat import (
    COMPOSITION_ERRORS,
    args_parser,
    error_line,
    integer_key,
    null_parent_line,
    override_values,
    parse_overrides,
    runs_nothing,
)
from rlrun.compose.presets import preset_override
from rlrun.compose.store import GROUPS, from_yaml
from rlrun.compose.sweep_resume import sweep_resume_args
from rlrun.config import CONF_DIR, TrainConfig, check, validate_play, validate_train
from rlrun.config.batched import LAUNCHER, batch_refusal
from rlrun.errors import NothingToDo, UserError

if TYPE_CHECKING:
    import gymnasium as gym

log = logging.getLogger("rlrun")

# What the pre-flight's env check (gymnasium's passive env checker) said of each env id, for the run's log: the
# pre-flight runs before the run folder and its log exist; train_config, in the same process, logs them there.
ENV_CHECK_WARNINGS: dict[str, list[str]] = {}


def check_device_present(device: str, local_ranks: int = 1) -> None:
    """A CUDA device named by `device` exists on this machine (`cuda` takes one per local rank). Imports torch: only
    for a command that will run, never for printing a config or a typo's line."""
    if not device.startswith("cuda"):
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    check(count > 0, f"device={device}: this machine has no CUDA device (accepted here: auto, cpu)")
    devices = f"{count} CUDA device{'s' if count > 1 else ''} (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
    if ":" in device:
        check(int(device[5:]) < count, f"device={device}: this machine has {devices}")
    else:  # each rank on the node takes cuda:<its local rank>
        check(local_ranks <= count, f"device=cuda with {local_ranks} ranks per node: this machine has {devices}")


def resumed_config(resume: str, overrides: list[str]) -> tuple[TrainConfig, dict[str, Any]]:
    """The checkpoint's config with the command line's key=value overrides on top, checked, and the
    checkpoint itself."""
    from rlrun.checkpoint import load_checkpoint

    state = load_checkpoint(resume)
    typed = replace(from_yaml(state["config"], overrides), resume=resume)
    validate_train(typed)
    check_device_present(typed.device, typed.distributed.nproc_per_node)
    check_fits(state, typed)
    _check_not_done(state, typed)
    return typed, state


def _check_not_done(state: dict[str, Any], typed: TrainConfig) -> None:
    """Resuming a run that has trained its whole budget, without a larger one, changes nothing."""
    per_iteration = state.get("steps_per_iteration")  # the checkpoint's; a resume to another world size may differ
    if not per_iteration:
        return
    if state["env_steps"] >= typed.total_steps // per_iteration * per_iteration:
        raise NothingToDo(
            f"{state['path']} is complete at {state['env_steps']} env steps (total_steps={typed.total_steps}); "
            "nothing to do: give a larger total_steps to train it longer"
        )


def check_fits(state: dict[str, Any], typed: TrainConfig) -> None:
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


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def _shape(shape: tuple[int, ...], short: bool = False) -> str:
    if len(shape) == 1:
        return str(shape[0]) if short else f"{shape[0]}-dim"
    return str(tuple(shape))


def _log_warnings(typed: TrainConfig) -> None:
    for line in [*validate_train(typed), *ENV_CHECK_WARNINGS.get(typed.env.id, [])]:
        log.warning(line)


def train_config(
    cfg: DictConfig, overrides: list[str], run_dir: Path, requeued: bool = False
) -> tuple[TrainConfig, dict[str, Any] | None]:
    """The typed config the run in `run_dir` trains with, and the checkpoint it resumes from (or None). With
    resume=auto, and always for a job the scheduler requeued, that is the run folder's newest checkpoint if any."""
    typed: TrainConfig = OmegaConf.to_object(cfg)
    if typed.resume == "auto" or requeued:
        from rlrun.run_folder import list_checkpoints

        found = list_checkpoints(run_dir / "checkpoints")
        if found:
            # The job's own command line made the checkpoint in its folder: its config group choices (algo=, env=,
            # the preset the pre-flight added) are the checkpoint's, which a resume keeps; its key=value overrides
            # go on top. A choice that names another algorithm, env or network is refused.
            resumed, state = resumed_config(str(found[-1]), [o for o in overrides if _group(o) not in GROUPS])
            _same_run(typed, resumed, found[-1])
            _log_warnings(resumed)
            return resumed, state
        typed = replace(typed, resume=None if typed.resume == "auto" else typed.resume)
    if typed.resume is not None:
        typed, state = resumed_config(typed.resume, overrides)
        _log_warnings(typed)
        return typed, state
    _log_warnings(typed)
    return typed, None


def _group(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _same_run(composed: TrainConfig, resumed: TrainConfig, checkpoint: Path) -> None:
    """resume=auto's command line (`composed`) chooses the algorithm, env and network its checkpoint has."""
    was, now = resumed, composed
    trained = (was.algo.name, was.env.id, was.model.name)
    if (now.algo.name, now.env.id, now.model.name) != trained:
        raise UserError(
            f"resume=auto continues {checkpoint}, trained as algo={trained[0]} env.id={trained[1]} model={trained[2]}; "
            f"this command line gives algo={now.algo.name} env.id={now.env.id} model={now.model.name}: "
            "use another run folder for another run"
        )


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
    (a resumed run is pointed at its original run folder; a resumed sweep is its own line again)."""
    if command == "train":
        args = sweep_resume_args(args)
    parsed = args_parser().parse_args(args)
    if parsed.help or parsed.hydra_help or parsed.info or parsed.shell_completion:
        return args
    overrides = list(parsed.overrides)
    runs = not runs_nothing(args)
    if command == "play":
        _no_training_choices(overrides)
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        try:
            combos = _combinations(overrides)
        except COMPOSITION_ERRORS as e:
            raise UserError(f"cannot parse overrides: {' '.join(str(e).splitlines()[:2])}") from e
        exact = _exact_integers(command, overrides)
        if exact != overrides:
            args = [exact[overrides.index(a)] if a in overrides else a for a in args]
            overrides, combos = exact, _combinations(exact)
        presets = set()
        batched = LAUNCHER in overrides
        for combo in combos:
            typed, preset = _composed(command, combo)
            presets.add(preset)
            if command == "train":
                _preflight_train(typed, runs)
                refused = batch_refusal(typed) if batched else None
                if refused is not None:
                    raise UserError(refused)
            else:
                validate_play(typed)
                if runs:  # a bad checkpoint or device ends here, before Hydra makes the play's run folder
                    from rlrun.checkpoint import load_checkpoint

                    check_device_present(typed.device)
                    load_checkpoint(typed.checkpoint)
    if command == "train":
        # One preset decision for every job is made here, so .hydra/ shows it; a sweep whose jobs differ (over
        # env.id, say) has each job decide for itself (rlrun.compose.presets.job_presets).
        if len(presets) == 1 and None not in presets:
            # beside the other overrides: Hydra's parser takes one run of them (`a=1 --cfg job b=2` is an error)
            at = max((i + 1 for i, a in enumerate(args) if a in overrides), default=0)
            args = [*args[:at], presets.pop(), *args[at:]]
        return _resume_args(overrides, args)
    return args


def _compose(command: str, combo: list[str]) -> DictConfig:
    try:
        return compose(command, overrides=combo, return_hydra_config=command == "train")
    except COMPOSITION_ERRORS as e:
        raise UserError(error_line(e, _reference(command, combo))) from e
    except AssertionError as e:  # OmegaConf's way of refusing a key below a null node
        raise UserError(null_parent_line(combo, _reference(command, combo))) from e


def _composed(command: str, combo: list[str]) -> tuple[object, str | None]:
    """The typed config `combo` composes to, with the preset override it needs (None: none; rlrun/compose/presets.py),
    or UserError with one line for every way it cannot be composed."""
    cfg, preset = _compose(command, combo), None
    if command == "train":
        with open_dict(cfg):
            choices = cfg.pop("hydra").runtime.choices
        # a resumed run keeps its checkpoint's groups; resume=auto's new run decides in its job
        preset = None if cfg.resume is not None else preset_override(choices, cfg.env.id, combo)
        if preset is not None:
            cfg = _compose(command, [*combo, preset])
            with open_dict(cfg):
                del cfg["hydra"]
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:  # a required key left unset (e.g. play checkpoint=...)
        key = getattr(e, "full_key", "") or "?"
        raise UserError(f"missing value for '{key}': give {key}=...") from e
    unknown = _unknown_keys(cfg, OmegaConf.structured(typed))
    if unknown:
        raise UserError(f"unknown key '{unknown[0]}' (added with +); the schema has no such key")
    return typed, preset


def _exact_integers(command: str, overrides: list[str]) -> list[str]:
    """The overrides with each float given to an integer key written as that integer when it is one (total_steps=1e6
    is total_steps=1000000, in the run folder's .hydra/ too; OmegaConf refuses any float for an int); one line for
    one that is not (total_steps=1.5). Sweeps of choices are converted value by value."""
    reference = None
    exact = []
    for o in parse_overrides(overrides):
        values = override_values(o)
        if not any(isinstance(v, float) for v in values):
            exact.append(o.input_line)
            continue
        if reference is None:
            reference = _reference(command, overrides)
        if not integer_key(reference, o.key_or_group):
            exact.append(o.input_line)
            continue
        for v in values:
            if isinstance(v, float) and not v.is_integer():
                raise UserError(f"{o.input_line}: must be an integer (100000 or 1e5)")
        written = ",".join(str(int(v)) if isinstance(v, float) else str(v) for v in values)
        exact.append(f"{o.input_line.split('=', 1)[0]}={written}")
    return exact


def _no_training_choices(overrides: list[str]) -> None:
    """play runs the checkpoint's algo, model and env: a config group choice (env=pendulum) is training's."""
    for override in overrides:
        group = override.split("=", 1)[0].lstrip("+~")
        if group in GROUPS:
            raise UserError(
                f"'{override}': play runs the checkpoint's {group}; to play another env with the same spaces, "
                "give env.id=ID"
            )


def _preflight_train(typed: TrainConfig, runs: bool) -> None:
    from rlrun.envs import check_action_space, check_env_id, env_spaces, import_env_modules, third_party, vector_backend

    if typed.resume in (None, "auto"):  # auto: the command line's config is checked (its checkpoint's, when found)
        validate_train(typed)
        if runs:
            check_device_present(typed.device, typed.distributed.nproc_per_node)
        import_env_modules(typed.env.imports)
        check_env_id(typed.env.id)
        vector_backend(typed.env)  # native: the env has a vectorized implementation
        entry, user_network = ALGORITHMS[typed.algo.name], typed.model._target_ is not None
        if typed.env.id.startswith("ALE/") and not user_network:
            return  # frames and discrete actions, which every algorithm that takes them takes; a game loads slowly
        check_env = runs and third_party(typed.env.id) and typed.env.id not in ENV_CHECK_WARNINGS
        found = ENV_CHECK_WARNINGS.setdefault(typed.env.id, []) if check_env else None
        obs_space, action_space = env_spaces(typed.env, found)  # one env: it builds, its spaces encode, it checks
        _check_replay_memory(typed, obs_space)
        if getattr(obs_space, "mask_size", 0) and getattr(typed.algo, "normalize_obs", False):
            raise UserError(f"algo.normalize_obs=true would rescale {typed.env.id}'s action masks; set it false")
        if entry.actions:
            check_action_space(action_space, entry.actions, typed.env.id, typed.algo.name)
        if user_network:  # the user's network, built and run once on sample observations
            if entry.network is None:
                raise UserError(f"algo={typed.algo.name} builds its own network; it takes no model._target_")
            entry.network(typed.algo, typed.model, obs_space, action_space)


def _check_replay_memory(typed: TrainConfig, obs_space: gym.Space[Any]) -> None:
    """A replay of observations that cannot fit in this machine's memory is refused before the run (numpy would
    allocate it lazily and the run die of memory part way): uint8 images are stored as bytes, the rest as float32."""
    import numpy as np

    capacity = getattr(typed.algo, "buffer_size", None)  # the replay algorithms' key (DQN, SAC, TD3)
    if capacity is None:
        return
    itemsize = 1 if obs_space.dtype == np.uint8 and len(obs_space.shape) == 3 else 4
    per_rank = capacity * int(np.prod(obs_space.shape)) * itemsize
    ranks = typed.distributed.nproc_per_node
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if per_rank * ranks > memory:
        fits = memory // ranks // (per_rank // capacity)
        gib = 2**30
        raise UserError(
            f"algo.buffer_size={capacity} observations of {typed.env.id} ({obs_space.dtype} {list(obs_space.shape)}) "
            f"take {per_rank / gib:.1f} GiB per rank (x{ranks} on this node), more than this machine's "
            f"{memory / gib:.1f} GiB: lower algo.buffer_size (below {fits} here)"
        )


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
