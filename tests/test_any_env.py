"""Any environment a researcher brings (issue 33): presets that apply only to the env they were tuned for,
errors that name the real cause, every gymnasium observation and action space the algorithms take, on real
third-party envs (the `envs` extra: Box2D, MiniGrid) and small envs written here."""

from __future__ import annotations

import pytest
import yaml

from rlrun.config.preflight import preflight
from rlrun.config.store import register_configs
from tests.conftest import rlrun

register_configs()

PRESETS = [
    ([], None),  # CartPole's own tuned PPO
    (["env.id=LunarLander-v3"], "~tuned"),  # not CartPole's preset on another env
    (["algo=dqn", "env.id=Acrobot-v1"], "~tuned"),
    (["env=lunarlander"], None),  # rl-zoo3's LunarLander PPO
    (["algo=sac", "env.id=MountainCarContinuous-v0"], "tuned=sac_default"),  # SB3's defaults for any Box env
    (["algo=td3", "env=pendulum", "env.id=MountainCarContinuous-v0"], "tuned=td3_default"),
    (["algo=sac", "env=pendulum"], None),
    (["env=breakout", "env.id=ALE/Pong-v5"], None),  # the Atari presets are for every game
    (["env.id=Acrobot-v1", "tuned=ppo_cartpole"], None),  # chosen on the command line: kept
]


@pytest.mark.parametrize("args, added", PRESETS, ids=[" ".join(a) or "defaults" for a, _ in PRESETS])
def test_a_tuned_preset_applies_only_to_the_env_it_was_tuned_for(args, added):
    out = preflight("train", args)
    assert [a for a in out if a not in args] == ([added] if added else [])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_presets_are_logged_and_a_sweep_over_env_ids_decides_per_job(tmp_path):
    out = rlrun(
        "train",
        "-m",
        "env.id=Acrobot-v1,CartPole-v1",
        "total_steps=1024",
        "eval.episodes=1",
        f"hydra.sweep.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (
        "presets: algo=ppo defaults; env=cartpole group with env.id=Acrobot-v1: tuned/ppo_cartpole not applied"
        in out.stdout
    )
    assert "presets: tuned/ppo_cartpole (tuned for CartPole-v1)" in out.stdout
    acrobot, cartpole = (yaml.safe_load((tmp_path / j / ".hydra/config.yaml").read_text()) for j in "01")
    assert acrobot["algo"]["num_steps"] == 128 and cartpole["algo"]["num_steps"] == 32  # PPO's defaults; the preset
    assert "~tuned" in yaml.safe_load((tmp_path / "0/.hydra/overrides.yaml").read_text())
