"""Proximal Policy Optimization (Schulman et al. 2017) with the implementation details of Huang et al. 2022
("The 37 implementation details of PPO"): GAE, clipped surrogate and value loss, entropy bonus, advantage
normalization, global grad-norm clipping, linear LR annealing, optional target-KL stop and normalization.
Recurrent policies (the LSTM details there; CleanRL's ppo_atari_lstm.py) carry their state across rollouts and
train on whole env sequences with the state reset where episodes start, without padding or chunking.
With several ranks and `preempt_fraction` set, a rank whose rollout lags is cut short (DD-PPO's straggler
preemption, Wijmans et al. 2020), and the update weighs the ranks' unequal rollouts so every sample counts alike.

This is the reference: plain torch, autograd, torch.optim.Adam, the policy acting in the rank. It is what
`algo.fast=false` runs end to end. With `algo.fast=true` (the default), rlrun/fast/ swaps some of its declared parts
(PPOParts) for faster ones with the same signatures; rlrun/fast/__init__.py says which and why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.configs import PPOConfig
from rlrun.algos.finite import require_finite
from rlrun.algos.normalize import MeanAll, RunningMoments, float_entries, normalize_advantages, weighted_mean_all
from rlrun.algos.parts import Acting, ClipGradNorm, MakeOptimizer, Optimizer, adam
from rlrun.algos.protocol import Annealed, EnvSpec, Reductions, Wrap, episodes_of
from rlrun.algos.returns import compute_gae, explained_variance
from rlrun.algos.rollout_step import ACTED, STEPPED, StepRows, act_step, step_groups
from rlrun.buffers.rollout import Rollout, minibatch_indices, minibatch_slices, take_rows
from rlrun.config import ModelConfig
from rlrun.envs.protocol import Episodes, VectorEnv
from rlrun.models import RecurrentActorCritic, build_actor_critic, trainable
from rlrun.models.encoders import observation_dtype


def clipped_surrogate_loss(log_ratio: Tensor, advantages: Tensor, clip: float) -> Tensor:
    """-E[min(r A, clip(r, 1-eps, 1+eps) A)], the PPO-Clip objective as a loss (paper eq. 7)."""
    ratio = log_ratio.exp()
    return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)).mean()


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float, clip_vloss: bool) -> Tensor:
    """0.5 E[(V - R)^2]; with clip_vloss, the max with the loss of V clipped to old_V +- clip (as in
    OpenAI baselines)."""
    unclipped = (values - returns).square()
    if not clip_vloss:
        return 0.5 * unclipped.mean()
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.max(unclipped, (clipped - returns).square()).mean()


STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


class PPOLearner(nn.Module):
    """The loss module: forward(minibatch) -> (loss, stats [len(STATS)]). Under DDP this is the wrapped
    module, so that its forward is where gradients get synchronized."""

    def __init__(self, model: nn.Module, cfg: PPOConfig):
        super().__init__()
        self.model = model
        self.cfg = cfg

    def forward(
        self,
        obs: Tensor,
        actions: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        returns: Tensor,
        old_values: Tensor,
        **memory: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """The PPO loss of a minibatch of steps [B, ...] (advantages normalized if configured); for a recurrent
        model, of env sequences [T, B, ...] with `memory` = their initial `state` [B, S] and episode `starts`
        [T, B]."""
        c = self.cfg
        log_probs, entropy, values = self.model.evaluate(obs, actions, **memory)
        log_ratio = log_probs - old_log_probs
        pg_loss = clipped_surrogate_loss(log_ratio, advantages, c.clip_coef)
        v_loss = value_loss(values, old_values, returns, c.clip_coef, c.clip_vloss)
        entropy_mean = entropy.mean()
        loss = pg_loss - c.ent_coef * entropy_mean + c.vf_coef * v_loss
        with torch.no_grad():
            ratio = log_ratio.exp()
            stats = torch.stack(
                [
                    pg_loss,
                    v_loss,
                    entropy_mean,
                    ((ratio - 1) - log_ratio).mean(),  # k3 estimator (Schulman 2020)
                    ((ratio - 1).abs() > c.clip_coef).float().mean(),
                ]
            )
        return loss, stats


# (envs, obs, cut) -> (observations after the rollout, episodes that ended, steps taken); cut as step_groups takes it
CollectSteps = Callable[[VectorEnv, np.ndarray, Callable[[int], bool] | None], tuple[np.ndarray, list[Episodes], int]]
# (minibatch, mean_all, weight) -> the minibatch's stats [len(STATS)], after one optimizer step on its loss; mean_all
# averages over the ranks' minibatches, `weight` is the minibatch's among the ranks' (None when all are equal)
MinibatchStep = Callable[[dict[str, Tensor], MeanAll, float | None], Tensor]


@dataclass
class PPOParts:
    """What an acceleration may replace in PPO (rlrun/algos/parts.py), each with a part of the same signature. PPO
    builds them from this file's code and calls them through here."""

    learner: nn.Module  # forward(**minibatch) -> (loss, stats), as PPOLearner; what DDP wraps (wrap_learner)
    make_optimizer: MakeOptimizer  # over PPO.trained, on first use
    clip_grad_norm_: ClipGradNorm
    policy: Acting  # what acts while collecting (feedforward models; a recurrent one acts itself)
    collect_steps: CollectSteps  # the steps of a rollout, into PPO.rollout
    minibatch_step: MinibatchStep  # one gradient step of update's


class PPO:
    """Collects rollouts from a vector env and updates the actor-critic. Knows nothing of ranks: cross-rank
    statistics go through `reductions.mean_all`, and the caller wraps `learner` (wrap_learner) in DDP."""

    def __init__(self, cfg: PPOConfig, model_cfg: ModelConfig, spec: EnvSpec, device: torch.device, reductions=None):
        reductions = reductions or Reductions()
        obs_space, action_space = spec.observation_space, spec.action_space
        self.cfg = cfg
        self.device = device
        self.mean_all = reductions.mean_all
        self.finish_line = reductions.finish_line if cfg.preempt_fraction is not None else None
        self.num_envs = spec.num_envs
        self.model_spec = (model_cfg, obs_space, action_space)  # what env workers build their copies from
        self.model = build_actor_critic(model_cfg, obs_space, action_space).to(device)
        self.recurrent = isinstance(self.model, RecurrentActorCritic)
        self.trained = trainable(self.model)  # what the optimizer trains and DDP synchronizes
        self.parts = PPOParts(
            learner=PPOLearner(self.model, cfg),
            make_optimizer=adam(cfg.lr, cfg.adam_eps),
            clip_grad_norm_=nn.utils.clip_grad_norm_,
            policy=self.model,
            collect_steps=self._act_and_step,
            minibatch_step=self.minibatch_step,
        )
        # integer actions: an index (Discrete), or one per component (MultiDiscrete, MultiBinary)
        discrete = isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        self.obs_dtype = observation_dtype(obs_space.shape, obs_space.dtype)
        self.rollout = Rollout(
            cfg.num_steps,
            spec.num_envs,
            obs_space.shape,
            torch.float32 if cfg.normalize_obs else self.obs_dtype,
            () if isinstance(action_space, gym.spaces.Discrete) else action_space.shape,
            torch.long if discrete else torch.float32,
            device,
            self.model.state_size if self.recurrent else 0,
        )
        scaled = float_entries(obs_space)  # encoded observations: their float keys only
        self.obs_rms = RunningMoments(obs_space.shape, self.mean_all, device, scaled) if cfg.normalize_obs else None
        self.ret_rms = RunningMoments((), self.mean_all) if cfg.normalize_reward else None
        self.next_obs: np.ndarray | None = None  # the observation the next collect starts from
        self.length = cfg.num_steps  # steps in the last rollout: fewer when a straggler was preempted
        self.discounted_return = np.zeros(spec.num_envs)  # per env, for reward scaling
        if self.recurrent:  # per env, carried across rollouts: the core's state, and whether next_obs starts an episode
            self.state = self.model.initial_state(spec.num_envs, device)
            self.starts = torch.ones(spec.num_envs, dtype=torch.bool, device=device)
        self.eval_state: Tensor | None = None  # what act() carries between calls (evaluation, play)

    @functools.cached_property
    def optimizer(self) -> Optimizer:
        """The parts' optimizer over the trained parameters, built on first use."""
        return self.parts.make_optimizer(self.trained)

    @property
    def steps_per_collect(self) -> int:
        return self.cfg.num_steps * self.num_envs

    @property
    def update_shape(self) -> tuple[int, int, int]:
        """(minibatch size, minibatches per epoch, epochs): every rank must agree on it, or DDP hangs. A
        recurrent model's minibatch is num_envs / num_minibatches whole sequences of num_steps."""
        c = self.cfg
        return self.steps_per_collect // c.num_minibatches, c.num_minibatches, c.update_epochs

    def wrap_learner(self, wrap: Wrap) -> None:
        self.parts.learner = wrap(self.parts.learner, self.trained)

    def start(self, obs: np.ndarray) -> None:
        self.next_obs = obs

    def preprocess(self, obs: np.ndarray, update_stats: bool = False) -> Tensor:
        """Observations as the model sees them: a tensor on the device, normalized if configured."""
        x = torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)
        if self.obs_rms is None:
            return x
        if update_stats:
            self.obs_rms.update(x)
        return self.obs_rms.normalize(x, self.cfg.clip_obs)

    def scale_rewards(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Divide one step's rewards [N] by the running std of the discounted return (as SB3's VecNormalize)."""
        ret = self.discounted_return * self.cfg.gamma + rewards
        self.ret_rms.update(torch.as_tensor(ret))
        ret[done] = 0.0
        self.discounted_return = ret
        scaled = rewards / np.sqrt(self.ret_rms.var.item() + 1e-8)
        return np.clip(scaled, -self.cfg.clip_obs, self.cfg.clip_obs)

    def _act(self, x: Tensor, t: int, envs: slice) -> tuple[Tensor, Tensor, Tensor]:
        """(action, log-prob, value) for the envs `envs` at rollout step t; a recurrent policy steps their
        states on, reset where the previous step ended an episode."""
        if not self.recurrent:
            return self.parts.policy.act(x)
        r = self.rollout
        if t > 0:
            self.starts[envs] = torch.as_tensor(r.terminated_np[t - 1, envs] | r.truncated_np[t - 1, envs])
        r.starts[t, envs] = self.starts[envs]
        action, log_prob, value, self.state[envs] = self.model.act(x, self.state[envs], self.starts[envs])
        return action, log_prob, value

    def value_of(self, obs: np.ndarray, envs: np.ndarray | slice, starts: Tensor | None = None) -> Tensor:
        """V of raw observations of the envs `envs`. A recurrent model steps on from each one's current state
        (reset where `starts`; by default not: a final observation continues its episode), without keeping it."""
        x = self.preprocess(obs)
        if not self.recurrent:
            return self.parts.policy.value(x)
        idx = torch.as_tensor(np.arange(self.num_envs)[envs], device=self.device)
        starts = torch.zeros_like(idx, dtype=torch.bool) if starts is None else starts
        return self.model.value(x, self.state[idx], starts)

    def _act_and_step(
        self, envs: VectorEnv, obs: np.ndarray, cut: Callable[[int], bool] | None = None
    ) -> tuple[np.ndarray, list[Episodes], int]:
        """collect's steps with the policy acting here (step_groups, which asks `cut`). Returns the observations
        after the rollout, the episodes that ended and the steps taken."""
        r = self.rollout
        acted = {name: StepRows(getattr(r, name)) for name in ACTED}
        out = SimpleNamespace(**acted, next_values=r.next_values, **{k: getattr(r, k) for k in STEPPED})

        def act(obs: np.ndarray, t: int, envs: slice) -> np.ndarray:
            return act_step(self._act, self.preprocess(obs, update_stats=True), t, envs, out).cpu().numpy()

        next_obs, episodes, steps = step_groups(envs, obs, self.cfg.num_steps, act, self.value_of, out, cut)
        for rows in acted.values():
            rows.flush()
        return next_obs, episodes, steps

    def _preempted(self, t: int) -> bool:
        """Whether a rollout at step t stops here: enough other ranks have finished theirs, and it has its floor."""
        return t >= self.cfg.preempt_after and self.finish_line.fraction_done() >= self.cfg.preempt_fraction

    @torch.inference_mode()
    def collect(self, envs: VectorEnv, progress: float = 0.0) -> dict:
        """One rollout of num_steps x num_envs transitions into self.rollout (fewer steps when this rank is a
        preempted straggler); returns the episodes that ended and the steps taken. (`progress`, the fraction of
        training done, is for algorithms with exploration schedules.)"""
        r = self.rollout
        self.model.eval()  # acting; update() learns in train mode (as SB3 does: BatchNorm's statistics are kept)
        if self.recurrent:
            r.initial_state.copy_(self.state)
        preempting = self.finish_line is not None
        if preempting:
            self.finish_line.start()
        self.next_obs, episodes, n = self.parts.collect_steps(
            envs, self.next_obs, self._preempted if preempting else None
        )
        if preempting:
            self.finish_line.finish()
        self.length = n
        if self.ret_rms is not None:  # step by step, in order, as the envs returned them
            done = r.terminated_np | r.truncated_np
            for t in range(n):
                r.rewards_np[t] = self.scale_rewards(r.rewards_np[t], done[t])
        if self.recurrent:  # whether next_obs starts an episode
            self.starts.copy_(torch.as_tensor(r.terminated_np[n - 1] | r.truncated_np[n - 1]))
            last_value = self.value_of(self.next_obs, slice(None), self.starts)
        else:
            last_value = self.value_of(self.next_obs, slice(None))
        # Bootstrap from the next step's value except where the episode was truncated (set by observe_step). A
        # rollout cut short ends as any rollout does: at the value of the observation it stopped at.
        following = torch.cat([r.values[1:n], last_value.unsqueeze(0)])
        r.next_values[:n] = torch.where(r.truncated[:n].to(self.device), r.next_values[:n], following)
        collected = episodes_of(episodes, n * self.num_envs)
        return collected | {"preempted": n < self.cfg.num_steps} if preempting else collected

    def annealed(self) -> list[Annealed]:
        c = self.cfg
        return [("learning rate", lambda p: c.lr * (1.0 - p), 1.0)] if c.anneal_lr else []

    def update(self, progress: float) -> dict[str, float]:
        """Epochs x minibatches of PPO on the last rollout. `progress` in [0, 1) is the fraction of training
        done, which sets the annealed learning rate."""
        c, r, n = self.cfg, self.rollout, self.length
        self.model.train()
        lr = c.lr * (1.0 - progress) if c.anneal_lr else c.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        rewards, terminated, truncated = (x[:n].to(self.device) for x in (r.rewards, r.terminated, r.truncated))
        advantages, returns = compute_gae(
            rewards, r.values[:n], r.next_values[:n], terminated, terminated | truncated, c.gamma, c.gae_lambda
        )
        batch = {
            "obs": r.obs[:n],
            "actions": r.actions[:n],
            "old_log_probs": r.log_probs[:n],
            "advantages": advantages,
            "returns": returns,
            "old_values": r.values[:n],
        }
        weights = self._sample_weights()
        totals = torch.zeros(len(STATS), device=self.device)
        count = 0
        for _epoch in range(c.update_epochs):
            for j, minibatch in enumerate(self._minibatches(batch)):
                weight = None if weights is None else weights[j]
                # ranks of unequal rollouts: every sample of every rank weighs alike
                mean_all = self.mean_all if weight is None else weighted_mean_all(self.mean_all, weight)
                stats = self.parts.minibatch_step(minibatch, mean_all, weight)
                totals += stats
                count += 1
            # Every rank takes this decision on the same all-reduced KL, so all stop together.
            if c.target_kl is not None and self.mean_all(stats[STATS.index("approx_kl")]) > c.target_kl:
                break
        out = dict(zip(STATS, (totals / count).tolist()))
        mean_all = self.mean_all if weights is None else weighted_mean_all(self.mean_all, weights[-1])  # all samples
        out.update(
            learning_rate=lr,
            explained_variance=explained_variance(r.values[:n].flatten(), returns.flatten(), mean_all),
            epochs=float(_epoch + 1),
        )
        return out

    def minibatch_step(self, minibatch: dict[str, Tensor], mean_all: MeanAll, weight: float | None) -> Tensor:
        """One gradient step on a minibatch (its advantages normalized first, with norm_adv); its stats."""
        c = self.cfg
        if c.norm_adv:  # per minibatch, over all ranks' minibatches
            minibatch["advantages"] = normalize_advantages(minibatch["advantages"], mean_all)
        loss, stats = self.parts.learner(**minibatch)
        if weight is not None:  # DDP averages the ranks' gradients: this makes it the global mean's
            loss, stats = loss * weight, stats * weight
        self.optimizer.zero_grad()
        loss.backward()
        require_finite(self.parts.clip_grad_norm_(self.trained, c.max_grad_norm), "the PPO gradient norm")
        self.optimizer.step()
        return stats

    def _sample_weights(self) -> list[float] | None:
        """With preemption, each minibatch's weight on this rank: its size over the mean size of that minibatch
        across ranks (1 when all are equal), then the same for the whole rollout; None without preemption, whose
        rollouts are all full."""
        if self.finish_line is None:
            return None
        c, n = self.cfg, self.length
        if self.recurrent:  # num_envs / num_minibatches whole env sequences of n steps each
            sizes = [n * (self.num_envs // c.num_minibatches)] * c.num_minibatches
        else:
            sizes = [s.stop - s.start for s in minibatch_slices(n * self.num_envs, c.num_minibatches)]
        sizes.append(n * self.num_envs)
        sizes = torch.tensor(sizes, dtype=torch.float64)
        return (sizes / self.mean_all(sizes)).tolist()

    def _minibatches(self, batch: dict[str, Tensor]) -> Iterator[dict[str, Tensor]]:
        """One epoch's minibatches of the rollout `batch` ([T, N, ...] each). Feedforward: random single steps.
        Recurrent: random whole env sequences [T, n], with their initial states and episode starts, so the core
        replays each env's rollout as it acted."""
        c, r = self.cfg, self.rollout
        if not self.recurrent:
            # One gather per tensor and epoch; the minibatches are then slices of it. The permutation comes from
            # the CPU generator (whose state checkpoints hold) and moves to the device.
            perm = torch.randperm(self.length * self.num_envs).to(self.device)
            shuffled = {k: take_rows(v.flatten(0, 1), perm) for k, v in batch.items()}
            for part in minibatch_slices(len(perm), c.num_minibatches):
                yield {k: v[part] for k, v in shuffled.items()}
            return
        starts = r.starts[: self.length]
        for idx in minibatch_indices(self.num_envs, c.num_minibatches):
            idx = idx.to(self.device)
            yield {k: v[:, idx] for k, v in batch.items()} | {"state": r.initial_state[idx], "starts": starts[:, idx]}

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = True, starts: np.ndarray | None = None) -> np.ndarray:
        """Actions for a batch of raw observations [B, ...] (evaluation and play). `starts` [B] marks the envs
        whose episode starts with this observation: a recurrent policy carries one state per env from call to
        call (apart from training's) and resets it there, and starts afresh when B changes; a feedforward
        policy ignores it."""
        self.model.eval()
        x = self.preprocess(obs)
        if not self.recurrent:
            return self.model.act(x, deterministic)[0].cpu().numpy()
        if self.eval_state is None or len(self.eval_state) != len(x):
            self.eval_state = self.model.initial_state(len(x), self.device)
        starts = torch.zeros(len(x), dtype=torch.bool) if starts is None else torch.as_tensor(starts)
        action, _, _, self.eval_state = self.model.act(x, self.eval_state, starts.to(self.device), deterministic)
        return action.cpu().numpy()

    def state_dict(self) -> dict:
        """What every rank shares: networks, optimizer, normalizers."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "obs_rms": self.obs_rms.state_dict() if self.obs_rms else None,
            "ret_rms": self.ret_rms.state_dict() if self.ret_rms else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.obs_rms is not None:
            self.obs_rms.load_state_dict(state["obs_rms"])
        if self.ret_rms is not None:
            self.ret_rms.load_state_dict(state["ret_rms"])

    def rank_state(self) -> dict:
        """What is this rank's own: where its envs are (the next observation, the running returns, and for a
        recurrent policy each env's state and episode-start flag)."""
        cursor = {
            "next_obs": torch.from_numpy(np.array(self.next_obs)),
            "discounted_return": torch.from_numpy(self.discounted_return.copy()),
        }
        if self.recurrent:
            cursor |= {"core_state": self.state.cpu().clone(), "episode_starts": self.starts.cpu().clone()}
        return cursor

    def load_rank_state(self, state: dict) -> None:
        self.next_obs = state["next_obs"].numpy().copy()
        self.discounted_return = state["discounted_return"].numpy().copy()
        if self.recurrent:
            self.state = state["core_state"].to(self.device).clone()
            self.starts = state["episode_starts"].to(self.device).clone()

    def shard_state(self) -> None:
        """PPO has no per-rank state too large to gather (DQN's replay shard is)."""
        return None

    def load_shard_state(self, state: dict) -> None:
        raise ValueError("PPO keeps no replay shard")
