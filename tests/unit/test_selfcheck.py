"""The accelerations that re-write the math (fused PPO and DQN losses, DQN's fused targets, fused A2C unroll, PPO's and
DQN's gradient steps in numpy, SAC's and TD3's steps without autograd, numpy acting) check themselves against the
reference at their first use (rlrun/fast/selfcheck.py): a researcher's edit to algos/ or models/, simulated here by
replacing the reference function or class in-process as an edit of the file would, makes the run say which one stepped
aside and train what the reference path (algo.fast=false) trains; an unedited run says nothing and equals, bit for bit,
the run of the same accelerations without their checks."""

import logging
import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from rlrun.algos import A2CConfig, PPOConfig, batched_ppo, build_algo
from rlrun.algos import a2c as a2c_module
from rlrun.algos import continuous as continuous_module
from rlrun.algos import dqn as dqn_module
from rlrun.algos import ppo as ppo_module
from rlrun.algos import sac as sac_module
from rlrun.algos import td3 as td3_module
from rlrun.algos.protocol import EnvSpec
from rlrun.config import EnvConfig, ModelConfig
from rlrun.envs import SyncEnvs, env_seeds, make_env
from rlrun.fast import accelerate
from rlrun.models import actor_critic as actor_critic_module
from rlrun.models import continuous as continuous_models
from rlrun.models import distributions as D
from rlrun.models import encoders
from rlrun.models import q_network as q_network_module
from rlrun.models.encoders import TwinMLP
from tests.conftest import continuous_run, ppo_batch

LINE = re.compile(r"(.+) differs from (.+) by (\d\.\de[-+]\d\d): running the reference")
PPO_SMALL = PPOConfig(num_steps=32, num_minibatches=2, update_epochs=2)
# 3 iterations of 32 steps x 4 envs, 4 updates each from the first on, epsilon 1 -> 0.37 -> 0.05, targets synced every
# 3 updates and a rate at which the online network's choices part from the target's between syncs. Numpy's matmuls
# round unlike torch's: where the fused loss stays on, a weight ends up to a few 1e-6 off the reference's (DQN_ATOL).
DQN_SMALL = dqn_module.DQNConfig(
    lr=1e-2, batch_size=16, learning_starts=64, buffer_size=1000, train_freq=32, gradient_steps=4,
    target_update_interval=3, exploration_fraction=0.5, end_e=0.05,
)  # fmt: skip
DQN_ATOL = 2e-5


def train(cfg, fast: bool, iterations: int = 3, unchecked: bool = False) -> tuple[list[torch.Tensor], list[str]]:
    """The parameters after `iterations` collects and updates on CartPole (4 envs, seed 1), accelerated as training
    does when `fast`; and the accelerations that applied. `unchecked`: the accelerations without their self-checks
    (as they ran before them)."""
    envs = SyncEnvs([make_env(EnvConfig(), train=True) for _ in range(4)])
    try:
        torch.manual_seed(1)
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space, 4)
        algo = build_algo(replace(cfg, fast=fast), ModelConfig(), spec, torch.device("cpu"))
        applied = accelerate(algo, envs)
        if unchecked:
            parts = algo.parts
            if isinstance(parts, dqn_module.DQNParts):  # DQN's checked parts hold the unchecked ones
                parts.learner, parts.targets = parts.learner.fast, parts.targets.fast
                parts.epsilon_greedy, parts.gradient_step = parts.epsilon_greedy.fast, parts.gradient_step.fast
            elif hasattr(parts.learner, "fast"):  # PPO's checked learner, policy and step hold the unchecked parts
                parts.learner, parts.policy = parts.learner.fast, parts.policy.fast
                parts.minibatch_step = parts.minibatch_step.fast
            else:
                parts.learner.checked = True  # A2C's fused unroll: as if checked
        algo.start(envs.reset(seed=env_seeds(1, 0, 4))[0])
        for i in range(iterations):
            algo.collect(envs, i / iterations)
            algo.update(progress=i / iterations)
        return [p.detach().clone() for p in algo.model.parameters()], applied
    finally:
        envs.close()


def stepped_aside(caplog) -> dict[str, float]:
    """{acceleration: difference} of the self-check lines logged, each at most once."""
    found = [LINE.fullmatch(r.getMessage()) for r in caplog.records]
    names = [m[1] for m in found if m]
    assert len(names) == len(set(names)), names
    return {m[1]: float(m[3]) for m in found if m}


def assert_trains_the_reference(cfg, caplog, expected: set[str], atol: float = 1e-6) -> None:
    """The accelerated run steps `expected` aside, each with one line, and ends where the reference path does (within
    `atol`: the accelerations that stay on round as they do)."""
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        fast, applied = train(cfg, fast=True)
    lines = stepped_aside(caplog)
    assert set(lines) == expected and all(d > 1e-4 for d in lines.values()), lines
    assert expected <= set(applied)
    reference, _ = train(cfg, fast=False)
    for a, b in zip(fast, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)


def huber_value_loss(values, old_values, returns, clip: float, clip_vloss: bool):
    """value_loss as a researcher might edit it: Huber instead of the squared error."""
    return nn.functional.smooth_l1_loss(values, returns)


def test_an_edited_ppo_value_loss_is_what_trains(monkeypatch, caplog):
    monkeypatch.setattr(ppo_module, "value_loss", huber_value_loss)
    assert_trains_the_reference(PPO_SMALL, caplog, {"fused PPO loss"})


def test_an_edited_ppo_clipping_shows_although_every_first_ratio_is_one(monkeypatch, caplog):
    """At the first minibatch no ratio leaves the clip range: the check's probe moves the old log-probs off it."""
    reference = ppo_module.clipped_surrogate_loss
    monkeypatch.setattr(
        ppo_module, "clipped_surrogate_loss", lambda log_ratio, adv, clip: reference(log_ratio, adv, 0.1)
    )
    assert_trains_the_reference(PPO_SMALL, caplog, {"fused PPO loss"})


def unscaled_advantages(adv, mean_all):
    """normalize_advantages as a researcher might edit it: centred only."""
    return adv - mean_all(adv.mean())


def test_an_edited_advantage_normalization_is_what_trains(monkeypatch, caplog):
    monkeypatch.setattr(ppo_module, "normalize_advantages", unscaled_advantages)
    assert_trains_the_reference(PPO_SMALL, caplog, {"minibatch step in numpy"})


def clipping_tighter(step, by: float):
    """A step (PPO.minibatch_step, DQN.gradient_step) edited to clip the gradient's norm at its max_grad_norm / by."""

    def edited(self, *args):
        clip = self.parts.clip_grad_norm_
        self.parts.clip_grad_norm_ = lambda params, max_norm: clip(params, max_norm / by)
        try:
            return step(self, *args)
        finally:
            self.parts.clip_grad_norm_ = clip

    return edited


def test_an_edited_gradient_clipping_is_what_trains(monkeypatch, caplog):
    monkeypatch.setattr(ppo_module.PPO, "minibatch_step", clipping_tighter(ppo_module.PPO.minibatch_step, 10))
    assert_trains_the_reference(PPO_SMALL, caplog, {"minibatch step in numpy"})


class NormedTwinMLP(TwinMLP):
    """TwinMLP with a LayerNorm after its first layer, as a researcher might add one in models/encoders.py."""

    def __init__(self, in_dim: int, hidden_sizes: list[int], activation: str):
        super().__init__(in_dim, hidden_sizes, activation)
        self.norm = nn.LayerNorm(hidden_sizes[0])

    def forward(self, x):
        h = self.norm(self.activation(self.first(x.flatten(1).float())).view(len(x), 2, -1)).transpose(0, 1)
        for w, b in zip(self.weights, self.biases):
            h = self.activation(torch.baddbmm(b, h, w))
        return h[0], h[1]


@pytest.mark.parametrize("cfg", [PPO_SMALL, A2CConfig(num_steps=8)], ids=["ppo", "a2c"])
def test_a_layer_added_to_the_mlp_is_what_trains(cfg, monkeypatch, caplog):
    monkeypatch.setattr(actor_critic_module, "TwinMLP", NormedTwinMLP)
    expected = {"fused PPO loss", "numpy acting"} if isinstance(cfg, PPOConfig) else {"fused A2C unroll"}
    assert_trains_the_reference(cfg, caplog, expected)


def test_an_edited_a2c_loss_is_what_trains(monkeypatch, caplog):
    reference = a2c_module.a2c_loss

    def halved_value_loss(log_probs, entropy, values, advantages, returns, ent_coef, vf_coef):
        return reference(log_probs, entropy, values, advantages, returns, ent_coef, vf_coef / 2)

    monkeypatch.setattr(a2c_module, "a2c_loss", halved_value_loss)
    assert_trains_the_reference(A2CConfig(num_steps=8), caplog, {"fused A2C unroll"})


class SharperTanh(nn.Module):
    def forward(self, x):
        return torch.tanh(1.5 * x)


def greedy_sample(log_p, noise=None):
    """categorical_sample edited to act greedily (and so to draw no noise: the random stream moves otherwise)."""
    return log_p.argmax(-1)


@pytest.mark.parametrize("edit", ["activation", "sampling"])
def test_numpy_acting_steps_aside_for_an_edited_model(edit, monkeypatch, caplog):
    """An activation edited in models/encoders.py (the fused loss steps aside too), or the categorical sampler edited
    in models/distributions.py, which only acting shows."""
    if edit == "activation":
        monkeypatch.setitem(encoders.ACTIVATIONS, "tanh", SharperTanh)
        expected = {"numpy acting", "fused PPO loss"}
    else:
        monkeypatch.setattr(D, "categorical_sample", greedy_sample)
        expected = {"numpy acting"}
    assert_trains_the_reference(PPO_SMALL, caplog, expected)


@pytest.mark.parametrize("cfg", [PPOConfig(num_steps=32), A2CConfig(num_steps=8)], ids=["ppo", "a2c"])
def test_an_unedited_run_passes_its_checks_and_equals_the_unchecked_run(cfg, caplog):
    with caplog.at_level(logging.DEBUG, logger="rlrun"):
        checked, applied = train(cfg, fast=True)
    assert stepped_aside(caplog) == {}
    assert {"fused PPO loss", "numpy acting", "fused A2C unroll"} & set(applied)
    unchecked, _ = train(cfg, fast=True, unchecked=True)
    for a, b in zip(checked, unchecked, strict=True):
        assert torch.equal(a, b)


def test_numpy_values_alone_are_checked_too(monkeypatch, caplog):
    """With acting in env workers, the rank asks numpy acting only for bootstrap values: the check runs on those."""
    from rlrun.fast.numpy_policy import NumpyPolicy
    from rlrun.fast.selfcheck import CheckedPolicy
    from rlrun.models import build_actor_critic

    monkeypatch.setitem(encoders.ACTIVATIONS, "tanh", SharperTanh)
    env = make_env(EnvConfig(), train=True)()
    model = build_actor_critic(ModelConfig(), env.observation_space, env.action_space)
    policy, obs = CheckedPolicy(NumpyPolicy(model), model), torch.randn(6, 4)
    with caplog.at_level(logging.WARNING, logger="rlrun"), torch.no_grad():
        assert torch.equal(policy.value(obs), model.value(obs))
        assert torch.equal(policy.value(obs), model.value(obs))
    assert set(stepped_aside(caplog)) == {"numpy acting"}
    env.close()


def test_an_edited_dqn_loss_is_what_trains(monkeypatch, caplog):
    monkeypatch.setattr(dqn_module, "td_loss", lambda q, targets, kind: 0.5 * (q - targets).square())
    assert_trains_the_reference(DQN_SMALL, caplog, {"fused DQN loss"})


def single_q_targets(online, target, next_obs, returns, discount, double_q: bool):
    """q_targets edited to ignore double_q: it differs only once the online and target networks part."""
    return returns + discount * target(next_obs).max(-1).values


def test_an_edited_double_dqn_target_shows_although_the_networks_start_equal(monkeypatch, caplog):
    monkeypatch.setattr(dqn_module, "q_targets", single_q_targets)
    assert_trains_the_reference(DQN_SMALL, caplog, {"fused DQN targets"}, DQN_ATOL)


def least_valued_acting(self, obs, explore, random):
    """DQN's acting edited to take the least valued action where it acts greedily."""
    return np.where(explore, random, self.model(self._obs(obs)).argmin(-1).cpu().numpy())


def test_edited_dqn_acting_shows_although_the_first_step_explores(monkeypatch, caplog):
    monkeypatch.setattr(dqn_module.DQN, "_greedy_or_random", least_valued_acting)
    assert_trains_the_reference(DQN_SMALL, caplog, {"numpy epsilon-greedy acting"}, DQN_ATOL)


def test_an_edited_q_network_is_what_trains(monkeypatch, caplog):
    reference = q_network_module.QNetwork.forward
    monkeypatch.setattr(q_network_module.QNetwork, "forward", lambda self, obs: 0.5 * reference(self, obs))
    expected = {"fused DQN loss", "fused DQN targets", "numpy epsilon-greedy acting"}
    assert_trains_the_reference(DQN_SMALL, caplog, expected)


def test_an_edited_dqn_gradient_step_is_what_trains(monkeypatch, caplog):
    monkeypatch.setattr(dqn_module.DQN, "gradient_step", clipping_tighter(dqn_module.DQN.gradient_step, 1000))
    assert_trains_the_reference(DQN_SMALL, caplog, {"gradient step in numpy"}, DQN_ATOL)


def test_an_unedited_dqn_run_passes_its_checks_and_equals_the_unchecked_run(caplog):
    with caplog.at_level(logging.DEBUG, logger="rlrun"):
        checked, applied = train(DQN_SMALL, fast=True)
    assert stepped_aside(caplog) == {}
    fused = {"fused DQN loss", "fused DQN targets", "numpy epsilon-greedy acting", "gradient step in numpy"}
    assert fused <= set(applied)
    unchecked, _ = train(DQN_SMALL, fast=True, unchecked=True)
    for a, b in zip(checked, unchecked, strict=True):
        assert torch.equal(a, b)


def train_batch(fast: bool, unchecked: bool = False) -> tuple[list[torch.Tensor], list[str]]:
    """The stacked parameters of seeds 1 and 2 trained side by side (rlrun/algos/batched_ppo.py) for 3 iterations
    on CartPole, accelerated when `fast`; and the accelerations that applied. `unchecked`: without their
    self-checks."""
    b = ppo_batch(PPO_SMALL, EnvConfig(num_envs=4), [1, 2], fast)
    try:
        if unchecked:
            b.batch.parts.learner, b.batch.parts.policy = b.batch.parts.learner.fast, b.batch.parts.policy.fast
        b.train(3)
        return [p.detach().clone() for p in b.batch.model.parameters()], b.applied
    finally:
        b.close()


class HalvedValueLoss(batched_ppo.BatchedPPOLearner):
    """BatchedPPOLearner with its value term halved, as a researcher might edit rlrun/algos/batched_ppo.py."""

    def forward(self, **minibatch):
        loss, stats = super().forward(**minibatch)
        return loss - 0.5 * self.cfg.vf_coef * stats[:, 1], stats


@pytest.mark.parametrize("edit", ["activation", "sampling", "loss"])
def test_a_batch_of_seeds_steps_aside_for_an_edit(edit, monkeypatch, caplog):
    """The batch's fused loss and numpy acting check themselves against algos/batched_ppo.py and models/ as the
    single run's do: an activation edited (both step aside), the sampler edited (acting only), the batched loss
    edited (the loss only); the run then trains what the batch's reference path trains."""
    if edit == "activation":
        monkeypatch.setitem(encoders.ACTIVATIONS, "tanh", SharperTanh)
        expected = {"batched numpy acting", "fused batched PPO loss"}
    elif edit == "sampling":
        monkeypatch.setattr(D, "categorical_sample", greedy_sample)
        expected = {"batched numpy acting"}
    else:
        monkeypatch.setattr(batched_ppo, "BatchedPPOLearner", HalvedValueLoss)
        expected = {"fused batched PPO loss"}
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        fast, applied = train_batch(fast=True)
    lines = stepped_aside(caplog)
    assert set(lines) == expected and all(d > 1e-4 for d in lines.values()), lines
    assert expected <= set(applied)
    reference, _ = train_batch(fast=False)
    for a, b in zip(fast, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_an_unedited_batch_passes_its_checks_and_equals_the_unchecked_batch(caplog):
    with caplog.at_level(logging.DEBUG, logger="rlrun"):
        checked, applied = train_batch(fast=True)
    assert stepped_aside(caplog) == {}
    assert {"fused batched PPO loss", "batched numpy acting"} <= set(applied)
    unchecked, _ = train_batch(fast=True, unchecked=True)
    for a, b in zip(checked, unchecked, strict=True):
        assert torch.equal(a, b)


def test_rollout_noise_that_would_draw_otherwise_steps_aside(caplog):
    """Noise drawn at once that does not match the step by step draws (as if torch's kernel drew in blocks): the
    check says so, puts the seeds' streams where the reference leaves them, and the reference's noise is used."""
    from rlrun.algos.batched_ppo import draw_rollout_noise as draw_noise
    from rlrun.fast.selfcheck import CheckedNoise

    def reversed_in_time(generators, kind, shape, device):
        return draw_noise(generators, kind, shape, device).flip(0)

    checked, cpu = CheckedNoise(reversed_in_time, draw_noise), torch.device("cpu")
    generators = [torch.Generator().manual_seed(s) for s in range(2)]
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        noise = checked(generators, "categorical", (5, 3, 2), cpu)
    assert set(stepped_aside(caplog)) == {"rollout noise drawn at once"}
    copies = [torch.Generator().manual_seed(s) for s in range(2)]
    assert torch.equal(noise, draw_noise(copies, "categorical", (5, 3, 2), cpu))
    assert all(torch.equal(g.get_state(), c.get_state()) for g, c in zip(generators, copies))


def huber_critic_loss(self, obs, actions, targets, weights):
    """CriticLearner.forward as a researcher might edit it: Huber errors instead of squared ones."""
    q = self.critic(obs, actions)
    errors = nn.functional.huber_loss(q, targets.expand_as(q), reduction="none")
    loss = self.scale * (weights * errors.sum(0)).sum() / self.batch_size
    return loss, (q - targets).detach().abs().mean(0), q.detach()


def first_q_sac_actor_loss(self, obs, noise, critic):
    """SACActorLearner.forward edited to read the first critic only, as TD3's actor does."""
    actions, log_prob = self.actor(obs, noise)
    q = critic(obs, actions, detached=True)[0]
    actor_loss = (self.log_alpha.detach().exp() * log_prob - q).sum() / self.batch_size
    alpha_loss = sac_module.temperature_loss(self.log_alpha, log_prob, self.target_entropy, self.batch_size)
    return actor_loss + alpha_loss, actor_loss.detach(), alpha_loss.detach(), -log_prob.detach().sum() / self.batch_size


def min_q_actor_loss(self, obs, critic):
    """TD3ActorLearner.forward edited to read the smaller of the two critics, as SAC's actor does."""
    return -critic(obs, self.actor(obs), detached=True).min(0).values.sum() / self.batch_size


@pytest.mark.parametrize(
    "algo, edit, expected",
    [
        ("sac", (continuous_module.CriticLearner, "forward", huber_critic_loss), "critic step without autograd"),
        ("td3", (continuous_module.CriticLearner, "forward", huber_critic_loss), "critic step without autograd"),
        ("sac", (sac_module.SACActorLearner, "forward", first_q_sac_actor_loss), "actor step without autograd"),
        ("td3", (td3_module.TD3ActorLearner, "forward", min_q_actor_loss), "actor step without autograd"),
    ],
)
def test_an_edited_sac_or_td3_loss_is_what_trains(algo, edit, expected, monkeypatch, caplog):
    monkeypatch.setattr(*edit)
    assert_continuous_trains_the_reference(algo, {expected}, caplog)


def assert_continuous_trains_the_reference(algo: str, expected: set[str], caplog) -> None:
    """A checked SAC or TD3 run steps `expected` aside, and trains as the reference run."""
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        fast, applied = continuous_run(algo, fast=True)
    lines = stepped_aside(caplog)
    assert set(lines) == expected <= set(applied) and all(d > 1e-4 for d in lines.values()), lines
    reference, _ = continuous_run(algo, fast=False)
    for name, value in reference.model.state_dict().items():
        torch.testing.assert_close(fast.model.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)


def leaky_twin_q(self, obs, actions, detached=False, first=False):
    """TwinQ.forward edited to leaky ReLUs, its modules unchanged: every pass through a critic, the targets' too."""
    x = torch.cat([obs.flatten(1).float(), actions], -1)
    q = []
    for critic in self.critics[: 1 if first else 2]:
        h = x
        for layer in critic:
            if isinstance(layer, nn.Linear):
                h = nn.functional.linear(h, layer.weight.detach(), layer.bias.detach()) if detached else layer(h)
            else:
                h = nn.functional.leaky_relu(h, 0.1)
        q.append(h)
    return torch.cat(q, -1).t()


def halved_deterministic_actor(self, obs):
    """DeterministicActor.forward edited to act in [-0.5, 0.5]: TD3's target actions and its actor's loss."""
    return 0.5 * torch.tanh(self.net(obs.flatten(1).float()))


CRITICS_READ = {"target Q without modules", "critic step without autograd", "actor step without autograd"}


def wider_gaussian_actor(self, obs, noise):
    """GaussianActor.forward edited to explore twice as wide: SAC's next actions, its actor's loss and exploration."""
    mean, log_std = self._moments(obs)
    return continuous_models.squashed_gaussian(mean, log_std + math.log(2.0), noise)


@pytest.mark.parametrize(
    "algo, edit, expected",
    [
        ("sac", leaky_twin_q, CRITICS_READ),
        ("td3", leaky_twin_q, CRITICS_READ),
        ("td3", halved_deterministic_actor, {"target actions without modules", "actor step without autograd"}),
        ("sac", wider_gaussian_actor, {"next actions without modules", "actor step without autograd"}),
    ],
)
def test_an_edited_sac_or_td3_network_is_what_trains(algo, edit, expected, monkeypatch, caplog):
    networks = {leaky_twin_q: continuous_models.TwinQ, wider_gaussian_actor: continuous_models.GaussianActor}
    monkeypatch.setattr(networks.get(edit, continuous_models.DeterministicActor), "forward", edit)
    assert_continuous_trains_the_reference(algo, expected, caplog)


@pytest.mark.parametrize(
    "algo, network, edit",
    [
        ("td3", continuous_models.DeterministicActor, halved_deterministic_actor),
        ("sac", continuous_models.GaussianActor, wider_gaussian_actor),
    ],
)
def test_edited_exploration_is_what_acts(algo, network, edit, monkeypatch, caplog):
    """With an actor edited in models/, numpy exploration steps aside at its first step with one line, and that step
    and the next are the edited reference's own actions, drawn from torch's generator as the reference draws them."""
    from tests.unit.test_fast_paths import explorer

    monkeypatch.setattr(network, "forward", edit)
    (fast, _), (ref, _) = explorer(algo, True, 3), explorer(algo, False, 3)
    obs = np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)
    torch.manual_seed(5)
    with caplog.at_level(logging.WARNING, logger="rlrun"):
        ours = [fast.explore(obs, 0.0)[1] for _ in range(2)]
    torch.manual_seed(5)
    expected = [ref.explore(obs, 0.0)[1] for _ in range(2)]
    assert set(stepped_aside(caplog)) == {"numpy exploration"}
    assert all(np.array_equal(a, b) for a, b in zip(ours, expected, strict=True))
