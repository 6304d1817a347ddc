"""SAC and TD3: their math as pure functions against hand-checked values and torch's distributions, the networks'
contracts, what one update changes (and what a delayed TD3 step leaves alone), and the config checks."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from rlrun.algos import SACConfig, TD3Config, build_algo
from rlrun.algos.continuous import ActionBounds
from rlrun.algos.sac import soft_q_targets, temperature_loss
from rlrun.algos.td3 import smoothed_target_actions
from rlrun.errors import UserError
from rlrun.models.continuous import TwinQ, squashed_gaussian
from tests.conftest import PENDULUM, SMALL_NET, rlrun, sac_batch


def test_squashed_gaussian_matches_torchs_tanh_transformed_normal():
    g = torch.Generator().manual_seed(0)
    mean, log_std = torch.randn(64, 3, generator=g) * 2, torch.randn(64, 3, generator=g).clamp(-3, 1)
    noise = torch.randn(64, 3, generator=g)
    action, log_prob = squashed_gaussian(mean, log_std, noise)
    dist = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()])
    u = mean + log_std.exp() * noise
    torch.testing.assert_close(action, torch.tanh(u))
    # torch's own log-density of the same pre-squash sample (its TanhTransform uses the same stable Jacobian)
    expected = Normal(mean, log_std.exp()).log_prob(u).sum(-1) - TanhTransform().log_abs_det_jacobian(u, action).sum(-1)
    torch.testing.assert_close(log_prob, expected, rtol=1e-5, atol=1e-4)
    inside = action.abs().max(-1).values < 0.999  # away from +-1, where the inverse tanh loses precision
    torch.testing.assert_close(log_prob[inside], dist.log_prob(action).sum(-1)[inside], rtol=1e-4, atol=1e-3)


def test_squashed_gaussian_stays_finite_where_tanh_rounds_to_one():
    action, log_prob = squashed_gaussian(torch.tensor([[30.0]]), torch.tensor([[-5.0]]), torch.zeros(1, 1))
    assert action.item() == 1.0 and torch.isfinite(log_prob).all()


def test_soft_q_targets_by_hand():
    returns, discount = torch.tensor([1.0, 1.0]), torch.tensor([0.99, 0.0])  # the second item terminated
    y = soft_q_targets(returns, discount, torch.tensor([2.0, 2.0]), torch.tensor([-1.0, -1.0]), torch.tensor(0.5))
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.99 * (2.0 + 0.5), 1.0]))


def test_temperature_loss_by_hand_and_its_gradient_direction():
    log_alpha = torch.tensor(math.log(2.0), requires_grad=True)
    log_prob = torch.tensor([-1.0, -3.0])  # entropy estimate 2, above the target -1: alpha must come down
    loss = temperature_loss(log_alpha, log_prob, target_entropy=-1.0, batch_size=2)
    assert loss.item() == pytest.approx(3 * math.log(2.0))
    loss.backward()
    assert log_alpha.grad.item() == pytest.approx(3.0)  # positive: gradient descent lowers alpha


def test_td3_target_smoothing_clips_the_noise_then_the_action():
    target_actions = torch.tensor([[0.0, 0.9, -0.95]])
    noise = torch.tensor([[0.3, 0.7, -0.2]])
    smoothed = smoothed_target_actions(target_actions, noise, noise_clip=0.5)
    torch.testing.assert_close(smoothed, torch.tensor([[0.3, 1.0, -1.0]]))


def test_action_bounds_scale_and_refuse_what_they_cannot_scale():
    bounds = ActionBounds(gym.spaces.Box(np.array([-2, 0], np.float32), np.array([2, 1], np.float32)), "sac")
    np.testing.assert_allclose(bounds.to_env(np.array([[-1.0, -1.0], [0.0, 1.0]])), [[-2.0, 0.0], [0.0, 1.0]])
    with pytest.raises(UserError, match="algo=sac needs a continuous"):
        ActionBounds(gym.spaces.Discrete(2), "sac")
    with pytest.raises(UserError, match="must be finite"):
        ActionBounds(gym.spaces.Box(-np.inf, np.inf, (1,)), "td3")


def test_twin_q_detached_and_first_give_the_same_values_without_weight_gradients():
    critic = TwinQ(3, 2, [8, 8], "relu")
    obs, actions = torch.randn(5, 3), torch.randn(5, 2, requires_grad=True)
    q = critic(obs, actions)
    assert q.shape == (2, 5) and not torch.equal(q[0], q[1])  # two critics, initialized apart
    detached = critic(obs, actions, detached=True)
    torch.testing.assert_close(detached, q)
    torch.testing.assert_close(critic(obs, actions, detached=True, first=True), q[:1])
    detached.sum().backward()
    assert actions.grad is not None and all(p.grad is None for p in critic.parameters())


def _state(algo) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in algo.model.state_dict().items()}


def test_one_sac_update_steps_critics_actor_and_temperature_and_averages_the_target():
    torch.manual_seed(0)
    cfg = SACConfig(batch_size=8, tau=0.1)
    algo = build_algo(cfg, SMALL_NET, PENDULUM, torch.device("cpu"))
    algo.sync_targets()
    before = _state(algo)
    algo.updates = 1
    stats, td_abs = algo.learn(sac_batch(8), torch.ones(8))
    after = _state(algo)
    assert {"qf_loss", "q_values", "actor_loss", "alpha_loss", "entropy", "charts/alpha"} <= set(stats)
    assert td_abs.shape == (8,) and (td_abs > 0).all()
    for name in after:
        if not name.startswith("critic_target"):
            assert not torch.equal(before[name], after[name]), f"{name} did not move"
    for name in (n for n in after if n.startswith("critic_target")):  # tau x new critic + (1 - tau) x old target
        online = after[name.replace("critic_target", "critic")]
        torch.testing.assert_close(after[name], 0.9 * before[name] + 0.1 * online)
    assert stats["charts/alpha"].item() == pytest.approx(after["log_alpha"].exp().item())


def test_sac_with_a_fixed_temperature_never_moves_it():
    algo = build_algo(SACConfig(batch_size=8, autotune=False, alpha=0.2), SMALL_NET, PENDULUM, torch.device("cpu"))
    algo.sync_targets()
    algo.updates = 1
    algo.learn(sac_batch(8), torch.ones(8))
    assert algo.model.log_alpha.item() == pytest.approx(math.log(0.2)) and "alpha" not in algo.optimizers()


def test_td3_delays_the_actor_and_the_targets():
    torch.manual_seed(0)
    algo = build_algo(TD3Config(batch_size=8, policy_delay=2), SMALL_NET, PENDULUM, torch.device("cpu"))
    algo.sync_targets()
    before = _state(algo)
    algo.updates = 1
    stats, _ = algo.learn(sac_batch(8), torch.ones(8))
    middle = _state(algo)
    assert "actor_loss" not in stats
    for name in middle:  # on a delayed step only the critics move
        assert torch.equal(before[name], middle[name]) == (not name.startswith("critic.")), name
    algo.updates = 2
    stats, _ = algo.learn(sac_batch(8, seed=1), torch.ones(8))
    after = _state(algo)
    assert "actor_loss" in stats
    assert all(not torch.equal(middle[n], after[n]) for n in after), "actor and targets move on the policy step"


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_exploration_is_uniform_until_updates_start_then_the_policys(algo):
    torch.manual_seed(0)
    a = build_algo((SACConfig if algo == "sac" else TD3Config)(), SMALL_NET, PENDULUM, torch.device("cpu"))
    obs = np.zeros((256, 3), dtype=np.float32)
    env_actions, stored = a.explore(obs, 0.0)
    assert env_actions.shape == (256, 1) and stored.dtype == np.float32
    np.testing.assert_allclose(env_actions, stored * 2.0, rtol=1e-6)  # [-1, 1] scaled to Pendulum's [-2, 2]
    assert stored.std() > 0.5  # uniform on [-1, 1]: std 0.58; the untrained policy's are near its mean
    a.updates = 1
    _, policy = a.explore(obs, 0.0)
    assert policy.std() < stored.std() and np.abs(policy).max() <= 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["algo=sac", "env=cartpole"], "algo=sac needs a continuous action space"),
        (["algo=td3", "env=pendulum", "model=lstm"], "algo=td3 builds MLP actors and critics"),
        (["algo=sac", "env=pendulum", "algo.tau=0"], "algo.tau=0.0: must be in (0, 1]"),
        (["algo=td3", "env=pendulum", "algo.policy_delay=0"], "algo.policy_delay=0: must be >= 1"),
        (["algo=sac", "env=pendulum", "algo.gradient_steps=0"], "algo.gradient_steps=0: must be >= 1"),
    ],
)
def test_bad_sac_and_td3_configs_get_one_line(tmp_path, args, message):
    out = rlrun("train", *args, cwd=tmp_path, timeout=60)
    assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
