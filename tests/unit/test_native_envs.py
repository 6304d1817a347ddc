"""env.vector.backend=native against the Python wrappers the other backends step: what is the same (shown on the
same start states and actions), and each difference, stated by a test of its own."""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.configs import PPOConfig
from rlrun.config import AtariConfig, EnvConfig, TrainConfig, VectorConfig
from rlrun.envs import make_env, make_vector_env, vector_backend
from rlrun.errors import NonFiniteError, UserError
from rlrun.fast import cartpoles_as_arrays

NATIVE = VectorConfig(backend="native")


def cartpole(**kw) -> EnvConfig:
    return EnvConfig(id="CartPole-v1", vector=NATIVE, **kw)


def atari(game: str, max_episode_steps: int | None = None, **kw) -> EnvConfig:
    return EnvConfig(id=f"ALE/{game}-v5", atari=AtariConfig(**kw), vector=NATIVE, max_episode_steps=max_episode_steps)


def python_env(cfg: EnvConfig, train: bool = True) -> gym.Env:
    return make_env(cfg, train)()


def test_cartpole_steps_as_the_python_envs_from_the_same_states():
    """Same start states and actions: the same observations, rewards, flags, final observations and episode
    statistics, over several episodes and a time limit in agent steps (only the start states' draws differ: one RNG
    for all envs instead of one per env)."""
    cfg, n = cartpole(max_episode_steps=30), 3
    native, envs = make_vector_env(cfg, n), [python_env(cfg) for _ in range(n)]
    obs, _ = native.reset(seed=[5, 6, 7])

    def copy_starts(rows):
        for i in rows:
            envs[i].reset()
            envs[i].unwrapped.state = native.parts[0].env.state[:, i].copy()

    copy_starts(range(n))
    rng, ended, truncations = np.random.default_rng(0), 0, 0
    for _ in range(300):
        actions = rng.integers(0, 2, n)
        step = native.step(actions)
        for i, env in enumerate(envs):
            o, r, te, tr, info = env.step(int(actions[i]))
            assert (r, te, tr) == (step.rewards[i], step.terminated[i], step.truncated[i])
            if te or tr:
                np.testing.assert_array_equal(step.info["final_obs"][i], o)
                assert step.episodes.ended[i] and step.episodes.returns[i] == info["episode"]["r"]
                assert step.episodes.lengths[i] == info["episode"]["l"]
            else:
                np.testing.assert_array_equal(step.obs[i], o)
                assert not step.episodes.ended[i]
        done = np.flatnonzero(step.terminated | step.truncated)
        ended, truncations = ended + len(done), truncations + int(step.truncated.sum())
        copy_starts(done)
    assert ended > 10 and truncations > 0


def test_cartpole_autoresets_in_the_same_step():
    """gymnasium's CartPoleVectorEnv restarts a finished episode at the next step (NEXT_STEP), which ignores that
    step's action and returns reward 0; native restarts it in the step that ends it, so every step is a
    transition: the observation after a done is a start state and every reward is 1."""
    native = make_vector_env(cartpole(), 4)
    native.reset(seed=1)
    rng, starts = np.random.default_rng(0), 0
    for _ in range(200):
        step = native.step(rng.integers(0, 2, 4))
        assert (step.rewards == 1).all()
        for i in np.flatnonzero(step.terminated | step.truncated):
            assert np.abs(step.obs[i]).max() <= 0.05  # CartPole's start states are drawn from [-0.05, 0.05]
            starts += 1
    assert starts > 5


def test_native_seeds_give_the_same_episodes():
    for cfg, actions in ((cartpole(), np.array([1, 0])), (atari("Breakout"), np.array([1, 3]))):
        a, b, c = (make_vector_env(cfg, 2) for _ in range(3))
        obs = [a.reset(seed=[3, 4])[0], b.reset(seed=[3, 4])[0], c.reset(seed=[9, 10])[0]]
        for _ in range(40):
            obs = [a.step(actions).obs, b.step(actions).obs, c.step(actions).obs]
        np.testing.assert_array_equal(obs[0], obs[1])
        assert not np.array_equal(obs[0], obs[2])
        for envs in (a, b, c):
            envs.close()


def test_cartpole_env_state_round_trip_continues_exactly(tmp_path):
    """A checkpoint's env state (plain data, weights_only) continues the envs' episodes and statistics exactly."""
    native = make_vector_env(cartpole(), 4)
    native.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(50):
        native.step(rng.integers(0, 2, 4))
    torch.save(native.get_env_state(), tmp_path / "envs.pt")
    actions = rng.integers(0, 2, (100, 4))
    expected = [native.step(a) for a in actions]
    resumed = make_vector_env(cartpole(), 4)
    resumed.reset(seed=123)
    resumed.set_env_state(torch.load(tmp_path / "envs.pt", weights_only=True))
    for a, want in zip(actions, expected):
        got = resumed.step(a)
        np.testing.assert_array_equal(got.obs, want.obs)
        np.testing.assert_array_equal(got.episodes.returns, want.episodes.returns)
    assert sum(s.episodes.ended.sum() for s in expected) > 0


def test_a_nan_observation_names_the_env():
    native = make_vector_env(cartpole(), 3)
    native.reset(seed=0)
    native.parts[0].env.state[1, 2] = np.nan  # as a diverging simulation would leave it
    with pytest.raises(NonFiniteError, match="env 2 returned a NaN observation"):
        native.step(np.zeros(3, np.int64))


def test_native_is_refused_for_envs_without_a_vectorized_implementation():
    with pytest.raises(UserError, match="Pendulum-v1 has no vectorized implementation"):
        vector_backend(EnvConfig(id="Pendulum-v1", vector=NATIVE))
    with pytest.raises(UserError, match=r"does not take env.kwargs \['mode'\]"):
        vector_backend(EnvConfig(id="ALE/Breakout-v5", kwargs={"mode": 1}, vector=NATIVE))


def test_auto_picks_native_for_cartpole_from_8_envs_subproc_for_ale_games_and_sync_otherwise():
    auto = VectorConfig(backend="auto")
    assert vector_backend(EnvConfig(id="CartPole-v1", num_envs=8, vector=auto))[0] == "native"
    assert vector_backend(EnvConfig(id="CartPole-v1", num_envs=4, vector=auto))[0] == "sync"
    assert vector_backend(EnvConfig(id="ALE/Pong-v5", vector=auto))[0] == "subproc"
    assert vector_backend(EnvConfig(id="Acrobot-v1", vector=auto))[0] == "sync"
    assert vector_backend(EnvConfig(id="ALE/Pong-v5", kwargs={"mode": 1}, vector=auto))[0] == "subproc"


def test_auto_keeps_cartpoles_in_process_where_the_accelerations_step_them_as_arrays():
    """The arrays step 8 to 32 CartPoles about as fast as native while episodes are short and 1.4x once they are long
    (bench/env_throughput.py), each env with its own episodes: auto picks sync where they would apply, native where
    they would not."""
    auto = VectorConfig(backend="auto")
    for n in (8, 32):
        backend, why = vector_backend(EnvConfig(id="CartPole-v1", num_envs=n, vector=auto), arrays=True)
        assert (backend, "the accelerations step CartPoles as arrays" in why) == ("sync", True)
        assert vector_backend(EnvConfig(id="CartPole-v1", num_envs=n, vector=auto))[0] == "native"
    assert vector_backend(EnvConfig(id="Acrobot-v1", num_envs=8, vector=auto), arrays=True)[0] == "sync"

    def as_arrays(fast: bool = True, **env: object) -> bool:
        settings: dict = {"id": "CartPole-v1", "num_envs": 8, "vector": auto} | env
        return cartpoles_as_arrays(TrainConfig(algo=PPOConfig(fast=fast), env=EnvConfig(**settings)))

    assert as_arrays()
    assert not as_arrays(fast=False)  # the reference steps each env by itself: native is the faster then
    assert not as_arrays(num_envs=2)  # below ARRAYS_FROM the arrays do not apply
    assert not as_arrays(id="Acrobot-v1")
    assert not as_arrays(kwargs={"render_mode": "rgb_array"})  # the arrays do not take rendering envs


def frames(steps: list[np.ndarray]) -> np.ndarray:
    return np.array([s[-1] for s in steps])  # the newest frame of each stack


def play(game: str, steps: int, python: bool = True, **atari_kw) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The same actions on one Python env (unless not `python`) and one native env of `game` (training envs): their
    stacks."""
    cfg = atari(game, **atari_kw)
    native = make_vector_env(cfg, 1)
    py_env = python_env(cfg) if python else None
    py_obs, nat_obs = [py_env.reset(seed=3)[0]] if py_env else [], [native.reset(seed=[3])[0][0]]
    rng = np.random.default_rng(0)
    for _ in range(steps):
        a = int(rng.integers(0, native.single_action_space.n))
        if py_env:
            py_obs.append(py_env.step(a)[0])
        nat_obs.append(native.step(np.array([a])).obs[0])
    native.close()
    return py_obs, nat_obs


def test_atari_frames_are_the_python_wrappers_frames():
    """Grayscale, max-pooling over the last two frames of each skip, the resize filter (INTER_AREA both) and the
    frame stack are the same: in a game without FIRE and without noops at reset, every stack is equal, the first
    (padded with the first frame, as FrameStackObservation pads; the ALE pads with zeros) included."""
    py, nat = play("Freeway", 300, noop_max=0)
    assert len({f.tobytes() for f in frames(py)}) > 30  # the screen changes
    np.testing.assert_array_equal(np.array(py), np.array(nat))


def test_atari_reset_noops_and_fire_differ():
    """At a reset, the Python wrappers do 1..noop_max no-op frames, then FIRE for a whole agent step (frame_skip
    frames); the ALE presses FIRE for one frame, then does 0..noop_max-2 no-ops. Counted in frames since the game
    started (the Python env's ALE; the native env's reset info)."""
    cfg = atari("Breakout", noop_max=30)
    python, native = python_env(cfg, train=False), make_vector_env(cfg, 8)  # (a training env resets at game over)
    py_frames = set()
    for seed in range(12):
        python.reset(seed=seed)
        py_frames.add(python.unwrapped.ale.getEpisodeFrameNumber())
    _, info = native.reset(seed=list(range(8)))
    nat_frames = set(info["episode_frame_number"].tolist())
    native.close()
    assert min(py_frames) >= 1 + 4 and max(py_frames) <= 30 + 4 and len(py_frames) > 6
    assert min(nat_frames) >= 1 and max(nat_frames) <= 29 and len(nat_frames) > 4


def lives_lost(cfg: EnvConfig, steps: int = 3000) -> dict:
    """Steps one native env of `cfg` with random actions: what happened at each life lost and at the game's end."""
    native = make_vector_env(cfg, 1)
    native.reset(seed=[1])
    rng, seen = np.random.default_rng(0), {"lost": [], "over": [], "rewards": set()}
    for t in range(steps):
        step = native.step(rng.integers(0, 4, 1))
        seen["rewards"].update(step.rewards.tolist())
        if step.episodes.ended[0]:
            seen["over"].append((t, step.episodes.returns[0], step.episodes.lengths[0], step.terminated[0]))
            break
        if step.terminated[0]:
            final = step.info["final_obs"][0]
            seen["lost"].append((t, final, step.obs[0]))
    native.close()
    return seen


def test_atari_a_life_lost_ends_the_training_episode_and_the_game_goes_on():
    """As EpisodicLife: terminated at each life lost, the game (and its score) going on to its end, where the
    statistics count the whole game. The stack starts again on the newest frame, as after the Python wrappers' reset
    there; what differs is that those first press no-op and FIRE (two agent steps the agent does not see): here
    the agent presses FIRE itself. Evaluation envs (train=False) do not end episodes at a life lost."""
    seen = lives_lost(atari("Breakout"))
    assert len(seen["lost"]) == 4 and len(seen["over"]) == 1  # Breakout's five lives
    for _, final, obs in seen["lost"]:
        assert (obs == obs[-1]).all() and not (final == final[-1]).all()
        np.testing.assert_array_equal(obs[-1], final[-1])
    t, score, length, terminated = seen["over"][0]
    assert terminated and length == t + 1 and score >= 0
    assert seen["rewards"] <= {0.0, 1.0}  # clipped to their sign for training (Breakout's bricks score 1 to 7)
    whole = lives_lost(atari("Breakout", terminal_on_life_loss=False, clip_reward=False))
    assert whole["lost"] == [] and whole["over"][0][:3] == seen["over"][0][:3]


def test_atari_eval_envs_keep_raw_rewards_and_whole_games():
    native = make_vector_env(atari("Breakout"), 1, train=False)
    assert not native.parts[0].life_loss and not native.parts[0].clip
    native.close()


def test_atari_sticky_actions_follow_the_config():
    """Sticky actions are the ALE's own in both (repeat_action_probability, here and in the Python env); the same
    seed gives other draws, as the Python env seeds its ALE from a seed it derives."""
    _, plain = play("Breakout", 100, python=False, noop_max=0, repeat_action_probability=0.0)
    _, again = play("Breakout", 100, python=False, noop_max=0, repeat_action_probability=0.0)
    _, sticky = play("Breakout", 100, python=False, noop_max=0, repeat_action_probability=0.5)
    np.testing.assert_array_equal(np.array(plain), np.array(again))
    assert not np.array_equal(np.array(plain), np.array(sticky))


def test_atari_time_limit_counts_agent_steps():
    native = make_vector_env(atari("Breakout", max_episode_steps=25, terminal_on_life_loss=False), 2)
    native.reset(seed=[0, 1])
    steps = [native.step(np.array([1, 1])) for _ in range(25)]  # FIRE: the ball stays in play for longer than 25
    assert not any(s.truncated.any() for s in steps[:-1])
    step = steps[-1]
    assert step.truncated.all() and (step.episodes.lengths == 25).all()
    assert step.info["final_obs"][0].shape == (4, 84, 84)
    native.close()


def test_atari_env_state_is_not_saved():
    """The emulators' state stays in ale-py's C++: a checkpoint holds none, and a resumed run starts fresh episodes
    (rlrun/training/resume.py), as for MuJoCo envs."""
    native = make_vector_env(atari("Breakout"), 2)
    assert native.get_env_state() == [None]
    native.close()


def test_atari_double_buffered_halves_step_as_one_batch():
    """env.vector.double_buffer: two AtariVectorEnvs (a collect loop acts for one while the other steps in its
    threads) whose envs give what one batch's give, env by env, stepped by group or whole."""
    double = replace(atari("Breakout"), vector=VectorConfig(backend="native", double_buffer=True))
    one, two = make_vector_env(atari("Breakout"), 4), make_vector_env(double, 4)
    assert [len(range(4)[g]) for g in two.groups] == [2, 2]
    seeds = [11, 12, 13, 14]
    np.testing.assert_array_equal(one.reset(seed=seeds)[0], two.reset(seed=seeds)[0])
    rng = np.random.default_rng(0)
    for t in range(300):
        actions = rng.integers(0, 4, 4)
        a = one.step(actions)
        if t % 2:
            b = two.step(actions)
        else:  # as the collect loop does: a group sent, the other received
            two.send(0, actions[:2])
            two.send(1, actions[2:])
            halves = [two.recv(0), two.recv(1)]
            b = [np.concatenate([h[k] for h in halves]) for k in range(4)]
        for x, y in zip(a[:4], b[:4]):
            np.testing.assert_array_equal(x, y)
    one.close()
    two.close()
