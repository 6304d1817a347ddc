"""Replay memory for off-policy algorithms: one shard per rank, and the cross-rank sampler that makes the
shards together behave exactly like one buffer holding all of them.

Storage. A vector env steps its N envs together, so a shard is a ring of rows, one row per vector step and
one column per env: row t holds the observation each env acted on, the action, the reward and the
terminated/truncated flags. The next observation of a transition is the next row's observation in the same
column, so observations are stored once. With frame stacks (Atari: [4, 84, 84]) only the newest frame is
stored and a stack is rebuilt from the rows before it, repeating the episode's first frame before the
episode start exactly as gymnasium's FrameStackObservation pads after a reset: 1M Atari transitions take
1M x 84 x 84 bytes (7 GB, allocated lazily) instead of four or eight times that. The one observation that is
in no row, the final observation of a truncated episode (needed to bootstrap), goes into a small side table.
When a shard starts (or restarts after a resume without its replay state) mid-episode, its first add also
writes the older frames of the current stacks as context rows that are never sampled.

Items. Item i = row * N + env is the transition starting at that row, with an n-step return (Sutton & Barto
7.1): rewards summed over n rows of its column, cut at the episode's end, bootstrapped from the observation
n rows later (gamma^n), from the truncated final observation, or not at all after termination. An item is
sampleable ("live") once its n-step window is written; rows whose frame look-back would reach an overwritten
row are taken out before they can be sampled.

Priorities (Schaul et al. 2016, proportional variant). Each item has a priority p_i; the sum tree holds
p_i^alpha. New items get the largest priority seen so far (over all shards), sampled items get |TD error| + eps.
Uniform replay keeps no tree: every live item has mass 1
(drawn as a row in use, redrawn in the rare case it is not live).

Across ranks. Rank r holds shard r with total mass T_r (sum of p^alpha over its live items) and size S_r.
A global batch of B = ranks x batch_size i.i.d. draws from one buffer holding every shard is drawn as:
  1. every rank gathers all (T_r, S_r, min p^alpha, max p), so all hold the same numbers;
  2. counts (c_r) ~ Multinomial(B, T_r / sum T) from a generator seeded alike on every rank (a shared
     stream), so every rank computes the same counts without another message;
  3. rank r draws c_r items from its own shard with probability p_i^alpha / T_r.
Then P(item i of shard r is a given draw) = T_r / T x p_i^alpha / T_r = p_i^alpha / T, which is the
single-buffer probability, and draws are independent: the multiset of sampled items has exactly the
single-buffer distribution. (Stratified sampling, as in the paper, would not split across shards this way.)
Importance weights w_i = (S P(i))^-beta / max_j (S P(j))^-beta use the global size S, total T and minimum
priority, so they are the single-buffer weights. Each rank's loss is sum_i w_i l_i / batch_size over its c_r
items; DDP averages gradients over the ranks, giving sum over all B items / B: the single-buffer gradient
of the mean weighted loss, whatever the c_r are (a rank with c_r = 0 still runs its forward and contributes
zeros). Uniform replay uses S_r in place of T_r.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from rlrun.buffers.sum_tree import SumTree


def _gather_one(t: Tensor) -> Tensor:
    return t.unsqueeze(0)


@dataclass(frozen=True)
class Shards:
    """This rank's place among the replay shards: its index and a gather of a small tensor over all shards
    ([W, ...], in shard order). One process: shard 0 of 1."""

    index: int = 0
    gather: Callable[[Tensor], Tensor] = field(default=_gather_one)


ONE_SHARD = Shards()


def shard_counts(masses: Tensor, batch: int, generator: torch.Generator) -> list[int]:
    """How many of `batch` i.i.d. draws from the union of the shards fall in each shard, given each
    shard's sampling mass [W]: a Multinomial(batch, masses / sum) sample [W]. Same generator state and
    masses on every rank -> same counts. One shard takes every draw, and no random number is drawn."""
    if len(masses) == 1:
        return [batch]
    draws = torch.multinomial(masses.double() / masses.sum(), batch, replacement=True, generator=generator)
    counts: list[int] = torch.bincount(draws, minlength=len(masses)).tolist()
    return counts


def importance_weights(mass: np.ndarray, total: float, size: float, min_mass: float, beta: float) -> np.ndarray:
    """Prioritized-replay importance weights (Schaul et al. 2016, eq. after Alg. 1) of items with sampling
    masses p_i^alpha, normalized by the largest weight in the buffer, that of the smallest mass.
    All three of total, size and min_mass are over the whole (global) buffer."""
    return ((size * mass / total) / (size * min_mass / total)) ** -beta


class ReplayBuffer:
    """One shard: a ring of rows x `num_envs` columns (see the module docstring) that holds `capacity`
    sampleable items once full, as users of CleanRL's and SB3's buffers expect (learning_starts = capacity
    works): ceil(capacity / num_envs) rows, plus the n rows whose n-step window is still open and the k - 1
    rows after the write head whose frame look-back it has overwritten.

    obs_shape is the shape of one observation; with frame_stack k > 1 its first axis is the stack of k
    frames and only the newest frame is stored per row. Actions are indices (int64, shape ()) by default, or
    vectors (a Box's shape, float32) for continuous control.
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        frame_stack: int = 1,
        n_step: int = 1,
        gamma: float = 0.99,
        alpha: float | None = None,
        priority_eps: float = 1e-6,
        action_shape: tuple[int, ...] = (),
        action_dtype: npt.DTypeLike = np.int64,
    ):
        if capacity < 1:
            raise ValueError(f"a replay must hold at least one item, got capacity {capacity}")
        self.rows = -(-capacity // num_envs) + n_step + frame_stack - 1
        self.num_envs, self.k, self.n, self.gamma = num_envs, frame_stack, n_step, gamma
        self.alpha, self.priority_eps = alpha, priority_eps  # alpha None: uniform replay
        frame_shape = obs_shape[1:] if frame_stack > 1 else obs_shape
        shape = (self.rows, num_envs)
        self.frames = np.zeros(shape + tuple(frame_shape), dtype=obs_dtype)  # zeros: pages allocated on use
        self.actions = np.zeros(shape + tuple(action_shape), dtype=action_dtype)  # discrete: (), Box: its shape
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.terminated = np.zeros(shape, dtype=bool)
        self.truncated = np.zeros(shape, dtype=bool)
        self.first = np.zeros(shape, dtype=bool)  # the row's observation is the first of its episode
        self.context = np.zeros(self.rows, dtype=bool)  # frames only, never sampled
        self.live = np.zeros(self.rows, dtype=bool)
        self.live_rows = 0
        self.final: dict[int, np.ndarray] = {}  # item -> final frame of a truncated episode
        self.tree = SumTree(self.rows * num_envs) if alpha is not None else None  # uniform: no tree needed
        self.pos = 0  # the row written next
        self.written = 0  # rows written since the shard started
        self.max_priority = 1.0
        self._episode_start = np.zeros(num_envs, dtype=bool)  # the next row's observations start episodes

    def __len__(self) -> int:
        """Live (sampleable) items."""
        return self.live_rows * self.num_envs

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final_obs: np.ndarray | None,
    ) -> None:
        """One vector step: obs [N, ...] acted on, actions [N, *action_shape], rewards [N], flags [N], and gymnasium's
        info["final_obs"] (object array [N], set where an episode ended) or None."""
        if self.written == 0 and self.k > 1:
            for j in range(self.k - 1):  # the older frames of the current stacks, so look-back stays exact
                self._write(obs[:, j], context=True)
        row = self._write(obs[:, -1] if self.k > 1 else obs, context=False)
        self.actions[row] = actions
        self.rewards[row] = rewards
        self.terminated[row] = terminated
        self.truncated[row] = truncated
        # (np.count_nonzero first: a C call, where most steps truncate nothing)
        for env in np.flatnonzero(truncated & ~terminated) if np.count_nonzero(truncated) else ():
            final = final_obs[env]
            self.final[row * self.num_envs + env] = np.array(final[-1] if self.k > 1 else final)
        self._episode_start = terminated | truncated
        complete = (row - self.n) % self.rows  # its n-step window is now written
        if self.written > self.n and not self.context[complete]:
            self._set_live(complete, True)

    def truncate_open(self, next_obs: np.ndarray) -> None:
        """End every episode still open at the newest row as a truncation whose final observation is
        `next_obs` [N, ...] (the observation each env would have given next), so the next row starts episodes."""
        row = (self.pos - 1) % self.rows
        open_ = ~(self.terminated[row] | self.truncated[row])
        for env in np.flatnonzero(open_):
            self.final[row * self.num_envs + env] = np.array(next_obs[env][-1] if self.k > 1 else next_obs[env])
        self.truncated[row] |= open_
        self._episode_start[:] = True

    def _write(self, frame: np.ndarray, context: bool) -> int:
        row = self.pos
        self._set_live(row, False)
        for env in range(self.num_envs) if self.final else ():  # (most runs hold few truncated episodes' finals)
            self.final.pop(row * self.num_envs + env, None)
        # Rows within k-1 after this one rebuild their stacks from it: their old look-back is gone.
        for later in range(1, self.k):
            self._set_live((row + later) % self.rows, False)
        self.frames[row] = frame
        self.first[row] = self._episode_start
        self.terminated[row] = self.truncated[row] = False
        self.context[row] = context
        self.pos = (row + 1) % self.rows
        self.written += 1
        return row

    def _set_live(self, row: int, live: bool) -> None:
        if self.live[row] == live:
            return
        self.live[row] = live
        self.live_rows += 1 if live else -1
        if self.tree is not None:
            items = np.arange(row * self.num_envs, (row + 1) * self.num_envs)
            self.tree.update(items, np.full(self.num_envs, self.max_priority**self.alpha if live else 0.0))

    def stats(self) -> Tensor:
        """[sampling mass, live items, smallest mass, largest priority]: what the shards exchange. Uniform
        replay: every live item has mass 1."""
        if self.tree is None:
            return torch.tensor([len(self), len(self), 1.0, 1.0], dtype=torch.float64)
        return torch.tensor([self.tree.total, len(self), self.tree.min, self.max_priority], dtype=torch.float64)

    def mass(self, items: np.ndarray) -> np.ndarray:
        return self.tree[items] if self.tree is not None else self.live[items // self.num_envs].astype(np.float64)

    def sample(self, count: int, generator: torch.Generator | None = None) -> np.ndarray:
        """`count` items drawn i.i.d. with probability mass_i / total (uniform over live items for uniform
        replay), from `generator` (torch's global one when None)."""
        if self.tree is not None:
            return self.tree.find(torch.rand(count, dtype=torch.float64, generator=generator).numpy() * self.tree.total)
        # Uniform over the rows in use, redrawing the few that are not live (the newest n, the k-1 after the
        # write head, context rows): uniform over live items, without a tree walk.
        in_use = min(self.written, self.rows) * self.num_envs
        items = np.zeros(0, dtype=np.int64)
        while len(items) < count:
            draw = torch.randint(in_use, (count - len(items),), generator=generator).numpy()
            kept = draw[self.live[draw // self.num_envs]]
            items = np.concatenate([items, kept]) if len(items) else kept
        return items

    def sample_global(
        self,
        shard_stats: Tensor,
        shard: int,
        batch_size: int,
        beta: float,
        generator: torch.Generator,
        draws: torch.Generator | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """This shard's part of a global batch of len(shard_stats) x batch_size draws from all shards as one
        buffer: (items, importance weights). `shard_stats` [W, 4] is every shard's stats(), gathered; `generator`
        is the stream shared by the shards, `draws` this shard's own (torch's global one when None; a batch of
        seeds gives each seed's its own)."""
        masses = shard_stats[:, 0]
        counts = shard_counts(masses, len(shard_stats) * batch_size, generator)
        items = self.sample(counts[shard], draws)
        if self.alpha is None:
            return items, np.ones(len(items), dtype=np.float32)  # the learners' dtype: no conversion
        size, min_mass = float(shard_stats[:, 1].sum()), float(shard_stats[:, 2].min())
        return items, importance_weights(self.mass(items), float(masses.sum()), size, min_mass, beta)

    def update_priorities(self, items: np.ndarray, td_abs: np.ndarray) -> None:
        """New priorities |TD error| + eps for sampled items (a no-op for uniform replay)."""
        if self.alpha is None or len(items) == 0:
            return
        priority = td_abs.astype(np.float64) + self.priority_eps
        self.max_priority = max(self.max_priority, float(priority.max()))
        self.tree.update(items, priority**self.alpha)

    def batch(self, items: np.ndarray) -> dict[str, np.ndarray]:
        """The n-step transitions of `items`: obs, actions, returns, next_obs and the discount to apply to
        the bootstrap value (0 after termination)."""
        row, env = np.divmod(items, self.num_envs)
        if self.n == 1:
            return self._one_step(row, env)
        window = (row[:, None] + np.arange(self.n)) % self.rows  # [B, n]
        col = env[:, None]
        terminated, truncated = self.terminated[window, col], self.truncated[window, col]
        done = terminated | truncated
        counts: np.ndarray = np.cumsum(done, axis=1) - done  # dones strictly before each step of the window
        inside: np.ndarray = counts == 0  # steps of the window still in the item's episode
        returns = (inside * self.gamma ** np.arange(self.n) * self.rewards[window, col]).sum(1)
        ended = (done & inside).any(1)
        last = np.where(ended, (done & inside).argmax(1), self.n - 1)  # the window's last step
        at_last = np.arange(len(items)), last
        discount = np.where(ended & terminated[at_last], 0.0, self.gamma ** (last + 1.0)).astype(np.float32)
        next_obs = self._stack((row + self.n) % self.rows, env)
        cut = np.flatnonzero(ended & truncated[at_last] & ~terminated[at_last])
        if len(cut):  # truncated inside the window: bootstrap from the final observation
            end_row = (row[cut] + last[cut]) % self.rows
            finals = np.stack([self.final[i] for i in end_row * self.num_envs + env[cut]])
            next_obs[cut] = self._with_newest(end_row, env[cut], finals)
        return {
            "obs": self._stack(row, env),
            "actions": self.actions[row, env],
            "returns": returns.astype(np.float32),
            "next_obs": next_obs,
            "discount": discount,
        }

    def _one_step(self, row: np.ndarray, env: np.ndarray) -> dict[str, np.ndarray]:
        """batch() for n_step = 1, without its windows: the same arrays, a few operations instead of ~30 (an update of
        a small network is over in the time the windows take)."""
        terminated, truncated = self.terminated[row, env], self.truncated[row, env]
        next_obs = self._stack((row + 1) % self.rows, env)
        cut = np.flatnonzero(truncated & ~terminated)
        if len(cut):  # truncated: bootstrap from the final observation
            finals = np.stack([self.final[i] for i in row[cut] * self.num_envs + env[cut]])
            next_obs[cut] = self._with_newest(row[cut], env[cut], finals)
        return {
            "obs": self._stack(row, env),
            "actions": self.actions[row, env],
            "returns": self.rewards[row, env],
            "next_obs": next_obs,
            "discount": np.where(terminated, np.float32(0.0), np.float32(self.gamma)),
        }

    def _stack(self, row: np.ndarray, env: np.ndarray) -> np.ndarray:
        """Observations at (row, env): the stored one, or the stack of the k newest frames up to that row,
        with the episode's first frame repeated before the episode start."""
        if self.k == 1:
            stored: np.ndarray = self.frames[row, env]
            return stored
        back = np.arange(self.k - 1)  # 0 = the row itself
        starts = self.first[(row[:, None] - back) % self.rows, env[:, None]]  # [B, k-1]
        since_start = np.where(starts.any(1), starts.argmax(1), self.k - 1)
        offsets = np.minimum(np.arange(self.k - 1, -1, -1), since_start[:, None])  # oldest frame first
        stacked: np.ndarray = self.frames[(row[:, None] - offsets) % self.rows, env[:, None]]
        return stacked

    def _with_newest(self, row: np.ndarray, env: np.ndarray, frame: np.ndarray) -> np.ndarray:
        """The stack that follows (row, env) when `frame` is observed next in the same episode."""
        if self.k == 1:
            return frame
        return np.concatenate([self._stack(row, env)[:, 1:], frame[:, None]], axis=1)

    def state_dict(self) -> dict[str, Any]:
        """Everything, as plain tensors (for a per-rank file; large)."""
        keys = np.array(sorted(self.final), dtype=np.int64)
        arrays = ("frames", "actions", "rewards", "terminated", "truncated", "first", "context", "live")
        return {
            **{name: torch.from_numpy(getattr(self, name)) for name in arrays},
            "mass": torch.from_numpy(self.mass(np.arange(self.rows * self.num_envs))),
            "final_items": torch.from_numpy(keys),
            "final_frames": torch.from_numpy(np.stack([self.final[k] for k in keys]) if len(keys) else np.zeros(0)),
            "episode_start": torch.from_numpy(self._episode_start),
            "pos": self.pos,
            "written": self.written,
            "max_priority": self.max_priority,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("frames", "actions", "rewards", "terminated", "truncated", "first", "context", "live"):
            getattr(self, name)[...] = state[name].numpy()
        if self.tree is not None:
            self.tree.update(np.arange(self.rows * self.num_envs), state["mass"].numpy())
        self.final = {int(k): f for k, f in zip(state["final_items"].tolist(), state["final_frames"].numpy())}
        self._episode_start = state["episode_start"].numpy().copy()
        self.pos, self.written, self.max_priority = state["pos"], state["written"], state["max_priority"]
        self.live_rows = int(self.live.sum())
