"""PPO's collect acted in the forked env workers (rlrun/algos/worker_acting.py), with real worker processes:
the rollout holds what the envs did and what the policy gave, with the rank's noise and weights; worker
failures inside a rollout surface as they do for single steps; two ranks through the CLI stay in sync and
resume exactly; the default CartPole run learns with acting workers."""

from __future__ import annotations

import json
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.ppo import PPO
from rlrun.config import EnvConfig, ModelConfig, PPOConfig, VectorConfig
from rlrun.envs import make_vector_env
from rlrun.envs.pool import EnvWorkerError, EnvWorkerTimeout, WorkerPool
from tests.conftest import rlrun
from tests.test_distributed import train as train_two_ranks
from tests.test_pool import Faulty, assert_reaped
from tests.test_train import assert_same_tensors, final_state, train

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]
SEEDS = [1, 2, 3, 4]


def worker_ppo(env_id: str, ppo: dict | None = None) -> tuple[PPO, WorkerPool]:
    cfg = EnvConfig(id=env_id, max_episode_steps=20, vector=VectorConfig(backend="subproc", num_workers=2))
    pool = make_vector_env(cfg, 4)
    algo = PPO(
        PPOConfig(num_steps=48, num_minibatches=2, **(ppo or {})),
        ModelConfig(),
        pool.single_observation_space,
        pool.single_action_space,
        4,
        torch.device("cpu"),
    )
    algo.next_obs, _ = pool.reset(seed=SEEDS)
    return algo, pool


def check_rollout(algo: PPO, replay, obs: np.ndarray, noise: torch.Tensor) -> tuple[np.ndarray, list]:
    """Step `replay` (in-process envs where the workers' envs were) with the rollout's actions from `obs`,
    checking every stored field against it and against the rank's policy; the next obs and ended returns."""
    r, model, returns = algo.rollout, algo.model, []
    for t in range(r.values.shape[0]):
        np.testing.assert_array_equal(r.obs[t].numpy(), obs)
        out, value = model._heads(torch.as_tensor(obs))
        torch.testing.assert_close(r.values[t], value, rtol=0, atol=1e-5)
        if model.discrete:  # the action is the Gumbel-max of the rank's noise, under the rank's weights
            log_p = torch.log_softmax(out, -1)
            torch.testing.assert_close(r.actions[t], (log_p - noise[t].log()).argmax(-1), rtol=0, atol=0)
        else:
            torch.testing.assert_close(r.actions[t], out + model.log_std.exp() * noise[t], rtol=0, atol=1e-5)
        log_prob, _, _ = model.evaluate(torch.as_tensor(obs), r.actions[t])
        torch.testing.assert_close(r.log_probs[t], log_prob, rtol=0, atol=1e-5)
        obs, reward, terminated, truncated, info = replay.step(r.actions[t].numpy())
        np.testing.assert_array_equal(r.rewards_np[t], reward.astype(np.float32))  # stored as float32
        np.testing.assert_array_equal(r.terminated_np[t], terminated)
        np.testing.assert_array_equal(r.truncated_np[t], truncated)
        for i in np.flatnonzero(truncated):  # bootstrapped from the final observation's value
            final = torch.as_tensor(info["final_obs"][i][None])
            torch.testing.assert_close(r.next_values[t, i], model.value(final)[0], rtol=0, atol=1e-5)
        if "final_info" in info:
            returns += info["final_info"]["episode"]["r"][info["final_info"]["_episode"]].tolist()
    return obs, returns


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_workers_act_with_the_ranks_noise_and_current_weights(env_id):
    algo, pool = worker_ppo(env_id)
    replay = make_vector_env(EnvConfig(id=env_id, max_episode_steps=20), 4)
    obs, _ = replay.reset(seed=SEEDS)
    try:
        for rollout in range(2):  # the second after an update: the workers must act with the new weights
            torch.manual_seed(rollout)
            episodes = algo.collect(pool)
            assert algo.worker_acting is not None
            torch.manual_seed(rollout)
            noise = algo.model.sampling_noise(*algo.rollout.values.shape)
            with torch.no_grad():
                obs, returns = check_rollout(algo, replay, obs, noise)
            np.testing.assert_array_equal(algo.next_obs, obs)
            assert sorted(episodes["episode_returns"].tolist()) == sorted(returns) and returns
            before = algo.optimizer.params.clone()
            algo.update(progress=0.0)
            assert not torch.equal(before, algo.optimizer.params)
    finally:
        replay.close()
        assert_reaped(pool)


@pytest.mark.parametrize("change", [{"act_in_workers": False}, {"normalize_obs": True}])
def test_rank_acts_when_told_or_when_it_normalizes_observations(change):
    algo, pool = worker_ppo("CartPole-v1", ppo=change)
    try:
        algo.collect(pool)
        assert algo.worker_acting is None and algo.rollout.rewards.sum() > 0
    finally:
        assert_reaped(pool)


def pool_ppo(env_fns: list, timeout: float, num_steps: int = 16) -> tuple[PPO, WorkerPool]:
    pool = WorkerPool(env_fns, 2, timeout)
    space, n = pool.single_observation_space, len(env_fns)
    algo = PPO(PPOConfig(num_steps=num_steps), ModelConfig(), space, pool.single_action_space, n, torch.device("cpu"))
    algo.next_obs, _ = pool.reset(seed=0)
    return algo, pool


@pytest.mark.parametrize("mode, timeout, error", [("raise", 10.0, EnvWorkerError), ("hang", 0.5, EnvWorkerTimeout)])
def test_env_failing_in_a_worker_rollout_names_worker_and_env_promptly(mode, timeout, error):
    algo, pool = pool_ppo([(lambda i=i: Faulty(mode if i == 3 else "ok")) for i in range(4)], timeout)
    start = time.monotonic()
    with pytest.raises(error) as info:
        algo.collect(pool)
    assert type(info.value) is error and "env worker 1" in str(info.value) and time.monotonic() - start < 2.5
    # an exception carries the env and its traceback; a stuck step is timed out after step_timeout_s
    assert ("env 3" in str(info.value) and "ValueError: boom in step" in str(info.value)) or "0.5 s" in str(info.value)
    assert_reaped(pool)


class Slow(gym.Env):
    """Steps take 20 ms: a rollout of many of them outlasts a step timeout it never exceeds per step."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        time.sleep(0.02)
        return np.zeros(4, np.float32), 1.0, False, False, {}


def test_a_rollout_longer_than_the_step_timeout_finishes_while_it_progresses():
    algo, pool = pool_ppo([Slow, Slow], timeout=0.3, num_steps=40)
    try:
        start = time.monotonic()
        algo.collect(pool)
        assert time.monotonic() - start > 0.6 and algo.rollout.rewards.sum() == 80
    finally:
        assert_reaped(pool)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_with_acting_workers_stay_in_sync_and_resume_exactly(tmp_path):
    args = ["env.vector.backend=subproc", "env.vector.num_workers=2", "algo.anneal_lr=false", "eval.every_steps=0"]
    whole = train_two_ranks(tmp_path, "whole", *args, "total_steps=8192")
    half = train_two_ranks(tmp_path, "half", *args, "total_steps=4096")
    out = rlrun("train", f"resume={half}", "total_steps=8192", cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((half / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1
    assert_same_tensors(final_state(whole)["algo"]["model"], final_state(half)["algo"]["model"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_default_cartpole_run_with_acting_workers_solves_it(tmp_path):
    run = train(tmp_path, "run", "env.vector.backend=subproc", "logging.progress=none")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_return_mean"] >= 475, summary  # 500 on 6 of seeds 0-6 here, as the in-process default
