"""Proximal Policy Optimization (Schulman et al. 2017) with the implementation details of Huang et al. 2022
("The 37 implementation details of PPO"): GAE, clipped surrogate and value loss, entropy bonus, advantage
normalization, global grad-norm clipping, linear LR annealing, optional target-KL stop and normalization.
Recurrent policies (the LSTM details there; CleanRL's ppo_atari_lstm.py) carry their state across rollouts and
train on whole env sequences with the state reset where episodes start, without padding or chunking."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.flat_adam import FlatAdam
from rlrun.algos.fused_ppo import FusedPPOLoss
from rlrun.algos.normalize import MeanAll, RunningMoments, identity, normalize_advantages
from rlrun.algos.returns import compute_gae, explained_variance
from rlrun.algos.worker_acting import WorkerActing, can_act_in_workers
from rlrun.buffers.rollout import Rollout, minibatch_indices, take_rows
from rlrun.config import ModelConfig, PPOConfig
from rlrun.envs import finished_episodes
from rlrun.models import ActorCritic, RecurrentActorCritic, build_actor_critic
from rlrun.models.encoders import observation_dtype
from rlrun.models.numpy_policy import NumpyPolicy


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
    module, so that its forward is where gradients get synchronized. A feedforward MLP actor-critic takes the
    fused path (FusedPPOLoss: the same loss with its gradient by hand); a change to the loss below must be
    made there too, where tests/test_fast_paths.py checks the two agree."""

    def __init__(self, model: nn.Module, cfg: PPOConfig, mean_all: MeanAll = identity):
        super().__init__()
        self.model = model
        self.cfg = cfg
        self.mean_all = mean_all
        self.fused = model.fused_params() if isinstance(model, ActorCritic) else None

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
        """The PPO loss of a minibatch of steps [B, ...]; for a recurrent model, of env sequences [T, B, ...]
        with `memory` = their initial `state` [B, S] and episode `starts` [T, B]."""
        c = self.cfg
        if c.norm_adv:
            advantages = normalize_advantages(advantages, self.mean_all)
        if self.fused is not None:
            m = self.model
            return FusedPPOLoss.apply(
                c, m.trunk.relu, m.discrete, obs, actions, old_log_probs, advantages, returns, old_values, *self.fused
            )
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


_STEP_FIELDS = ("obs", "actions", "log_probs", "values")  # what acting stores per step, as Rollout names them


class PPO:
    """Collects rollouts from a vector env and updates the actor-critic. Knows nothing of ranks: cross-rank
    statistics go through `mean_all`, and the caller may wrap `learner` in DDP."""

    def __init__(
        self,
        cfg: PPOConfig,
        model_cfg: ModelConfig,
        obs_space: gym.spaces.Box,
        action_space: gym.Space,
        num_envs: int,
        device: torch.device,
        mean_all: MeanAll = identity,
    ):
        self.cfg = cfg
        self.device = device
        self.mean_all = mean_all
        self.num_envs = num_envs
        self.model_spec = (model_cfg, obs_space, action_space)  # what env workers build their copies from
        self.model = build_actor_critic(model_cfg, obs_space, action_space).to(device)
        self.recurrent = isinstance(self.model, RecurrentActorCritic)
        self.learner: nn.Module = PPOLearner(self.model, cfg, mean_all)
        self.optimizer = FlatAdam(list(self.model.parameters()), cfg.lr, cfg.adam_eps)
        # Acting on CPU goes through numpy where it can (the fused MLP): after FlatAdam, whose buffer it views.
        cpu_mlp = device.type == "cpu" and self.learner.fused is not None
        self.numpy_policy = NumpyPolicy(self.model) if cpu_mlp else None
        discrete = isinstance(action_space, gym.spaces.Discrete)
        self.obs_dtype = observation_dtype(obs_space.shape, obs_space.dtype)
        self.rollout = Rollout(
            cfg.num_steps,
            num_envs,
            obs_space.shape,
            torch.float32 if cfg.normalize_obs else self.obs_dtype,
            () if discrete else action_space.shape,
            torch.long if discrete else torch.float32,
            device,
            self.model.state_size if self.recurrent else 0,
        )
        self.obs_rms = RunningMoments(obs_space.shape, mean_all, device) if cfg.normalize_obs else None
        self.ret_rms = RunningMoments((), mean_all) if cfg.normalize_reward else None
        self.next_obs: np.ndarray | None = None  # the observation the next collect starts from
        self.discounted_return = np.zeros(num_envs)  # per env, for reward scaling
        if self.recurrent:  # per env, carried across rollouts: the core's state, and whether next_obs starts an episode
            self.state = self.model.initial_state(num_envs, device)
            self.starts = torch.ones(num_envs, dtype=torch.bool, device=device)
        self.eval_state: Tensor | None = None  # what act() carries between calls (evaluation, play)
        self.worker_acting: WorkerActing | None = None  # set up on the first collect from envs whose workers act

    @property
    def steps_per_collect(self) -> int:
        return self.cfg.num_steps * self.num_envs

    def preprocess(self, obs: np.ndarray, update_stats: bool = False) -> Tensor:
        """Observations as the model sees them: a tensor on the device, normalized if configured."""
        x = torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)
        if self.obs_rms is None:
            return x
        if update_stats:
            self.obs_rms.update(x)
        return self.obs_rms.normalize(x, self.cfg.clip_obs)

    def _scale_rewards(self, rewards: np.ndarray, done: np.ndarray, envs: slice) -> np.ndarray:
        """Divide rewards by the running std of the discounted return (as SB3's VecNormalize)."""
        ret = self.discounted_return[envs] * self.cfg.gamma + rewards
        self.ret_rms.update(torch.as_tensor(ret))
        ret[done] = 0.0
        self.discounted_return[envs] = ret
        scaled = rewards / np.sqrt(self.ret_rms.var.item() + 1e-8)
        return np.clip(scaled, -self.cfg.clip_obs, self.cfg.clip_obs)

    def _act(self, obs: np.ndarray, t: int, envs: slice, steps: dict[str, list[Tensor]]) -> np.ndarray:
        """Act for the envs in `envs` at rollout step t, appending what the policy produced to `steps`
        (stacked into the rollout at the end: one copy per rollout, not four small ones per step)."""
        x = self.preprocess(obs, update_stats=True)
        if self.numpy_policy is not None:
            acted = [torch.from_numpy(a) for a in self.numpy_policy.act(x.numpy())]
        elif self.recurrent:
            self.rollout.starts[t, envs] = self.starts[envs]
            *acted, self.state[envs] = self.model.act(x, self.state[envs], self.starts[envs])
        else:
            acted = self.model.act(x)
        for name, v in zip(_STEP_FIELDS, (x, *acted)):
            steps[name].append(v)
        return acted[0].cpu().numpy()

    def _observe(self, result: tuple, t: int, envs: slice, episodes: list) -> np.ndarray:
        """Store what the envs in `envs` returned for rollout step t; returns their next observations."""
        r = self.rollout
        obs, reward, terminated, truncated, info = result
        if self.ret_rms is not None:
            reward = self._scale_rewards(reward, terminated | truncated, envs)
        r.rewards_np[t, envs] = reward
        r.terminated_np[t, envs] = terminated
        r.truncated_np[t, envs] = truncated
        if truncated.any():
            final = np.stack(info["final_obs"][truncated])
            idx = torch.arange(envs.start, envs.stop, device=self.device)[
                torch.as_tensor(truncated, device=self.device)
            ]
            # The final observation continues the truncated episode: a recurrent model reads it with the
            # episode's state (not yet reset), as it would have on the next step.
            r.next_values[t, idx] = self._value(final, idx, starts=torch.zeros_like(idx, dtype=torch.bool))
        if self.recurrent:
            self.starts[envs] = torch.as_tensor(terminated | truncated, device=self.device)
        if "final_info" in info:  # some episode ended in this step
            ended, returns, lengths = finished_episodes(info, len(reward))
            episodes.append((returns[ended], lengths[ended]))
        return obs

    def _value(self, obs: np.ndarray, envs: Tensor | slice, starts: Tensor | None) -> Tensor:
        """V of raw observations of the envs `envs`; a recurrent model steps on from each one's current state,
        reset where `starts`, without keeping the state it would move to."""
        x = self.preprocess(obs)
        if not self.recurrent:
            return self.model.value(x)
        return self.model.value(x, self.state[envs], starts)

    @torch.inference_mode()
    def collect(self, envs, progress: float = 0.0) -> dict[str, np.ndarray]:
        """One rollout of num_steps x num_envs transitions into self.rollout; returns finished episodes.
        (`progress`, the fraction of training done, is for algorithms with exploration schedules.)

        Where the envs' workers can act (worker_acting.py), each runs the rollout of its envs. Otherwise the
        policy acts here, for the envs in groups (one, or two when the worker pool double-buffers): a group
        steps while the policy acts for the next. The rollout layout is the same either way.
        """
        r = self.rollout
        if self.recurrent:
            r.initial_state.copy_(self.state)
        episodes = self._collect_in_workers() if self._workers_act(envs) else self._act_and_step(envs)
        last_value = self._value(self.next_obs, slice(None), self.starts if self.recurrent else None)
        # Bootstrap from the next step's value except where the episode was truncated (set in _observe).
        following = torch.cat([r.values[1:], last_value.unsqueeze(0)])
        r.next_values.copy_(torch.where(r.truncated.to(self.device), r.next_values, following))
        return {
            "episode_returns": np.concatenate([e[0] for e in episodes] or [np.zeros(0)]),
            "episode_lengths": np.concatenate([e[1] for e in episodes] or [np.zeros(0, dtype=np.int64)]),
        }

    def _workers_act(self, envs) -> bool:
        if not can_act_in_workers(self.cfg, envs, self.model, self.device):
            return False
        if self.worker_acting is None or self.worker_acting.pool is not envs:
            self.worker_acting = WorkerActing(envs, self.model, self.model_spec, self.rollout)
        return True

    def _collect_in_workers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """collect when the envs' workers act; the (returns, lengths) of the episodes that ended."""
        r = self.rollout
        self.next_obs, returns, lengths = self.worker_acting.collect(self.optimizer.params, self.next_obs, r)
        if self.ret_rms is not None:  # step by step, as when acting here
            done = r.terminated_np | r.truncated_np
            for t in range(self.cfg.num_steps):
                r.rewards_np[t] = self._scale_rewards(r.rewards_np[t], done[t], slice(None))
        return [(returns, lengths)]

    def _act_and_step(self, envs) -> list[tuple[np.ndarray, np.ndarray]]:
        """collect's loop when the policy acts here; the (returns, lengths) of the episodes that ended."""
        r, groups, episodes = self.rollout, envs.groups, []
        obs = [self.next_obs[g] for g in groups]
        steps = [{name: [] for name in _STEP_FIELDS} for _ in groups]
        for t in range(self.cfg.num_steps):
            for i, g in enumerate(groups):
                if t > 0:
                    obs[i] = self._observe(envs.recv(i), t - 1, g, episodes)
                envs.send(i, self._act(obs[i], t, g, steps[i]))
        for i, g in enumerate(groups):
            obs[i] = self._observe(envs.recv(i), self.cfg.num_steps - 1, g, episodes)
            for name, values in steps[i].items():
                getattr(r, name)[:, g] = torch.stack(values)
        self.next_obs = np.concatenate(obs)  # the groups' observations, in env order
        return episodes

    def update(self, progress: float) -> dict[str, float]:
        """Epochs x minibatches of PPO on the last rollout. `progress` in [0, 1) is the fraction of training
        done, which sets the annealed learning rate."""
        c, r = self.cfg, self.rollout
        lr = c.lr * (1.0 - progress) if c.anneal_lr else c.lr
        rewards, terminated, truncated = (x.to(self.device) for x in (r.rewards, r.terminated, r.truncated))
        advantages, returns = compute_gae(
            rewards, r.values, r.next_values, terminated, terminated | truncated, c.gamma, c.gae_lambda
        )
        batch = {
            "obs": r.obs,
            "actions": r.actions,
            "old_log_probs": r.log_probs,
            "advantages": advantages,
            "returns": returns,
            "old_values": r.values,
        }
        totals = torch.zeros(len(STATS), device=self.device)
        count = 0
        for _epoch in range(c.update_epochs):
            for minibatch in self._minibatches(batch):
                loss, stats = self.learner(**minibatch)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.clip_grad_norm(c.max_grad_norm)
                self.optimizer.step(lr)
                totals += stats
                count += 1
            # Every rank takes this decision on the same all-reduced KL, so all stop together.
            if c.target_kl is not None and self.mean_all(stats[STATS.index("approx_kl")]) > c.target_kl:
                break
        out = dict(zip(STATS, (totals / count).tolist()))
        out.update(
            learning_rate=lr,
            explained_variance=explained_variance(r.values.flatten(), returns.flatten(), self.mean_all),
            epochs=float(_epoch + 1),
        )
        return out

    def _minibatches(self, batch: dict[str, Tensor]) -> Iterator[dict[str, Tensor]]:
        """One epoch's minibatches of the rollout `batch` ([T, N, ...] each). Feedforward: random single steps.
        Recurrent: random whole env sequences [T, n], with their initial states and episode starts, so the core
        replays each env's rollout as it acted."""
        c, r = self.cfg, self.rollout
        if not self.recurrent:
            # One gather per tensor and epoch; the minibatches are then slices of it. (The permutation is
            # minibatch_indices' concatenated, so the RNG stream and the minibatches are what they were.)
            # The permutation comes from the CPU generator (whose state checkpoints hold) and moves to the device.
            perm = torch.cat(minibatch_indices(self.steps_per_collect, c.num_minibatches)).to(self.device)
            shuffled = {k: take_rows(v.flatten(0, 1), perm) for k, v in batch.items()}
            size = self.steps_per_collect // c.num_minibatches
            for start in range(0, self.steps_per_collect, size):
                yield {k: v[start : start + size] for k, v in shuffled.items()}
            return
        for idx in minibatch_indices(self.num_envs, c.num_minibatches):
            idx = idx.to(self.device)
            yield {k: v[:, idx] for k, v in batch.items()} | {"state": r.initial_state[idx], "starts": r.starts[:, idx]}

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = True, starts: np.ndarray | None = None) -> np.ndarray:
        """Actions for a batch of raw observations [B, ...] (evaluation and play). `starts` [B] marks the envs
        whose episode starts with this observation: a recurrent policy carries one state per env from call to
        call (apart from training's) and resets it there, and starts afresh when B changes; a feedforward
        policy ignores it."""
        x = self.preprocess(obs)
        if not self.recurrent:
            return self.model.act(x, deterministic)[0].cpu().numpy()
        if self.eval_state is None or len(self.eval_state) != len(x):
            self.eval_state = self.model.initial_state(len(x), self.device)
        starts = torch.zeros(len(x), dtype=torch.bool) if starts is None else torch.as_tensor(starts)
        action, _, _, self.eval_state = self.model.act(x, self.eval_state, starts.to(self.device), deterministic)
        return action.cpu().numpy()

    @property
    def update_shape(self) -> tuple[int, int, int]:
        """(minibatch size, minibatches per epoch, epochs): every rank must agree on it, or DDP hangs. A
        recurrent model's minibatch is num_envs / num_minibatches whole sequences of num_steps."""
        c = self.cfg
        return self.steps_per_collect // c.num_minibatches, c.num_minibatches, c.update_epochs

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

    def cursor_state(self) -> dict:
        """What is this rank's own: where its envs are (the next observation, the running returns, and for a
        recurrent policy each env's state and episode-start flag)."""
        cursor = {
            "next_obs": torch.from_numpy(np.array(self.next_obs)),
            "discounted_return": torch.from_numpy(self.discounted_return.copy()),
        }
        if self.recurrent:
            cursor |= {"core_state": self.state.cpu().clone(), "episode_starts": self.starts.cpu().clone()}
        return cursor

    def load_cursor_state(self, state: dict) -> None:
        self.next_obs = state["next_obs"].numpy().copy()
        self.discounted_return = state["discounted_return"].numpy().copy()
        if self.recurrent:
            self.state = state["core_state"].to(self.device).clone()
            self.starts = state["episode_starts"].to(self.device).clone()

    def shard_state(self) -> None:
        """PPO has no per-rank state too large to gather (DQN's replay shard is)."""
        return None
