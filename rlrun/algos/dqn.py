"""Deep Q-learning (Mnih et al. 2015) as double DQN (van Hasselt et al. 2016): a target network synced by copy
or Polyak averaging, n-step returns, MSE or Huber loss, linearly decayed epsilon-greedy exploration, optional dueling
head, and uniform or prioritized replay whose shards across ranks sample as one buffer (rlrun/buffers/replay.py).
This is the reference (torch.optim.Adam); with algo.fast, rlrun/fast/ swaps in faster parts (DQNParts)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from rlrun.algos.configs import DQNConfig
from rlrun.algos.finite import require_finite
from rlrun.algos.off_policy import ReplayAlgorithm, polyak_update
from rlrun.algos.parts import ClipGradNorm, MakeOptimizer, Optimizer, adam
from rlrun.algos.protocol import Annealed, EnvSpec, Reductions, VectorEnv, Wrap
from rlrun.config import ModelConfig
from rlrun.errors import UserError
from rlrun.models import trainable
from rlrun.models.actor_critic import action_mask_size
from rlrun.models.encoders import observation_dtype
from rlrun.models.q_network import build_q_network


def linear_schedule(start: float, end: float, fraction: float, progress: float) -> float:
    """From `start` at progress 0 to `end` at progress `fraction`, then `end` (progress in [0, 1])."""
    return end + (start - end) * max(0.0, 1.0 - progress / fraction)


def q_targets(
    online: nn.Module, target: nn.Module, next_obs: Tensor, returns: Tensor, discount: Tensor, double_q: bool
) -> Tensor:
    """n-step targets R + gamma^m Q_target(s', a') with a' = argmax Q_online(s') (double DQN) or
    argmax Q_target(s') (DQN); `discount` is gamma^m, or 0 after termination. [B]"""
    next_q: Tensor = target(next_obs)
    best = (online(next_obs) if double_q else next_q).argmax(-1, keepdim=True)
    return returns + discount * next_q.gather(-1, best).squeeze(-1)


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


# (obs [N, ...] as the env gives them, explore [N] bool, random actions [N]) -> actions [N]: the random action where
# explore, else the greedy one in Q
EpsilonGreedy = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
# A vector step's exploration noise (DQN.draw_noise): each env's coin [N] and its random action's pick [N]
Noise = tuple[np.ndarray, np.ndarray]
# (next_obs [B, ...], returns [B], discount [B]) -> the n-step targets [B], as q_targets with DQN's networks
QTargets = Callable[[Tensor, Tensor, Tensor], Tensor]
# (obs, actions, targets, weights) -> (loss, |TD errors| [B], Q(s, a) [B]) of the learner, after one optimizer step on
# the loss
GradientStep = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


@dataclass
class DQNParts:
    """What an acceleration may replace in DQN (rlrun/algos/parts.py), each with a part of the same signature. DQN
    builds them from this file's code and calls them through here."""

    learner: nn.Module  # forward(obs, actions, targets, weights) -> (loss, |TD|, Q), as DQNLearner; what DDP wraps
    targets: QTargets
    epsilon_greedy: EpsilonGreedy  # acting, while collecting and for evaluation, on DQN's draws (DQN.draw_noise)
    make_optimizer: MakeOptimizer  # over DQN.trained, on first use
    gradient_step: GradientStep  # one optimizer step on the learner's loss (DQN.gradient_step)
    clip_grad_norm_: ClipGradNorm = nn.utils.clip_grad_norm_


class DQN(ReplayAlgorithm):
    """Epsilon-greedy collection into the replay shard, double-DQN updates on global batches (off_policy.py)."""

    def __init__(
        self,
        cfg: DQNConfig,
        model_cfg: ModelConfig,
        spec: EnvSpec,
        device: torch.device,
        reductions: Reductions | None = None,
    ):
        obs_space, action_space = spec.observation_space, spec.action_space
        if not isinstance(action_space, gym.spaces.Discrete):
            raise UserError(f"algo=dqn needs a discrete action space; this env has {action_space}")
        super().__init__(
            cfg, spec, device, reductions or Reductions(), observation_dtype(obs_space.shape, obs_space.dtype)
        )
        self.model = build_q_network(model_cfg, obs_space, action_space, cfg.dueling).to(device)
        self.target = copy.deepcopy(self.model).requires_grad_(False).eval()  # computes targets only
        # rlrun's own networks act alike in train and eval mode (no BatchNorm, no dropout): no switching between them,
        # a walk over every module twice per iteration. A user's network may have them.
        self.modal = model_cfg._target_ is not None
        self.trained = trainable(self.model)  # what the optimizer trains and DDP synchronizes
        self.num_actions = int(action_space.n)
        self.mask_size = action_mask_size(obs_space)  # the env's action masks end its observations
        self.epsilon = cfg.start_e
        self.noise: Iterator[Noise] = iter(())  # this collect's exploration noise, a step's at a time
        self.parts = DQNParts(  # what an acceleration may replace
            learner=DQNLearner(self.model, cfg.batch_size, cfg.loss),
            targets=functools.partial(q_targets, self.model, self.target, double_q=cfg.double_q),
            epsilon_greedy=self._greedy_or_random,
            make_optimizer=adam(cfg.lr, cfg.adam_eps),
            gradient_step=self.gradient_step,
        )

    @functools.cached_property
    def optimizer(self) -> Optimizer:
        """The parts' optimizer over the trained parameters, built on first use."""
        return self.parts.make_optimizer(self.trained)

    def _greedy_or_random(self, obs: np.ndarray, explore: np.ndarray, random: np.ndarray) -> np.ndarray:
        greedy = self.model(self._obs(obs)).argmax(-1).cpu().numpy()
        return np.where(explore, random, greedy)

    def draw_noise(self, steps: int, n: int, generator: torch.Generator | None = None) -> Iterator[Noise]:
        """The exploration noise of `steps` vector steps of `n` envs, drawn at once from `generator` (torch's global
        one when None): per step, each env's coin (it explores where the coin is below epsilon) and the uniform that
        picks its random action (random_actions). Two draws for a collect, where a draw per step cost more than acting
        on one env."""
        coins = torch.rand((steps, n), generator=generator).numpy()
        picks = torch.rand((steps, n), dtype=torch.float64, generator=generator).numpy()
        return zip(coins, picks, strict=True)

    def random_actions(self, obs: np.ndarray, picks: np.ndarray) -> np.ndarray:
        """Actions [N] uniform over each env's legal actions (all, without action masks), chosen by `picks` [N]
        uniform in [0, 1)."""
        if not self.mask_size:
            return (picks * self.num_actions).astype(np.int64)
        legal = np.asarray(obs).reshape(len(obs), -1)[:, -self.mask_size :] >= 0.5  # the masks end the observations
        index = (picks * np.count_nonzero(legal, axis=1)).astype(np.int64)  # among the legal ones, in order
        chosen: np.ndarray = np.argmax(np.cumsum(legal, axis=1) > index[:, None], axis=1)
        return chosen

    def epsilon_greedy(self, obs: np.ndarray, epsilon: float, noise: Noise) -> np.ndarray:
        """Actions [N] for obs [N, ...]: random among the legal ones with probability epsilon, else greedy in Q."""
        coins, picks = noise
        return self.parts.epsilon_greedy(obs, coins < epsilon, self.random_actions(obs, picks))

    def step_noise(self, noise: Iterator[Noise], n: int, generator: torch.Generator | None = None) -> Noise:
        """The next step's of a collect's `noise`, or (a step outside a collect) one step's of `n` envs drawn now."""
        step = next(noise, None)
        return next(self.draw_noise(1, n, generator)) if step is None else step

    def collect(self, envs: VectorEnv, progress: float = 0.0) -> dict[str, Any]:
        self.noise = self.draw_noise(self.cfg.train_freq, self.num_envs)
        return super().collect(envs, progress)

    def explore(self, obs: np.ndarray, progress: float) -> tuple[np.ndarray, np.ndarray]:
        c = self.cfg
        self.epsilon = linear_schedule(c.start_e, c.end_e, c.exploration_fraction, progress)
        actions = self.epsilon_greedy(obs, self.epsilon, self.step_noise(self.noise, len(obs)))
        return actions, actions

    def wrap_learner(self, wrap: Wrap) -> None:
        self.parts.learner = wrap(self.parts.learner, self.trained)
        self.sync_targets()

    def sync_targets(self) -> None:
        polyak_update(self.target, self.model, 1.0)

    def annealed(self) -> list[Annealed]:
        c = self.cfg
        epsilon = (
            "epsilon",
            lambda p: linear_schedule(c.start_e, c.end_e, c.exploration_fraction, p),
            c.exploration_fraction,
        )
        return [epsilon, *super().annealed()]

    def charts(self) -> dict[str, float]:
        return {"learning_rate": self.cfg.lr, "charts/epsilon": self.epsilon}

    def learn(self, batch: dict[str, Tensor], weights: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """One double-DQN update: td_loss and q_values (Q(s, a) summed over this rank's items / batch_size)."""
        c = self.cfg
        with torch.no_grad():
            targets = self.parts.targets(batch["next_obs"], batch["returns"], batch["discount"])
        loss, td_abs, q = self.parts.gradient_step(batch["obs"], batch["actions"], targets, weights)
        if self.updates % c.target_update_interval == 0:
            polyak_update(self.target, self.model, c.tau)
        return {"td_loss": loss.detach(), "q_values": q.sum() / c.batch_size}, td_abs

    def gradient_step(
        self, obs: Tensor, actions: Tensor, targets: Tensor, weights: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One optimizer step on the learner's loss of a batch; the learner's (loss, |TD errors|, Q(s, a))."""
        loss, td_abs, q = self.parts.learner(obs, actions, targets, weights)
        self.optimizer.zero_grad()
        loss.backward()
        require_finite(self.parts.clip_grad_norm_(self.trained, self.cfg.max_grad_norm), "the DQN gradient norm")
        self.optimizer.step()
        return loss, td_abs, q

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = True, starts: np.ndarray | None = None) -> np.ndarray:
        """Greedy actions (deterministic) or epsilon-greedy with the final epsilon, for evaluation and play.
        (`starts`, the envs whose episodes begin here, matters only to policies with memory.)"""
        if self.modal:  # (else a walk over every module at every step of an evaluation, for nothing)
            self.model.eval()
        noise = next(self.draw_noise(1, len(obs)))
        return self.epsilon_greedy(obs, 0.0 if deterministic else self.cfg.end_e, noise)

    def learner_state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_learner_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.target.load_state_dict(state["target"])
        self.load_optimizer(self.optimizer, state["optimizer"])
