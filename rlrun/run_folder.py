"""Where a run folder keeps its checkpoints: names, listing, the newest, the run a checkpoint belongs to. Plain
paths, no torch, so that the pre-flight finds a missing checkpoint quickly."""

from __future__ import annotations

from pathlib import Path

from rlrun.errors import UserError

_PREFIX = "ckpt_"


def checkpoint_name(env_steps: int) -> str:
    return f"{_PREFIX}{env_steps:012d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints in `directory`, oldest first (names sort by step)."""
    return sorted(directory.glob(f"{_PREFIX}*.pt")) if directory.is_dir() else []


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given, or the newest checkpoint of a run folder (or of its checkpoints/)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        found = list_checkpoints(p / "checkpoints") or list_checkpoints(p)
        if found:
            return found[-1]
        raise UserError(f"no checkpoint in {p} (expected {p}/checkpoints/{_PREFIX}*.pt)")
    raise UserError(f"checkpoint not found: {p} (give a checkpoint file or a run folder)")


def is_newest(checkpoint: Path) -> bool:
    """Whether no checkpoint of a later step lies beside `checkpoint`."""
    found = list_checkpoints(checkpoint.parent)
    return not found or found[-1].name <= checkpoint.name


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint was saved in, if it sits in one."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
