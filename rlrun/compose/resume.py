"""Resuming: the checkpoint's config with the command line's `key=value` overrides on top (the resume merge), refused
in one line when the checkpoint's networks cannot continue in it or it has nothing left to train, and the run folder
a resume continues in."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from rlrun.compose.hydra_compat import override_key, parse_overrides
from rlrun.compose.store import GROUPS, from_yaml
from rlrun.config import TrainConfig, validate_train
from rlrun.errors import NothingToDo, UserError


@dataclass(frozen=True)
class Resumed:
    """A resume's config (checked; `warnings`: what the checks let pass) and the checkpoint it continues from."""

    typed: TrainConfig
    state: dict[str, Any]
    warnings: tuple[str, ...]


def resumed_config(resume: str, overrides: list[str], state: dict[str, Any] | None = None) -> Resumed:
    """The checkpoint `resume` names (loaded here unless given as `state`) with the command line's overrides on top,
    checked against it. The machine's devices are the caller's to check (preflight.check_device_present)."""
    if state is None:
        from rlrun.checkpoint import load_checkpoint

        state = load_checkpoint(resume)
    typed = replace(from_yaml(state["config"], overrides), resume=resume)
    warnings = tuple(validate_train(typed))
    check_fits(state, typed)
    _check_not_done(state, typed)
    return Resumed(typed, state, warnings)


def auto_resumed(
    checkpoint: Path, typed: TrainConfig, overrides: list[str], state: dict[str, Any] | None = None
) -> Resumed:
    """resume=auto's resume of its run folder's newest `checkpoint`, `typed` being the command line's config: the job's
    own command line made that checkpoint, so its config group choices (algo=, env=, the preset) are the
    checkpoint's, which a resume keeps; its key=value `overrides` go on top. A choice that names another algorithm,
    env or network is refused."""
    resumed = resumed_config(str(checkpoint), [o for o in overrides if override_key(o) not in GROUPS], state)
    was, now = resumed.typed, typed
    trained = (was.algo.name, was.env.id, was.model.name)
    if (now.algo.name, now.env.id, now.model.name) != trained:
        raise UserError(
            f"resume=auto continues {checkpoint}, trained as algo={trained[0]} env.id={trained[1]} model={trained[2]}; "
            f"this command line gives algo={now.algo.name} env.id={now.env.id} model={now.model.name}: "
            "use another run folder for another run"
        )
    return resumed


def resume_folder(overrides: list[str], args: list[str]) -> list[str]:
    """The command line `args` to run a resume with. Resuming from a run's newest checkpoint continues in its run
    folder and keeps that folder's .hydra/ as it was. Resuming from an older one starts a new run folder (which records
    where it came from): continuing in the old one would leave the abandoned later checkpoints there, which outrank
    the new ones by step. Decided before anything is composed, so the run's one composition names its folder."""
    given = [o.value() for o in parse_overrides(overrides) if o.key_or_group == "resume"]
    if not given or not isinstance(given[0], str) or given[0] == "auto":  # auto: found in the run folder Hydra makes
        return args
    from rlrun.run_folder import is_newest, resolve_checkpoint, run_dir_of

    path = resolve_checkpoint(given[0])  # a checkpoint that is not there fails here, before any run folder
    run_dir = run_dir_of(path)
    if run_dir is None or not is_newest(path) or any(a.startswith("hydra.run.dir=") for a in args):
        return args
    return [*args, f"hydra.run.dir='{run_dir}'", "hydra.output_subdir=null"]


def _check_not_done(state: dict[str, Any], typed: TrainConfig) -> None:
    """Resuming a run that has trained its whole budget, without a larger one, changes nothing; unless the run ended
    in its final evaluation (a signal, a failure), which the resume then runs, ending the run with its summary."""
    from rlrun.run_record import ended_unevaluated

    per_iteration = state.get("steps_per_iteration")  # the checkpoint's; a resume to another world size may differ
    if not per_iteration:
        return
    target = typed.total_steps // per_iteration * per_iteration
    if state["env_steps"] >= target and not ended_unevaluated(Path(state["path"]), state["env_steps"]):
        done = "is complete at" if state["env_steps"] == target else "has trained past total_steps, at"
        raise NothingToDo(
            f"{state['path']} {done} {state['env_steps']} env steps (total_steps={typed.total_steps}); "
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
            changes = _changed("model", trained, typed, was=True) or _changed("algo", trained, typed, was=True)
            raise UserError(
                f"the checkpoint's network does not fit {changes or 'this config'}: {key} is {was} there, {now} here"
            )


def _changed(section: str, a: TrainConfig, b: TrainConfig, was: bool = False) -> str:
    """The keys of `section` whose values differ between two configs, as key=value of `b` (`was`: with `a`'s value,
    the checkpoint's, beside it: a network's tensor shapes alone do not say which setting made them)."""
    x, y = (cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(getattr(c, section)))) for c in (a, b))
    flat_x, flat_y = _flat(x), _flat(y)
    keys = [k for k in flat_y if flat_x.get(k) != flat_y[k]]
    return " ".join(
        f"{section}.{k}={flat_y[k]}" + (f" (the checkpoint's: {flat_x.get(k)})" if was else "") for k in keys
    )


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def _shape(shape: tuple[int, ...] | None, short: bool = False) -> str:
    shape = shape or ()
    if len(shape) == 1:
        return str(shape[0]) if short else f"{shape[0]}-dim"
    return str(tuple(shape))
