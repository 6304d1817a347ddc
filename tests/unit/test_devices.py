"""Device placement without a GPU: the learner runs on a simulated second device (tests/simulated_device.py)
that refuses, as CUDA does, an op mixing its tensors with non-scalar CPU tensors. Collects and updates of every
model family on it catch a default-device `torch.randperm` / `torch.zeros` in the update path and normalizer
statistics left on the CPU, the way a GPU run would crash on them; and observations of any dtype reach the
networks as float32."""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos import build_algo
from rlrun.algos.configs import A2CConfig, DQNConfig, PPOConfig, ReplayConfig, SACConfig, TD3Config
from rlrun.algos.protocol import EnvSpec
from rlrun.checkpoint import rng_state, set_rng_state
from rlrun.config import EnvConfig, ModelConfig
from rlrun.envs import SyncEnvs, env_seeds, frame_stack, make_env
from rlrun.fast import accelerate
from tests.conftest import ppo_batch, tensors_in
from tests.simulated_device import simulated_device

BREAKOUT = EnvConfig(id="ALE/Breakout-v5", num_envs=2)
CARTPOLE = EnvConfig(id="CartPole-v1", num_envs=2)
CNN = ModelConfig(name="nature_cnn", hidden_sizes=[32], activation="relu", shared=True)
USER_BN = ModelConfig(_target_="tests.data.user_nets.BatchNormNet")
SMALL_PPO = {"num_steps": 8, "num_minibatches": 2, "update_epochs": 1}
PENDULUM = EnvConfig(id="Pendulum-v1", num_envs=2)
RELU_16 = ModelConfig(hidden_sizes=[16], activation="relu")

CASES = {
    "ppo-mlp": (PPOConfig(**SMALL_PPO), ModelConfig(), CARTPOLE),
    "ppo-mlp-normalized": (
        PPOConfig(**SMALL_PPO, normalize_obs=True, normalize_reward=True),
        ModelConfig(),
        CARTPOLE,
    ),
    "ppo-shared-mlp-continuous": (PPOConfig(**SMALL_PPO), ModelConfig(shared=True), EnvConfig(id="Pendulum-v1")),
    "ppo-cnn": (PPOConfig(**SMALL_PPO), CNN, BREAKOUT),
    "ppo-lstm": (PPOConfig(**SMALL_PPO), ModelConfig(name="lstm", hidden_sizes=[16], shared=True), CARTPOLE),
    "ppo-lru": (PPOConfig(**SMALL_PPO), ModelConfig(name="lru", hidden_sizes=[16], shared=True), CARTPOLE),
    "dqn-per": (
        DQNConfig(buffer_size=256, learning_starts=16, batch_size=8, train_freq=8, n_step=3,
                  replay=ReplayConfig(prioritized=True)),
        ModelConfig(hidden_sizes=[16]),
        CARTPOLE,
    ),
    "dqn-cnn-dueling": (
        DQNConfig(buffer_size=256, learning_starts=16, batch_size=8, train_freq=8, dueling=True, loss="huber"),
        CNN,
        BREAKOUT,
    ),
    "a2c-mlp": (A2CConfig(num_steps=8, norm_adv=True), ModelConfig(), CARTPOLE),
    "a2c-cnn-rmsprop-tf": (A2CConfig(num_steps=4, optimizer="rmsprop_tf"), CNN, BREAKOUT),
    "a2c-continuous-adam": (A2CConfig(optimizer="adam"), ModelConfig(), EnvConfig(id="Pendulum-v1")),
    "a2c-user-batchnorm": (A2CConfig(num_steps=8), USER_BN, CARTPOLE),
    "ppo-user-batchnorm": (PPOConfig(**SMALL_PPO), USER_BN, CARTPOLE),
    "sac-per-n-step": (
        SACConfig(buffer_size=256, learning_starts=16, batch_size=8, train_freq=8, n_step=2,
                  replay=ReplayConfig(prioritized=True)),
        RELU_16,
        PENDULUM,
    ),
    "td3-delayed": (
        TD3Config(buffer_size=256, learning_starts=16, batch_size=8, train_freq=8, gradient_steps=2), RELU_16, PENDULUM
    ),
}  # fmt: skip


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
@pytest.mark.parametrize("case", CASES)
def test_collect_update_act_and_state_on_a_non_cpu_device(case, fast):
    algo_cfg, model_cfg, env_cfg = CASES[case]
    algo_cfg = replace(algo_cfg, fast=fast)
    torch.manual_seed(0)
    envs = SyncEnvs([make_env(env_cfg, train=True) for _ in range(env_cfg.num_envs)])
    try:
        with simulated_device() as device:
            _collect_update_act_and_state(algo_cfg, model_cfg, env_cfg, envs, device)
    finally:
        envs.close()


def _collect_update_act_and_state(algo_cfg, model_cfg, env_cfg: EnvConfig, envs, device: torch.device) -> None:
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, env_cfg.num_envs, frame_stack(env_cfg))
    algo = build_algo(algo_cfg, model_cfg, spec, device)
    accelerate(algo, envs)  # with fast, those that apply off the CPU (the fused loss, flat Adam)
    algo.start(envs.reset(seed=env_seeds(0, 0, env_cfg.num_envs))[0])
    for _ in range(3):  # DQN: the first collects fill the replay to learning_starts
        algo.collect(envs, 0.1)
        stats = algo.update(0.1)
    assert all(np.isfinite(v) for v in stats.values()), stats
    assert {"td_loss", "policy_loss", "qf_loss"} & set(stats)  # an update really ran
    assert next(algo.model.parameters()).device == device
    actions = algo.act(algo.next_obs, deterministic=False, starts=np.ones(env_cfg.num_envs, dtype=bool))
    assert actions.shape[0] == env_cfg.num_envs
    state = algo.state_dict()
    assert all(t.device.type == "cpu" for t in tensors_in(state["obs_rms"] if "obs_rms" in state else {}))
    algo.load_state_dict(state)
    algo.collect(envs, 0.2)
    algo.update(0.2)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalized"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
def test_a_batch_of_seeds_collects_updates_and_saves_on_a_non_cpu_device(fast, normalize):
    """The batched PPO of several seeds (hydra/launcher=batched) on the device: its acting noise drawn from each
    seed's generator and moved there, per-seed decisions (target KL) taken on the host, checkpoints that load back."""
    cfg = PPOConfig(**SMALL_PPO, target_kl=0.01, normalize_obs=normalize, normalize_reward=normalize)
    with simulated_device() as device:
        b = ppo_batch(cfg, CARTPOLE, [0, 1], fast, device)
        try:
            b.train(2)
            assert next(b.batch.model.parameters()).device == device
            for algo in b.algos:
                assert next(algo.model.parameters()).device == device
                algo.load_state_dict(algo.state_dict())  # as a resume loads a seed's checkpoint
            b.batch.load_seeds()
            b.train(1)
        finally:
            b.close()


def test_observations_of_any_dtype_reach_the_networks_as_float32_and_frames_stay_bytes():
    gym.register("rlrun-test/CartPoleFloat64-v0", entry_point=lambda: _retyped(np.float64, lambda o: o))
    gym.register(
        "rlrun-test/CartPoleBytes-v0", entry_point=lambda: _retyped(np.uint8, lambda o: np.clip(o * 20 + 128, 0, 255))
    )
    try:
        for env_id in ("rlrun-test/CartPoleFloat64-v0", "rlrun-test/CartPoleBytes-v0"):
            env_cfg = EnvConfig(id=env_id, num_envs=2)
            configs = (
                PPOConfig(**SMALL_PPO),
                A2CConfig(),
                DQNConfig(buffer_size=256, learning_starts=16, train_freq=8),
            )
            for algo_cfg in configs:
                envs = SyncEnvs([make_env(env_cfg, train=True) for _ in range(2)])
                try:
                    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 2)
                    algo = build_algo(algo_cfg, ModelConfig(), spec, torch.device("cpu"))
                    algo.start(envs.reset(seed=[1, 2])[0])
                    for _ in range(3):
                        algo.collect(envs, 0.1)
                        stats = algo.update(0.1)
                    assert all(np.isfinite(v) for v in stats.values()), (env_id, stats)
                    algo.act(algo.next_obs)
                finally:
                    envs.close()
    finally:
        for env_id in ("rlrun-test/CartPoleFloat64-v0", "rlrun-test/CartPoleBytes-v0"):
            gym.registry.pop(env_id, None)
    frames = PPOConfig(**SMALL_PPO)
    envs = SyncEnvs([make_env(BREAKOUT, train=True)])
    try:
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space)
        algo = build_algo(frames, CNN, spec, torch.device("cpu"))
        assert algo.rollout.obs.dtype == torch.uint8  # frames are stored as bytes, 4x smaller than floats
    finally:
        envs.close()


def _retyped(dtype: type, transform) -> gym.Env:
    env = gym.make("CartPole-v1")
    space = gym.spaces.Box(0 if dtype == np.uint8 else -np.inf, 255 if dtype == np.uint8 else np.inf, (4,), dtype)
    return gym.wrappers.TransformObservation(env, lambda o: transform(o).astype(dtype), space)


def test_a_ranks_rng_state_covers_its_device_generator_and_round_trips():
    # On a GPU the device's generator (PPO's sampling noise) is saved and restored too; on the CPU, the CPU's.
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    state = rng_state(device)
    assert len(state["device_rng"]) == (device.type == "cuda")
    first = torch.rand(4), torch.rand(4, device=device)
    set_rng_state(state, device)
    again = torch.rand(4), torch.rand(4, device=device)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
