"""The batched PPO of many seeds (rlrun/algos/batched_ppo.py) against the single-seed reference (rlrun/algos/ppo.py):
each seed's update is its single run's, and no seed's training depends on the seeds beside it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from rlrun.algos.batched_ppo import BatchedPPO, SeedAdam, clip_grad_norm_per_seed
from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import EnvSpec
from rlrun.config import EnvConfig, ModelConfig
from rlrun.envs import SyncEnvs, env_seeds, make_env
from rlrun.seeding import TRAIN, torch_seed

NUM_ENVS = 4


def seed_run(cfg: PPOConfig, env_id: str, seed: int) -> tuple[PPO, SyncEnvs]:
    """A seed's PPO and envs as its single run builds them (rlrun/training/parts.py): torch's global generator
    seeded for the seed's training stream before the model is built, envs reset on the seed's env seeds. The
    global generator is left where the seed's stream stands after building."""
    envs = SyncEnvs([make_env(EnvConfig(id=env_id), train=True) for _ in range(NUM_ENVS)])
    torch.manual_seed(torch_seed(seed, 0, TRAIN))
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, NUM_ENVS)
    algo = PPO(cfg, ModelConfig(), spec, torch.device("cpu"))
    algo.start(envs.reset(seed=env_seeds(seed, 0, NUM_ENVS))[0])
    return algo, envs


def single_updates(cfg: PPOConfig, env_id: str, seed: int, updates: int) -> tuple[list[torch.Tensor], list[float]]:
    """The parameters of the seed's single run after `updates` iterations, and each update's epochs."""
    algo, envs = seed_run(cfg, env_id, seed)
    epochs = []
    for i in range(updates):
        algo.collect(envs)
        epochs.append(algo.update(progress=i / updates)["epochs"])
    envs.close()
    return [p.detach().clone() for p in algo.model.parameters()], epochs


def batched_updates(
    cfg: PPOConfig, env_id: str, seeds: list[int], updates: int
) -> tuple[list[list[torch.Tensor]], list[list[float]]]:
    """The same for the seeds trained side by side in one BatchedPPO: each seed's parameters and epochs."""
    built, generators = [], []
    for seed in seeds:
        built.append(seed_run(cfg, env_id, seed))
        generators.append(torch.Generator().set_state(torch.get_rng_state()))
    batch = BatchedPPO([algo for algo, _ in built], generators)
    envs = [e for _, e in built]
    epochs: list[list[float]] = [[] for _ in seeds]
    for i in range(updates):
        batch.collect(envs)
        for s, stats in enumerate(batch.update(progress=i / updates)):
            epochs[s].append(stats["epochs"])
    for e in envs:
        e.close()
    return [[p.detach().clone() for p in algo.model.parameters()] for algo, _ in built], epochs


CARTPOLE = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=3)


@pytest.mark.parametrize("env_id, normalize", [("CartPole-v1", False), ("Pendulum-v1", False), ("Pendulum-v1", True)])
def test_each_seeds_first_update_equals_its_single_run(env_id, normalize):
    cfg = replace(CARTPOLE, normalize_obs=normalize, normalize_reward=normalize)
    seeds = [0, 1, 2]
    batched, _ = batched_updates(cfg, env_id, seeds, 1)
    for seed, params in zip(seeds, batched):
        single, _ = single_updates(cfg, env_id, seed, 1)
        for a, b in zip(params, single, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_clipping_and_the_target_kl_stop_are_each_seeds_own():
    """With a gradient norm cap every update hits and a KL target that stops some seeds' updates early and not
    others', each seed's first update is still its single run's (clipped by its own norm, stopped by its own KL,
    and a stopped seed not moved by Adam's momentum in the epochs it sits out)."""
    cfg = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=8, lr=3e-3, max_grad_norm=0.05, target_kl=0.004)
    seeds = [0, 1, 2, 3]
    batched, epochs = batched_updates(cfg, "CartPole-v1", seeds, 1)
    stopped = [e[0] for e in epochs]
    assert min(stopped) < cfg.update_epochs and len(set(stopped)) > 1, f"the stops do not differ by seed: {stopped}"
    for seed, params, own in zip(seeds, batched, stopped):
        single, single_epochs = single_updates(cfg, "CartPole-v1", seed, 1)
        assert single_epochs == [own]
        for a, b in zip(params, single, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_a_seed_trains_alike_whatever_seeds_train_beside_it():
    cfg = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=4, target_kl=0.01)
    beside_123, _ = batched_updates(cfg, "CartPole-v1", [0, 1, 2, 3], 4)
    beside_567, _ = batched_updates(cfg, "CartPole-v1", [0, 5, 6, 7], 4)
    for a, b in zip(beside_123[0], beside_567[0], strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(beside_123[1][0], beside_567[1][0])  # the neighbours did train differently


def test_per_seed_clipping_and_adam_are_s_independent_ones():
    torch.manual_seed(0)
    stacked = [nn.Parameter(torch.randn(3, 5, 4)), nn.Parameter(torch.randn(3, 1, 4))]
    for p in stacked:
        p.grad = torch.randn_like(p) * torch.tensor([0.01, 10.0, 1.0]).view(3, 1, 1)
    own = [[nn.Parameter(p[s].detach().clone()) for p in stacked] for s in range(3)]
    for s, params in enumerate(own):
        for p, q in zip(params, stacked):
            p.grad = q.grad[s].clone()
    norms = clip_grad_norm_per_seed(stacked, 0.5)
    adams = [torch.optim.Adam(params, lr=0.1, eps=1e-5) for params in own]
    for s, params in enumerate(own):
        torch.testing.assert_close(norms[s], nn.utils.clip_grad_norm_(params, 0.5), rtol=1e-6, atol=0)
        adams[s].step()
    before = [p.detach().clone() for p in stacked]
    adam = SeedAdam(stacked, lr=0.1, eps=1e-5)
    adam.step(torch.tensor([True, True, True]))
    for p, q in zip(stacked, before):
        q[1] = p[1].detach()  # the values after one step, for seed 1 to keep below
    adam.step(torch.tensor([True, False, True]))  # seed 1 stopped: nothing of it moves
    for s in (0, 2):
        adams[s].step()
    for s in (0, 2):
        for p, q in zip(stacked, own[s]):
            torch.testing.assert_close(p[s], q, rtol=0, atol=1e-6)
    for p, q in zip(stacked, before):
        assert torch.equal(p[1], q[1])
    assert adam.steps.tolist() == [2, 1, 2]
