"""`rlrun train resume=SWEEP`: a sweep's folder (where Hydra wrote multirun.yaml) continues as the sweep it was: its
own command line again, in that folder, each job from its folder's newest checkpoint (resume=auto: a complete job
says so and is skipped, one never started starts). The resume line's other overrides go on top of the sweep's."""

from __future__ import annotations

from pathlib import Path

import yaml

from rlrun.compose.hydra_compat import COMPOSITION_ERRORS, args_parser, parse_overrides
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
    given = [a for a in args if _key(a) != "resume" and a not in ("-m", "--multirun")]
    keys = _SET_HERE | {_key(a) for a in given}
    kept = [o for o in line if _key(o) not in keys]
    return ["-m", *kept, *given, f"hydra.sweep.dir='{folder}'", "hydra.output_subdir=null", "resume=auto"]


def _sweep_folder(args: list[str]) -> Path | None:
    """The folder resume= names when it is a sweep's (it holds multirun.yaml), else None."""
    resume = [a for a in args_parser().parse_args(args).overrides if _key(a) == "resume"]
    try:
        parsed = parse_overrides(resume)
    except COMPOSITION_ERRORS:  # the pre-flight says what is wrong with it
        return None
    for o in parsed:
        if isinstance(o.value(), str):
            folder = Path(str(o.value()))
            return folder if (folder / "multirun.yaml").is_file() else None
    return None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")
