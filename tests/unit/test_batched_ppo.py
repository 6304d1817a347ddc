"""The batched PPO of many seeds (rlrun/algos/batched_ppo.py) against the single-seed reference (rlrun/algos/ppo.py):
each seed's update is its single run's, and no seed's training depends on the seeds beside it, on the batch's
reference path and on its accelerated one (rlrun/fast/); and each acceleration of the batch against the part it
replaces, through the same signature."""

from __future__ import annotations

import io
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rlrun.algos.batched_ppo import BatchedActorCritic, BatchedPPOLearner, JoinedEnvs, draw_rollout_noise, layout_ties
from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.stacked import SeedSteps, clip_grad_norm_per_seed, normalize_per_seed
from rlrun.config import EnvConfig, ModelConfig
from rlrun.envs import SyncEnvs, env_seeds, make_env
from rlrun.errors import NonFiniteError
from rlrun.fast.batched_numpy_policy import BatchedNumpyPolicy
from rlrun.fast.fused_batched_ppo import FusedBatchedPPOLearner
from rlrun.fast.fused_ppo import SIGMOID_TANH_FROM
from rlrun.fast.joined_sync import JoinedSyncEnvs
from rlrun.fast.rollout_noise import draw_noise_at_once
from rlrun.models import build_actor_critic
from rlrun.seeds import Guarded
from tests.conftest import Faulty, ppo_batch, seed_run, tensors_in

CARTPOLE = EnvConfig(id="CartPole-v1", num_envs=4)
PPO_SMALL = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=3)
# The batch's two paths: the reference (algo.fast=false) and the accelerated one, whose names must all apply.
PATHS = {
    "reference": (False, set()),
    "fast": (
        True,
        {"seeds' envs stepped as one", "fused batched PPO loss", "batched numpy acting"},
    ),
}


def single_updates(cfg: PPOConfig, env: EnvConfig, seed: int, updates: int) -> tuple[PPO, list[float]]:
    """The seed's single run (algo.fast=false) after `updates` iterations, and each update's epochs."""
    algo, envs = seed_run(cfg, env, seed)
    epochs = []
    for i in range(updates):
        algo.collect(envs)
        epochs.append(algo.update(progress=i / updates)["epochs"])
    envs.close()
    return algo, epochs


def batched_updates(
    cfg: PPOConfig, env: EnvConfig, seeds: list[int], updates: int, path: str
) -> tuple[list[PPO], list[list[float]]]:
    """The same for the seeds trained side by side in one BatchedPPO on `path`: each seed's PPO and epochs."""
    fast, expected = PATHS[path]
    b = ppo_batch(cfg, env, seeds, fast)
    assert expected <= set(b.applied), b.applied
    epochs = b.train(updates)
    b.close()
    if fast:  # the accelerations that re-write the math passed their self-checks: they are what trained
        parts = b.batch.parts
        checked = (parts.learner, parts.policy) + ((parts.draw_noise,) if b.batch.model.kind == "categorical" else ())
        assert all(part.active is part.fast for part in checked)
    return b.algos, epochs


def assert_same_state(batched: PPO, single: PPO) -> None:
    """The seed's network and optimizer state (as its checkpoint holds them) equal its single run's, to 1e-5."""
    a, b = batched.state_dict(), single.state_dict()
    for x, y in zip(a["model"].values(), b["model"].values(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    for i, own in b["optimizer"]["state"].items():
        for key, value in own.items():
            torch.testing.assert_close(a["optimizer"]["state"][i][key], value, rtol=0, atol=1e-5, check_dtype=False)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "env, normalize",
    [
        (CARTPOLE, False),
        (replace(CARTPOLE, id="Pendulum-v1"), False),
        (replace(CARTPOLE, id="Pendulum-v1"), True),
        # Episodes cut by the time limit inside the rollout: each seed bootstraps from its own final observations.
        (replace(CARTPOLE, max_episode_steps=5), True),
    ],
    ids=["cartpole", "pendulum", "pendulum-normalized", "truncated-normalized"],
)
def test_each_seeds_first_update_equals_its_single_run(env, normalize, path):
    cfg = replace(PPO_SMALL, normalize_obs=normalize, normalize_reward=normalize)
    seeds = [0, 1, 2]
    batched, _ = batched_updates(cfg, env, seeds, 1, path)
    for seed, algo in zip(seeds, batched):
        assert_same_state(algo, single_updates(cfg, env, seed, 1)[0])


@pytest.mark.parametrize("path", PATHS)
def test_clipping_and_the_target_kl_stop_are_each_seeds_own(path):
    """With a gradient norm cap every update hits and a KL target that stops some seeds' updates early and not
    others', each seed's first update is still its single run's (clipped by its own norm, stopped by its own KL,
    and a stopped seed not moved by Adam's momentum in the epochs it sits out)."""
    cfg = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=8, lr=3e-3, max_grad_norm=0.05, target_kl=0.004)
    seeds = [0, 1, 2, 3]
    batched, epochs = batched_updates(cfg, CARTPOLE, seeds, 1, path)
    stopped = [e[0] for e in epochs]
    assert min(stopped) < cfg.update_epochs and len(set(stopped)) > 1, f"the stops do not differ by seed: {stopped}"
    for seed, algo, own in zip(seeds, batched, stopped):
        single, single_epochs = single_updates(cfg, CARTPOLE, seed, 1)
        assert single_epochs == [own]
        assert_same_state(algo, single)


@pytest.mark.parametrize("path", PATHS)
def test_a_seed_trains_alike_whatever_seeds_train_beside_it(path):
    cfg = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=4, target_kl=0.01)
    beside_123, _ = batched_updates(cfg, CARTPOLE, [0, 1, 2, 3], 4, path)
    beside_567, _ = batched_updates(cfg, CARTPOLE, [0, 5, 6, 7], 4, path)
    a, b = beside_123[0].state_dict(), beside_567[0].state_dict()
    assert tensors_in(a) and all(torch.equal(x, y) for x, y in zip(tensors_in(a), tensors_in(b), strict=True))
    assert not torch.equal(beside_123[1].model.trunk.first.weight, beside_567[1].model.trunk.first.weight)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
def test_on_a_gpu_each_seeds_first_update_equals_its_single_gpu_run(fast):
    """On a GPU a single run draws its acting noise from the device's generator: each seed of a batch must too (from
    its own device generator), or its actions differ from its single run's from the first step."""
    cuda = torch.device("cuda")
    seeds = [0, 1, 2]
    b = ppo_batch(PPO_SMALL, CARTPOLE, seeds, fast, cuda)
    b.train(1)
    b.close()
    if fast:
        assert {"seeds' envs stepped as one", "fused batched PPO loss"} <= set(b.applied), b.applied
        assert b.batch.parts.learner.active is b.batch.parts.learner.fast
    for seed, algo in zip(seeds, b.algos):
        single, envs = seed_run(PPO_SMALL, CARTPOLE, seed, cuda)
        single.collect(envs)
        single.update(progress=0.0)
        envs.close()
        assert_same_state(algo, single)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
def test_on_a_gpu_a_single_runs_checkpoint_resumes_in_a_batch(fast):
    """A single GPU run's checkpoint, loaded to the CPU as a resume loads it (step counts on the CPU), trains on in a
    batch on the GPU, whose fused Adam keeps its step counts on the device; the seed's state then reads as its single
    run's would."""
    cuda = torch.device("cuda")
    single, envs = seed_run(PPO_SMALL, CARTPOLE, 1, cuda)
    single.collect(envs)
    single.update(progress=0.0)
    envs.close()
    buffer = io.BytesIO()
    torch.save(single.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, map_location="cpu", weights_only=True)
    b = ppo_batch(PPO_SMALL, CARTPOLE, [0, 1], fast, cuda)
    b.algos[1].load_state_dict(saved)
    b.batch.load_seeds()
    b.train(1)
    b.close()
    steps = PPO_SMALL.num_minibatches * PPO_SMALL.update_epochs
    assert b.batch.optimizer.steps() == [steps, 2 * steps]
    for algo in b.algos:
        for own in algo.state_dict()["optimizer"]["state"].values():
            assert own["step"].device.type == "cpu" and own["exp_avg"].device.type == "cuda"


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


@pytest.mark.parametrize("path", PATHS)
def test_a_seeds_checkpoint_state_loads_back_into_a_batch(path):
    trained, _ = batched_updates(PPO_SMALL, CARTPOLE, [0, 1], 1, path)
    saved = trained[1].state_dict()
    fresh = ppo_batch(PPO_SMALL, CARTPOLE, [0, 1], PATHS[path][0])
    fresh.algos[1].load_state_dict(saved)  # as a resume loads a seed's checkpoint
    fresh.batch.load_seeds()
    fresh.batch.write_seeds()
    loaded = fresh.algos[1].state_dict()
    assert all(torch.equal(x, y) for x, y in zip(tensors_in(loaded), tensors_in(saved), strict=True))
    assert fresh.batch.optimizer.steps() == [0, PPO_SMALL.num_minibatches * PPO_SMALL.update_epochs]
    fresh.close()


@pytest.mark.parametrize("path", PATHS)
def test_a_stopped_seed_and_one_whose_gradient_goes_nan_stay_put_while_the_others_train_on(path):
    """After a first update, seed 2 is stopped (stop_seed: its env failed) and seed 1's next rollout holds NaN
    rewards: that update gives seed 1 the NonFiniteError its single run raises, and neither seed moves (weights,
    Adam moments, step count) in it or the next; seeds 0 and 3 train exactly as in the same batch without either."""

    def three_updates(fail: bool) -> tuple[list[PPO], list[list[torch.Tensor]], list]:
        b = ppo_batch(PPO_SMALL, CARTPOLE, [0, 1, 2, 3], PATHS[path][0])
        b.batch.collect(b.envs)
        b.batch.update(progress=0.0)
        b.batch.collect(b.envs)
        if fail:
            b.batch.stop_seed(2)
            b.batch.rollout["rewards"][:, 1] = float("nan")  # [T, S, N]: seed 1's
        before = [[t.clone() for t in tensors_in(algo.state_dict())] for algo in b.algos]
        second = b.batch.update(progress=0.3)
        b.batch.collect(b.envs)
        b.batch.update(progress=0.6)
        b.close()
        return b.algos, before, second

    failed, before, second = three_updates(fail=True)
    healthy, _, _ = three_updates(fail=False)
    assert isinstance(second[1], NonFiniteError) and str(second[1]) == "the PPO gradient norm is NaN"
    assert all(isinstance(stats, dict) for s, stats in enumerate(second) if s != 1)
    steps = PPO_SMALL.update_epochs * PPO_SMALL.num_minibatches
    for s in (1, 2):
        after = tensors_in(failed[s].state_dict())
        assert len(after) == len(before[s]) and all(torch.equal(x, y) for x, y in zip(after, before[s]))
        assert failed[s].state_dict()["optimizer"]["state"][0]["step"] == steps
    for s in (0, 3):
        a, b = tensors_in(failed[s].state_dict()), tensors_in(healthy[s].state_dict())
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# The accelerations of the batch against the parts they replace, through the same signatures.

SPACES = {
    "discrete": (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), ModelConfig()),
    "box": (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,)), ModelConfig()),
    "discrete-relu-deep": (
        gym.spaces.Box(-1, 1, (4,)),
        gym.spaces.Discrete(2),
        ModelConfig(activation="relu", hidden_sizes=[16, 16, 16]),
    ),
}


def stacked_model(space: str, S: int = 3) -> BatchedActorCritic:
    """S seeds' networks for `space`, stacked, with Gaussian log-stds away from 0."""
    obs_space, action_space, model_cfg = SPACES[space]
    model = BatchedActorCritic([build_actor_critic(model_cfg, obs_space, action_space) for _ in range(S)])
    if model.kind == "gaussian":
        with torch.no_grad():
            model.log_std.normal_()
    return model


def minibatch(model: BatchedActorCritic, S: int = 3, B: int = 16) -> dict[str, torch.Tensor]:
    P = model.policy_w.shape[-1]
    actions = torch.randint(0, P, (S, B)) if model.kind == "categorical" else torch.randn(S, B, P)
    return {
        "obs": torch.randn(S, B, model.first_w.shape[1]),
        "actions": actions,
        "old_log_probs": torch.randn(S, B) * 0.3 - 1,
        "advantages": normalize_per_seed(torch.randn(S, B)),
        "returns": torch.randn(S, B),
        "old_values": torch.randn(S, B) * 0.1,
    }


# (seeds, rows): a small batch, and 8 seeds' minibatches of 128 rows, whose tanh activations the fused loss takes
# as 2 sigmoid(2z) - 1 (fused_ppo.SIGMOID_TANH_FROM) and whose heads' products go through numpy
SIZES = {"small": (3, 16), "8x128": (8, 128)}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("clip_vloss", [True, False])
@pytest.mark.parametrize("space", SPACES)
def test_the_fused_batched_loss_equals_the_reference_with_its_gradients(space, clip_vloss, size):
    torch.manual_seed(0)
    S, B = SIZES[size]
    model, cfg = stacked_model(space, S), PPOConfig(clip_vloss=clip_vloss)
    if size != "small" and isinstance(model.activation, nn.Tanh):
        assert 2 * S * B * model.hidden >= SIGMOID_TANH_FROM  # the sigmoid form is what is checked
    mb, params = minibatch(model, S, B), model.seed_parameters()
    expected_loss, expected_stats = BatchedPPOLearner(model, cfg)(**mb)
    loss, stats = FusedBatchedPPOLearner(model, cfg)(**mb)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats, expected_stats, rtol=1e-5, atol=1e-6)
    expected = torch.autograd.grad(expected_loss.sum(), params)
    for g, e in zip(torch.autograd.grad(loss.sum(), params), expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("space", SPACES)
def test_batched_numpy_acting_equals_the_stacked_model_with_live_weights(space):
    torch.manual_seed(0)
    model = stacked_model(space)
    policy = BatchedNumpyPolicy(model)
    with torch.no_grad():  # moved after the policy was made: it acts with the weights as they are now
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    obs = torch.randn(3, 5, model.first_w.shape[1])
    generators = [torch.Generator().manual_seed(s) for s in range(3)]
    noise = draw_rollout_noise(generators, model.kind, (1, 5, model.policy_w.shape[-1]), torch.device("cpu"))[0]
    with torch.no_grad():
        for ours, expected in zip(policy.act(obs, noise), model.act(obs, noise), strict=True):
            torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(policy.value(obs), model.value(obs), rtol=1e-5, atol=1e-5)


def seeds_envs(env: EnvConfig, seeds: list[int]) -> list[SyncEnvs]:
    out = []
    for seed in seeds:
        envs = SyncEnvs([make_env(env, train=True) for _ in range(env.num_envs)])
        envs.reset(seed=env_seeds(seed, 0, env.num_envs))
        out.append(envs)
    return out


def test_the_seeds_envs_stepped_as_one_return_what_they_return_stepped_seed_by_seed():
    """Episodes ending and cut by the time limit (final observations) within 40 steps of 3 seeds x 4 envs."""
    env = replace(CARTPOLE, max_episode_steps=7)
    joined, reference = JoinedSyncEnvs(seeds_envs(env, [0, 1, 2])), JoinedEnvs(seeds_envs(env, [0, 1, 2]))
    rng = np.random.default_rng(0)
    ended = truncated = 0
    for _ in range(40):
        actions = rng.integers(0, 2, 12)
        ours, expected = joined.step(actions), reference.step(actions)
        for a, b in zip(ours[:4], expected[:4]):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(ours.episodes, expected.episodes):
            np.testing.assert_array_equal(a, b)
        cut = np.flatnonzero(expected.truncated)
        if len(cut):
            finals = (np.stack(r.info["final_obs"][cut]) for r in (ours, expected))
            np.testing.assert_array_equal(*finals)
            truncated += len(cut)
        ended += int(expected.episodes.ended.sum())
    assert ended > 12 and truncated > 0


def test_a_non_finite_value_names_the_env_in_its_seed_as_its_own_envs_do():
    """Seed 1's env 1 (the batch's env 3) returns a NaN: both ways of stepping say env 1, as seed 1's own would."""
    messages = []
    for join in (JoinedSyncEnvs, JoinedEnvs):
        fine, nan = (lambda: Faulty("none")), (lambda: Faulty("nan", at_step=3))
        envs = [SyncEnvs([fine, fine]), SyncEnvs([fine, nan])]
        for e in envs:
            e.reset(seed=0)
        joined = join(envs)
        with pytest.raises(NonFiniteError) as raised:
            for _ in range(5):
                joined.step(np.zeros(4, dtype=np.int64))
        messages.append(str(raised.value))
    assert messages[0] == messages[1] == "env 1 returned a NaN observation", messages


def test_guarded_seeds_stepped_as_one_fail_alone_as_stepped_seed_by_seed():
    """The batch driver's guards (rlrun/seeds.py) around the seeds' envs: seed 1's env 1 raises at step 3, seed 2's
    env 0 returns a NaN at step 5. Both ways of stepping fail each of them alone, once, with the error its own envs
    raise, stand in for its rows from then on, and step the other seeds alike."""
    fine, raises, nan = (lambda: Faulty("none")), (lambda: Faulty("raise", 3)), (lambda: Faulty("nan", 5))
    results, failures = [], []
    for join in (JoinedSyncEnvs, JoinedEnvs):
        failed: list[tuple[int, str]] = []
        seeds = [SyncEnvs([fine, fine]), SyncEnvs([fine, raises]), SyncEnvs([nan, fine])]
        guards = [
            Guarded(e, lambda error, s=s, failed=failed: failed.append((s, f"{type(error).__name__}: {error}")))
            for s, e in enumerate(seeds)
        ]
        for e in seeds:
            e.reset(seed=0)
        joined = join(guards)
        results.append([joined.step(np.ones(6, dtype=np.int64)) for _ in range(7)])
        failures.append(failed)
    assert (
        failures[0]
        == failures[1]
        == [(1, "ValueError: boom in step"), (2, "NonFiniteError: env 0 returned a NaN observation")]
    )
    for ours, expected in zip(*results):
        for a, b in zip(ours[:4], expected[:4]):
            np.testing.assert_array_equal(a, b)


def batch_rollouts(env: EnvConfig, in_numpy: bool, rollouts: int = 4) -> tuple[list, list[str]]:
    """Each rollout of a batch of 3 seeds on the fast path: its rows, each seed's episodes and next observations;
    `in_numpy` False swaps back the reference's collect steps (BatchedPPO.act_and_step) around numpy acting."""
    b = ppo_batch(replace(PPO_SMALL, num_steps=48), env, [0, 1, 2], fast=True)
    if not in_numpy:
        b.batch.parts.collect_steps = b.batch.parts.collect_steps.reference
    out = []
    for _ in range(rollouts):
        episodes = b.batch.collect(b.envs)
        out.append(([v.clone() for v in b.batch.rollout.values()], episodes, [a.next_obs.copy() for a in b.algos]))
    b.close()
    return out, b.applied


SHORT_EPISODES = [
    replace(CARTPOLE, max_episode_steps=40),
    EnvConfig(id="Pendulum-v1", num_envs=2, max_episode_steps=40),
]


@pytest.mark.parametrize("env", SHORT_EPISODES)
def test_a_batchs_rollout_kept_in_numpy_is_the_reference_collects(env):
    ours, applied = batch_rollouts(env, in_numpy=True)
    reference, _ = batch_rollouts(env, in_numpy=False)
    assert "rollout kept in numpy" in applied
    for (rows, episodes, obs), (ref_rows, ref_episodes, ref_obs) in zip(ours, reference, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(rows, ref_rows, strict=True))
        for e, ref in zip(episodes, ref_episodes, strict=True):
            assert e["episode_returns"].tolist() == ref["episode_returns"].tolist()
            assert e["episode_lengths"].tolist() == ref["episode_lengths"].tolist()
        assert all(np.array_equal(x, y) for x, y in zip(obs, ref_obs, strict=True))
    assert sum(len(e["episode_lengths"]) for _, episodes, _ in ours for e in episodes) > 6


def test_a_rollouts_noise_drawn_at_once_is_the_step_by_step_draws_and_leaves_the_streams_alike():
    generators = [torch.Generator().manual_seed(s) for s in range(3)]
    copies = [torch.Generator().manual_seed(s) for s in range(3)]
    shape, cpu = (7, 4, 3), torch.device("cpu")
    torch.testing.assert_close(
        draw_noise_at_once(generators, "categorical", shape, cpu),
        draw_rollout_noise(copies, "categorical", shape, cpu),
        rtol=0,
        atol=0,
    )
    assert all(torch.equal(g.get_state(), c.get_state()) for g, c in zip(generators, copies))


def test_the_seeds_adam_in_one_call_steps_as_seed_steps_to_the_bit():
    """SeedsAdamStep (the fused kernel over the active seeds' slices) against SeedSteps.step (torch.optim's Adam over
    them), side by side from the first step: seeds sitting steps out, and one seed's optimizer state reloaded from its
    checkpoint form half-way (as a resume loads it): the same weights, and the same checkpoint state, to the bit."""
    from rlrun.algos.stacked import SeedOptimizer
    from rlrun.fast.stacked_adam import SeedsAdamStep

    def stack():
        torch.manual_seed(0)
        models = [build_actor_critic(ModelConfig(), gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)) for _ in "abc"]
        model = BatchedActorCritic(models)
        steps = SeedSteps(model.seed_parameters(), lambda ps: torch.optim.Adam(ps, lr=1e-3, eps=1e-5))
        shares = [SeedOptimizer(steps, layout_ties(model, model.layouts, s, m), list(m.parameters())) for s, m in
                  enumerate(models)]  # fmt: skip
        return steps, shares

    (reference, ref_shares), (steps, shares) = stack(), stack()
    fast = SeedsAdamStep(steps)
    assert SeedsAdamStep.applies(steps)
    draws = torch.Generator().manual_seed(1)
    for t in range(12):
        grads = [torch.randn(p.shape, generator=draws) for p in reference.params]
        active = torch.tensor([True, t not in (0, 5, 6), t != 9])  # seed 1's first step comes after the others'
        if t == 7:  # seed 2's state through its checkpoint form, into both
            saved = ref_shares[2].state_dict()
            ref_shares[2].load_state_dict(saved)
            shares[2].load_state_dict(saved)
        for st, step in ((reference, reference.step), (steps, fast)):
            st.zero_grad()
            for p, g in zip(st.params, grads, strict=True):
                p.grad = g.clone()
            step(active)
        assert all(torch.equal(a, b) for a, b in zip(reference.params, steps.params, strict=True)), t
    for ours, theirs in zip(shares, ref_shares, strict=True):
        a, b = ours.state_dict(), theirs.state_dict()
        assert a["state"].keys() == b["state"].keys()
        for i in b["state"]:
            assert all(torch.equal(a["state"][i][k], v) for k, v in b["state"][i].items())
    assert fast.counts.tolist() == [[12.0] * 8, [9.0] * 8, [11.0] * 8]  # its own counts: the kernel took the steps
    assert not SeedsAdamStep.applies(SeedSteps(reference.params, lambda ps: torch.optim.RMSprop(ps)))
