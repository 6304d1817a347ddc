"""`rlrun train resume=SWEEP`: a sweep's folder (where Hydra wrote multirun.yaml) continues as the sweep it was: its
own command line again, in that folder, each job from its folder's newest checkpoint (resume=auto: a complete job
says so and is skipped, one never started starts). The resume line's other overrides go on top of the sweep's."""

from __future__ import annotations

from pathlib import Path

import yaml

from rlrun.compose.hydra_compat import COMPOSITION_ERRORS, args_parser, override_key, parse_overrides
from rlrun.errors import UserError

# Set by the resume itself: the sweep's own values of these are dropped.
_SET_HERE = {"resume", "hydra.sweep.dir", "hydra.mode", "hydra.output_subdir"}


def sweep_resume_args(args: list[str]) -> list[str]:
    """`args` as the sweep's own multirun line when they resume a sweep's folder; other args unchanged. The jobs'
    .hydra/ stay as they were (hydra.output_subdir=null), as a single run's do when it resumes in its folder."""
    folder = _sweep_folder(args)
    if folder is None:
        return args
    try:
        saved = yaml.safe_load((folder / "multirun.yaml").read_text())["hydra"]["overrides"]
        line = [str(o) for o in [*(saved["hydra"] or []), *(saved["task"] or [])]]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise UserError(f"resume={folder}: cannot read the sweep's overrides from its multirun.yaml ({e})") from e
    given = [a for a in args if override_key(a) != "resume" and a not in ("-m", "--multirun")]
    _check_continues(folder, line, given)
    keys = _SET_HERE | {override_key(a) for a in given}
    kept = [o for o in line if override_key(o) not in keys]
    return ["-m", *kept, *given, f"hydra.sweep.dir='{folder}'", "hydra.output_subdir=null", "resume=auto"]


def _check_continues(folder: Path, line: list[str], given: list[str]) -> None:
    """The resume line continues the sweep's own jobs, each in its folder: it may add overrides for every job
    (total_steps=...), not sweep anew, change what the sweep sweeps or its config groups (Hydra would number the jobs
    anew, and a folder's checkpoint would go on as another job), nor start while a job of the sweep still runs."""
    from rlrun.compose.store import GROUPS
    from rlrun.run_folder import holder_of

    try:
        saved, new = parse_overrides(line), parse_overrides([a for a in given if "=" in a])
    except COMPOSITION_ERRORS:  # the pre-flight says what is wrong with it
        return
    swept = {o.key_or_group for o in saved if o.is_sweep_override()}
    same = set(line)
    for o in new:
        key, text = o.key_or_group.lstrip("+~"), o.input_line or o.key_or_group
        if o.is_sweep_override():
            reason = f"{text} is a sweep of its own"
        elif key in swept:
            reason = f"{text} sets {key}, which the sweep sweeps"
        elif key in GROUPS and text not in same:
            reason = f"{text} chooses the sweep's {key} anew"
        else:
            continue
        raise UserError(
            f"resume={folder} continues the sweep's own jobs, each in its folder; {reason}: give only overrides "
            "for every job (total_steps=..., say), or start a new sweep"
        )
    for job in sorted(p for p in folder.iterdir() if p.is_dir()):
        holder = holder_of(job)
        if holder is not None:
            raise UserError(f"resume={folder}: the sweep still runs (job folder {job} is held by {holder})")


def _sweep_folder(args: list[str]) -> Path | None:
    """The folder resume= names when it is a sweep's (it holds multirun.yaml), else None."""
    resume = [a for a in args_parser().parse_args(args).overrides if override_key(a) == "resume"]
    try:
        parsed = parse_overrides(resume)
    except COMPOSITION_ERRORS:  # the pre-flight says what is wrong with it
        return None
    for o in parsed:
        if isinstance(o.value(), str):
            folder = Path(str(o.value()))
            return folder if (folder / "multirun.yaml").is_file() else None
    return None
