"""Recurrent policies, fast part: the parallel scan against a loop, resets inside a sequence against separate
episodes, PPO replaying a real rollout exactly as it acted, minibatches of whole env sequences, eval memory."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import EnvSpec
from rlrun.config import EnvConfig, ModelConfig
from rlrun.envs import SyncEnvs, env_seeds, make_env
from rlrun.envs.masked import MASKED_CARTPOLE
from rlrun.models import RecurrentActorCritic
from rlrun.models.recurrent import GRUCore, LRUCore, LSTMCore, unroll
from rlrun.models.scan import linear_scan

CORES = {
    "lstm": lambda: LSTMCore(5, 8),
    "gru": lambda: GRUCore(5, 8),
    "lru": lambda: LRUCore(5, 8),
    "lru_input_decay": lambda: LRUCore(5, 8, input_decay=True),
}


def loop(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    out, h = [], h0
    for t in range(len(a)):
        h = a[t] * h + b[t]
        out.append(h)
    return torch.stack(out)


@pytest.mark.parametrize("steps", [1, 2, 7, 64, 129])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_linear_scan_equals_loop_with_resets_forward_and_gradients(steps, dtype):
    g = torch.Generator().manual_seed(steps)
    resets = torch.rand(steps, 3, 1, generator=g) < 0.1
    a = (torch.rand(steps, 3, 4, generator=g) * 0.2 + 0.8).to(dtype).requires_grad_()
    b = torch.randn(steps, 3, 4, generator=g).to(dtype).requires_grad_()
    h0 = torch.randn(3, 4, generator=g).to(dtype).requires_grad_()
    weights = torch.randn(steps, 3, 4, generator=g)  # a loss that weighs every output differently
    grads = []
    for fn in (linear_scan, loop):
        h = fn(a * ~resets, b, h0)
        (torch.view_as_real(h) if h.is_complex() else h.unsqueeze(-1)).sum(-1).mul(weights).sum().backward()
        grads.append([x.grad.clone() for x in (a, b, h0)])
        for x in (a, b, h0):
            x.grad = None
        if fn is linear_scan:
            scanned = h.detach()
    torch.testing.assert_close(scanned, h.detach(), atol=1e-5, rtol=1e-5)
    for ours, ref in zip(*grads):
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(CORES))
def test_sequence_forward_equals_step_loop_forward_and_gradients(name):
    """The LRU's scan (and the LSTM/GRU's RNN kernels) against stepping the same parameters one step at a time,
    on random sequences with random resets."""
    torch.manual_seed(0)
    core = CORES[name]()
    x = torch.randn(100, 6, 5, requires_grad=True)
    starts = torch.rand(100, 6) < 0.05
    state = torch.randn(6, core.state_size)
    results = []
    for run in (core.forward, lambda *args: unroll(core.step, *args)):
        core.zero_grad()
        x.grad = None
        y, final = run(x, state, starts)
        (y * torch.linspace(-1, 1, y.shape[-1])).mean().backward()  # a mean, as losses are: O(1) gradients
        results.append((y.detach(), final.detach(), x.grad.clone(), [p.grad.clone() for p in core.parameters()]))
    (y1, s1, gx1, gp1), (y2, s2, gx2, gp2) = results
    for ours, ref in [(y1, y2), (s1, s2), (gx1, gx2), *zip(gp1, gp2)]:
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(CORES))
def test_reset_inside_a_sequence_equals_running_the_episodes_separately(name):
    torch.manual_seed(0)
    core = CORES[name]()
    first, second = torch.randn(13, 2, 5), torch.randn(9, 2, 5)
    starts = torch.zeros(22, 2, dtype=torch.bool)
    starts[13] = True  # the second episode starts at step 13 in both envs
    state = torch.randn(2, core.state_size)  # whatever came before is forgotten at the reset
    with torch.no_grad():
        y, _ = core(torch.cat([first, second]), state, starts)
        y_first, _ = core(first, state, starts[:13])
        y_second, _ = core(second, torch.zeros(2, core.state_size), starts[13:] & False)
    torch.testing.assert_close(y[:13], y_first, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(y[13:], y_second, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(y_second, core(second, state, starts[13:] & False)[0], atol=1e-3)  # state mattered


class RecordingEnvs(SyncEnvs):
    """Real CartPole envs that also keep each step's final observations (as the rollout does not)."""

    def __init__(self, env_fns):
        super().__init__(env_fns)
        self.finals: list[dict[int, np.ndarray]] = []

    def recv(self, group: int):
        result = super().recv(group)
        info, ended = result[4], result[2] | result[3]
        self.finals.append({int(i): info["final_obs"][i].copy() for i in np.flatnonzero(ended)})
        return result


def recurrent_ppo(name: str, num_envs: int = 4, **algo) -> tuple[PPO, RecordingEnvs]:
    env_cfg = EnvConfig(id=MASKED_CARTPOLE, max_episode_steps=20)  # truncations and terminations inside rollouts
    envs = RecordingEnvs([make_env(env_cfg, train=True) for _ in range(num_envs)])
    torch.manual_seed(0)
    model_cfg = ModelConfig(name=name, hidden_sizes=[16], shared=True, core_size=8)
    cfg = PPOConfig(num_steps=32, **algo)
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, num_envs)
    ppo = PPO(cfg, model_cfg, spec, torch.device("cpu"))
    ppo.start(envs.reset(seed=env_seeds(0, 0, num_envs))[0])
    return ppo, envs


@pytest.mark.parametrize("name", ["lstm", "gru", "lru"])
def test_update_replays_each_rollout_exactly_as_the_policy_acted(name):
    ppo, envs = recurrent_ppo(name)
    r = ppo.rollout
    for rollout in range(2):  # the second starts from the state carried over from the first
        envs.finals.clear()
        ppo.collect(envs)
        carried = r.initial_state.abs().sum() > 0
        assert (r.starts[0].all() and not carried) if rollout == 0 else carried
        assert r.truncated.any() and r.terminated.any()
        with torch.no_grad():
            log_probs, _, values = ppo.model.evaluate(r.obs, r.actions, r.initial_state, r.starts)
        torch.testing.assert_close(log_probs, r.log_probs, atol=1e-5, rtol=0)
        torch.testing.assert_close(values, r.values, atol=1e-5, rtol=0)
        # A truncated episode bootstraps from V(final obs) read with that episode's state, not a fresh one.
        model = ppo.model
        for t, i in r.truncated.nonzero().tolist():
            with torch.no_grad():
                features = model.encoder(r.obs[: t + 1, i])
                _, state = model.core(features.unsqueeze(1), r.initial_state[i : i + 1], r.starts[: t + 1, i : i + 1])
                final = ppo.preprocess(envs.finals[t][i][None])
                expected = model.value(final, state, torch.zeros(1, dtype=torch.bool))
            torch.testing.assert_close(r.next_values[t, i], expected[0], atol=1e-5, rtol=0)
    envs.close()


class RecordingLearner(nn.Module):
    """Wraps the learner the way DDP does, keeping what each minibatch call received."""

    def __init__(self, learner: nn.Module):
        super().__init__()
        self.learner = learner
        self.calls: list[dict[str, torch.Tensor]] = []

    def forward(self, **minibatch: torch.Tensor):
        self.calls.append({k: v.detach().clone() for k, v in minibatch.items()})
        return self.learner(**minibatch)


def test_minibatches_are_whole_env_sequences():
    ppo, envs = recurrent_ppo("lstm", num_envs=6, num_minibatches=3, update_epochs=2)
    ppo.collect(envs)
    envs.close()
    r = ppo.rollout
    ppo.parts.learner = recorder = RecordingLearner(ppo.parts.learner)
    ppo.update(progress=0.0)
    assert ppo.update_shape == (32 * 2, 3, 2) and len(recorder.calls) == 6
    orders = []
    for calls in [recorder.calls[:3], recorder.calls[3:]]:
        seen = []
        for mb in calls:
            assert mb["obs"].shape == (32, 2, 2) and mb["starts"].shape == (32, 2) and mb["state"].shape == (2, 16)
            for k in range(2):  # each column is one env's whole rollout, with that env's initial state and starts
                (env,) = [j for j in range(6) if torch.equal(r.obs[:, j], mb["obs"][:, k])]
                assert torch.equal(mb["starts"][:, k], r.starts[:, env])
                assert torch.equal(mb["state"][k], r.initial_state[env])
                assert torch.equal(mb["actions"][:, k], r.actions[:, env])
                seen.append(env)
        assert sorted(seen) == list(range(6))
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled every epoch


def test_acting_memory_is_per_env_and_reset_where_episodes_start():
    ppo, envs = recurrent_ppo("gru")
    envs.close()
    obs = np.random.default_rng(0).normal(size=(5, 4, 2)).astype(np.float32)
    every, none = np.ones(4, dtype=bool), np.zeros(4, dtype=bool)
    ppo.act(obs[0], starts=every)
    fresh = ppo.eval_state.clone()
    for o in obs[1:]:
        ppo.act(o, starts=none)
    carried = ppo.eval_state.clone()
    assert not torch.allclose(carried, fresh)
    only_env_2 = np.array([False, False, True, False])
    ppo.act(obs[0], starts=only_env_2)
    torch.testing.assert_close(ppo.eval_state[2], fresh[2])  # env 2 restarted: as from zero state
    assert not torch.allclose(ppo.eval_state[0], fresh[0])  # the others remembered
    training_state = ppo.state.clone()
    ppo.act(obs[0][:3], starts=None)  # another batch size: fresh memory, and training's is untouched
    assert ppo.eval_state.shape[0] == 3 and torch.equal(ppo.state, training_state)


def test_recurrent_model_on_frames_uses_the_nature_cnn():
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    cfg = ModelConfig(name="lstm", hidden_sizes=[256], shared=True, encoder="nature_cnn", core_size=32)
    model = RecurrentActorCritic(cfg, space, gym.spaces.Discrete(4))
    obs = torch.randint(0, 255, (3, 2, 4, 84, 84), dtype=torch.uint8)
    action, log_prob, value, state = model.act(
        obs[0], model.initial_state(2, torch.device("cpu")), torch.ones(2, dtype=bool)
    )
    assert action.shape == log_prob.shape == value.shape == (2,) and state.shape == (2, 64)
    starts = torch.zeros(3, 2, dtype=torch.bool)
    log_probs, entropy, values = model.evaluate(obs, torch.zeros(3, 2, dtype=torch.long), state, starts)
    assert log_probs.shape == entropy.shape == values.shape == (3, 2)


def test_masked_cartpole_hides_the_velocities():
    full, masked = gym.make("CartPole-v1"), gym.make(MASKED_CARTPOLE)
    assert masked.observation_space.shape == (2,) and masked.spec.max_episode_steps == 500
    o_full, _ = full.reset(seed=3)
    o_masked, _ = masked.reset(seed=3)
    for action in [0, 1, 1, 0, 1]:
        np.testing.assert_array_equal(o_masked, o_full[[0, 2]])
        o_full, *_ = full.step(action)
        o_masked, *_ = masked.step(action)
