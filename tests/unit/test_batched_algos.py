"""The batched A2C, DQN, SAC and TD3 of many seeds (rlrun/algos/batched_*.py) against their single-seed references
(rlrun/algos/a2c.py, dqn.py, sac.py, td3.py): each seed's first updates are its single run's, and no seed's training
depends on the seeds beside it."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rlrun.algos import build_algo
from rlrun.algos.batched import batch_of, unbatchable
from rlrun.algos.configs import A2CConfig, DQNConfig, ReplayConfig, SACConfig, TD3Config
from rlrun.algos.protocol import EnvSpec
from rlrun.config import EnvConfig, ModelConfig
from rlrun.envs import SyncEnvs, env_seeds, make_env
from rlrun.errors import NonFiniteError
from rlrun.seeding import TRAIN, torch_seed
from rlrun.seeds import streams_now
from tests.conftest import tensors_in
from tests.simulated_device import simulated_device

MASKED = "rlrun-test/BatchedMasked-v0"  # tests/data/spaces_envs.py's Masked: action masks in a Dict observation
gym.register(MASKED, entry_point="tests.data.spaces_envs:Masked")
CPU = torch.device("cpu")
SMALL = ModelConfig(hidden_sizes=[16, 16], activation="relu")
REPLAY = {"buffer_size": 256, "learning_starts": 12, "batch_size": 8}
Case = tuple[Any, ModelConfig, str, int]  # (algo config, model, env id, envs per seed)
CASES: dict[str, Case] = {
    "sac": (SACConfig(**REPLAY), SMALL, "Pendulum-v1", 2),
    "sac-per-n-step-delayed": (
        SACConfig(**REPLAY, n_step=2, policy_frequency=2, gradient_steps=2, replay=ReplayConfig(prioritized=True)),
        SMALL,
        "Pendulum-v1",
        2,
    ),
    "a2c": (A2CConfig(num_steps=8, norm_adv=True, max_grad_norm=0.05), ModelConfig(), "CartPole-v1", 4),
    "a2c-continuous-adam": (
        A2CConfig(num_steps=8, optimizer="adam", anneal_lr=True, gae_lambda=0.95, ent_coef=0.01),
        SMALL,
        "Pendulum-v1",
        2,
    ),
    "a2c-rmsprop-tf-masked": (A2CConfig(num_steps=4, optimizer="rmsprop_tf"), SMALL, MASKED, 2),
    "td3": (TD3Config(**REPLAY, gradient_steps=3), SMALL, "Pendulum-v1", 2),
    "dqn": (DQNConfig(**REPLAY, train_freq=2, gradient_steps=2, target_update_interval=2), SMALL, "CartPole-v1", 2),
    "dqn-dueling-per-huber-masked": (
        DQNConfig(
            **REPLAY,
            train_freq=2,
            dueling=True,
            loss="huber",
            tau=0.5,
            n_step=3,
            max_grad_norm=0.05,
            exploration_fraction=0.5,
            replay=ReplayConfig(prioritized=True),
        ),
        ModelConfig(hidden_sizes=[16], activation="tanh"),
        MASKED,
        2,
    ),
    "td3-per-quiet": (
        TD3Config(**REPLAY, exploration_noise=0.0, policy_delay=3, replay=ReplayConfig(prioritized=True)),
        SMALL,
        "Pendulum-v1",
        2,
    ),
}


def seed_run(case: Case, seed: int, device: torch.device = CPU) -> tuple[Any, SyncEnvs]:
    """A seed's algorithm and envs as its single run builds them (rlrun/training/parts.py): torch's global generator
    seeded for the seed's training stream before the algorithm is built, envs reset on the seed's env seeds. The
    global generator is left where the seed's stream stands after building."""
    algo_cfg, model_cfg, env_id, n = case
    envs = SyncEnvs([make_env(EnvConfig(id=env_id), train=True) for _ in range(n)])
    torch.manual_seed(torch_seed(seed, 0, TRAIN))
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, n)
    algo = build_algo(replace(algo_cfg, fast=False), model_cfg, spec, device)
    algo.start(envs.reset(seed=env_seeds(seed, 0, n))[0])
    return algo, envs


def single_run(
    case: Case, seed: int, iterations: int, device: torch.device = CPU
) -> tuple[Any, list[dict[str, float]]]:
    """The seed's single run after `iterations` collects and updates, and each update's stats."""
    algo, envs = seed_run(case, seed, device)
    stats = []
    for i in range(iterations):
        algo.collect(envs, i / iterations)
        stats.append(algo.update(i / iterations))
    envs.close()
    return algo, stats


def batched_run(
    case: Case, seeds: list[int], iterations: int, device: torch.device = CPU
) -> tuple[list[Any], list[list[dict[str, float]]]]:
    """The same for the seeds trained side by side in one batched learner: each seed's algorithm and stats."""
    built, streams = [], []
    for seed in seeds:  # as rlrun/seeds.py builds them, with the seed's streams of the global generators
        built.append(seed_run(case, seed, device))
        streams.append(streams_now(device))
    algos, envs = [a for a, _ in built], [e for _, e in built]
    assert all(unbatchable(case[0].name, a) is None for a in algos)
    on_device = [d for _, d in streams if d is not None]
    batch = batch_of(case[0].name, algos, [g for g, _ in streams], on_device or None)
    stats: list[list[dict[str, float]]] = [[] for _ in seeds]
    for i in range(iterations):
        batch.collect(envs, i / iterations)
        for s, st in enumerate(batch.update(i / iterations)):
            stats[s].append(st)
    for e in envs:
        e.close()
    return algos, stats


def assert_close_states(a: dict[str, Any], b: dict[str, Any], path: str = "", rtol: float = 0.0) -> None:
    """Two checkpoint states alike: tensors and floats computed from them (PER's max priority) to 1e-5 (and `rtol`),
    everything else equal. (A batch's products and a single run's round apart by an ulp on some CPUs: the max priority
    of an AMD EPYC's runs differed in its last float32 bit.)"""
    assert type(a) is type(b), path
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_close_states(a[k], b[k], f"{path}/{k}", rtol)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=rtol, atol=1e-5, msg=lambda m: f"{path}: {m}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close_states(x, y, f"{path}[{i}]", rtol)
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=1e-5), f"{path}: {a} != {b}"
    else:
        assert a == b, path


ITERATIONS = 10  # the replay algorithms update from the 6th on (learning_starts 12, 2 envs)


@pytest.mark.parametrize("case", CASES)
def test_each_seeds_first_updates_equal_its_single_run(case):
    seeds = [0, 1, 2]
    batched, batched_stats = batched_run(CASES[case], seeds, ITERATIONS)
    for seed, algo, stats in zip(seeds, batched, batched_stats):
        single, single_stats = single_run(CASES[case], seed, ITERATIONS)
        assert single_stats[-1].get("charts/updates", 1) > 0  # it updated
        assert_close_states(algo.state_dict(), single.state_dict())
        for mine, theirs in zip(stats, single_stats, strict=True):
            assert mine.keys() == theirs.keys()
            for k, v in mine.items():
                assert v == pytest.approx(theirs[k], rel=1e-5, abs=1e-6), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ["a2c", "a2c-continuous-adam", "sac-per-n-step-delayed", "td3", "dqn"])
def test_on_a_gpu_each_seeds_first_updates_equal_its_single_gpu_run(case):
    """On a GPU a single run draws its sampling noise (A2C) and its Gaussian noise (SAC, TD3) from the device's
    generator, and the rest on the CPU: each seed of a batch draws them from its own streams of both, or its actions
    differ from its single run's from the first step (DQN draws on the CPU alone). CUDA's batched and single products
    round apart: Adam's second moments, near 1, differ by 1e-5 after ten updates (other draws would differ by far
    more), hence rtol 1e-4."""
    cuda, seeds = torch.device("cuda"), [0, 1, 2]
    batched, batched_stats = batched_run(CASES[case], seeds, ITERATIONS, cuda)
    for seed, algo, stats in zip(seeds, batched, batched_stats):
        single, single_stats = single_run(CASES[case], seed, ITERATIONS, cuda)
        assert_close_states(algo.state_dict(), single.state_dict(), rtol=1e-4)
        for mine, theirs in zip(stats, single_stats, strict=True):
            assert mine == pytest.approx(theirs, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("case", ["a2c", "dqn", "sac", "td3"])
def test_a_seed_trains_alike_whatever_seeds_train_beside_it(case):
    beside_123, stats_123 = batched_run(CASES[case], [0, 1, 2, 3], ITERATIONS)
    beside_567, stats_567 = batched_run(CASES[case], [0, 5, 6, 7], ITERATIONS)
    a, b = beside_123[0].state_dict(), beside_567[0].state_dict()
    assert tensors_in(a) and all(torch.equal(x, y) for x, y in zip(tensors_in(a), tensors_in(b), strict=True))
    assert stats_123[0] == stats_567[0]
    assert not torch.equal(tensors_in(beside_123[1].state_dict())[0], tensors_in(beside_567[1].state_dict())[0])


def test_each_seeds_gradient_is_clipped_by_its_own_norm():
    """A DQN update whose max_grad_norm lies between the seeds' gradient norms clips some seeds and not others;
    each seed's update is still its single run's (one norm over the stack would clip all of them alike)."""
    cfg, seeds, norms = DQNConfig(**REPLAY, train_freq=8), [0, 1, 2, 3], []  # one update, in the first iteration
    for seed in seeds:
        algo, envs = seed_run((cfg, SMALL, "CartPole-v1", 2), seed)
        clip = algo.parts.clip_grad_norm_

        def clip_and_record(params: list[nn.Parameter], max_norm: float, clip: Any = clip) -> torch.Tensor:
            norm: torch.Tensor = clip(params, max_norm)
            norms.append(float(norm))
            return norm

        algo.parts.clip_grad_norm_ = clip_and_record
        algo.collect(envs, 0.0)
        assert algo.update(0.0)["charts/updates"] == 1
        envs.close()
    low, high = sorted(norms)[1:3]
    assert low < high
    case = (replace(cfg, max_grad_norm=(low + high) / 2), SMALL, "CartPole-v1", 2)
    batched, _ = batched_run(case, seeds, 1)
    for seed, algo in zip(seeds, batched):
        assert_close_states(algo.state_dict(), single_run(case, seed, 1)[0].state_dict())


@pytest.mark.parametrize("case", ["a2c-rmsprop-tf-masked", "dqn", "sac", "td3"])
def test_the_seeds_checkpoint_states_load_back_into_a_batch(case):
    trained, _ = batched_run(CASES[case], [0, 1], ITERATIONS)
    saved = [a.state_dict() for a in trained]
    fresh = [seed_run(CASES[case], seed) for seed in (0, 1)]
    batch = batch_of(CASES[case][0].name, [a for a, _ in fresh], [torch.Generator(), torch.Generator()])
    for (algo, _), state in zip(fresh, saved):  # as a resume loads each seed's checkpoint into its algorithm
        algo.load_state_dict(state)
    batch.load_seeds()
    batch.write_seeds()
    for (algo, envs), state in zip(fresh, saved):
        loaded = algo.state_dict()
        assert all(torch.equal(x, y) for x, y in zip(tensors_in(loaded), tensors_in(state), strict=True))
        envs.close()


@pytest.mark.parametrize(
    "case", ["a2c-continuous-adam", "dqn-dueling-per-huber-masked", "sac-per-n-step-delayed", "td3"]
)
def test_a_batch_trains_on_a_non_cpu_device(case):
    """On a simulated second device (tests/simulated_device.py), which refuses ops mixing its tensors with the CPU's
    as CUDA does, a batch collects, updates and checkpoints, its networks and its seeds' on the device."""
    with simulated_device() as device:
        algos, stats = batched_run(CASES[case], [0, 1], ITERATIONS, device)
        assert all(math.isfinite(v) for seed in stats for v in seed[-1].values()), stats
        assert {"qf_loss", "td_loss", "policy_loss"} & set(stats[0][-1])
        for algo in algos:
            assert all(p.device == device for p in algo.model.parameters())
            algo.load_state_dict(algo.state_dict())


def _poison(name: str, batch: Any, algos: list[Any], seed: int) -> None:
    """NaN rewards for seed `seed`'s next update: in its replay, or in its A2C unroll just collected."""
    if name.startswith("a2c"):
        batch.unrolls[seed].rewards.fill_(float("nan"))
    else:
        algos[seed].replay.rewards[:] = np.nan


def _learned(algo: Any) -> list[torch.Tensor]:
    """The tensors of what a seed has learned: its networks (targets too) and its optimizers' states."""
    return tensors_in(
        {k: v for k, v in algo.state_dict().items() if k in ("model", "target") or k.endswith("optimizer")}
    )


@pytest.mark.parametrize(
    "case, error",
    [
        ("a2c", "the A2C gradient norm is NaN"),
        ("dqn-dueling-per-huber-masked", "the DQN gradient norm is NaN"),
        ("sac", "the SAC critic loss is NaN"),
        ("td3", "the TD3 critic loss is NaN"),
    ],
)
def test_a_stopped_seed_and_one_whose_loss_goes_nan_stay_put_while_the_others_train_on(case, error):
    """Seed 2 is stopped (stop_seed: its env failed) and seed 1's next update sees NaN rewards: that update gives
    seed 1 the NonFiniteError its single run raises, and neither seed's networks, targets or optimizer states move
    in it or the next; seeds 0 and 3 train exactly as in the same batch without either."""

    def run(fail: bool) -> tuple[list[Any], list[list[torch.Tensor]], list[Any]]:
        built = [seed_run(CASES[case], seed) for seed in range(4)]
        generators = [torch.Generator().set_state(torch.get_rng_state()) for _ in built]
        algos, envs = [a for a, _ in built], [e for _, e in built]
        batch = batch_of(CASES[case][0].name, algos, generators)
        for i in range(ITERATIONS - 1):
            batch.collect(envs, i / ITERATIONS)
            batch.update(i / ITERATIONS)
        batch.collect(envs, 0.9)
        if fail:
            batch.stop_seed(2)
            _poison(case, batch, algos, 1)
        before = [[t.clone() for t in _learned(a)] for a in algos]
        failing = batch.update(0.9)
        batch.collect(envs, 0.95)
        batch.update(0.95)
        for e in envs:
            e.close()
        return algos, before, failing

    failed, before, failing = run(fail=True)
    healthy, _, _ = run(fail=False)
    assert isinstance(failing[1], NonFiniteError) and str(failing[1]) == error
    assert all(isinstance(stats, dict) for s, stats in enumerate(failing) if s != 1)
    for s in (1, 2):
        after = _learned(failed[s])
        assert len(after) == len(before[s]) and all(torch.equal(x, y) for x, y in zip(after, before[s]))
    for s in (0, 3):
        a, b = tensors_in(failed[s].state_dict()), tensors_in(healthy[s].state_dict())
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
