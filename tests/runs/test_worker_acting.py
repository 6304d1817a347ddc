"""PPO's collect acted in the forked env workers (rlrun/algos/worker_acting.py), with real worker processes:
the rollout holds what the envs did and what the policy gave, with the rank's noise and weights; worker
failures inside a rollout surface as they do for single steps; two ranks through the CLI stay in sync and
resume exactly; the default CartPole run learns with acting workers."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.normalize import RunningMoments
from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import EnvSpec
from rlrun.config import AtariConfig, EnvConfig, ModelConfig, VectorConfig
from rlrun.envs import make_vector_env
from rlrun.envs.pool import EnvWorkerError, EnvWorkerTimeout, WorkerPool
from rlrun.fast import accelerate
from tests.conftest import (
    TWO_RANKS,
    Faulty,
    assert_reaped,
    assert_same_tensors,
    final_state,
    resumed_copy,
    train,
)

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]
SEEDS = [1, 2, 3, 4]


def ppo_on(pool, model: ModelConfig | None = None, seed=0, num_steps: int = 16, **ppo) -> PPO:
    """PPO (the default MLP unless `model`) for the envs of `pool`, accelerated as training does, starting
    from their reset with `seed`; `algo.accelerations` names what applied."""
    spec = EnvSpec(pool.single_observation_space, pool.single_action_space, pool.num_envs)
    algo = PPO(PPOConfig(num_steps=num_steps, **ppo), model or ModelConfig(), spec, torch.device("cpu"))
    algo.accelerations = accelerate(algo, pool)
    algo.start(pool.reset(seed=seed)[0])
    return algo


def sampling_noise(algo: PPO) -> torch.Tensor:
    """The noise the rank draws for its workers' rollout: Exp(1) per action (Gumbel-max) or N(0, 1) per action
    dimension, for every step and env."""
    noise = torch.empty(*algo.rollout.values.shape, algo.model.policy_head.out_features)
    return noise.exponential_() if algo.model.discrete else noise.normal_()


class RewardScale:
    """The reward scaling of normalize_reward (SB3's VecNormalize), step by step: the reference."""

    def __init__(self, cfg: PPOConfig):
        self.cfg, self.moments, self.discounted = cfg, RunningMoments(), np.zeros(4)

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.discounted = self.discounted * self.cfg.gamma + reward
        self.moments.update(torch.as_tensor(self.discounted))
        self.discounted[done] = 0.0
        scaled = reward / np.sqrt(self.moments.var.item() + 1e-8)
        return np.clip(scaled, -self.cfg.clip_obs, self.cfg.clip_obs)


def check_rollout(algo: PPO, replay, obs: np.ndarray, noise: torch.Tensor | None, scale=None) -> tuple:
    """Step `replay` (in-process envs where the workers' envs were) with the rollout's actions from `obs`,
    checking every stored field against it and against the rank's policy (its actions against the rank's
    `noise`, when given); the next obs and the returns of the episodes that ended, in order."""
    r, model, returns = algo.rollout, algo.model, []
    for t in range(r.values.shape[0]):
        np.testing.assert_array_equal(r.obs[t].numpy(), obs)
        x = torch.as_tensor(obs)
        torch.testing.assert_close(r.values[t], model.value(x), rtol=0, atol=1e-4)
        if noise is not None and model.discrete:  # the Gumbel-max of the rank's noise, under its weights
            log_p = torch.stack([model.evaluate(x, torch.full((4,), a))[0] for a in range(noise.shape[-1])], -1)
            torch.testing.assert_close(r.actions[t], (log_p - noise[t].log()).argmax(-1), rtol=0, atol=0)
        elif noise is not None:
            mean = model.act(x, deterministic=True)[0]
            torch.testing.assert_close(r.actions[t], mean + model.log_std.exp() * noise[t], rtol=0, atol=1e-5)
        torch.testing.assert_close(r.log_probs[t], model.evaluate(x, r.actions[t])[0], rtol=0, atol=1e-4)
        obs, reward, terminated, truncated, info, _ = replay.step(r.actions[t].numpy())
        expected = reward if scale is None else scale(reward, terminated | truncated)
        np.testing.assert_allclose(r.rewards_np[t], expected.astype(np.float32), rtol=1e-6)  # stored as float32
        np.testing.assert_array_equal(r.terminated_np[t], terminated)
        np.testing.assert_array_equal(r.truncated_np[t], truncated)
        for i in np.flatnonzero(truncated):  # bootstrapped from the final observation's value
            final = torch.as_tensor(info["final_obs"][i][None])
            torch.testing.assert_close(r.next_values[t, i], model.value(final)[0], rtol=0, atol=1e-4)
        if "final_info" in info:
            returns += info["final_info"]["episode"]["r"][info["final_info"]["_episode"]].tolist()
    return obs, returns


CNN = ModelConfig(name="nature_cnn", hidden_sizes=[512], activation="relu", shared=True)
CASES = {  # env, model, rollout length, PPO settings
    "cartpole": (EnvConfig(id="CartPole-v1"), ModelConfig(), 48, {}),
    "pendulum": (EnvConfig(id="Pendulum-v1"), ModelConfig(), 48, {}),
    "cartpole-scaled-rewards": (EnvConfig(id="CartPole-v1"), ModelConfig(), 48, {"normalize_reward": True}),
    "breakout": (EnvConfig(id="ALE/Breakout-v5", atari=AtariConfig()), CNN, 12, {}),
}


def limited(env: EnvConfig, **vector) -> EnvConfig:
    """`env` with short episodes (so that rollouts see truncations), in worker processes if `vector` says.
    Breakout's are shorter: its rollouts here are 12 steps."""
    steps = 5 if env.id.startswith("ALE/") else 20
    return replace(env, max_episode_steps=steps, vector=VectorConfig(**vector))


@pytest.mark.parametrize("case", CASES)
def test_workers_act_with_the_ranks_noise_and_current_weights(case):
    env, model, num_steps, ppo = CASES[case]
    pool = make_vector_env(limited(env, backend="subproc", num_workers=2), 4)
    algo = ppo_on(pool, model, SEEDS, num_steps, num_minibatches=2, **ppo)
    replay = make_vector_env(limited(env), 4)
    obs, _ = replay.reset(seed=SEEDS)
    scale = RewardScale(algo.cfg) if algo.cfg.normalize_reward else None
    try:
        for rollout in range(2):  # the second after an update: the workers must act with the new weights
            torch.manual_seed(rollout)
            episodes = algo.collect(pool)
            assert "acting in env workers" in algo.accelerations
            torch.manual_seed(rollout)
            noise = sampling_noise(algo)
            with torch.no_grad():
                obs, returns = check_rollout(algo, replay, obs, noise, scale)
            np.testing.assert_array_equal(algo.next_obs, obs)
            assert episodes["episode_returns"].tolist() == returns and returns
            before = torch.nn.utils.parameters_to_vector(algo.model.parameters())
            algo.update(progress=0.0)
            assert not torch.equal(before, torch.nn.utils.parameters_to_vector(algo.model.parameters()))
    finally:
        replay.close()
        assert_reaped(pool)


@pytest.mark.parametrize("change", [{"act_in_workers": False}, {"normalize_obs": True}])
def test_rank_acts_when_told_or_when_it_normalizes_observations(change):
    env = limited(EnvConfig(id="CartPole-v1"), backend="subproc", num_workers=2)
    pool = make_vector_env(env, 4)
    algo = ppo_on(pool, seed=SEEDS, num_steps=48, num_minibatches=2, **change)
    replay = make_vector_env(limited(EnvConfig(id="CartPole-v1")), 4)
    obs, _ = replay.reset(seed=SEEDS)
    try:
        algo.collect(pool)
        assert "acting in env workers" not in algo.accelerations
        if not algo.cfg.normalize_obs:  # (normalized, the rollout holds what the policy saw)
            with torch.no_grad():
                check_rollout(algo, replay, obs, noise=None)
    finally:
        replay.close()
        assert_reaped(pool)


@pytest.mark.serial  # a deadline of seconds (half a second for a hang)
@pytest.mark.parametrize("mode", ["raise", "hang", "segfault"])
def test_env_failing_in_a_worker_rollout_names_worker_and_cause_promptly(mode):
    timeout = 0.5 if mode == "hang" else 10.0
    pool = WorkerPool([(lambda i=i: Faulty(mode if i == 3 else "ok")) for i in range(4)], 2, timeout)
    algo = ppo_on(pool)
    start = time.monotonic()
    with pytest.raises(EnvWorkerError) as info:
        algo.collect(pool)
    text = str(info.value)
    assert "env worker 1" in text and "rollout" in text and time.monotonic() - start < 4.0
    if mode == "raise":
        assert "in env 3" in text and "ValueError: boom in step" in text and "Traceback" in text
    elif mode == "hang":  # one step over step_timeout_s, not the whole rollout
        assert isinstance(info.value, EnvWorkerTimeout) and "0.5 s" in text
    else:
        assert "SIGSEGV" in text
    assert_reaped(pool)


class Slow(gym.Env):
    """Steps take 100 ms: a rollout of many of them outlasts a step timeout it never exceeds per step."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        time.sleep(0.1)
        return np.zeros(4, np.float32), 1.0, False, False, {}


@pytest.mark.serial  # 100 ms steps against a step timeout of 1 s
def test_a_rollout_longer_than_the_step_timeout_finishes_while_it_progresses():
    pool = WorkerPool([Slow, Slow], 2, step_timeout_s=1.0)
    algo = ppo_on(pool, num_steps=25)
    try:
        start = time.monotonic()
        algo.collect(pool)
        assert time.monotonic() - start > 2.0 and algo.rollout.rewards.sum() == 50
    finally:
        assert_reaped(pool)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_with_acting_workers_stay_in_sync_and_resume_exactly(tmp_path):
    args = ["env.vector.backend=subproc", "env.vector.num_workers=2", "eval.every_steps=0", "total_steps=8192"]
    whole = train(tmp_path, "whole", *TWO_RANKS, *args, "checkpoint.every_steps=4096", "checkpoint.keep_last=2")
    part = resumed_copy(tmp_path, whole, 4096, timeout=180)  # from the checkpoint half way
    summary = json.loads((part / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1
    assert_same_tensors(final_state(whole)["algo"]["model"], final_state(part)["algo"]["model"])
