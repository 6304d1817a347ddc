"""What the replay-based algorithms (DQN, SAC, TD3) share: collecting train_freq vector steps into this rank's replay
shard, and gradient_steps updates, each on one global batch drawn across all shards (rlrun/buffers/replay.py), once
the shards hold learning_starts items together; the update count, the shard-split stream and each rank's shard in
checkpoints. An algorithm adds how it acts while collecting (`explore`), one update on a batch (`learn`), and the
state of its networks and optimizers (`learner_state`). It knows nothing of ranks beyond its shard's index and gather.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim.swa_utils import get_ema_multi_avg_fn

from rlrun.algos.parts import Optimizer
from rlrun.algos.protocol import Annealed, EnvSpec, Reductions, Wrap, episodes_of
from rlrun.buffers.replay import ReplayBuffer
from rlrun.envs.protocol import VectorEnv

log = logging.getLogger("rlrun")


def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- tau * online + (1 - tau) * target (tau = 1: copy) for the parameters; buffers (BatchNorm's
    statistics) are copied, as SB3 does."""
    # torch's exponential moving average of parameter lists: one foreach lerp for them all, not one call per tensor.
    ema = get_ema_multi_avg_fn(1.0 - tau)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    ema(list(target.parameters()), list(online.parameters()), None)
    with torch.no_grad():
        for t, o in zip(target.buffers(), online.buffers()):
            t.copy_(o)


class ReplayAlgorithm:
    """The base of DQN, SAC and TD3. `cfg` has buffer_size, learning_starts, batch_size, gamma, n_step, train_freq,
    gradient_steps and replay (configs.ReplayConfig); the subclass sets `model` (every network it keeps, targets
    included: what evaluation acts with and what the ranks' parameter digests cover)."""

    model: nn.Module
    # Whether the networks behave differently in train and eval mode (BatchNorm, dropout: a user's network may have
    # them). False skips the switches between collecting and updating, each a walk over every module.
    modal = True

    def __init__(
        self,
        cfg,
        spec: EnvSpec,
        device: torch.device,
        reductions: Reductions,
        obs_dtype: torch.dtype,
        action_shape: tuple[int, ...] = (),
        action_dtype: type = np.int64,
    ):
        self.cfg, self.device, self.num_envs = cfg, device, spec.num_envs
        self.shards = reductions.shards
        self.obs_dtype = obs_dtype
        # np.zeros storage: pages are only allocated as the replay fills (play never fills it).
        self.replay = ReplayBuffer(
            cfg.buffer_size,
            spec.num_envs,
            spec.observation_space.shape,
            np.uint8 if obs_dtype == torch.uint8 else np.float32,
            spec.frame_stack,
            n_step=cfg.n_step,
            gamma=cfg.gamma,
            alpha=cfg.replay.alpha if cfg.replay.prioritized else None,
            priority_eps=cfg.replay.priority_eps,
            action_shape=action_shape,
            action_dtype=action_dtype,
        )
        # The stream that splits each global batch over the shards: seeded alike on every rank.
        self.shard_rng = torch.Generator().manual_seed(1)
        self.updates = 0
        self.env_steps_seen = 0  # by this rank since it was built: to say so when updates fail to start
        self.stall_reported = False
        self.next_obs: np.ndarray | None = None

    # What the subclass provides.
    def explore(self, obs: np.ndarray, progress: float) -> tuple[np.ndarray, np.ndarray]:
        """(the actions the envs take, the actions the replay stores) for a vector step while collecting."""
        raise NotImplementedError

    def learn(self, batch: dict[str, Tensor], weights: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """One update on this rank's share of a global batch: (its stats as 0-d tensors, each this rank's share of
        the global batch's value, so that the ranks' mean is the global one; |TD errors| [n] for priorities)."""
        raise NotImplementedError

    def learner_state(self) -> dict[str, Any]:
        """The networks' and optimizers' state, shared by every rank."""
        raise NotImplementedError

    def load_learner_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def sync_targets(self) -> None:
        """Targets <- the online networks. Called once the learners are wrapped: DDP gave every rank rank 0's
        networks there, and the targets start from them (a resume then loads its own)."""

    def annealed(self) -> list[Annealed]:
        r = self.cfg.replay
        return [("PER beta", lambda p: r.beta_start + (1.0 - r.beta_start) * p, 1.0)] if r.prioritized else []

    def charts(self) -> dict[str, float]:
        """What the algorithm logs at every update besides its stats (schedules, rates)."""
        return {}

    # The shared part.
    @property
    def steps_per_collect(self) -> int:
        return self.cfg.train_freq * self.num_envs

    @property
    def update_shape(self) -> tuple[int, int, int]:
        """(batch size per rank, updates per iteration, 1): every rank must agree on it, or DDP hangs."""
        return self.cfg.batch_size, self.cfg.gradient_steps, 1

    def wrap_learner(self, wrap: Wrap) -> None:
        self.learner = wrap(self.learner, self.trained)
        self.sync_targets()

    def start(self, obs: np.ndarray) -> None:
        """Collecting starts from `obs` after a reset. When the replay holds episodes still open (a resume whose
        envs were reset: their state was not plain data), each ends as a truncation at the observation that would
        have come next (the checkpoint's cursor), so no item spans the seam into an unrelated start state."""
        if self.next_obs is not None and self.replay.written:
            self.replay.truncate_open(self.next_obs)
        self.next_obs = obs

    def _obs(self, obs: np.ndarray) -> Tensor:
        return torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)

    @torch.inference_mode()
    def collect(self, envs: VectorEnv, progress: float = 0.0) -> dict[str, Any]:
        """train_freq vector steps into the replay shard; returns finished episodes."""
        if self.modal:
            self.model.eval()  # acting; update() learns in train mode
        obs, episodes = self.next_obs, []
        self.env_steps_seen += self.steps_per_collect
        for _ in range(self.cfg.train_freq):
            actions, stored = self.explore(obs, progress)
            step = envs.step(actions)
            self.replay.add(obs, stored, step.rewards, step.terminated, step.truncated, step.info.get("final_obs"))
            if np.count_nonzero(step.episodes.ended):  # a C call: ndarray.any() passes through Python
                episodes.append(step.episodes.finished())
            obs = step.obs
        self.next_obs = obs
        return episodes_of(episodes, self.steps_per_collect)

    def update(self, progress: float) -> dict[str, float]:
        """gradient_steps updates, each on one global batch (ranks x batch_size items) drawn across the shards.
        Nothing happens until the shards hold learning_starts items together (the same decision on all ranks:
        it reads gathered numbers)."""
        c, replay = self.cfg, self.replay
        if self.modal:
            self.model.train()
        beta = c.replay.beta_start + (1.0 - c.replay.beta_start) * progress
        shard_stats = self.shards.gather(replay.stats())  # [W, 4]: mass, size, min mass, max priority
        held = int(sum(shard_stats[:, 1].tolist()))  # (in Python: a few numbers, where each torch call costs more)
        if held < max(c.learning_starts, 1):
            self.warn_if_stalled(len(shard_stats), held)
            return self.update_stats(beta, [])
        steps = []
        for step in range(c.gradient_steps):
            if step > 0 and c.replay.prioritized:  # priorities changed: the shards' masses too (uniform: not)
                shard_stats = self.shards.gather(replay.stats())
            items, weights = replay.sample_global(shard_stats, self.shards.index, c.batch_size, beta, self.shard_rng)
            batch = {k: torch.as_tensor(v, device=self.device) for k, v in replay.batch(items).items()}
            batch["obs"], batch["next_obs"] = self._obs(batch["obs"]), self._obs(batch["next_obs"])
            self.updates += 1  # counts this update: learn() reads it for its schedules (target syncs, delays)
            stats, td_abs = self.learn(batch, torch.as_tensor(weights, dtype=torch.float32, device=self.device))
            if c.replay.prioritized:
                replay.update_priorities(items, td_abs.cpu().numpy())
            steps.append(stats)
        if c.replay.prioritized:  # new items enter at the largest priority any shard has seen, as in one buffer
            replay.max_priority = float(self.shards.gather(torch.tensor([replay.max_priority])).max())
        return self.update_stats(beta, steps)

    def warn_if_stalled(self, shards: int, items: int) -> None:
        """Say once when the replay should hold learning_starts items by now (every step it saw, but the n-step
        windows and frame stacks still open) and updates have not started."""
        c = self.cfg
        expected = (self.env_steps_seen - self.num_envs * (c.n_step + self.replay.k)) * shards
        if not self.stall_reported and expected > c.learning_starts:
            self.stall_reported = True
            log.warning(
                "%s: no update yet after %d env steps: the replay holds %d items, algo.learning_starts=%d",
                c.name,
                self.env_steps_seen * shards,
                items,
                c.learning_starts,
            )

    def update_stats(self, beta: float, steps: list[dict[str, Tensor]]) -> dict[str, float]:
        """What an update logs: the mean of its steps' stats once it has made any, the update count and charts."""
        out = self.charts() | {"charts/updates": float(self.updates)}
        if steps:  # a stat's mean over the steps that made it; one transfer for all (not a device sync each)
            names = list(dict.fromkeys(k for s in steps for k in s))
            if len(steps) == 1:  # (a mean over one step is its values: no view and mean to pay per update)
                means = torch.stack([steps[0][k] for k in names]).tolist()
            elif all(len(s) == len(names) for s in steps):  # every step made every stat: one stack, one mean
                stacked = torch.stack([s[k] for s in steps for k in names]).view(len(steps), len(names))
                means = stacked.mean(0).tolist()
            else:
                means = torch.stack([torch.stack([s[k] for s in steps if k in s]).mean() for k in names]).tolist()
            out |= dict(zip(names, means))
        if self.cfg.replay.prioritized:
            out["charts/beta"] = beta
        return out

    def load_optimizer(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """An optimizer's saved state, at the configured rate (also when the resume changed it)."""
        optimizer.load_state_dict(state)
        for group in optimizer.param_groups:
            group["lr"] = self.cfg.lr

    def state_dict(self) -> dict[str, Any]:
        """What every rank shares: networks, optimizers, update count, the shard-split stream, max priority."""
        shared = {"updates": self.updates, "shard_rng": self.shard_rng.get_state()}
        return self.learner_state() | shared | {"max_priority": self.replay.max_priority}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_learner_state(state)
        self.updates = state["updates"]
        self.shard_rng.set_state(state["shard_rng"])
        self.replay.max_priority = state["max_priority"]

    def rank_state(self) -> dict[str, Any]:
        return {"next_obs": torch.from_numpy(np.array(self.next_obs))}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        self.next_obs = state["next_obs"].numpy().copy()

    def shard_state(self) -> dict[str, Any] | None:
        """This rank's replay shard, when configured to be checkpointed (each rank writes its own file)."""
        return self.replay.state_dict() if self.cfg.replay.checkpoint else None

    def load_shard_state(self, state: dict[str, Any]) -> None:
        if tuple(state["frames"].shape) != self.replay.frames.shape:  # saved by an older rlrun, or another size
            log.warning("replay shard of another layout (%s rows): this rank refills its replay", len(state["frames"]))
            return
        self.replay.load_state_dict(state)
