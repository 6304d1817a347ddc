"""CartPoles stepped as arrays (rlrun/fast/cartpole_arrays.py), and a few in floats (cartpole_floats.py), against
the same envs stepped one by one (SyncEnvs' run_command, the reference): the same observations, rewards, flags, final
observations and episode statistics to the bit, through terminations, time limits and autoresets; the same env state
for a checkpoint, at any step; a restored state stepped on alike; a batch of seeds' envs stepped at once equal to each
seed's own; and the self-checks, which step aside with one line when gymnasium's CartPole is not what they compute."""

import logging
import re

import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from rlrun.config import EnvConfig
from rlrun.envs import SyncEnvs, make_env
from rlrun.envs.state import env_state
from rlrun.fast.cartpole_arrays import CartPoleArrays, coverable
from rlrun.fast.cartpole_floats import CartPoleFloats
from rlrun.fast.joined_sync import JoinedSyncEnvs, all_cartpoles

LINE = re.compile(r"CartPole as arrays differs from gymnasium's CartPoleEnv.step by .+: running the reference")
FLOATS_LINE = re.compile(
    r"CartPole stepped in floats differs from gymnasium's CartPoleEnv.step by .+: running the reference"
)


def cartpoles(n: int, seed: int = 0, arrays: bool = False, floats: bool = False, **env: object) -> SyncEnvs:
    """n CartPoles as training makes them, reset with seeds seed..seed+n-1; `arrays`: stepped as arrays, `floats`: in
    floats (rlrun/fast/cartpole_floats.py)."""
    envs = SyncEnvs([make_env(EnvConfig(**env), train=True) for _ in range(n)])  # type: ignore[arg-type]
    if arrays:
        envs.run_command = CartPoleArrays(envs.envs).rows(0, n)
    if floats:
        envs.run_command = CartPoleFloats(envs.envs)
    envs.reset(seed=seed)
    return envs


def balancing(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Mostly push toward the pole's fall (long episodes, time limits), sometimes at random (early ends)."""
    lean = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
    return np.where(rng.random(len(obs)) < 0.15, rng.integers(0, 2, len(obs)), lean)


def plain_state(envs: SyncEnvs) -> list:
    """The envs' checkpoint state without RecordEpisodeStatistics' wall-clock times (which no two runs share)."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("episode_start_time", "time_queue")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x.tolist() if hasattr(x, "tolist") else x

    return strip(envs.get_env_state())


def assert_same_step(a, b) -> None:
    for x, y in zip(a[:4], b[:4], strict=True):  # obs, rewards, terminated, truncated
        assert x.dtype == y.dtype and np.array_equal(x, y)
    for x, y in zip(a.episodes, b.episodes, strict=True):
        assert np.array_equal(x, y)
    assert set(a.info) == set(b.info)
    if "final_obs" in b.info:
        ended = b.info["_final_obs"]
        assert np.array_equal(np.stack(a.info["final_obs"][ended]), np.stack(b.info["final_obs"][ended]))
        ours, theirs = a.info["final_info"]["episode"], b.info["final_info"]["episode"]
        assert all(np.array_equal(ours[k], theirs[k]) for k in ("r", "l", "_r", "_l"))


@pytest.mark.parametrize("kind, n", [("arrays", 6), ("floats", 1), ("floats", 3)])
@pytest.mark.parametrize(
    "env",
    [
        {},
        {"max_episode_steps": 40},  # truncations, and episodes that end both ways at once
        {"kwargs": {"sutton_barto_reward": True}},
    ],
    ids=["v1", "time-limit", "sutton-barto"],
)
def test_the_accelerations_step_as_the_envs_do_and_keep_their_state(env, kind, n):
    """As arrays, or in floats (the steps that end no episode; the others the envs' own): the same outputs and episodes
    to the bit, and the same env state at any step, through falls, time limits and autoresets."""
    ours, reference = cartpoles(n, **{kind: True}, **env), cartpoles(n, **env)
    rng, ends = np.random.default_rng(0), 0
    for t in range(3000):
        actions = balancing(reference.buffers["obs"], rng)
        a, b = ours.step(actions), reference.step(actions)
        assert_same_step(a, b)
        ends += int(b.episodes.ended.sum())
        if t % 500 == 250:  # a checkpoint's state, at any step, is the reference's
            assert plain_state(ours) == plain_state(reference)
    assert ends > 3 * n and (env or max(max(e.return_queue) for e in reference.envs) == 500)  # time limits too


@pytest.mark.parametrize("kind, n", [("arrays", 4), ("floats", 2)])
def test_semi_implicit_euler_and_a_restored_state_step_alike(kind, n):
    ours, reference = cartpoles(n, **{kind: True}), cartpoles(n)
    for envs in (ours, reference):
        for e in envs.envs:
            e.unwrapped.kinematics_integrator = "semi-implicit euler"
    rng = np.random.default_rng(1)
    for t in range(1500):
        if t == 700:  # both restored to a third set of envs' state (as a resume does)
            other = cartpoles(n, seed=99)
            for _ in range(30):
                other.step(np.zeros(n, dtype=np.int64))
            state = other.get_env_state()
            ours.set_env_state(state)
            reference.set_env_state(state)
        actions = balancing(reference.buffers["obs"], rng)
        assert_same_step(ours.step(actions), reference.step(actions))


def test_what_the_arrays_do_not_take_is_left_to_the_envs():
    made = [make_env(EnvConfig(), train=True)() for _ in range(2)]
    assert coverable(made)
    made[1].unwrapped.gravity = 3.7  # envs of unlike physics
    assert not coverable(made)
    assert not coverable([make_env(EnvConfig(), train=True, render_mode="rgb_array")()])
    assert not coverable([make_env(EnvConfig(id="Acrobot-v1"), train=True)()])
    # An invalid action raises as the env's own step does (the arrays leave the step to it).
    for ours in (cartpoles(4, arrays=True), cartpoles(2, floats=True)):
        with pytest.raises(AssertionError, match="invalid"):
            ours.step(np.array([0, 1, 2, 0][: ours.num_envs - 1] + [2]))


def test_a_batch_of_seeds_at_once_steps_each_seed_as_its_own_envs():
    """Three seeds' envs stepped as one set of arrays (the batch's join), the second stopped half-way (its rows the
    guard's stand-in): each running seed's steps and state equal its own envs stepped one by one."""

    class Guard:
        def __init__(self, envs):
            self.envs, self.stopped = envs, False

        def fail(self, error):
            raise AssertionError(f"no env fails here: {error}")

    seeds = [Guard(cartpoles(4, seed=10 * s)) for s in range(3)]
    alone = [cartpoles(4, seed=10 * s) for s in range(3)]
    assert all_cartpoles(seeds)
    joined = JoinedSyncEnvs(seeds, arrays=True)
    rng = np.random.default_rng(2)
    for t in range(1200):
        if t == 600:
            seeds[1].stopped = True
        actions = [balancing(e.buffers["obs"], rng) for e in alone]
        step = joined.step(np.concatenate(actions))
        for s, envs in enumerate(alone):
            rows = slice(4 * s, 4 * s + 4)
            if seeds[s].stopped:
                assert not step.obs[rows].any() and not step.episodes.ended[rows].any()
                continue
            own = envs.step(actions[s])
            assert np.array_equal(step.obs[rows], own.obs)
            assert np.array_equal(step.rewards[rows], own.rewards)
            assert np.array_equal(step.episodes.ended[rows], own.episodes.ended)
            assert np.array_equal(step.episodes.returns[rows], own.episodes.returns)
    for s in (0, 2):  # a running seed's checkpoint state, through its own envs, is its envs' alone
        assert plain_state(seeds[s].envs) == plain_state(alone[s])


def edit_cartpole(monkeypatch, edit: str) -> None:
    """gymnasium's CartPole edited in-process, as a new gymnasium version might change it."""
    step, reset = CartPoleEnv.step, CartPoleEnv.reset

    def faster(self, action):  # its physics: seen on the first step
        obs, reward, term, trunc, info = step(self, action)
        self.state = self.state * 1.001
        return self.state.astype(np.float32), reward, term, trunc, info

    def no_reward_for_a_fall(self, action):  # its last reward: seen on the first step that ends an episode
        obs, reward, term, trunc, info = step(self, action)
        return obs, 0.0 if term else reward, term, trunc, info

    def wider_starts(self, *, seed=None, options=None):  # its reset, which the arrays leave to the env
        reset(self, seed=seed, options=options)
        self.state = self.state * 2.0
        return self.state.astype(np.float32), {}

    edits = {"physics": faster, "last reward": no_reward_for_a_fall, "reset": wider_starts}
    monkeypatch.setattr(CartPoleEnv, "reset" if edit == "reset" else "step", edits[edit])


@pytest.mark.parametrize(
    "kind, n, edit, lines",
    [
        ("arrays", 4, "physics", 1),
        ("arrays", 4, "last reward", 1),
        ("arrays", 4, "reset", 0),
        ("floats", 1, "physics", 1),
        ("floats", 1, "last reward", 0),
        ("floats", 1, "reset", 0),
    ],
)
def test_the_accelerations_step_aside_when_gymnasiums_cartpole_differs(kind, n, edit, lines, monkeypatch, caplog):
    """An edit of what the arrays or the floats compute makes them say so in one line (on the first step, or for the
    arrays on the first that ends an episode), and from then on the run's envs step as the edited envs do; an edit of
    the reset needs no line (each env is reset by its own reset), nor for the floats one of the last reward (the steps
    that end an episode are the envs' own)."""
    edit_cartpole(monkeypatch, edit)
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        ours, reference = cartpoles(n, **{kind: True}), cartpoles(n)
        rng = np.random.default_rng(3)
        for _ in range(300):
            actions = rng.integers(0, 2, n)
            assert_same_step(ours.step(actions), reference.step(actions))
    said = {"arrays": LINE, "floats": FLOATS_LINE}[kind]
    assert len([r for r in caplog.records if said.fullmatch(r.getMessage())]) == lines
    assert plain_state(ours) == plain_state(reference)


def test_an_unedited_run_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        ours = cartpoles(8, arrays=True)
        for _ in range(100):
            ours.step(np.zeros(8, dtype=np.int64))  # pushed one way: episodes end within the first 100 steps
    assert not [r for r in caplog.records if LINE.fullmatch(r.getMessage())]
    assert sum(e.episode_count for e in ours.envs) > 0
    assert env_state(ours.envs[0]) is not None
