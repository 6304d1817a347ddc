"""The accelerations (rlrun/fast/) against the reference parts they replace, through the same signatures:
FusedPPOLearner against PPOLearner, the gradient steps in numpy against PPO.minibatch_step and DQN.gradient_step,
FusedA2CUnroll against A2CUnroll, FlatAdam against torch.optim.Adam (and their state dicts interchangeable), NumpyPolicy
against ActorCritic.act, channels-last rollout frames against indexing; a whole first update with algo.fast on and off;
and SyncEnvs against gymnasium's SyncVectorEnv, Gumbel-max sampling against torch.multinomial."""

import copy
import logging
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlrun.algos.off_policy import polyak_update
from rlrun.algos.ppo import PPO, PPOConfig, PPOLearner
from rlrun.algos.protocol import EnvSpec
from rlrun.buffers.rollout import take_rows
from rlrun.config import AtariConfig, EnvConfig, ModelConfig
from rlrun.envs import SyncEnvs, env_seeds, make_env
from rlrun.errors import NonFiniteError
from rlrun.fast import accelerate
from rlrun.fast.continuous_steps import NextActionsWithoutModules, TargetActionsWithoutModules, TargetQWithoutModules
from rlrun.fast.flat_adam import FlatAdam
from rlrun.fast.flat_polyak import FlatPolyak, flattenable
from rlrun.fast.fused_ppo import FusedPPOLearner, FusedPPOLoss, fusable, fused_params
from rlrun.fast.numpy_policy import NumpyPolicy
from rlrun.fast.numpy_ppo import NumpyPPOLoss
from rlrun.models import build_actor_critic
from rlrun.models import distributions as D
from rlrun.models.continuous import DeterministicActor, GaussianActor, TwinQ
from tests.conftest import PENDULUM, continuous_run, sac_batch

OBS = gym.spaces.Box(-1, 1, (5,))


def actor_critic(discrete: bool, activation: str = "tanh", hidden_sizes=(64, 64)):
    torch.manual_seed(0)
    actions = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(-1, 1, (2,))
    return build_actor_critic(ModelConfig(hidden_sizes=list(hidden_sizes), activation=activation), OBS, actions)


def minibatch(model, n: int = 96) -> dict:
    """Observations with the actions the policy took, old log-probs and values nudged off the current ones (so
    ratios leave the clip range and values the value-clip range), and random advantages and returns."""
    obs = torch.randn(n, 5)
    with torch.no_grad():
        actions, log_probs, values = model.act(obs)
    return {
        "obs": obs,
        "actions": actions,
        "old_log_probs": log_probs + 0.4 * torch.randn(n),
        "advantages": torch.randn(n),
        "returns": values + torch.randn(n),
        "old_values": values + 0.3 * torch.randn(n),
    }


def loss_and_grads(model, cfg: PPOConfig, batch: dict, fused: bool) -> tuple[torch.Tensor, torch.Tensor, list]:
    learner = (FusedPPOLearner if fused else PPOLearner)(model, cfg)
    model.zero_grad()
    loss, stats = learner(**batch)
    (2.5 * loss).backward()  # an upstream gradient other than 1 must scale every parameter's
    return loss.detach(), stats, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "discrete, activation, hidden_sizes, clip_vloss",
    [
        (True, "tanh", (64, 64), True),
        (True, "relu", (32, 16, 8), False),
        (False, "tanh", (64, 64), False),
        (False, "relu", (16,), True),
    ],
)
def test_fused_loss_and_gradients_equal_autograd(discrete, activation, hidden_sizes, clip_vloss):
    model = actor_critic(discrete, activation, hidden_sizes)
    cfg = PPOConfig(clip_vloss=clip_vloss, ent_coef=0.05)
    assert fusable(model)
    batch = minibatch(model)
    loss, stats, grads = loss_and_grads(model, cfg, batch, fused=True)
    ref_loss, ref_stats, ref_grads = loss_and_grads(model, cfg, batch, fused=False)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats, ref_stats, rtol=1e-5, atol=1e-6)
    assert 0 < float(stats[4]) < 1  # some ratios were clipped and some were not: both branches ran
    for g, ref in zip(grads, ref_grads, strict=True):
        assert ref.abs().max() > 0
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("discrete, activation, clip_vloss", [(True, "tanh", True), (False, "relu", False)])
def test_the_fused_loss_in_numpy_equals_it_in_torch(discrete, activation, clip_vloss):
    """On CPU the fused loss runs in numpy (NumpyPPOLoss); elsewhere in torch (FusedPPOLoss): the same loss, stats and
    gradients from both."""
    model = actor_critic(discrete, activation, (32, 16))
    cfg, batch = PPOConfig(clip_vloss=clip_vloss, ent_coef=0.05), minibatch(model)
    inputs = [batch[k] for k in ("obs", "actions", "old_log_probs", "advantages", "returns", "old_values")]
    params = fused_params(model)
    results = []
    for loss_fn in (NumpyPPOLoss, FusedPPOLoss):
        loss, stats = loss_fn.apply(cfg, model.trunk.relu, model.discrete, *inputs, *params)
        results.append((loss.detach(), stats, torch.autograd.grad(3.0 * loss, params)))
    (loss, stats, grads), (ref_loss, ref_stats, ref_grads) = results
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats, ref_stats, rtol=1e-5, atol=1e-6)
    for g, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)


def test_a_shared_encoder_keeps_the_reference_loss():
    spec = EnvSpec(OBS, gym.spaces.Discrete(3))
    algo = PPO(PPOConfig(), ModelConfig(shared=True), spec, torch.device("cpu"))
    applied = accelerate(algo, SyncEnvs([make_env(EnvConfig(), train=True)]))
    assert "fused PPO loss" not in applied and type(algo.parts.learner) is PPOLearner and "flat Adam" in applied


def test_flat_adam_follows_torch_adam_and_their_states_interchange():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    flat, adam = FlatAdam(ours, lr=1e-2, eps=1e-5), torch.optim.Adam(ref, lr=1e-2, eps=1e-5)
    for step in range(30):
        if step == 10:  # resume each from the other's state: the formats are one
            flat_state, adam_state = flat.state_dict(), adam.state_dict()
            flat, adam = FlatAdam(ours, lr=1.0, eps=1e-3), torch.optim.Adam(ref, lr=1.0, eps=1e-3)
            flat.load_state_dict(adam_state)
            adam.load_state_dict(flat_state)
            assert flat.eps == adam.param_groups[0]["eps"] == 1e-5  # the saved settings win, in both
        grads = [10 * torch.randn(3, 4), torch.randn(5)]  # norms above and below the clip
        flat.zero_grad()
        adam.zero_grad()
        for p, q, g in zip(ours, ref, grads):
            p.grad += g
            q.grad = g.clone()
        norm = torch.nn.utils.clip_grad_norm_(ours, 5.0)  # on the flat buffer's views, as the algorithms do
        torch.testing.assert_close(norm, torch.nn.utils.clip_grad_norm_(ref, 5.0))
        for group in flat.param_groups + adam.param_groups:
            group["lr"] = 1e-2 * (1 - step / 30)
        flat.step()
        adam.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="parameters"):
        FlatAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3, eps=1e-5).load_state_dict(flat_state)


def test_flat_targets_follow_polyak_update_to_the_bit():
    """Targets laid out flat take polyak_update's numbers, through the Polyak part's signature; a pair it was not
    built for goes to polyak_update."""
    torch.manual_seed(0)
    online = [TwinQ(3, 1, [32, 32], "relu") for _ in range(2)]
    targets = [copy.deepcopy(n).requires_grad_(False) for n in online]
    ref_targets = [copy.deepcopy(t) for t in targets]
    optimizer = FlatAdam(list(online[0].parameters()), lr=1e-3, eps=1e-8)
    assert flattenable(targets[0], online[0], optimizer) and not flattenable(targets[1], online[1], optimizer)
    polyak = FlatPolyak([(targets[0], online[0], optimizer)])
    for _ in range(20):
        with torch.no_grad():
            for p in (*online[0].parameters(), *online[1].parameters()):
                p.add_(0.01 * torch.randn_like(p))
        for target, ref, net in zip(targets, ref_targets, online):
            polyak(target, net, 0.005)
            polyak_update(ref, net, 0.005)
    for target, ref in zip(targets, ref_targets):
        assert all(torch.equal(p, q) for p, q in zip(target.state_dict().values(), ref.state_dict().values()))
    assert not torch.equal(targets[0].critics[0][0].weight, online[0].critics[0][0].weight)  # it moved part way


def test_target_passes_without_modules_are_the_modules_forward():
    """The target critics', TD3's target actor's and SAC's next actions' passes without the modules give the modules'
    outputs to the bit (a hidden layer's bias and ReLU as one pass included), log-std clamped where it is large."""
    torch.manual_seed(0)
    critic, actor = TwinQ(3, 2, [32, 32], "relu"), DeterministicActor(3, 2, [32, 32], "relu")
    gaussian = GaussianActor(3, 2, [32, 32], "relu")
    with torch.no_grad():
        gaussian.net[-1].bias[2:] += torch.tensor([-30.0, 5.0])  # log-stds below and above their bounds
    obs, actions = torch.randint(0, 255, (16, 3), dtype=torch.uint8), torch.rand(16, 2) * 2 - 1  # any obs dtype
    noise = torch.randn(16, 2)
    with torch.no_grad():
        assert torch.equal(TargetQWithoutModules(critic)(obs, actions), critic(obs, actions))
        assert torch.equal(TargetActionsWithoutModules(actor)(obs), actor(obs))
        for ours, expected in zip(NextActionsWithoutModules(gaussian)(obs, noise), gaussian(obs, noise), strict=True):
            assert torch.equal(ours, expected)


def test_flat_adam_flushes_denormal_moments_and_keeps_the_parameters_to_the_bit():
    """Weights whose gradients stay 0 (a ReLU unit off for every batch) have first moments that decay into float32's
    denormals, where x86 computes many times slower: FlatAdam's are 0 instead, and every parameter it steps has the
    bits torch's fused Adam gives them, which keeps the denormals."""
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(64, 32) * 0.1), torch.nn.Parameter(torch.randn(32) * 0.1)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    flat, adam = FlatAdam(ours, lr=1e-3, eps=1e-8), torch.optim.Adam(ref, lr=1e-3, eps=1e-8, fused=True)
    off = [torch.rand(p.shape) < 0.5 for p in ours]  # from step 100 these get no gradient
    for step in range(1000):
        flat.zero_grad()
        for p, q, o in zip(ours, ref, off):
            g = 1e-3 * torch.randn(p.shape)
            p.grad += g.masked_fill(o, 0.0) if step >= 100 else g
            q.grad = p.grad.clone()
        flat.step()
        adam.step()
    for p, q in zip(ours, ref):
        assert torch.equal(p, q)
    tiny = torch.finfo(torch.float32).tiny
    denormals = lambda t: int(((t != 0) & (t.abs() < tiny)).sum())  # noqa: E731
    assert sum(denormals(adam.state[q]["exp_avg"]) for q in ref) > 500  # most of the ~1,000 moments left off
    assert denormals(flat.exp_avg) == denormals(flat.exp_avg_sq) == 0
    torch.testing.assert_close(flat.exp_avg_sq, torch.cat([adam.state[q]["exp_avg_sq"].flatten() for q in ref]))


@pytest.mark.parametrize("discrete", [True, False])
def test_numpy_policy_acts_as_the_torch_model(discrete):
    model = actor_critic(discrete)
    FlatAdam(list(model.parameters()), lr=1e-3, eps=1e-5)  # as accelerated: parameters are buffer views
    policy = NumpyPolicy(model)
    obs = torch.randn(64, 5)
    torch.manual_seed(3)
    with torch.no_grad():
        expected = model.act(obs)
    torch.manual_seed(3)  # the same noise: numpy acting draws it from torch's generator in the same order
    for ours, ref in zip(policy.act(obs), expected, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # it reads the live parameters: an update shows without rebuilding it
        for p in model.parameters():
            p.add_(0.1)
        values = model.value(obs)
    torch.testing.assert_close(policy.value(obs), values, rtol=1e-5, atol=1e-5)


def collected(env_id: str, in_numpy: bool, rollouts: int = 4, num_envs: int = 4) -> tuple[list, list]:
    """Each rollout's tensors and episodes, the observations after it and torch's RNG state, from seed 1 with every
    acceleration (numpy acting included); `in_numpy` False swaps back the reference's collect steps around it."""
    cfg = PPOConfig(num_steps=48, fast=True)
    envs = SyncEnvs([make_env(EnvConfig(id=env_id, max_episode_steps=40), train=True) for _ in range(num_envs)])
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, num_envs)
    torch.manual_seed(1)
    algo = PPO(cfg, ModelConfig(), spec, torch.device("cpu"))
    applied = accelerate(algo, envs)
    if not in_numpy:
        algo.parts.collect_steps = algo.parts.collect_steps.reference
    algo.start(envs.reset(seed=env_seeds(1, 0, num_envs))[0])
    r, out = algo.rollout, []
    for _ in range(rollouts):
        episodes = algo.collect(envs)
        fields = (r.obs, r.actions, r.log_probs, r.values, r.next_values, r.rewards, r.terminated, r.truncated)
        out.append([f.clone() for f in fields] + [episodes, algo.next_obs.copy(), torch.get_rng_state()])
    envs.close()
    return out, applied


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_rollout_kept_in_numpy_is_the_reference_collects(env_id):
    """The same rollouts to the bit, truncations (episodes of 40 steps) bootstrapped, and torch's generator left
    where it is left: a categorical policy's noise drawn once per rollout, a Gaussian one's step by step."""
    ours, applied = collected(env_id, in_numpy=True)
    reference, _ = collected(env_id, in_numpy=False)
    assert "rollout kept in numpy" in applied
    for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
        for x, y in zip(a[:8], b[:8], strict=True):
            assert torch.equal(x, y), step
        (episodes, obs, rng), (ref_episodes, ref_obs, ref_rng) = a[8:], b[8:]
        assert episodes["episode_returns"].tolist() == ref_episodes["episode_returns"].tolist()
        assert episodes["episode_lengths"].tolist() == ref_episodes["episode_lengths"].tolist()
        assert np.array_equal(obs, ref_obs) and torch.equal(rng, ref_rng)
    assert sum(len(a[8]["episode_lengths"]) for a in ours) > 4  # episodes ended, and were counted


def updated(env_id: str, cfg: PPOConfig, activation: str, in_numpy: bool) -> tuple[list, list]:
    """The parameters, the last step's gradient (flat Adam's buffer, clipped) and each update's stats after 3 collects
    and updates from seed 1 with every acceleration, the minibatch step in numpy without its self-check; `in_numpy`
    False: with PPO.minibatch_step instead (the fused loss through autograd)."""
    envs = SyncEnvs([make_env(EnvConfig(id=env_id), train=True) for _ in range(4)])
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 4)
    torch.manual_seed(1)
    algo = PPO(cfg, ModelConfig(activation=activation), spec, torch.device("cpu"))
    assert "minibatch step in numpy" in accelerate(algo, envs)
    checked = algo.parts.minibatch_step
    algo.parts.minibatch_step = checked.fast if in_numpy else checked.reference
    algo.start(envs.reset(seed=env_seeds(1, 0, 4))[0])
    stats = []
    for i in range(3):
        algo.collect(envs)
        stats.append(algo.update(progress=i / 3))
    envs.close()
    return [p.detach().clone() for p in algo.model.parameters()] + [algo.optimizer.grads.clone()], stats


@pytest.mark.parametrize(
    "env_id, activation, settings",
    [
        ("CartPole-v1", "tanh", {}),  # normalized advantages, clipped values, a norm clipped at times
        ("CartPole-v1", "relu", {"norm_adv": False, "max_grad_norm": 100.0}),  # nothing clipped
        ("Pendulum-v1", "relu", {"clip_vloss": False, "max_grad_norm": 0.05}),  # every norm clipped; log-std's
    ],
)
def test_a_minibatch_step_in_numpy_steps_as_the_reference_step(env_id, activation, settings):
    cfg = PPOConfig(num_steps=64, num_minibatches=4, update_epochs=3, fast=True, **settings)
    ours, our_stats = updated(env_id, cfg, activation, in_numpy=True)
    reference, stats = updated(env_id, cfg, activation, in_numpy=False)
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert our_stats == [pytest.approx(s, rel=1e-4, abs=1e-6) for s in stats]


class DrawsFromTorch(gym.Wrapper):
    """An env of a user's that draws from torch's generator as it steps."""

    def step(self, action):
        torch.rand(1)
        return self.env.step(action)


def test_a_rollout_kept_in_numpy_says_when_an_env_draws_from_torch(caplog):
    """Acting's noise drawn ahead would no longer be what the reference draws: one line, then drawn step by step."""
    num_envs = 2
    envs = SyncEnvs([lambda: DrawsFromTorch(make_env(EnvConfig(), train=True)()) for _ in range(num_envs)])
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, num_envs)
    algo = PPO(PPOConfig(num_steps=16, fast=True), ModelConfig(), spec, torch.device("cpu"))
    accelerate(algo, envs)
    algo.start(envs.reset(seed=env_seeds(1, 0, num_envs))[0])
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        for _ in range(4):
            algo.collect(envs)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["torch's generator was drawn from during a rollout: acting draws its noise step by step now"]
    envs.close()


def test_gumbel_max_sampling_draws_what_multinomial_draws():
    log_p = torch.randn(500, 4).log_softmax(-1)
    torch.manual_seed(7)
    ours = D.categorical_sample(log_p)
    torch.manual_seed(7)
    assert torch.equal(ours, torch.multinomial(log_p.exp(), 1).squeeze(-1))


def test_sync_envs_step_as_gymnasium_sync_vector_env():
    cfg = EnvConfig(id="CartPole-v1", max_episode_steps=30)  # truncations as well as terminations
    fns = [make_env(cfg, train=True) for _ in range(3)]
    ours, ref = SyncEnvs(fns), SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    seeds = [11, 12, 13]
    np.testing.assert_array_equal(ours.reset(seed=seeds)[0], ref.reset(seed=seeds)[0])
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(200):
        actions = rng.integers(0, 2, 3)
        out, expected = ours.step(actions), ref.step(actions)
        for a, b in zip(out[:4], expected[:4]):
            np.testing.assert_array_equal(a, b)
        info, ref_info = out[4], expected[4]
        done = expected[2] | expected[3]
        assert ("final_obs" in info) == done.any()
        for i in np.flatnonzero(done):
            np.testing.assert_array_equal(info["final_obs"][i], ref_info["final_obs"][i])
            assert info["final_info"]["episode"]["r"][i] == ref_info["final_info"]["episode"]["r"][i]
            ended += 1
        assert not np.shares_memory(out[0], ours.buffers["obs"])  # a copy the caller may keep
    assert ended > 10
    ours.close()
    ref.close()


def test_channels_last_rollout_frames_gather_as_indexing_does():
    cfg = EnvConfig(id="ALE/Breakout-v5", num_envs=3, atari=AtariConfig())
    envs = SyncEnvs([make_env(cfg, train=True) for _ in range(3)])
    cnn = ModelConfig(name="nature_cnn", hidden_sizes=[32], activation="relu", shared=True)
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 3, 4)
    algo = PPO(PPOConfig(num_steps=5), cnn, spec, torch.device("cpu"))
    assert "channels-last frames" in accelerate(algo, envs)
    algo.rollout.obs.copy_(torch.randint(0, 255, algo.rollout.obs.shape, dtype=torch.uint8))
    frames = algo.rollout.obs.flatten(0, 1)  # [T * N, C, H, W] as the update reads it: a view, channels-last
    assert frames.is_contiguous(memory_format=torch.channels_last) and not frames.is_contiguous()
    perm = torch.randperm(15)
    taken = take_rows(frames, perm)
    assert torch.equal(taken, frames[perm])
    assert taken.is_contiguous(memory_format=torch.channels_last)
    vectors = torch.randn(15, 3)
    assert torch.equal(take_rows(vectors, perm), vectors[perm])
    envs.close()


def first_update(fast: bool) -> tuple[list[torch.Tensor], list[str]]:
    """The parameters after one collect and one update of the default CartPole PPO (its tuned settings) from
    seed 1, accelerated as training does when `fast`; and the accelerations that applied."""
    cfg = PPOConfig(lr=1e-3, num_steps=32, gamma=0.98, gae_lambda=0.8, num_minibatches=1, update_epochs=10, fast=fast)
    envs = SyncEnvs([make_env(EnvConfig(), train=True) for _ in range(8)])
    torch.manual_seed(1)
    algo = PPO(
        cfg, ModelConfig(), EnvSpec(envs.single_observation_space, envs.single_action_space, 8), torch.device("cpu")
    )
    applied = accelerate(algo, envs)
    algo.start(envs.reset(seed=env_seeds(1, 0, 8))[0])
    algo.collect(envs)
    algo.update(progress=0.0)
    envs.close()
    return [p.detach().clone() for p in algo.model.parameters()], applied


def test_first_update_with_and_without_accelerations_agree():
    fast, applied = first_update(True)
    ref, none = first_update(False)
    assert applied == [
        "fused PPO loss",
        "flat Adam",
        "minibatch step in numpy",
        "numpy acting",
        "rollout kept in numpy",
        "CartPole stepped as arrays",
    ]
    assert none == []
    for a, b in zip(fast, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "env_id, activation, norm_adv", [("CartPole-v1", "tanh", False), ("Pendulum-v1", "relu", True)]
)
def test_fused_a2c_unroll_equals_the_reference_unroll(env_id, activation, norm_adv):
    """The same unroll (same envs, same sampling noise) through A2CUnroll and FusedA2CUnroll: the same actions,
    loss, stats and gradients (with an upstream gradient other than 1), and the same next observations."""
    from rlrun.algos.a2c import A2CConfig, A2CUnroll
    from rlrun.fast.fused_a2c import FusedA2CUnroll

    cfg = A2CConfig(num_steps=12, ent_coef=0.05, vf_coef=0.3, norm_adv=norm_adv)
    results = []
    for unroll_class in (A2CUnroll, FusedA2CUnroll):
        envs = SyncEnvs([make_env(EnvConfig(id=env_id, max_episode_steps=7), train=True) for _ in range(3)])
        try:
            torch.manual_seed(0)
            model = build_actor_critic(
                ModelConfig(activation=activation), envs.single_observation_space, envs.single_action_space
            )
            unroll = unroll_class(model, cfg, 3, torch.float32, lambda x: x)
            assert fusable(model)
            obs = envs.reset(seed=[4, 5, 6])[0]
            torch.manual_seed(1)
            loss, stats, next_obs, episodes = unroll(envs, obs)
            model.zero_grad()
            (2.5 * loss).backward()
            grads = [p.grad.clone() for p in model.parameters()]
            results.append((loss.detach(), stats, next_obs, grads, unroll.truncated.clone()))
        finally:
            envs.close()
    (loss_a, stats_a, obs_a, grads_a, cut_a), (loss_b, stats_b, obs_b, grads_b, cut_b) = results
    assert cut_a.any() and torch.equal(cut_a, cut_b)  # truncations (bootstrapped) happened, in both alike
    np.testing.assert_allclose(obs_a, obs_b, atol=1e-6)  # the same actions were taken
    torch.testing.assert_close(loss_a, loss_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats_a, stats_b, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "algo, activation, settings",
    [
        ("sac", "relu", {}),
        ("sac", "relu", {"autotune": False, "alpha": 0.2}),  # no temperature step
        ("sac", "relu", {"policy_frequency": 2}),  # two actor steps every second update
        ("sac", "tanh", {}),
        ("td3", "relu", {}),
        ("td3", "tanh", {}),
    ],
)
def test_sac_and_td3_updates_with_and_without_accelerations_agree(algo, activation, settings, caplog):
    """Three updates with flat Adam, and for ReLU networks the steps without autograd (checked on the first update,
    alone on the next two), against torch.optim.Adam and autograd."""
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        runs = [continuous_run(algo, fast, activation, **settings) for fast in (False, True)]
    assert not caplog.records  # no acceleration stepped aside: the last two updates ran them alone
    steps = ["target Q without modules", "critic step without autograd"]
    steps += ["target actions without modules"] if algo == "td3" else ["next actions without modules"]
    steps += ["actor step without autograd"]
    expected = ["flat Adam", "flat targets"] + (["numpy exploration", *steps] if activation == "relu" else [])
    assert [applied for _, applied in runs] == [[], expected]
    (reference, _), (fast, _) = runs
    for name, value in reference.model.state_dict().items():
        torch.testing.assert_close(fast.model.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    states = reference.learner_state(), fast.learner_state()
    for key in (k for k in states[0] if k.endswith("_optimizer")):  # the fast optimizers' state resumes the reference
        torch.testing.assert_close(states[1][key]["state"], states[0][key]["state"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_non_finite_critic_loss_stops_the_step_without_autograd_before_it_steps(algo):
    """After the checked first update, a NaN target raises the reference's error from the step without autograd,
    and neither the critics nor their optimizer's state move."""
    a, applied = continuous_run(algo, fast=True)
    assert "critic step without autograd" in applied
    before = [t.clone() for t in a.critic_optimizer.state_dict()["state"][0].values()]
    weights = [p.detach().clone() for p in a.model.critic.parameters()]
    batch = sac_batch(16, seed=9)
    batch["returns"][3] = float("nan")
    a.updates = 4
    with pytest.raises(NonFiniteError, match=f"the {algo.upper()} critic loss is NaN"):
        a.learn(batch, torch.ones(16), torch.zeros((2, 16, 1) if algo == "sac" else (16, 1)))
    for p, w in zip(a.model.critic.parameters(), weights, strict=True):
        assert torch.equal(p, w)
    after = a.critic_optimizer.state_dict()["state"][0].values()
    assert all(torch.equal(x, y) for x, y in zip(after, before, strict=True))


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_frozen_layer_keeps_the_reference_steps(algo):
    """A critic layer frozen in models/ (requires_grad off: flat Adam holds no gradient for it) keeps autograd's
    steps."""
    from rlrun.algos import SACConfig, TD3Config, build_algo

    config = SACConfig if algo == "sac" else TD3Config
    model = ModelConfig(hidden_sizes=[16, 16], activation="relu")  # (the steps without autograd's networks)
    a = build_algo(config(batch_size=16), model, PENDULUM, torch.device("cpu"))
    a.model.critic.critics[0][0].requires_grad_(False)
    targets = [
        "target Q without modules",
        "target actions without modules" if algo == "td3" else "next actions without modules",
    ]
    # No flat targets (flat Adam holds no frozen layer); the actor, not frozen, still explores in numpy.
    assert accelerate(a, None) == ["flat Adam", "numpy exploration"] + targets
    a.updates = 1
    a.learn(sac_batch(16), torch.ones(16))


def q_network(activation: str = "relu", hidden_sizes=(24, 16), seed: int = 0, **kwargs):
    from rlrun.models.q_network import build_q_network

    torch.manual_seed(seed)
    cfg = ModelConfig(hidden_sizes=list(hidden_sizes), activation=activation)
    return build_q_network(cfg, OBS, gym.spaces.Discrete(3), kwargs.get("dueling", False))


@pytest.mark.parametrize("activation, kind", [("relu", "mse"), ("tanh", "huber"), ("relu", "huber")])
def test_fused_dqn_loss_and_gradients_equal_autograd(activation, kind):
    from rlrun.algos.dqn import DQNLearner
    from rlrun.fast.fused_dqn import FusedDQNLearner, fusable_q

    model = q_network(activation)
    assert fusable_q(model)
    g = torch.Generator().manual_seed(1)
    obs, actions = torch.randn(40, 5, generator=g), torch.randint(3, (40,), generator=g)
    targets, weights = 3 * torch.randn(40, generator=g), torch.rand(40, generator=g)  # errors above and below 1
    results = []
    for learner_class in (FusedDQNLearner, DQNLearner):
        model.zero_grad()
        loss, td_abs, q = learner_class(model, 32, kind)(obs, actions, targets, weights)  # 40 items, batch_size 32
        (2.5 * loss).backward()  # an upstream gradient other than 1 must scale every parameter's
        results.append((loss.detach(), td_abs, q, [p.grad.clone() for p in model.parameters()]))
    (loss, td_abs, q, grads), (ref_loss, ref_td_abs, ref_q, ref_grads) = results
    assert not td_abs.requires_grad and not q.requires_grad
    assert (ref_td_abs > 1).any() and (ref_td_abs < 1).any()  # both of Huber's branches ran
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(td_abs, ref_td_abs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(q, ref_q, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, ref_grads, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("double_q", [True, False])
def test_fused_q_targets_equal_q_targets(double_q):
    from rlrun.algos.dqn import q_targets
    from rlrun.fast.fused_dqn import FusedQTargets

    online, target = q_network("tanh", seed=0), q_network("tanh", seed=1)  # two networks that disagree
    g = torch.Generator().manual_seed(2)
    next_obs, returns, discount = torch.randn(64, 5, generator=g), torch.randn(64, generator=g), torch.rand(64)
    fused = FusedQTargets(online, target, double_q)
    with torch.no_grad():
        expected = q_targets(online, target, next_obs, returns, discount, double_q)
    torch.testing.assert_close(fused(next_obs, returns, discount), expected, rtol=1e-6, atol=1e-6)
    assert not fused.choices_agree(next_obs) and FusedQTargets(online, online, double_q).choices_agree(next_obs)


def dqn(fast: bool, num_envs: int = 4, **cfg):
    from rlrun.algos.dqn import DQN, DQNConfig

    torch.manual_seed(0)
    c = DQNConfig(fast=fast, batch_size=16, learning_starts=32, buffer_size=500, train_freq=8, gradient_steps=3)
    spec = EnvSpec(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), num_envs)
    algo = DQN(replace(c, **cfg), ModelConfig(hidden_sizes=[32, 32], activation="relu"), spec, torch.device("cpu"))
    return algo, accelerate(algo, None)


def test_numpy_epsilon_greedy_acts_as_dqn_does():
    """Through DQNParts.epsilon_greedy, on the same noise: the same actions whether no env, some or all explore."""
    from rlrun.fast.numpy_q import NumpyEpsilonGreedy

    ref, _ = dqn(False, num_envs=64)
    fast = NumpyEpsilonGreedy(ref.model)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    coins, picks = next(ref.draw_noise(1, 64))
    random = ref.random_actions(obs, picks)
    for epsilon in (0.0, 0.4, 1.0):
        expected = ref.parts.epsilon_greedy(obs, coins < epsilon, random)
        actions = fast(obs, coins < epsilon, random)
        assert actions.dtype == expected.dtype == np.int64 and np.array_equal(actions, expected)
    assert 0 < (expected != ref.parts.epsilon_greedy(obs, coins < 0.0, random)).sum()  # the draws mattered


def dqn_run(fast: bool, step: str | None = None, **cfg) -> tuple[list[torch.Tensor], list[str], dict]:
    """Four collects of 8 steps on 4 random-walk observations and the updates after them (3 each from the second
    on): the parameters, the accelerations and the last update's stats. `step`: "fast" or "reference", the checked
    gradient step's part that runs instead of it; the parameters are then followed by the last step's gradient (flat
    Adam's buffer, clipped)."""
    algo, applied = dqn(fast, **cfg)
    if step is not None:
        algo.parts.gradient_step = getattr(algo.parts.gradient_step, step)
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(4, 4)).astype(np.float32)
    algo.start(obs)
    for i in range(4):
        algo.model.eval()
        for _ in range(algo.cfg.train_freq):
            actions, stored = algo.explore(obs, i / 4)
            next_obs = obs + 0.1 * rng.normal(size=obs.shape).astype(np.float32)
            done = rng.random(4) < 0.1
            algo.replay.add(obs, stored, actions - 0.5 * obs[:, 0], done & (rng.random(4) < 0.5), done, next_obs)
            obs = next_obs
        stats = algo.update(i / 4)
    params = [p.detach().clone() for p in algo.model.parameters()]
    return params + ([algo.optimizer.grads.clone()] if step else []), applied, stats


OTHER_DQN = {"double_q": False, "loss": "huber", "tau": 0.5, "target_update_interval": 2}


@pytest.mark.parametrize("settings", [{}, OTHER_DQN])
def test_dqn_updates_with_and_without_accelerations_agree(settings):
    fast, applied, stats = dqn_run(True, **settings)
    ref, none, ref_stats = dqn_run(False, **settings)
    fused = ["fused DQN loss", "fused DQN targets", "numpy epsilon-greedy acting", "gradient step in numpy"]
    assert none == [] and applied == ["flat Adam", *fused]
    assert stats["charts/updates"] == ref_stats["charts/updates"] == 9
    for a, b in zip(fast, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert stats["td_loss"] == pytest.approx(ref_stats["td_loss"], rel=1e-4)


@pytest.mark.parametrize("settings", [{}, OTHER_DQN | {"max_grad_norm": 0.05}])  # the second: every norm clipped
def test_a_dqn_gradient_step_in_numpy_steps_as_the_reference_step(settings):
    """DQN.gradient_step (the fused loss through autograd) against the step in numpy, unchecked, over 9 updates."""
    ours, applied, stats = dqn_run(True, step="fast", **settings)
    reference, _, ref_stats = dqn_run(True, step="reference", **settings)
    assert "gradient step in numpy" in applied
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert stats == pytest.approx(ref_stats, rel=1e-4, abs=1e-6)


def test_dueling_and_masked_q_networks_keep_the_reference_update():
    from rlrun.fast.fused_dqn import fusable_q

    assert not fusable_q(q_network(dueling=True))
    algo, applied = dqn(True, dueling=True)
    assert applied == ["flat Adam"] and type(algo.parts.learner).__name__ == "DQNLearner"


def test_a_rank_runs_numpys_matrix_products_on_one_blas_thread():
    """The numpy accelerations' products are small: a rank sets numpy's BLAS to one thread, as it sets torch's
    (OpenBLAS's default, a spinning thread per core, made a default CartPole run 10x slower on a busy machine). In a
    fresh interpreter, with no thread variables set, as a user's shell starts one."""
    import os
    import subprocess
    import sys

    code = (
        "from threadpoolctl import threadpool_info\n"
        "from rlrun.config import TrainConfig\n"
        "from rlrun.distributed import from_env\n"
        "from rlrun.training.parts import configure_torch\n"
        "before = max(i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas')\n"
        "configure_torch(TrainConfig(threads=1), from_env('cpu'))\n"
        "print(before, max(i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = map(int, out.stdout.split())
    assert after == 1, (before, after)


def explorer(algo_name: str, fast: bool, num_envs: int, **settings):
    """SAC or TD3 on Pendulum-shaped observations of `num_envs` envs, its networks seeded alike, past its warm-up."""
    from dataclasses import replace

    from rlrun.algos import SACConfig, TD3Config, build_algo

    torch.manual_seed(0)
    config = SACConfig if algo_name == "sac" else TD3Config
    spec = replace(PENDULUM, num_envs=num_envs)
    a = build_algo(
        config(fast=fast, **settings), ModelConfig(hidden_sizes=[32, 32], activation="relu"), spec, torch.device("cpu")
    )
    applied = accelerate(a, None)
    a.updates = 1  # the policy acts (before the first update, exploring is uniform)
    return a, applied


@pytest.mark.parametrize(
    "algo_name, settings",
    [("sac", {}), ("td3", {}), ("td3", {"exploration_noise": 0.0}), ("td3", {"exploration_noise": 0.9})],
)
@pytest.mark.parametrize("num_envs", [1, 5])
def test_numpy_exploration_acts_as_the_reference(algo_name, settings, num_envs, caplog):
    """SAC's and TD3's exploring actions in numpy are the reference's on the same draws, step after step, and leave
    torch's generator where the reference leaves it: the envs get the same actions and the replay stores them."""
    runs = [explorer(algo_name, fast, num_envs, **settings) for fast in (True, False)]
    assert [applied[:3] for _, applied in runs] == [["flat Adam", "flat targets", "numpy exploration"], []]
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        for step in range(6):
            obs = rng.normal(scale=3.0, size=(num_envs, 3)).astype(np.float32)
            (fast, _), (ref, _) = runs
            torch.manual_seed(step)
            actions, stored = fast.explore(obs, 0.0)
            state = torch.get_rng_state()
            torch.manual_seed(step)
            ref_actions, ref_stored = ref.explore(obs, 0.0)
            assert torch.equal(state, torch.get_rng_state())
            assert stored.dtype == ref_stored.dtype == np.float32 and stored.shape == (num_envs, 1)
            np.testing.assert_allclose(stored, ref_stored, rtol=0, atol=1e-6)
            np.testing.assert_allclose(actions, ref_actions, rtol=0, atol=1e-5)
            clipped = np.abs(ref_stored) == 1.0
            assert np.array_equal(np.abs(stored) == 1.0, clipped)  # TD3's noisy actions clipped alike
    assert not caplog.records  # the check passed: no stepping aside
    if settings.get("exploration_noise") == 0.0:  # no noise: deterministic, and nothing drawn
        state = torch.get_rng_state()
        first = runs[0][0].explore(obs, 0.0)[1]
        assert np.array_equal(first, runs[0][0].explore(obs, 0.0)[1]) and torch.equal(state, torch.get_rng_state())
