"""The fast paths against the plain ones they replace: PPO's fused loss against autograd through PPOLearner,
FlatAdam against torch.optim.Adam, acting in numpy against ActorCritic.act, SyncEnvs against gymnasium's
SyncVectorEnv, Gumbel-max sampling against torch.multinomial, channels-last rollout frames against indexing."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlrun.algos.flat_adam import FlatAdam
from rlrun.algos.ppo import PPOLearner
from rlrun.buffers.rollout import Rollout, take_rows
from rlrun.config import EnvConfig, ModelConfig, PPOConfig
from rlrun.envs import SyncEnvs, make_env
from rlrun.models import build_actor_critic
from rlrun.models import distributions as D
from rlrun.models.numpy_policy import NumpyPolicy

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
    learner = PPOLearner(model, cfg)
    if not fused:
        learner.fused = None  # the plain path: autograd through ActorCritic.evaluate and the loss functions
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
    assert PPOLearner(model, cfg).fused is not None
    batch = minibatch(model)
    loss, stats, grads = loss_and_grads(model, cfg, batch, fused=True)
    ref_loss, ref_stats, ref_grads = loss_and_grads(model, cfg, batch, fused=False)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats, ref_stats, rtol=1e-5, atol=1e-6)
    assert 0 < float(stats[4]) < 1  # some ratios were clipped and some were not: both branches ran
    for g, ref in zip(grads, ref_grads, strict=True):
        assert ref.abs().max() > 0
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)


def test_a_shared_encoder_takes_the_autograd_path():
    model = build_actor_critic(ModelConfig(shared=True), OBS, gym.spaces.Discrete(3))
    assert PPOLearner(model, PPOConfig()).fused is None


def test_flat_adam_follows_torch_adam_and_resumes_from_its_state():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    flat, adam = FlatAdam(ours, lr=1e-2, eps=1e-5), torch.optim.Adam(ref, lr=1e-2, eps=1e-5)
    for step in range(30):
        if step == 15:  # resume: a fresh FlatAdam from the state dict carries on identically
            state = flat.state_dict()
            flat = FlatAdam(ours, lr=1e-2, eps=1e-5)
            flat.load_state_dict(state)
        grads = [10 * torch.randn(3, 4), torch.randn(5)]  # norms above and below the clip
        flat.zero_grad()
        for p, g in zip(ours, grads):
            p.grad += g
        for p, g in zip(ref, grads):
            p.grad = g.clone()
        norm = flat.clip_grad_norm(5.0)
        torch.testing.assert_close(norm, torch.nn.utils.clip_grad_norm_(ref, 5.0))
        lr = 1e-2 * (1 - step / 30)
        flat.step(lr)
        adam.param_groups[0]["lr"] = lr
        adam.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="parameters"):
        FlatAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3, eps=1e-5).load_state_dict(state)


@pytest.mark.parametrize("discrete", [True, False])
def test_numpy_policy_acts_as_the_torch_model(discrete):
    model = actor_critic(discrete)
    FlatAdam(list(model.parameters()), lr=1e-3, eps=1e-5)  # as PPO builds it: parameters are buffer views
    policy = NumpyPolicy(model)
    obs = torch.randn(64, 5)
    torch.manual_seed(3)
    with torch.no_grad():
        actions, log_probs, values = model.act(obs)
    torch.manual_seed(3)  # the same noise: numpy acting draws it from torch's generator in the same order
    np_actions, np_log_probs, np_values = policy.act(obs.numpy())
    np.testing.assert_allclose(np_actions, actions.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np_log_probs, log_probs.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np_values, values.numpy(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # it reads the live parameters: an update shows without rebuilding it
        for p in model.parameters():
            p.add_(0.1)
        values = model.value(obs)
    np.testing.assert_allclose(policy.act(obs.numpy())[2], values.numpy(), rtol=1e-5, atol=1e-5)


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


def test_rollout_frames_are_channels_last_and_gather_as_indexing_does():
    r = Rollout(5, 3, (4, 6, 7), torch.uint8, (), torch.long, torch.device("cpu"))
    r.obs.copy_(torch.randint(0, 255, r.obs.shape, dtype=torch.uint8))
    frames = r.obs.flatten(0, 1)  # [T * N, C, H, W] as the update reads it: a view, channels-last
    assert frames.is_contiguous(memory_format=torch.channels_last) and not frames.is_contiguous()
    perm = torch.randperm(15)
    taken = take_rows(frames, perm)
    assert torch.equal(taken, frames[perm])
    assert taken.is_contiguous(memory_format=torch.channels_last)
    vectors = torch.randn(15, 3)
    assert torch.equal(take_rows(vectors, perm), vectors[perm])
