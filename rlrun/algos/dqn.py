"""Deep Q-learning (Mnih et al. 2015) as double DQN (van Hasselt et al. 2016): a target network synced by copy
or Polyak averaging, n-step returns, MSE or Huber loss, linearly decayed epsilon-greedy exploration, optional dueling
head, and uniform or prioritized replay whose shards across ranks sample as one buffer (rlrun/buffers/replay.py).
This is the reference (torch.optim.Adam); with algo.fast, rlrun/fast/ swaps in a faster optimizer."""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from rlrun.algos.configs import DQNConfig
from rlrun.algos.protocol import EnvSpec, Reductions, Wrap, episodes_of
from rlrun.buffers.replay import ReplayBuffer
from rlrun.config import ModelConfig
from rlrun.envs import finished_episodes
from rlrun.errors import UserError
from rlrun.models import trainable
from rlrun.models.encoders import observation_dtype
from rlrun.models.q_network import build_q_network

log = logging.getLogger("rlrun")


def linear_schedule(start: float, end: float, fraction: float, progress: float) -> float:
    """From `start` at progress 0 to `end` at progress `fraction`, then `end` (progress in [0, 1])."""
    return end + (start - end) * max(0.0, 1.0 - progress / fraction)


def q_targets(
    online: nn.Module, target: nn.Module, next_obs: Tensor, returns: Tensor, discount: Tensor, double_q: bool
) -> Tensor:
    """n-step targets R + gamma^m Q_target(s', a') with a' = argmax Q_online(s') (double DQN) or
    argmax Q_target(s') (DQN); `discount` is gamma^m, or 0 after termination. [B]"""
    next_q = target(next_obs)
    best = (online(next_obs) if double_q else next_q).argmax(-1, keepdim=True)
    return returns + discount * next_q.gather(-1, best).squeeze(-1)


def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- tau * online + (1 - tau) * target (tau = 1: copy) for the parameters; buffers (BatchNorm's
    statistics) are copied, as SB3 does."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)  # one call, not one per tensor
        for t, o in zip(target.buffers(), online.buffers()):
            t.copy_(o)


def td_loss(q: Tensor, targets: Tensor, kind: str) -> Tensor:
    """Per-item TD loss [B]: "mse" (Q - y)^2 (CleanRL's dqn.py and dqn_atari.py), or "huber" with delta 1
    (SB3; Mnih et al. 2015's error clipping). Huber caps each item's pull at 1: with unclipped rewards the few
    terminal items can then no longer hold Q down, and Q runs away (as on CartPole); it suits Atari's
    clipped rewards."""
    if kind == "huber":
        return F.huber_loss(q, targets, reduction="none")
    return (q - targets).square()


class DQNLearner(nn.Module):
    """The loss module DDP wraps: forward(minibatch) -> (loss, |TD errors|, Q(s, a)). The loss is
    sum_i w_i td_loss(Q(s_i, a_i), y_i) / batch_size: with DDP's gradient averaging over the ranks this is the
    mean over the global batch even when ranks hold different numbers of its items (replay.py)."""

    def __init__(self, model: nn.Module, batch_size: int, loss: str = "mse"):
        super().__init__()
        self.model = model
        self.batch_size = batch_size
        self.loss = loss

    def forward(self, obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q = self.model(obs).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        loss = (weights * td_loss(q, targets, self.loss)).sum() / self.batch_size
        return loss, (q - targets).detach().abs(), q.detach()


class DQN:
    """Collects train_freq vector steps into this rank's replay shard, then runs gradient_steps updates on
    global batches drawn across all shards. Knows nothing of ranks beyond its shard's index and gather."""

    def __init__(self, cfg: DQNConfig, model_cfg: ModelConfig, spec: EnvSpec, device: torch.device, reductions=None):
        obs_space, action_space, num_envs = spec.observation_space, spec.action_space, spec.num_envs
        if not isinstance(action_space, gym.spaces.Discrete):
            raise UserError(f"algo=dqn needs a discrete action space; this env has {action_space}")
        self.cfg = cfg
        self.device = device
        self.num_envs = num_envs
        self.shards = (reductions or Reductions()).shards
        self.model = build_q_network(model_cfg, obs_space, action_space, cfg.dueling).to(device)
        self.target = copy.deepcopy(self.model).requires_grad_(False).eval()  # computes targets only
        self.learner: nn.Module = DQNLearner(self.model, cfg.batch_size, cfg.loss)
        self.trained = trainable(self.model)  # what the optimizer trains and DDP synchronizes
        self.clip_grad_norm_ = nn.utils.clip_grad_norm_  # (parameters, max_norm) -> the norm before clipping
        self.num_actions = int(action_space.n)
        self.obs_dtype = observation_dtype(obs_space.shape, obs_space.dtype)
        # np.zeros storage: pages are only allocated as the replay fills (play never fills it).
        self.replay = ReplayBuffer(
            cfg.buffer_size,
            num_envs,
            obs_space.shape,
            np.uint8 if self.obs_dtype == torch.uint8 else np.float32,
            spec.frame_stack,
            n_step=cfg.n_step,
            gamma=cfg.gamma,
            alpha=cfg.replay.alpha if cfg.replay.prioritized else None,
            priority_eps=cfg.replay.priority_eps,
        )
        # The stream that splits each global batch over the shards: seeded alike on every rank.
        self.shard_rng = torch.Generator().manual_seed(1)
        self.updates = 0
        self.env_steps_seen = 0  # by this rank since it was built: to say so when updates fail to start
        self.stall_reported = False
        self.epsilon = cfg.start_e
        self.next_obs: np.ndarray | None = None

    @functools.cached_property
    def optimizer(self) -> torch.optim.Optimizer:
        """Adam over the trained parameters, built on first use: when an acceleration puts another in its place
        first, torch._dynamo, which torch.optim's optimizers import when built (a second of start-up), never loads."""
        return torch.optim.Adam(self.trained, lr=self.cfg.lr, eps=self.cfg.adam_eps)

    @property
    def steps_per_collect(self) -> int:
        return self.cfg.train_freq * self.num_envs

    def wrap_learner(self, wrap: Wrap) -> None:
        self.learner = wrap(self.learner, self.trained)

    def start(self, obs: np.ndarray) -> None:
        self.next_obs = obs

    @property
    def update_shape(self) -> tuple[int, int, int]:
        """(batch size per rank, updates per iteration, 1): every rank must agree on it, or DDP hangs."""
        return self.cfg.batch_size, self.cfg.gradient_steps, 1

    def _obs(self, obs: np.ndarray) -> Tensor:
        return torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)

    def _explore(self, obs: np.ndarray, epsilon: float) -> np.ndarray:
        greedy = self.model(self._obs(obs)).argmax(-1).cpu()
        random = torch.randint(self.num_actions, greedy.shape)
        return torch.where(torch.rand(greedy.shape) < epsilon, random, greedy).numpy()

    @torch.inference_mode()
    def collect(self, envs, progress: float = 0.0) -> dict[str, np.ndarray]:
        """train_freq epsilon-greedy vector steps into the replay shard; returns finished episodes."""
        c = self.cfg
        self.epsilon = linear_schedule(c.start_e, c.end_e, c.exploration_fraction, progress)
        self.model.eval()  # acting; update() learns in train mode
        obs, episodes = self.next_obs, []
        self.env_steps_seen += self.steps_per_collect
        for _ in range(c.train_freq):
            actions = self._explore(obs, self.epsilon)
            next_obs, reward, terminated, truncated, info = envs.step(actions)
            self.replay.add(obs, actions, reward, terminated, truncated, info.get("final_obs"))
            ended, returns, lengths = finished_episodes(info, self.num_envs)
            if ended.any():
                episodes.append((returns[ended], lengths[ended]))
            obs = next_obs
        self.next_obs = obs
        return episodes_of(episodes)

    def update(self, progress: float) -> dict[str, float]:
        """gradient_steps updates, each on one global batch (ranks x batch_size items) drawn across the shards.
        Nothing happens until the shards hold learning_starts items together (the same decision on all ranks:
        it reads gathered numbers)."""
        c, replay = self.cfg, self.replay
        self.model.train()
        for group in self.optimizer.param_groups:  # the configured rate, also after a resume that changed it
            group["lr"] = c.lr
        beta = c.replay.beta_start + (1.0 - c.replay.beta_start) * progress
        losses, q_sum = [], 0.0
        shard_stats = self.shards.gather(replay.stats())  # [W, 4]: mass, size, min mass, max priority
        if shard_stats[:, 1].sum() < max(c.learning_starts, 1):
            self._warn_if_stalled(len(shard_stats), int(shard_stats[:, 1].sum()))
            return self._update_stats(beta)
        if self.updates == 0:  # DDP gave every rank rank 0's network; the target starts from it, not from our own
            polyak_update(self.target, self.model, 1.0)
        for step in range(c.gradient_steps):
            if step > 0 and c.replay.prioritized:  # priorities changed: the shards' masses too (uniform: not)
                shard_stats = self.shards.gather(replay.stats())
            loss, q = self._step(shard_stats, beta)
            losses.append(loss)
            q_sum += float(q.sum())
        if c.replay.prioritized:  # new items enter at the largest priority any shard has seen, as in one buffer
            replay.max_priority = float(self.shards.gather(torch.tensor([replay.max_priority])).max())
        # Q summed over this rank's items / (batch_size x updates): the ranks' mean is the global batch's mean,
        # as for the loss, whatever share of each batch a rank held.
        return self._update_stats(beta, losses, q_sum / (c.batch_size * c.gradient_steps))

    def _warn_if_stalled(self, shards: int, items: int) -> None:
        """Say once when the replay should hold learning_starts items by now (every step it saw, but the n-step
        windows and frame stacks still open) and updates have not started."""
        c = self.cfg
        expected = (self.env_steps_seen - self.num_envs * (c.n_step + self.replay.k)) * shards
        if not self.stall_reported and expected > c.learning_starts:
            self.stall_reported = True
            log.warning(
                "dqn: no update yet after %d env steps: the replay holds %d items, algo.learning_starts=%d",
                self.env_steps_seen * shards,
                items,
                c.learning_starts,
            )

    def _update_stats(self, beta: float, losses: Sequence[float] = (), q_mean: float = 0.0) -> dict[str, float]:
        """What an update logs: td_loss (mean over its updates) and q_values (this rank's part of the global
        batch's mean Q) once it has made any."""
        c = self.cfg
        out = {"learning_rate": c.lr, "charts/epsilon": self.epsilon, "charts/updates": float(self.updates)}
        if losses:
            out |= {"td_loss": sum(losses) / len(losses), "q_values": q_mean}
        if c.replay.prioritized:
            out["charts/beta"] = beta
        return out

    def _step(self, shard_stats: Tensor, beta: float) -> tuple[float, Tensor]:
        """One update on this rank's share of a global batch: (its loss, Q(s, a) of its items)."""
        c, replay = self.cfg, self.replay
        items, weights = replay.sample_global(shard_stats, self.shards.index, c.batch_size, beta, self.shard_rng)
        batch = {k: torch.as_tensor(v, device=self.device) for k, v in replay.batch(items).items()}
        batch["obs"], batch["next_obs"] = self._obs(batch["obs"]), self._obs(batch["next_obs"])
        with torch.no_grad():
            next_obs, returns, discount = batch["next_obs"], batch["returns"], batch["discount"]
            targets = q_targets(self.model, self.target, next_obs, returns, discount, c.double_q)
        weights = torch.as_tensor(weights, dtype=torch.float32, device=self.device)
        loss, td_abs, q = self.learner(batch["obs"], batch["actions"], targets, weights)
        self.optimizer.zero_grad()
        loss.backward()
        self.clip_grad_norm_(self.trained, c.max_grad_norm)
        self.optimizer.step()
        replay.update_priorities(items, td_abs.cpu().numpy())
        self.updates += 1
        if self.updates % c.target_update_interval == 0:
            polyak_update(self.target, self.model, c.tau)
        return loss.item(), q

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = True, starts: np.ndarray | None = None) -> np.ndarray:
        """Greedy actions (deterministic) or epsilon-greedy with the final epsilon, for evaluation and play.
        (`starts`, the envs whose episodes begin here, matters only to policies with memory.)"""
        self.model.eval()
        return self._explore(obs, 0.0 if deterministic else self.cfg.end_e)

    def state_dict(self) -> dict:
        """What every rank shares: networks, optimizer, update count, the shard-split stream, max priority."""
        return {
            "model": self.model.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "shard_rng": self.shard_rng.get_state(),
            "max_priority": self.replay.max_priority,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]
        self.shard_rng.set_state(state["shard_rng"])
        self.replay.max_priority = state["max_priority"]

    def rank_state(self) -> dict:
        return {"next_obs": torch.from_numpy(np.array(self.next_obs))}

    def load_rank_state(self, state: dict) -> None:
        self.next_obs = state["next_obs"].numpy().copy()

    def shard_state(self) -> dict | None:
        """This rank's replay shard, when configured to be checkpointed (each rank writes its own file)."""
        return self.replay.state_dict() if self.cfg.replay.checkpoint else None

    def load_shard_state(self, state: dict) -> None:
        if tuple(state["frames"].shape) != self.replay.frames.shape:  # saved by an older rlrun, or another size
            log.warning("replay shard of another layout (%s rows): this rank refills its replay", len(state["frames"]))
            return
        self.replay.load_state_dict(state)
