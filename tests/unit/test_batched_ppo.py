"""The batched PPO of many seeds (rlrun/algos/batched_ppo.py) against the single-seed reference (rlrun/algos/ppo.py):
each seed's update is its single run's, and no seed's training depends on the seeds beside it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from rlrun.algos.batched_ppo import BatchedPPO
from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import EnvSpec
from rlrun.algos.stacked import SeedSteps, clip_grad_norm_per_seed
from rlrun.config import EnvConfig, ModelConfig
from rlrun.envs import SyncEnvs, env_seeds, make_env
from rlrun.errors import NonFiniteError
from rlrun.seeding import TRAIN, torch_seed
from tests.conftest import tensors_in

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


def single_updates(cfg: PPOConfig, env_id: str, seed: int, updates: int) -> tuple[PPO, list[float]]:
    """The seed's single run after `updates` iterations, and each update's epochs."""
    algo, envs = seed_run(cfg, env_id, seed)
    epochs = []
    for i in range(updates):
        algo.collect(envs)
        epochs.append(algo.update(progress=i / updates)["epochs"])
    envs.close()
    return algo, epochs


def assert_same_state(batched: PPO, single: PPO) -> None:
    """The seed's network and optimizer state (as its checkpoint holds them) equal its single run's, to 1e-5."""
    a, b = batched.state_dict(), single.state_dict()
    for x, y in zip(a["model"].values(), b["model"].values(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    for i, own in b["optimizer"]["state"].items():
        for key, value in own.items():
            torch.testing.assert_close(a["optimizer"]["state"][i][key], value, rtol=0, atol=1e-5)


def batched_updates(cfg: PPOConfig, env_id: str, seeds: list[int], updates: int) -> tuple[list[PPO], list[list[float]]]:
    """The same for the seeds trained side by side in one BatchedPPO: each seed's PPO and epochs."""
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
    return [algo for algo, _ in built], epochs


CARTPOLE = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=3)


@pytest.mark.parametrize("env_id, normalize", [("CartPole-v1", False), ("Pendulum-v1", False), ("Pendulum-v1", True)])
def test_each_seeds_first_update_equals_its_single_run(env_id, normalize):
    cfg = replace(CARTPOLE, normalize_obs=normalize, normalize_reward=normalize)
    seeds = [0, 1, 2]
    batched, _ = batched_updates(cfg, env_id, seeds, 1)
    for seed, algo in zip(seeds, batched):
        assert_same_state(algo, single_updates(cfg, env_id, seed, 1)[0])


def test_clipping_and_the_target_kl_stop_are_each_seeds_own():
    """With a gradient norm cap every update hits and a KL target that stops some seeds' updates early and not
    others', each seed's first update is still its single run's (clipped by its own norm, stopped by its own KL,
    and a stopped seed not moved by Adam's momentum in the epochs it sits out)."""
    cfg = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=8, lr=3e-3, max_grad_norm=0.05, target_kl=0.004)
    seeds = [0, 1, 2, 3]
    batched, epochs = batched_updates(cfg, "CartPole-v1", seeds, 1)
    stopped = [e[0] for e in epochs]
    assert min(stopped) < cfg.update_epochs and len(set(stopped)) > 1, f"the stops do not differ by seed: {stopped}"
    for seed, algo, own in zip(seeds, batched, stopped):
        single, single_epochs = single_updates(cfg, "CartPole-v1", seed, 1)
        assert single_epochs == [own]
        assert_same_state(algo, single)


def test_a_seed_trains_alike_whatever_seeds_train_beside_it():
    cfg = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=4, target_kl=0.01)
    beside_123, _ = batched_updates(cfg, "CartPole-v1", [0, 1, 2, 3], 4)
    beside_567, _ = batched_updates(cfg, "CartPole-v1", [0, 5, 6, 7], 4)
    a, b = beside_123[0].state_dict(), beside_567[0].state_dict()
    assert tensors_in(a) and all(torch.equal(x, y) for x, y in zip(tensors_in(a), tensors_in(b), strict=True))
    assert not torch.equal(beside_123[1].model.trunk.first.weight, beside_567[1].model.trunk.first.weight)


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
    adam = SeedSteps(stacked, lambda params: torch.optim.Adam(params, lr=0.1, eps=1e-5))
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
    assert adam.steps() == [2, 1, 2]


def test_a_seeds_checkpoint_state_loads_back_into_a_batch():
    trained, _ = batched_updates(CARTPOLE, "CartPole-v1", [0, 1], 1)
    saved = trained[1].state_dict()
    fresh = [seed_run(CARTPOLE, "CartPole-v1", seed) for seed in (0, 1)]
    batch = BatchedPPO([algo for algo, _ in fresh], [torch.Generator(), torch.Generator()])
    fresh[1][0].load_state_dict(saved)  # as a resume loads a seed's checkpoint
    batch.load_seeds()
    batch.write_seeds()
    loaded = fresh[1][0].state_dict()
    assert all(torch.equal(x, y) for x, y in zip(tensors_in(loaded), tensors_in(saved), strict=True))
    assert batch.optimizer.steps() == [0, CARTPOLE.num_minibatches * CARTPOLE.update_epochs]
    for _, envs in fresh:
        envs.close()


def test_a_stopped_seed_and_one_whose_gradient_goes_nan_stay_put_while_the_others_train_on():
    """After a first update, seed 2 is stopped (stop_seed: its env failed) and seed 1's next rollout holds NaN
    rewards: that update gives seed 1 the NonFiniteError its single run raises, and neither seed moves (weights,
    Adam moments, step count) in it or the next; seeds 0 and 3 train exactly as in the same batch without either."""

    def three_updates(fail: bool) -> tuple[list[PPO], list[list[torch.Tensor]], list]:
        built = [seed_run(CARTPOLE, "CartPole-v1", seed) for seed in range(4)]
        generators = [torch.Generator().set_state(torch.get_rng_state()) for _ in built]
        batch = BatchedPPO([algo for algo, _ in built], generators)
        envs = [e for _, e in built]
        batch.collect(envs)
        batch.update(progress=0.0)
        batch.collect(envs)
        if fail:
            batch.stop_seed(2)
            batch.rollout["rewards"][1] = float("nan")
        before = [[t.clone() for t in tensors_in(algo.state_dict())] for algo, _ in built]
        second = batch.update(progress=0.3)
        batch.collect(envs)
        batch.update(progress=0.6)
        for e in envs:
            e.close()
        return [algo for algo, _ in built], before, second

    failed, before, second = three_updates(fail=True)
    healthy, _, _ = three_updates(fail=False)
    assert isinstance(second[1], NonFiniteError) and str(second[1]) == "the PPO gradient norm is NaN"
    assert all(isinstance(stats, dict) for s, stats in enumerate(second) if s != 1)
    for s in (1, 2):
        after = tensors_in(failed[s].state_dict())
        assert len(after) == len(before[s]) and all(torch.equal(x, y) for x, y in zip(after, before[s]))
        assert (
            failed[s].state_dict()["optimizer"]["state"][0]["step"] == CARTPOLE.update_epochs * CARTPOLE.num_minibatches
        )
    for s in (0, 3):
        a, b = tensors_in(failed[s].state_dict()), tensors_in(healthy[s].state_dict())
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
