"""The typed schemas registered with Hydra's ConfigStore (the train and play apps, each algorithm's section),
and the TrainConfig as YAML text, which checkpoints store and ranks are handed: to it and back, and back with
`key=value` overrides on top (resume)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlrun.algos import ALGORITHMS
from rlrun.compose.hydra_compat import read_config_store_live
from rlrun.config import PlayConfig, TrainConfig
from rlrun.errors import UserError

GROUPS = ("algo", "env", "model", "tuned")  # the config groups (conf/<group>/): a resumed run keeps its choices


def register_configs() -> None:
    read_config_store_live()
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="play_schema", node=PlayConfig)
    for name, entry in ALGORITHMS.items():
        cs.store(group="algo", name=f"{name}_schema", node=entry.schema)
    # rlrun's joblib launcher in place of Hydra's, under its name: stored after Hydra's plugin scan, which stores the
    # plugins' own configs (each time it loads their modules, in the order of the folders on sys.path).
    from hydra.core.plugins import Plugins

    from hydra_plugins.rlrun_joblib_launcher.joblib_launcher import JoblibLauncherConf

    Plugins.instance()
    cs.store(group="hydra/launcher", name="joblib", node=JoblibLauncherConf, provider="rlrun")


def from_yaml(text: str, overrides: Sequence[str] = ()) -> TrainConfig:
    """The typed TrainConfig from its YAML text (as stored in checkpoints and handed to ranks), with
    `key=value` overrides applied on top (a resume's command line; `resume` and `hydra.*` are not the run's)."""
    saved = OmegaConf.create(text)
    merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), {"algo": ALGORITHMS[saved.algo.name].schema}, saved)
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if key == "resume" or key.startswith("hydra"):
            continue
        if key in GROUPS:
            raise UserError(f"resume keeps the checkpoint's {key}; override its keys ({key}.x=...) instead")
        try:
            OmegaConf.update(merged, key, override.value(), merge=True)
        except OmegaConfBaseException as e:
            message = str(e).splitlines()[0]
            raise UserError(f"{override.input_line}: {message} (the checkpoint's algo is {saved.algo.name})") from e
    return cast(TrainConfig, OmegaConf.to_object(merged))  # a structured TrainConfig node converts to one


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
