"""Checkpoint files (atomic, plain data, every way a file can be wrong) and exact env state round trips."""

import os
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from rlrun.checkpoint import Checkpointer, load_checkpoint, resolve_checkpoint
from rlrun.config import AtariConfig, EnvConfig
from rlrun.envs import make_env, make_vector_env
from rlrun.errors import UserError


def test_save_keeps_last_k_and_loads_plain_data(tmp_path):
    ck = Checkpointer(tmp_path / "checkpoints", keep_last=2)
    for step in (100, 200, 300):
        ck.save({"config": "seed: 1\n", "x": torch.arange(3)}, step)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["ckpt_000000000200.pt", "ckpt_000000000300.pt"]  # no temp files left either
    state = load_checkpoint(tmp_path)  # a run folder resolves to its newest checkpoint
    assert state["env_steps"] == 300 and torch.equal(state["x"], torch.arange(3))


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_a_pickle_that_runs_code_is_refused(tmp_path):
    marker = str(tmp_path / "pwned")
    path = tmp_path / "evil.pt"
    torch.save({"rlrun_format": 1, "payload": _RunsCode(marker)}, path)
    with pytest.raises(UserError, match="plain data"):
        load_checkpoint(path)
    assert not os.path.exists(marker)


BAD_FILES = ["missing", "truncated", "garbage", "text", "empty", "random", "other_zip", "not_rlrun", "future_version"]


@pytest.mark.parametrize("kind", [*BAD_FILES, "empty_dir"])
def test_bad_checkpoint_files(tmp_path, kind):
    path = tmp_path / "c.pt"
    if kind == "text":  # torch.load read it as a raw pickle stream: KeyError: 101
        path.write_text("hello from my notes\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "other_zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("notes.txt", "not a checkpoint")
    elif kind == "truncated":
        torch.save({"rlrun_format": 1, "w": torch.zeros(1000)}, path)
        path.write_bytes(path.read_bytes()[:300])
    elif kind == "garbage":
        path.write_bytes(b"not a checkpoint at all")
    elif kind == "not_rlrun":
        torch.save({"weights": torch.zeros(2)}, path)
    elif kind == "future_version":
        torch.save({"rlrun_format": 99}, path)
    elif kind == "empty_dir":
        path = tmp_path / "run"
        path.mkdir()
    expected = {
        "missing": "not found",
        "truncated": "not a readable",
        "garbage": "not a readable",
        "text": "not a readable checkpoint",
        "empty": "not a readable checkpoint",
        "random": "not a readable checkpoint",
        "other_zip": "not a readable checkpoint",
        "not_rlrun": "not an rlrun checkpoint",
        "future_version": "format version 99",
        "empty_dir": "no checkpoint in",
    }[kind]
    with pytest.raises(UserError, match=expected):
        load_checkpoint(path)


def _roll(envs, actions):
    out = []
    for a in actions:
        obs, r, te, tr, *_ = envs.step(a)
        out.append((obs.copy(), r.copy(), te.copy(), tr.copy()))
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        EnvConfig(id="CartPole-v1"),
        EnvConfig(id="Pendulum-v1"),
        EnvConfig(id="ALE/Breakout-v5", atari=AtariConfig()),
    ],
    ids=lambda c: c.id,
)
def test_env_state_round_trip_continues_exactly(cfg, tmp_path):
    assert_round_trip(cfg, tmp_path)


def test_ale_envs_made_with_their_seeds_as_training_makes_them_resume_exactly(tmp_path):
    # Training makes ALE games with their seeds (rlrun/envs/atari_seeded.py's AtariEnv): their state was not
    # saved, so a resumed Breakout run started fresh episodes and differed from the run that went on.
    assert_round_trip(EnvConfig(id="ALE/Breakout-v5", atari=AtariConfig()), tmp_path, seeds=[1, 2])


def assert_round_trip(cfg, tmp_path, seeds=None):
    rng = np.random.default_rng(0)
    envs = make_vector_env(cfg, 2, seeds=seeds)
    envs.reset(seed=[1, 2])
    envs.action_space.seed(3)
    _roll(envs, [envs.action_space.sample() for _ in range(40)])
    state = envs.get_env_state()
    assert all(s is not None for s in state)  # None: the env cannot be restored, and a resume starts fresh episodes
    torch.save({"envs": state}, tmp_path / "s.pt")
    actions = [envs.action_space.sample() for _ in range(120)]
    expected = _roll(envs, actions)
    fresh = make_vector_env(cfg, 2, seeds=seeds)
    fresh.reset(seed=seeds or [int(s) for s in rng.integers(1000, size=2)])
    fresh.set_env_state(torch.load(tmp_path / "s.pt", weights_only=True)["envs"])
    for (o1, r1, te1, tr1), (o2, r2, te2, tr2) in zip(expected, _roll(fresh, actions)):
        np.testing.assert_array_equal(o1, o2)
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_array_equal(te1 | tr1, te2 | tr2)
    envs.close()
    fresh.close()


@pytest.mark.parametrize("sticky", [0.0, 0.25])
def test_envs_made_with_their_first_seed_roll_out_as_envs_reset_with_it(sticky):
    # ALE games take the seed while they are made and skip the second ROM load at that reset: the same game,
    # sticky-action draws and noop starts as a plain env seeded at reset; a reset with another seed reseeds.
    cfg = EnvConfig(id="ALE/Breakout-v5", atari=AtariConfig(repeat_action_probability=sticky), max_episode_steps=100)
    actions = [np.array([a, b]) for a, b in np.random.default_rng(5).integers(4, size=(150, 2))]  # with autoresets

    def rollout(made_with: list[int] | None, reset_with: list[int]) -> list[np.ndarray]:
        envs = make_vector_env(cfg, 2, seeds=made_with)
        try:
            first = envs.reset(seed=reset_with)[0]
            return [first] + [np.concatenate([o.ravel(), r, te | tr]) for o, r, te, tr in _roll(envs, actions)]
        finally:
            envs.close()

    def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
        return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    plain = rollout(None, [11, 12])
    assert same(rollout([11, 12], [11, 12]), plain)
    assert same(rollout([11, 12], [21, 22]), rollout(None, [21, 22]))
    assert not same(rollout(None, [21, 22]), plain)  # the seed matters, or the above would prove nothing


def test_unknown_env_id_names_close_matches():
    with pytest.raises(UserError, match="did you mean CartPole-v1"):
        make_vector_env(EnvConfig(id="CartPol-v1"), 1)


def test_breakout_preprocessing_shapes():
    envs = make_vector_env(EnvConfig(id="ALE/Breakout-v5", atari=AtariConfig()), 2)
    obs, _ = envs.reset(seed=[0, 1])
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    assert isinstance(envs.single_action_space, gym.spaces.Discrete)
    envs.close()


def test_resolve_checkpoint_prefers_newest(tmp_path):
    ck = Checkpointer(tmp_path / "checkpoints", keep_last=5)
    for step in (5, 50, 500):
        ck.save({}, step)
    assert resolve_checkpoint(tmp_path).name == "ckpt_000000000500.pt"


@pytest.mark.parametrize("train", [True, False])
def test_atari_max_episode_steps_counts_agent_steps(train):
    cfg = EnvConfig(id="ALE/Breakout-v5", max_episode_steps=50)
    env = make_env(cfg, train=train)()
    try:
        env.reset(seed=3)
        env.action_space.seed(3)
        steps, truncated, info = 0, False, {}
        while not truncated:  # life losses end training episodes (terminated) but not the game
            _, _, terminated, truncated, info = env.step(env.action_space.sample())
            steps += 1
            if terminated and not train:
                break
            if terminated:
                env.reset()
        # 50 agent steps, of which the caller made all but the FIRE after reset (and the no-op and FIRE
        # after each lost life, in training); 50 emulator frames would have been 12 agent steps.
        assert truncated and 40 <= steps < 50 and info["episode"]["l"] == 50
    finally:
        env.close()


def test_format_2_checkpoints_load_with_their_optimizer_state(tmp_path):
    # Format 2 held Adam's moments as flat buffers (FlatAdam's own format); format 3 holds torch.optim.Adam's.
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    adam = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-5)
    for _ in range(3):
        adam.zero_grad()
        model(torch.randn(5, 3)).square().sum().backward()
        adam.step()
    now = adam.state_dict()
    moments = {k: torch.cat([now["state"][i][k].reshape(-1) for i in range(4)]) for k in ("exp_avg", "exp_avg_sq")}
    # A DQN Breakout run of then: Huber loss without saying so, a time limit in emulator frames.
    config = "algo:\n  name: dqn\n  lr: 0.001\n  adam_eps: 1.0e-05\nenv:\n  id: ALE/Breakout-v5\n"
    config += "  max_episode_steps: 4000\n  atari:\n    frame_skip: 4\n"
    old = {"rlrun_format": 2, "env_steps": 10, "config": config}
    old["algo"] = {"model": model.state_dict(), "optimizer": {"steps": 3, **moments}}
    torch.save(old, tmp_path / "old.pt")
    upgraded = load_checkpoint(tmp_path / "old.pt")
    assert upgraded["rlrun_format"] == 3
    fresh = torch.optim.Adam(model.parameters(), lr=1.0)
    fresh.load_state_dict(upgraded["algo"]["optimizer"])
    for i in range(4):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(fresh.state_dict()["state"][i][k], now["state"][i][k]), (i, k)
    assert fresh.param_groups[0]["lr"] == 1e-3 and fresh.param_groups[0]["eps"] == 1e-5
    saved = yaml.safe_load(upgraded["config"])
    assert saved["algo"]["loss"] == "huber" and saved["env"]["max_episode_steps"] == 1000  # agent steps


@pytest.mark.parametrize(
    "settings",
    [
        dict(frame_skip=4, sticky=0.0, life_loss=False, grayscale=True),
        dict(frame_skip=3, sticky=0.25, life_loss=True, grayscale=True),
        dict(frame_skip=2, sticky=0.25, life_loss=False, grayscale=False),
        dict(frame_skip=1, sticky=0.0, life_loss=False, grayscale=True),
    ],
    ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()),
)
def test_atari_frames_step_as_gymnasiums_preprocessing(settings):
    # AtariFrames plays an agent step's frames on the ALE itself: every observation, reward, flag and info is
    # AtariPreprocessing's over AtariEnv.step, through games that end, lives lost and truncations (a game cut at
    # 400 frames), with sticky actions and every frame skip.
    from ale_py.env import AtariEnv

    from rlrun.envs import _register_ale
    from rlrun.envs.atari import AtariFrames

    _register_ale()
    kind = {"frame_skip": settings["frame_skip"], "terminal_on_life_loss": settings["life_loss"]}
    kind |= {"grayscale_obs": settings["grayscale"]}

    def make(wrapper):
        game = gym.make(
            "ALE/Breakout-v5",
            frameskip=1,
            repeat_action_probability=settings["sticky"],
            max_num_frames_per_episode=400,
            disable_env_checker=True,
        )
        return wrapper(game, noop_max=5, **kind)

    ours, theirs = make(AtariFrames), make(gym.wrappers.AtariPreprocessing)
    assert isinstance(ours.atari, AtariEnv)
    rng = np.random.default_rng(7)
    ended = 0
    for env in (ours, theirs):
        env.reset(seed=3)
    assert ours.direct  # from the first reset on, its own step runs
    for a in rng.integers(4, size=1600 // settings["frame_skip"]):  # 1,600 frames: 4 games cut at 400 at least
        mine, gyms = ours.step(int(a)), theirs.step(int(a))
        np.testing.assert_array_equal(mine[0], gyms[0])
        assert mine[1:] == gyms[1:] and type(mine[1]) is type(gyms[1])
        if mine[2] or mine[3]:
            ended += 1
            np.testing.assert_array_equal(ours.reset()[0], theirs.reset()[0])
    assert ended >= 3  # the comparison went through ends and starts


def test_atari_frames_leave_a_wrapped_game_to_gymnasium():
    # Between AtariFrames and the game, a TimeLimit counts frames: AtariFrames steps through it (gymnasium's step),
    # and before a reset its step asks for one as OrderEnforcing's does.
    from rlrun.envs import _register_ale
    from rlrun.envs.atari import AtariFrames

    _register_ale()
    game = gym.make("ALE/Breakout-v5", frameskip=1, max_episode_steps=30, disable_env_checker=True)
    env = AtariFrames(game, noop_max=0)
    assert env.atari is None
    plain = AtariFrames(gym.make("ALE/Breakout-v5", frameskip=1, disable_env_checker=True), noop_max=0)
    with pytest.raises(gym.error.ResetNeeded):
        plain.step(0)
    env.reset(seed=0)
    steps = 1
    while not env.step(1)[3]:
        steps += 1
    assert steps == 8 and not env.direct  # 30 frames: the TimeLimit's count, 4 frames an agent step
