"""A2C for S seeds side by side in one process (issue 35): the seeds' MLP actor-critics stacked into one network of
batched weights (batched_ppo.py's BatchedActorCritic), one forward per env step for all S with autograd on, as A2C
unrolls, and one backward for all S. Read it next to rlrun/algos/a2c.py, the single-seed reference: each step below
is that file's, done per seed. Each seed samples from its own generator, bootstraps and normalizes its advantages on
its own unroll, clips its gradient by its own norm (never one norm over the stack) and steps its own optimizer
(RMSprop, RMSpropTF or Adam, per seed); losses are summed over seeds only to run one backward, whose gradient for each
seed is its own."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from rlrun.algos.a2c import A2C, STATS, A2CUnroll, build_optimizer
from rlrun.algos.batched_ppo import BatchedActorCritic, unstackable
from rlrun.algos.parts import MakeOptimizer
from rlrun.algos.protocol import episodes_of
from rlrun.algos.returns import explained_variance
from rlrun.algos.rollout_step import observe_step
from rlrun.algos.stacked import (
    Running,
    SeedOptimizer,
    SeedSteps,
    clip_grad_norm_per_seed,
    draw_noise,
    gae_per_seed,
    give_own,
    layout_ties,
    normalize_per_seed,
    take_own,
)
from rlrun.envs.protocol import Episodes, VectorEnv
from rlrun.errors import NonFiniteError
from rlrun.models import ActorCritic
from rlrun.models import distributions as D


def unbatchable(algo: object) -> str | None:
    """Why the built algorithm `algo` cannot train in a batch of seeds (BatchedA2C), or None when it can."""
    if not isinstance(algo, A2C):
        return type(algo).__name__
    if not isinstance(algo.parts.learner, A2CUnroll):
        return "an A2C whose unroll was replaced"
    return unstackable(algo.model)


class BatchedA2C:
    """S seeds' A2C (each a single-run A2C object, built as its single run builds it; one config but the seed)
    trained together: collect runs every seed's unroll with one batched forward per step and keeps the graph;
    update takes every seed's gradient step. `generators`: each seed's training stream (what its single run draws
    from torch's global generator: its actions' sampling noise on the CPU), `device_generators`: on a GPU, each seed's
    stream of the device's default generator (its single run samples there); None draws the noise from `generators`
    and moves it to the device."""

    def __init__(
        self,
        seeds: list[A2C],
        generators: list[torch.Generator],
        device_generators: list[torch.Generator] | None = None,
    ) -> None:
        self.seeds, self.generators = seeds, generators
        self.noise_generators = device_generators or generators
        self.cfg: Any = seeds[0].cfg
        self.S, self.N, self.device = len(seeds), seeds[0].num_envs, seeds[0].device
        self.obs_dtype = seeds[0].obs_dtype
        networks = [cast(ActorCritic, a.model) for a in seeds]  # unbatchable checked them
        self.model = BatchedActorCritic(networks)
        self.ties = [t for s, m in enumerate(networks) for t in layout_ties(self.model, self.model.layouts, s, m)]
        # Each seed's own optimizer (the configured one, as its single run builds it) over its slices of the stack.
        make = functools.partial(build_optimizer, self.cfg)
        self.optimizer = SeedSteps(self.model.seed_parameters(), cast(MakeOptimizer, make))
        for s, a in enumerate(seeds):  # A2C builds its optimizer on first use: each seed's is its share of the stack's
            if "optimizer" in vars(a):
                raise ValueError("a seed's optimizer was built before the batch: its state would be left behind")
            # A2C asks of its optimizer only what SeedOptimizer has (state_dict, load_state_dict, param_groups).
            vars(a)["optimizer"] = SeedOptimizer(self.optimizer, [t for t in self.ties if t.seed == s], a.trained)
        self.unrolls = [cast(A2CUnroll, a.parts.learner) for a in seeds]
        # Where observe_step stores each seed's rewards, flags and truncation values: its unroll's, as A2CUnroll.run.
        self.stored = [
            SimpleNamespace(
                rewards_np=u.rewards.numpy(),
                terminated_np=u.terminated.numpy(),
                truncated_np=u.truncated.numpy(),
                next_values=u.next_values,
            )
            for u in self.unrolls
        ]
        self.unroll: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # the last one's, with its graph
        self.running = Running(self.S)
        self.load_seeds()

    def load_seeds(self) -> None:
        """Take the seeds' networks' weights (at the start, and after each loaded a checkpoint; their optimizer
        states load straight into the per-seed optimizer, through SeedOptimizer)."""
        take_own(self.ties)

    def stop_seed(self, seed: int) -> None:
        """Stop seed `seed` for good (its run failed): no update moves its weights or optimizer state again. Its
        rows still ride along in the batched forward, unused."""
        self.running.stop(seed)

    def write_seeds(self) -> None:
        """Give each seed's network its weights (what its checkpoints, evaluation, play and truncation bootstraps
        read)."""
        give_own(self.ties)

    def _observations(self, obs: list[np.ndarray]) -> Tensor:
        return torch.as_tensor(np.stack(obs), dtype=self.obs_dtype, device=self.device)

    def collect(self, envs: list[VectorEnv], progress: float) -> list[dict[str, Any]]:
        """Every seed's unroll of num_steps x num_envs (A2CUnroll.run, seed s on envs[s]), keeping its policy outputs
        and values with their graph for update(); each seed's collect result."""
        T = self.cfg.num_steps
        self.model.train()
        obs = [a.next_obs for a in self.seeds if a.next_obs is not None]
        assert len(obs) == self.S, "collect before start"
        outs, values, actions = [], [], []
        episodes: list[list[Episodes]] = [[] for _ in self.seeds]
        for t in range(T):
            out, value = self.model(self._observations(obs))  # [S, N, P], [S, N], with autograd
            with torch.no_grad():
                action = self._sample(out)
            outs.append(out)
            values.append(value)
            actions.append(action)
            sent = action.cpu().numpy()
            for s, (unroll, env) in enumerate(zip(self.unrolls, envs)):
                obs[s], ended = observe_step(unroll.value_of, env.step(sent[s]), t, slice(0, self.N), self.stored[s])
                episodes[s].append(ended)
        with torch.no_grad():  # V of the observations after the unroll (A2CUnroll.targets' value_of)
            last = self.model(self._observations(obs))[1]
        self.unroll = torch.stack(outs, 1), torch.stack(values, 1), torch.stack(actions, 1), last
        for a, o in zip(self.seeds, obs):
            a.next_obs = o
        return [episodes_of(e, a.steps_per_collect) for e, a in zip(episodes, self.seeds)]

    def _sample(self, out: Tensor) -> Tensor:
        """Actions [S, N, ...] from the policy outputs [S, N, P] (ActorCritic.sample), each seed's noise from its
        generator."""
        noise = draw_noise(self.noise_generators, self.model.kind, tuple(out.shape[1:]), out.device)
        if self.model.kind == "categorical":
            return D.categorical_sample(torch.log_softmax(out, -1), noise)
        return D.gaussian_sample(out, self.model.log_std, noise)

    def update(self, progress: float) -> list[dict[str, float] | NonFiniteError]:
        """Every running seed's gradient step on its last unroll (A2CUnroll.forward's loss, then A2C.update); each
        seed's stats, or the error that stopped it (its gradient norm not finite, before its optimizer stepped)."""
        assert self.unroll is not None, "update before collect"
        c, (outs, values, actions, last), self.unroll = self.cfg, self.unroll, None
        lr = c.lr * (1.0 - progress) if c.anneal_lr else c.lr
        self.optimizer.lr = lr
        advantages, returns = self._targets(values.detach(), last)
        flat_outs = outs.flatten(1, 2)  # [S, T * N, P]: a seed's unroll as one batch
        if self.model.kind == "categorical":
            log_p = torch.log_softmax(flat_outs, -1)
            log_probs, entropy = D.categorical_log_prob(log_p, actions.flatten(1, 2)), D.categorical_entropy(log_p)
        else:
            log_probs = D.gaussian_log_prob(flat_outs, self.model.log_std, actions.flatten(1, 2))
            entropy = D.gaussian_entropy(flat_outs, self.model.log_std)
        # a2c_loss per seed, each mean over the seed's own unroll
        policy_loss = -(advantages.flatten(1) * log_probs).mean(1)
        value_loss = (returns.flatten(1) - values.flatten(1)).square().mean(1)
        entropy_mean = entropy.mean(1)
        loss = policy_loss - c.ent_coef * entropy_mean + c.vf_coef * value_loss
        self.optimizer.zero_grad()
        torch.autograd.backward(loss.sum())  # d(sum)/d(seed's loss) = 1: each seed's gradient is its own
        norms = clip_grad_norm_per_seed(self.optimizer.params, c.max_grad_norm)
        self.optimizer.step(self.running.require_finite(norms, "the A2C gradient norm"))
        self.write_seeds()
        stats = torch.stack([policy_loss, value_loss, entropy_mean], 1).detach().tolist()
        out = []
        for s in range(self.S):
            ev = explained_variance(values[s].detach().flatten(), returns[s].flatten())
            out.append(dict(zip(STATS, stats[s])) | {"explained_variance": ev, "learning_rate": lr})
        return self.running.outcomes(out)

    def _targets(self, values: Tensor, last: Tensor) -> tuple[Tensor, Tensor]:
        """(advantages, returns) [S, T, N] of the seeds' last unrolls, whose values [S, T, N] (no gradient) and the
        values after them [S, N] are given (A2CUnroll.targets per seed): normalized per seed if configured."""
        c, device = self.cfg, values.device
        rewards, terminated, truncated, stored_next = (
            torch.stack([getattr(u, name) for u in self.unrolls]).to(device)
            for name in ("rewards", "terminated", "truncated", "next_values")
        )
        # Bootstrap from the next step's value, except where the episode was truncated (set by observe_step).
        following = torch.cat([values[:, 1:], last[:, None]], 1)
        next_values = torch.where(truncated, stored_next, following)
        advantages, returns = gae_per_seed(rewards, values, next_values, terminated, truncated, c.gamma, c.gae_lambda)
        if c.norm_adv:
            advantages = normalize_per_seed(advantages.flatten(1)).view_as(advantages)
        return advantages, returns
