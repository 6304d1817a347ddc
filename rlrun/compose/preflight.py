"""Everything between the command line and the run, in-process and testable without a subprocess: compose and
check every configuration a command would run before anything starts (a typo ends with one line and no run folder),
each once, and hand what was checked to the job that runs it (rlrun/compose/handoff.py)."""

from __future__ import annotations

import argparse
import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra import compose, initialize_config_dir
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from rlrun.algos import ALGORITHMS
from rlrun.compose.handoff import Checked, hand_over
from rlrun.compose.hydra_compat import (
    COMPOSITION_ERRORS,
    args_parser,
    error_line,
    integer_key,
    null_parent_line,
    override_key,
    override_values,
    parse_overrides,
    runs_nothing,
)
from rlrun.compose.presets import preset_override
from rlrun.compose.resume import auto_resumed, resume_folder, resumed_config
from rlrun.compose.store import GROUPS
from rlrun.compose.sweep_resume import sweep_resume_args
from rlrun.config import CONF_DIR, PlayConfig, TrainConfig, check, validate_play, validate_train
from rlrun.config.batched import LAUNCHER, batch_refusal
from rlrun.errors import UserError
from rlrun.run_folder import list_checkpoints

if TYPE_CHECKING:
    import gymnasium as gym

# What the pre-flight's env check (gymnasium's passive env checker) said of each env id, for the run's log: the
# pre-flight runs before the run folder and its log exist; the job, in the same process, logs them there (job.py).
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


def _combinations(overrides: list[str]) -> list[list[str]]:
    """Single-valued override lists covering every value of every sweep (one sweep varied at a time), so a
    bad value anywhere in a multirun is found before its first job starts. Non-choice sweeps (Optuna
    intervals) are left to the sweeper."""
    base: list[str] = []
    sweeps: list[list[str]] = []
    for o in parse_overrides(overrides):
        line = o.input_line or ""  # set for every override parsed from text
        if not o.is_sweep_override():
            base.append(line)
            continue
        left = line.split("=", 1)[0]
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
        path = f"{prefix}{key!s}"
        if key not in schema:
            found.append(path)
        elif isinstance(cfg[key], DictConfig) and isinstance(schema[key], DictConfig):
            found += _unknown_keys(cfg[key], schema[key], path + ".")
    return found


def _reference(command: str, combo: list[str]) -> DictConfig:
    """The config the command line's group choices give, without its other overrides: the keys that exist for
    this run (algo=dqn has algo.replay.*, the default algo does not; hydra/launcher=joblib has hydra.launcher.n_jobs).
    Plain defaults if a choice is the error."""
    choices = [o for o in combo if o.split("=", 1)[0] in GROUPS or o.startswith("hydra/")]
    try:
        return compose(command, overrides=choices, return_hydra_config=True)
    except COMPOSITION_ERRORS:
        return compose(command, return_hydra_config=True)


@dataclass(frozen=True)
class Preflight:
    """What the pre-flight hands the command: the command line to run (integers exact, the presets chosen, the run
    folder of a resume or a torchrun job, a resumed sweep's own line) and, for a single run, the config Hydra's app
    composes from that line (its hydra node included), which the run takes instead of composing it again
    (hydra_compat.run_composed)."""

    args: list[str]
    run: DictConfig | None = None


def preflight(command: str, args: list[str]) -> Preflight:
    """Compose and check every configuration the command would run, each once, and hand what was checked to the job
    that runs it in this process (rlrun/compose/handoff.py)."""
    if command == "train":
        args = sweep_resume_args(args)
    parsed = args_parser().parse_args(args)
    modes = [parsed.run, parsed.multirun, parsed.cfg, parsed.info, parsed.shell_completion]
    if sum(bool(m) for m in modes) > 1:  # Hydra's own check, a traceback: one line here
        raise UserError(
            "only one of --run, --multirun (-m), --cfg, --info and --shell-completion can be given (to print a "
            "sweep job's config, give that job's values without -m)"
        )
    if parsed.help or parsed.hydra_help or parsed.info or parsed.shell_completion:
        return Preflight(args)
    overrides = list(parsed.overrides)
    runs = not runs_nothing(args)
    if command == "play":
        _no_training_choices(overrides)
    single = command == "train" and not parsed.multirun
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        try:
            combos = _combinations(overrides)
        except COMPOSITION_ERRORS as e:
            raise UserError(f"cannot parse overrides: {' '.join(str(e).splitlines()[:2])}") from e
        exact = _exact_integers(command, overrides)
        args = [exact[overrides.index(a)] if a in overrides else a for a in args]
        if single:  # a single run's folder, named before its one composition
            exact, args = _run_folder(exact, args, runs)
        if exact != overrides:
            overrides, combos = exact, _combinations(exact)
        composed, presets = _check_all(command, combos, overrides, runs, single)
        if parsed.multirun:
            _check_sweep_base(command, overrides)
    chosen = presets.pop() if len(presets) == 1 else None
    if command == "train" and chosen is not None:
        # One preset decision for every job is made here, so .hydra/ shows it; a sweep whose jobs differ (over
        # env.id, say) has each job decide for itself (rlrun.compose.presets.job_presets). Beside the other
        # overrides: Hydra's parser takes one run of them (`a=1 --cfg job b=2` is an error).
        at = max((i + 1 for i, a in enumerate(args) if a in overrides), default=0)
        args = [*args[:at], chosen, *args[at:]]
    if command == "train" and not single:  # a sweep's jobs compose for themselves: named after its checks
        args = _run_folder(overrides, args, runs)[1]
    run = runs and composed is not None and _single_run(parsed, combos, overrides, composed)
    return Preflight(args, composed if run else None)


def _check_sweep_base(command: str, overrides: list[str]) -> None:
    """Hydra composes a sweep's config without its sweeps (a swept config group at its default) before its jobs,
    and applies the other overrides to it: `algo=sac,td3 algo.learning_starts=200` sets the key on the default PPO,
    which has none, each job being fine. One line here, where that was Hydra's multi-line error."""
    parsed = parse_overrides(overrides)
    if not any(o.is_sweep_override() for o in parsed):
        return
    base = [o.input_line or "" for o in parsed if not o.is_sweep_override()]
    try:
        _compose(command, base)
    except UserError as e:
        groups = [o for o in parsed if o.is_sweep_override() and o.key_or_group in GROUPS]
        swept = " ".join(o.input_line or "" for o in groups) or "the sweep"
        why = str(e).split(" (keys under")[0]
        raise UserError(
            f"-m {swept}: Hydra composes a sweep at its config groups' defaults first, with the overrides that are "
            f"not swept, and that fails ({why}): give each choice a sweep of its own (-m per "
            f"{groups[0].key_or_group if groups else 'choice'}), or leave that key at its default"
        ) from e


def _run_folder(overrides: list[str], args: list[str], runs: bool) -> tuple[list[str], list[str]]:
    """The overrides and args with what names the run folder appended: a resume's (resume_folder) and, for a run,
    a torchrun job's (torchrun_args)."""
    named = resume_folder(overrides, args)
    named = torchrun_args(named) if runs else named
    return [*overrides, *named[len(args) :]], named


def _check_all(
    command: str, combos: list[list[str]], overrides: list[str], runs: bool, single: bool = False
) -> tuple[DictConfig | None, set[str | None]]:
    """Compose and check each of `combos`, handing what was checked to its job when the command runs; returns the
    last composition (a single run's) and the preset override each needs. `single`: one training run, whose folder
    the composition names."""
    presets: set[str | None] = set()
    composed: DictConfig | None = None
    loaded: dict[str, dict[str, Any]] = {}  # the checkpoints resumes merge, each loaded once
    for combo in combos:
        composed, job, typed, preset = _composed(command, combo)
        presets.add(preset)
        _check_launcher(composed.hydra.launcher)
        refused = batch_refusal(typed) if command == "train" and LAUNCHER in overrides else None
        if refused is not None:
            raise UserError(refused)
        if command == "play":
            checked = _check_play(typed, runs)
            _check_play_folder(Path(composed.hydra.run.dir))
        else:
            run_dir = Path(composed.hydra.run.dir) if single else None
            checked = _check_train(typed, runs, combo, loaded, handed=len(combos) == 1, run_dir=run_dir)
        if runs:
            hand_over(job, checked)
    return composed, presets


def _check_launcher(launcher: DictConfig) -> None:
    """The values of rlrun's sweep launchers (hydra_plugins/), which would fail only once the sweep has started."""
    if "n_jobs" in launcher:  # joblib's meaning: -1 one job per core, -2 all cores but one, ...
        check(launcher.n_jobs != 0, "hydra.launcher.n_jobs=0: give the jobs to run at a time (-1: one per core)")
    if "max_batch" in launcher:
        check(launcher.max_batch >= 1, f"hydra.launcher.max_batch={launcher.max_batch}: give at least 1 seed a batch")


def _single_run(
    parsed: argparse.Namespace, combos: list[list[str]], overrides: list[str], composed: DictConfig
) -> bool:
    """Whether the command line is one run of the config the pre-flight composed last, which Hydra's app would
    compose alike: no sweep, no other config (-cn, -cp, -cd, a rerun), no Hydra debug output (hydra.verbose)."""
    other = parsed.config_path or parsed.config_name or parsed.config_dir or parsed.experimental_rerun
    if parsed.multirun or other or combos != [overrides]:
        return False
    return composed.hydra.mode in (None, RunMode.RUN) and not composed.hydra.verbose


def torchrun_args(args: list[str]) -> list[str]:
    """Under torchrun every rank runs this CLI. They must share ONE run folder (named by the rendezvous run id, not by
    each process's clock), and only rank 0 may create files in it."""
    from rlrun.job_env import torchrun_job

    job = torchrun_job()
    if job is None:
        return args
    rank, run_id = job
    if not any(a.startswith("hydra.run.dir=") for a in args):
        args = [*args, f"hydra.run.dir=outputs/torchrun/{run_id}"]
    if rank != 0:
        args = [*args, "hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    return args


def _compose(command: str, combo: list[str]) -> DictConfig:
    try:
        return compose(command, overrides=combo, return_hydra_config=True)
    except COMPOSITION_ERRORS as e:
        raise UserError(error_line(e, _reference(command, combo))) from e
    except AssertionError as e:  # OmegaConf's way of refusing a key below a null node
        raise UserError(null_parent_line(combo, _reference(command, combo))) from e


def _composed(command: str, combo: list[str]) -> tuple[DictConfig, DictConfig, Any, str | None]:
    """What `combo` composes to (its hydra node included), the job's part of it (no hydra node), that part typed, and
    the preset override it needs (None: none; rlrun/compose/presets.py), or UserError with one line for every way it
    cannot be composed. A preset is composed in: the second composition is the run's."""
    composed, preset = _compose(command, combo), None
    if command == "train":
        # a resumed run keeps its checkpoint's groups; resume=auto's new run decides in its job
        choices = composed.hydra.runtime.choices
        preset = None if composed.resume is not None else preset_override(choices, composed.env.id, combo)
        if preset is not None:
            composed = _compose(command, [*combo, preset])
    job = copy.deepcopy(composed)  # as Hydra hands a job its config
    with open_dict(job):
        del job["hydra"]
    try:
        typed = OmegaConf.to_object(job)
    except OmegaConfBaseException as e:  # a required key left unset (e.g. play checkpoint=...)
        key = getattr(e, "full_key", "") or "?"
        raise UserError(f"missing value for '{key}': give {key}=...") from e
    unknown = _unknown_keys(job, OmegaConf.structured(typed))
    if unknown:
        raise UserError(f"unknown key '{unknown[0]}' (added with +); the schema has no such key")
    return composed, job, typed, preset


def _check_play_folder(folder: Path) -> None:
    """A play writes a folder of its own (.hydra/, play.log, videos/): not a training run's, whose .hydra/ it would
    replace."""
    if (folder / "summary.json").exists() or (folder / "checkpoints").is_dir():
        raise UserError(
            f"hydra.run.dir={folder} is a training run's folder; rlrun play writes a folder of its own and would "
            "replace the run's .hydra/: give another hydra.run.dir (the default makes one)"
        )


def _check_play(typed: PlayConfig, runs: bool) -> Checked:
    validate_play(typed)
    if not runs:
        return Checked(typed)
    from rlrun.checkpoint import load_checkpoint

    check_device_present(typed.device)  # a bad checkpoint or device ends here, before Hydra makes the run folder
    return Checked(typed, state=load_checkpoint(typed.checkpoint))


def _check_train(
    typed: TrainConfig,
    runs: bool,
    combo: list[str],
    loaded: dict[str, dict[str, Any]],
    handed: bool,
    run_dir: Path | None = None,
) -> Checked:
    """A training config checked: the command line's, or for a resume the checkpoint's with the command line's
    overrides on top (the checkpoint, loaded once into `loaded`, handed over to a single run's job: a sweep's jobs
    each load their own). resume=auto resumes its run folder's newest checkpoint if there is one: a single run's
    (`run_dir`, named now) is looked at here, so that a refusal, or a run with nothing left to do, writes nothing into
    it; a sweep's jobs look at theirs."""
    found = list_checkpoints(run_dir / "checkpoints") if typed.resume == "auto" and run_dir is not None else []
    if found:
        resumed = auto_resumed(found[-1], typed, combo, loaded.get(str(found[-1])))
        if runs:
            check_device_present(resumed.typed.device, resumed.typed.distributed.nproc_per_node)
            _check_env(resumed.typed, runs)
        return Checked(resumed.typed, resumed.warnings, str(found[-1]), resumed.state if handed else None)
    if typed.resume in (None, "auto"):
        try:
            warnings = tuple(validate_train(typed))
        except UserError:
            _check_action_space_first(typed)
            raise
        if runs:
            check_device_present(typed.device, typed.distributed.nproc_per_node)
        _check_env(typed, runs)
        return Checked(typed, warnings)
    from rlrun.run_folder import resolve_checkpoint

    path = str(resolve_checkpoint(typed.resume))
    resumed = resumed_config(path, combo, loaded.get(path))
    loaded[path] = resumed.state
    if runs:
        check_device_present(resumed.typed.device, resumed.typed.distributed.nproc_per_node)
        _check_env(resumed.typed, runs)  # as for a new run: an env that no longer imports or builds is one line here
    return Checked(resumed.typed, resumed.warnings, path, resumed.state if handed else None)


def _exact_integers(command: str, overrides: list[str]) -> list[str]:
    """The overrides with each float given to an integer key written as that integer when it is one (total_steps=1e6
    is total_steps=1000000, in the run folder's .hydra/ too; OmegaConf refuses any float for an int); one line for
    one that is not (total_steps=1.5). Sweeps of choices are converted value by value."""
    reference = None
    exact = []
    for o in parse_overrides(overrides):
        values, line = override_values(o), o.input_line or ""
        if not any(isinstance(v, float) for v in values):
            exact.append(line)
            continue
        if reference is None:
            reference = _reference(command, overrides)
        if not integer_key(reference, o.key_or_group):
            exact.append(line)
            continue
        for v in values:
            if isinstance(v, float) and not v.is_integer():
                raise UserError(f"{line}: must be an integer (100000 or 1e5)")
        written = ",".join(str(int(v)) if isinstance(v, float) else str(v) for v in values)
        exact.append(f"{line.split('=', 1)[0]}={written}")
    return exact


def _no_training_choices(overrides: list[str]) -> None:
    """play runs the checkpoint's algo, model and env: a config group choice (env=pendulum) is training's."""
    for override in overrides:
        group = override_key(override)
        if group in GROUPS:
            raise UserError(
                f"'{override}': play runs the checkpoint's {group}; to play another env with the same spaces, "
                "give env.id=ID"
            )


def _check_action_space_first(typed: TrainConfig) -> None:
    """Before a config check's refusal: an env whose actions the algorithm cannot take (DQN on Box actions) is what to
    say first. The budget checks, say, assume actions it takes, and a line about learning_starts would send the user
    the wrong way. An env that does not build leaves the refusal to the config's own line."""
    from rlrun.envs import check_action_space, env_spaces, import_env_modules

    entry = ALGORITHMS[typed.algo.name]
    if not entry.actions:
        return
    try:
        import_env_modules(typed.env.imports)
        action_space = env_spaces(typed.env)[1]
    except Exception:  # noqa: BLE001 (whatever stops the env, the config's line comes first)
        return
    check_action_space(action_space, entry.actions, typed.env.id, typed.algo.name)


def _check_env(typed: TrainConfig, runs: bool) -> None:
    """The env builds and fits the algorithm (and the user's network, the env), its replay this machine's memory."""
    from rlrun.envs import check_action_space, check_env_id, env_spaces, import_env_modules, third_party, vector_backend

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
    shape = obs_space.shape or ()
    itemsize = 1 if obs_space.dtype == np.uint8 and len(shape) == 3 else 4
    per_rank = capacity * int(np.prod(shape)) * itemsize
    ranks = typed.distributed.nproc_per_node
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if per_rank * ranks > memory:
        fits = memory // ranks // (per_rank // capacity)
        gib = 2**30
        raise UserError(
            f"algo.buffer_size={capacity} observations of {typed.env.id} ({obs_space.dtype} {list(shape)}) "
            f"take {per_rank / gib:.1f} GiB per rank (x{ranks} on this node), more than this machine's "
            f"{memory / gib:.1f} GiB: lower algo.buffer_size (below {fits} here)"
        )
