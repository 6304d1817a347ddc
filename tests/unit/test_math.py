"""Pure functions against hand-worked numbers and against torch.distributions."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.configs import DQNConfig
from rlrun.algos.dqn import DQN
from rlrun.algos.normalize import RunningMoments, normalize_advantages
from rlrun.algos.ppo import clipped_surrogate_loss, value_loss
from rlrun.algos.protocol import EnvSpec
from rlrun.algos.returns import compute_gae, explained_variance
from rlrun.config import EnvConfig, ModelConfig
from rlrun.envs import env_spaces
from rlrun.models import distributions as D


def test_gae_three_steps_with_truncation_and_termination():
    # Column 0: step 1 is truncated (bootstraps from V(final obs)=0.9); column 1: step 1 terminates.
    rewards = torch.ones(3, 2)
    values = torch.tensor([[0.5, 0.5], [0.4, 0.4], [0.3, 0.3]])
    next_values = torch.tensor([[0.4, 0.4], [0.9, 0.9], [0.2, 0.2]])
    terminated = torch.tensor([[0, 0], [0, 1], [0, 0]], dtype=torch.bool)
    done = torch.tensor([[0, 0], [1, 1], [0, 0]], dtype=torch.bool)
    adv, ret = compute_gae(rewards, values, next_values, terminated, done, gamma=0.9, lam=0.8)
    # deltas col 0: 1+.9*.4-.5=.86, 1+.9*.9-.4=1.41, 1+.9*.2-.3=.88; col 1 step 1: 1-.4=.6
    expected = torch.tensor([[0.86 + 0.72 * 1.41, 0.86 + 0.72 * 0.6], [1.41, 0.6], [0.88, 0.88]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + values)


def test_gae_without_dones_is_discounted_td_sum():
    torch.manual_seed(0)
    r, v, nv = torch.randn(5, 3), torch.randn(5, 3), torch.randn(5, 3)
    nv[:-1] = v[1:]
    zeros = torch.zeros(5, 3, dtype=torch.bool)
    adv, _ = compute_gae(r, v, nv, zeros, zeros, gamma=0.99, lam=1.0)
    # lambda = 1: A_0 = sum_t gamma^t r_t + gamma^T V(s_T) - V(s_0)
    g = torch.tensor([0.99**t for t in range(5)]).unsqueeze(1)
    torch.testing.assert_close(adv[0], (g * r).sum(0) + 0.99**5 * nv[-1] - v[0])


def test_clipped_surrogate_hand_worked():
    log_ratio = torch.log(torch.tensor([0.5, 1.5, 1.0]))
    adv = torch.tensor([1.0, 1.0, -1.0])
    # min(rA, clip(r)A): 0.5, 1.2 (clipped), -1.0 -> loss = -mean
    assert clipped_surrogate_loss(log_ratio, adv, 0.2).item() == pytest.approx(-(0.5 + 1.2 - 1.0) / 3)


def test_value_loss_clipping():
    v, old, ret = torch.tensor([2.0]), torch.tensor([1.0]), torch.tensor([3.0])
    assert value_loss(v, old, ret, 0.2, clip_vloss=False).item() == pytest.approx(0.5)
    assert value_loss(v, old, ret, 0.2, clip_vloss=True).item() == pytest.approx(0.5 * 1.8**2)


def test_categorical_matches_torch_distributions():
    torch.manual_seed(0)
    logits = torch.randn(6, 4)
    actions = torch.randint(0, 4, (6,))
    ref = torch.distributions.Categorical(logits=logits)
    log_p = torch.log_softmax(logits, -1)
    torch.testing.assert_close(D.categorical_log_prob(log_p, actions), ref.log_prob(actions))
    torch.testing.assert_close(D.categorical_entropy(log_p), ref.entropy())


def test_categorical_sample_frequencies():
    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.6, 0.3])
    samples = D.categorical_sample(probs.log().expand(20000, 3))
    freq = torch.bincount(samples, minlength=3).float() / 20000
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


def test_gaussian_matches_torch_distributions():
    torch.manual_seed(0)
    mean, log_std, a = torch.randn(5, 2), torch.randn(2), torch.randn(5, 2)
    ref = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(D.gaussian_log_prob(mean, log_std, a), ref.log_prob(a).sum(-1))
    torch.testing.assert_close(D.gaussian_entropy(mean, log_std), ref.entropy().sum(-1))


def test_running_moments_match_whole_data():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 2)) for n in (7, 50, 13)]
    rms = RunningMoments((2,))
    for b in batches:
        rms.update(torch.as_tensor(b))
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-3)


def test_normalize_advantages_and_explained_variance():
    adv = normalize_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0]))
    assert adv.mean().abs() < 1e-6 and abs(adv.square().mean().item() - 1) < 1e-4
    target = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(target, target) == 1.0
    assert math.isnan(explained_variance(target, torch.ones(3)))


def test_dqn_random_actions_are_uniform_over_the_legal_ones():
    """DQN's exploration picks each legal action alike and never an illegal one, with and without action masks (the
    masks end the observations, as rlrun encodes them); a collect's noise is drawn once and read a step at a time."""

    def dqn(obs_space: gym.Space, actions: int) -> DQN:
        spec = EnvSpec(obs_space, gym.spaces.Discrete(actions), 4)
        return DQN(DQNConfig(train_freq=5), ModelConfig(hidden_sizes=[8]), spec, torch.device("cpu"))

    torch.manual_seed(0)
    plain = dqn(gym.spaces.Box(-1, 1, (3,)), 3)
    picks = next(plain.draw_noise(1, 30_000))[1]
    counts = np.bincount(plain.random_actions(np.zeros((30_000, 3), np.float32), picks), minlength=3)
    assert counts.sum() == 30_000 and np.all(np.abs(counts / 30_000 - 1 / 3) < 0.01), counts

    masked = dqn(env_spaces(EnvConfig(id="Masked-v0", imports=["tests.data.spaces_envs"]))[0], 3)  # [pos, mask]
    assert masked.mask_size == 3
    masks = np.array([[1, 0, 1], [0, 1, 1], [0, 0, 1], [1, 1, 1]], np.float32).repeat(10_000, axis=0)
    obs = np.concatenate([np.zeros((len(masks), 2), np.float32), masks], axis=1)
    chosen = masked.random_actions(obs, next(masked.draw_noise(1, len(obs)))[1])
    assert np.all(masks[np.arange(len(obs)), chosen] == 1)  # legal only
    for mask in np.unique(masks, axis=0):
        rows = np.all(masks == mask, axis=1)
        shares = np.bincount(chosen[rows], minlength=3)[mask == 1] / rows.sum()
        assert np.all(np.abs(shares - 1 / mask.sum()) < 0.02), (mask, shares)

    noise = plain.draw_noise(5, 4)  # train_freq steps of 4 envs
    steps = list(noise)
    assert len(steps) == 5 and all(c.shape == p.shape == (4,) for c, p in steps)
    assert all(c.dtype == np.float32 and p.dtype == np.float64 for c, p in steps)
