"""What the batched DQN, SAC and TD3 share (rlrun/algos/off_policy.py's ReplayAlgorithm, for S seeds at once):
collecting train_freq vector steps of every seed into the seed's own replay, and gradient_steps updates, each on one
batch per seed, drawn from the seed's own replay (uniform or prioritized, with its own priorities) with the seed's own
generator, stacked [S, B, ...] for one batched learn. Each seed's bookkeeping (its update count, its PER priorities
and their maximum, the shard stream its single run draws batch splits from, the stall warning, the stats it logs) is
done on its single-run object as its single run does it. A subclass adds how the seeds act while collecting
(`explore`), one update on the stacked batch (`learn`), and the ties of its stacked networks to the seeds' own."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlrun.algos.off_policy import ReplayAlgorithm
from rlrun.algos.protocol import episodes_of
from rlrun.algos.stacked import Running, Tie, give_own, take_own
from rlrun.envs.protocol import Episodes, VectorEnv
from rlrun.errors import NonFiniteError


class BatchedReplay:
    """S seeds' replay-based algorithm: `seeds` their single-run objects (built as their single runs build them; one
    config but the seed), `generators` their training streams (what each single run draws from torch's global
    generator, drawn here in the same order: exploration, batch items, the learner's noise), `device_generators` on a
    GPU each seed's stream of the device's default generator, where its single run draws its policy's and its
    learner's Gaussian noise (SAC, TD3); None draws that noise from `generators` and moves it to the device."""

    ties: list[Tie]  # the subclass's stacked networks' parameters and the seeds' own

    def __init__(
        self,
        seeds: list[ReplayAlgorithm],
        generators: list[torch.Generator],
        device_generators: list[torch.Generator] | None = None,
    ) -> None:
        self.seeds, self.generators = seeds, generators
        self.noise_generators = device_generators or generators
        self.cfg: Any = seeds[0].cfg
        self.S, self.N, self.device = len(seeds), seeds[0].num_envs, seeds[0].device
        self.obs_dtype = seeds[0].obs_dtype
        self.running = Running(self.S)

    # What the subclass provides.
    def explore(self, obs: np.ndarray, progress: float) -> tuple[np.ndarray, np.ndarray]:
        """(the actions each seed's envs take, the actions its replay stores), [S, N, ...] each, for the seeds'
        observations obs [S, N, ...] (ReplayAlgorithm.explore, per seed)."""
        raise NotImplementedError

    def learn(self, batch: dict[str, Tensor], weights: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """One update of every seed on its batch (each entry [S, B, ...]; importance weights [S, B]): (stats, each
        [S], |TD errors| [S, B]), each seed's as its single run's learn gives them."""
        raise NotImplementedError

    # The shared part.
    def load_seeds(self) -> None:
        """Take the seeds' networks (at the start, and after each loaded a checkpoint; their optimizer states load
        straight into the per-seed optimizers, through their SeedOptimizers)."""
        if len({a.updates for a in self.seeds}) > 1:  # their schedules (target syncs, delays, warm-up) run as one
            raise ValueError("the seeds of a batch must have made as many updates")
        take_own(self.ties)

    def write_seeds(self) -> None:
        """Give each seed's networks their weights (what its checkpoints, evaluation and play read)."""
        give_own(self.ties)

    def stop_seed(self, seed: int) -> None:
        """Stop seed `seed` for good (its run failed): no update moves its networks, optimizer states or targets
        again, nor its replay's priorities. Its rows still ride along in the batched forward, unused."""
        self.running.stop(seed)

    @property
    def updates(self) -> int:
        """The update count, every seed's (load_seeds checks they agree)."""
        return self.seeds[0].updates

    @torch.inference_mode()
    def collect(self, envs: list[VectorEnv], progress: float) -> list[dict[str, Any]]:
        """train_freq vector steps of every seed, seed s on envs[s], into its replay; each seed's finished episodes
        (what ReplayAlgorithm.collect returns)."""
        episodes: list[list[Episodes]] = [[] for _ in self.seeds]
        for _ in range(self.cfg.train_freq):
            obs = [a.next_obs for a in self.seeds if a.next_obs is not None]
            assert len(obs) == self.S, "collect before start"
            actions, stored = self.explore(np.stack(obs), progress)
            for s, (a, env) in enumerate(zip(self.seeds, envs)):
                step = env.step(actions[s])
                a.replay.add(
                    obs[s], stored[s], step.rewards, step.terminated, step.truncated, step.info.get("final_obs")
                )
                if step.episodes.ended.any():
                    episodes[s].append(step.episodes.finished())
                a.next_obs = step.obs
        for a in self.seeds:
            a.env_steps_seen += a.steps_per_collect
        return [episodes_of(e, a.steps_per_collect) for e, a in zip(episodes, self.seeds)]

    def update(self, progress: float) -> list[dict[str, float] | NonFiniteError]:
        """gradient_steps updates of every seed once its replay holds learning_starts items (ReplayAlgorithm.update:
        the seeds' replays fill alike, so they start together); each seed's stats, or the error that stopped it."""
        c = self.cfg
        beta = c.replay.beta_start + (1.0 - c.replay.beta_start) * progress
        shard_stats = [a.shards.gather(a.replay.stats()) for a in self.seeds]
        if shard_stats[0][:, 1].sum() < max(c.learning_starts, 1):
            for a, st in zip(self.seeds, shard_stats):
                a.warn_if_stalled(len(st), int(st[:, 1].sum()))
            return self.running.outcomes([a.update_stats(beta, []) for a in self.seeds])
        steps = []
        for step in range(c.gradient_steps):
            live = [s for s, on in enumerate(self.running.mask.tolist()) if on]
            if not live:
                break
            if step > 0 and c.replay.prioritized:  # priorities changed: the masses too
                shard_stats = [a.shards.gather(a.replay.stats()) for a in self.seeds]
            drawn = {s: self._draw(s, shard_stats[s], beta) for s in live}
            # A stopped seed draws nothing more (its streams and replay stay as they were): its rows repeat a running
            # seed's batch, computed and never used.
            batch, weights = self._stacked([drawn.get(s, drawn[live[0]]) for s in range(self.S)])
            for a in self.seeds:
                a.updates += 1  # counts this update: learn() reads it for its schedules (target syncs, delays)
            stats, td_abs = self.learn(batch, weights)
            if c.replay.prioritized:  # a seed its TD errors stopped (non-finite) keeps its priorities
                td, running = td_abs.cpu().numpy(), self.running.mask.tolist()
                for s, (items, _, _) in drawn.items():
                    if running[s]:
                        self.seeds[s].replay.update_priorities(items, td[s])
            steps.append(stats)
        if c.replay.prioritized:  # as ReplayAlgorithm.update, through the seed's own (one-shard) gather
            for a in (a for a, on in zip(self.seeds, self.running.mask.tolist()) if on):
                a.replay.max_priority = float(a.shards.gather(torch.tensor([a.replay.max_priority])).max())
        self.write_seeds()
        return self.running.outcomes(self._seed_stats(beta, steps))

    def _draw(self, s: int, shard_stats: Tensor, beta: float) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Seed s's batch from its replay as its single run draws it (ReplayAlgorithm.update): (items, importance
        weights, the transitions)."""
        a, c = self.seeds[s], self.cfg
        items, weights = a.replay.sample_global(
            shard_stats, a.shards.index, c.batch_size, beta, a.shard_rng, self.generators[s]
        )
        return items, weights, a.replay.batch(items)

    def _stacked(
        self, drawn: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]
    ) -> tuple[dict[str, Tensor], Tensor]:
        """The seeds' batches as tensors [S, B, ...] on the device (observations in the networks' dtype), and their
        importance weights [S, B]."""
        batches = [b for _, _, b in drawn]
        batch = {k: torch.as_tensor(np.stack([b[k] for b in batches]), device=self.device) for k in batches[0]}
        for k in ("obs", "next_obs"):
            batch[k] = batch[k].to(self.obs_dtype)
        weights = np.stack([w for _, w, _ in drawn])
        return batch, torch.as_tensor(weights, dtype=torch.float32, device=self.device)

    def _seed_stats(self, beta: float, steps: list[dict[str, Tensor]]) -> list[dict[str, float]]:
        """Each seed's stats as ReplayAlgorithm.update logs them: a stat's mean over the steps that made it (here
        for all seeds in one reduction per stat, each over its own row), the update count, charts."""
        names = list(dict.fromkeys(k for s in steps for k in s))
        means = {k: torch.stack([s[k] for s in steps if k in s], 1).mean(1) for k in names}  # [S] each
        return [a.update_stats(beta, [{k: m[s] for k, m in means.items()}]) for s, a in enumerate(self.seeds)]
