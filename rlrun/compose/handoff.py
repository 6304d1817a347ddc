"""What the pre-flight checked, handed to the job that runs it in the same process, keyed by the composed config it
checked: the typed config, the lines its checks let pass (for the run's log) and a resume's checkpoint, loaded. So
a process converts and checks a config once, and loads the checkpoint it resumes from once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class Checked:
    """A config the pre-flight checked. `typed`: a TrainConfig (for a resume, the checkpoint's with the command line's
    overrides on top) or a PlayConfig; `resumed_from`: the checkpoint file a resume merged, `state` that checkpoint
    (or the one a play runs), when the pre-flight hands it over."""

    typed: Any
    warnings: tuple[str, ...] = ()
    resumed_from: str | None = None
    state: dict[str, Any] | None = None


_CHECKED: dict[str, Checked] = {}


def _key(cfg: DictConfig) -> str:
    """The job's config as plain containers' text, interpolations unresolved (a job's config holds none of Hydra's):
    equal for equal compositions, whichever order their overrides came in."""
    return repr(OmegaConf.to_container(cfg))


def hand_over(cfg: DictConfig, checked: Checked) -> None:
    """`cfg`: the job's part of the composed config (no hydra node), as a Hydra job gets it."""
    _CHECKED[_key(cfg)] = checked


def take(cfg: DictConfig) -> Checked | None:
    """What the pre-flight of this process checked of the job config `cfg`, once (a loaded checkpoint is the job's
    from then on), or None: a config no pre-flight of this process composed (a launcher's job process, a restart)."""
    return _CHECKED.pop(_key(cfg), None)
