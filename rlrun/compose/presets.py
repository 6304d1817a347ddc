"""Which presets a training run gets, decided once from the composition's group choices and env.id. A tuned file
(conf/tuned/<algo>_<env>.yaml, the `optional tuned: ${algo}_${env}` default) was tuned for the id its env group
names: when env.id leaves that id it does not apply, and an algorithm's defaults for any env of its space
(conf/tuned/<algo>_default.yaml: SAC's and TD3's one env and SB3's networks) apply where no tuned file does. The
decision is an override (`~tuned`, `tuned=sac_default`), so the composed config and the run's .hydra/ say the
truth."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlrun.config import CONF_DIR


def _exists(tuned: str) -> bool:
    return (Path(CONF_DIR) / "tuned" / f"{tuned}.yaml").is_file()


@cache
def env_group_id(group: str) -> str | None:
    """The env id the env group's yaml names (conf/env/<group>.yaml: `id:`, or `env.id:` in a global one)."""
    path = Path(CONF_DIR) / "env" / f"{group}.yaml"
    if not path.is_file():
        return None
    text = OmegaConf.load(path)
    return OmegaConf.select(text, "env.id") or OmegaConf.select(text, "id")


def tuned_for(group_id: str | None, env_id: str) -> bool:
    """Whether presets tuned on `group_id` suit `env_id`: the same id, or any ALE game for an Atari group's (its
    presets are the papers' settings for every game, as rl-zoo3's and CleanRL's Atari entries)."""
    return env_id == group_id or (env_id.startswith("ALE/") and str(group_id).startswith("ALE/"))


def chooses_tuned(overrides: list[str]) -> bool:
    """Whether the command line picks the tuned preset itself (tuned=..., ~tuned): then it is left as chosen."""
    return any(o.lstrip("~+").split("=", 1)[0] == "tuned" for o in overrides)


def preset_override(choices: Mapping[str, str | None], env_id: str, overrides: list[str]) -> str | None:
    """The override that gives this run the presets that were meant for its env, or None when the composition
    already does. `choices`: Hydra's group choices (hydra.runtime.choices)."""
    if chooses_tuned(overrides):
        return None
    algo, env = choices["algo"], choices["env"]
    tuned = f"{algo}_{env}"
    if _exists(tuned) and tuned_for(env_group_id(env), env_id):
        return None
    if _exists(f"{algo}_default"):
        return f"tuned={algo}_default"
    return "~tuned" if _exists(tuned) else None


def presets_line(choices: Mapping[str, str | None], env_id: str) -> str:
    """One line saying which presets the run got, for the run's log."""
    algo, env, chosen = choices["algo"], choices["env"], choices.get("tuned")
    tuned, group_id = f"{algo}_{env}", env_group_id(env)
    if chosen == tuned and _exists(tuned):
        return f"presets: tuned/{tuned} (tuned for {group_id})"
    if chosen is not None and chosen != f"{algo}_default" and _exists(chosen):
        return f"presets: tuned/{chosen} (chosen on the command line) with env={env} group, env.id={env_id}"
    head = f"presets: algo={algo} defaults" + (f" + tuned/{chosen}" if chosen == f"{algo}_default" else "")
    if not _exists(tuned):
        return f"{head}; env={env} group: no tuned/{tuned}"
    if not tuned_for(group_id, env_id):
        return f"{head}; env={env} group with env.id={env_id}: tuned/{tuned} not applied"
    return f"{head}; env={env} group: tuned/{tuned} not applied (~tuned)"


def job_presets(cfg: DictConfig, choices: Mapping[str, str | None], overrides: list[str], hydra_dir: Path | None):
    """(the job's config, its presets line) inside a running Hydra job. The pre-flight adds the preset override to
    the command line when every job of the command takes the same one; a job of a sweep whose jobs differ (over
    env.id, say) is recomposed here with its own, and its .hydra/ rewritten to match."""
    preset = None if cfg.resume not in (None, "auto") else preset_override(choices, cfg.env.id, overrides)
    if preset is None:
        return cfg, presets_line(choices, cfg.env.id)
    from hydra import compose

    cfg = compose("train", overrides=[*overrides, preset])
    choices = dict(choices)
    if preset == "~tuned":
        choices.pop("tuned", None)
    else:
        choices["tuned"] = preset.split("=", 1)[1]
    if hydra_dir is not None and hydra_dir.is_dir():
        OmegaConf.save(cfg, hydra_dir / "config.yaml")
        OmegaConf.save(OmegaConf.create([*overrides, preset]), hydra_dir / "overrides.yaml")
    return cfg, presets_line(choices, cfg.env.id)
