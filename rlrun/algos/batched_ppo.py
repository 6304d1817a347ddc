"""PPO for S seeds side by side in one process (issue 35): the seeds' MLP actor-critics stacked into one network of
batched weights [S, in, out] (torch.baddbmm), one forward per env step and one forward and backward per minibatch for
all S. Read it next to rlrun/algos/ppo.py, the single-seed reference: each step below is that file's, done per seed.

Each seed is as if alone. Its single-run PPO object (built as its single run builds it: same initialization, same
RNG stream) stays the seed's state for checkpoints, evaluation and play; the stacked weights hold the same numbers
laid out for speed, read from those objects at the start and written back after every update, and the seed's
optimizer is its own torch.optim.Adam over its slices of the stacked weights (stacked.py's SeedSteps), seen in its
single run's format (SeedOptimizer). Nothing crosses
seeds: random draws come from each seed's own torch.Generator (its single run's draws from torch's global one, in
the same order), advantages are normalized per seed, the loss is the sum of per-seed means (so each seed's gradient
is its own), gradients are clipped by each seed's own norm (one norm over the stack would couple them), and a seed
whose target-KL stop fires takes no further step in that update: its slices get no gradient, so its Adam leaves its
weights, moments and step count as they are (a zeroed gradient would not: Adam's momentum would still move it).
The same mask stops a seed for good (stop_seed: its env failed, or its gradient norm went non-finite, which update
finds per seed before the optimizer steps): it still rides along in the batched forward, but never moves again.

The seeds' N envs each are one rollout of S x N envs ([T, S, N]: env j of the batch is env j % N of seed j // N), so
a step's acting, storing and bookkeeping run once for all seeds (rlrun/algos/rollout_step.py, as PPO's). This is the
reference; BatchedPPOParts are what rlrun/fast/ may swap for faster parts of the same signatures."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.configs import PPOConfig
from rlrun.algos.finite import nonfinite_error
from rlrun.algos.parts import MakeOptimizer
from rlrun.algos.ppo import PPO, STATS
from rlrun.algos.protocol import episodes_of
from rlrun.algos.returns import explained_variance
from rlrun.algos.rollout_step import ACTED, STEPPED, StepRows, ValueOf, act_step, observe_step
from rlrun.algos.stacked import (
    Layout,
    SeedOptimizer,
    SeedSteps,
    clip_grad_norm_per_seed,
    draw_noise,
    gae_per_seed,
    layout_ties,
    normalize_per_seed,
    row,
    same,
    transposed,
)
from rlrun.config.batched import LAUNCHER, SUPPORTED
from rlrun.envs.protocol import EndedEpisodes, Episodes, StepResult, VectorEnv
from rlrun.errors import NonFiniteError
from rlrun.models import ActorCritic
from rlrun.models import distributions as D
from rlrun.models.encoders import ACTIVATIONS, TwinMLP


def unbatchable(algo: object) -> str | None:
    """Why the built algorithm `algo` cannot train in a batch of seeds, or None when it can."""
    if not isinstance(algo, PPO):
        return f"{type(algo).__name__}"
    return unstackable(algo.model)


def unstackable(model: object) -> str | None:
    """Why the actor-critic `model` cannot be one of a BatchedActorCritic's, or None when it can."""
    if type(model) is not ActorCritic or not isinstance(model.trunk, TwinMLP):
        return f"a {type(model).__name__} network that is not model=mlp with model.shared=false"
    if model.kind not in ("categorical", "gaussian"):
        return f"{model.kind} actions"
    return None


class BatchedActorCritic(nn.Module):
    """S ActorCritics of the TwinMLP layout (rlrun/models/encoders.py) as one module: observations [S, B, ...] ->
    (policy output [S, B, P], value [S, B]). Every parameter is [S, ...], seed s's slice being seed s's own network;
    Linear weights are stored transposed, [S, in, out], for baddbmm."""

    first_w: nn.Parameter
    first_b: nn.Parameter
    policy_w: nn.Parameter
    policy_b: nn.Parameter
    value_w: nn.Parameter
    value_b: nn.Parameter
    log_std: nn.Parameter  # Box actions only

    def __init__(self, models: list[ActorCritic]) -> None:
        super().__init__()
        first = models[0]
        self.S, self.kind, self.mask_size = len(models), first.kind, first.mask_size
        self.activation = ACTIVATIONS["relu" if first.trunk.relu else "tanh"]()
        self.hidden = first.trunk.out_dim
        depth = len(first.trunk.weights)
        self.layouts: list[Layout] = [
            ("first_w", "trunk.first.weight", transposed),  # [S, in, 2h]: actor and critic columns
            ("first_b", "trunk.first.bias", row),
            *[(f"hidden_w.{i}", f"trunk.weights.{i}", same) for i in range(depth)],  # [S, 2, h, h]
            *[(f"hidden_b.{i}", f"trunk.biases.{i}", same) for i in range(depth)],  # [S, 2, 1, h]
            ("policy_w", "policy_head.weight", transposed),  # [S, h, P]
            ("policy_b", "policy_head.bias", row),
            ("value_w", "value_head.weight", transposed),  # [S, h, 1]
            ("value_b", "value_head.bias", row),
        ]
        if self.kind == "gaussian":
            self.layouts.append(("log_std", "log_std", row))  # [S, 1, D]
        stacked = {
            name: nn.Parameter(torch.stack([view(m.get_parameter(path).detach()) for m in models]))
            for name, path, view in self.layouts
        }
        self.hidden_w = nn.ParameterList(stacked.pop(f"hidden_w.{i}") for i in range(depth))
        self.hidden_b = nn.ParameterList(stacked.pop(f"hidden_b.{i}") for i in range(depth))
        for name, parameter in stacked.items():
            self.register_parameter(name, parameter)

    def seed_parameters(self) -> list[nn.Parameter]:
        """The stacked parameters [S, ...], in the order of `layouts`."""
        return [self.get_parameter(name) for name, _, _ in self.layouts]

    @torch.no_grad()
    def read_from(self, models: list[ActorCritic]) -> None:
        """Take the seeds' own networks' weights (at the start, and after a checkpoint was loaded into them)."""
        for name, path, view in self.layouts:
            stacked = self.get_parameter(name)
            for s, m in enumerate(models):
                stacked[s].copy_(view(m.get_parameter(path)))

    @torch.no_grad()
    def write_to(self, models: list[ActorCritic]) -> None:
        """Give each seed's own network its slice (what checkpoints, evaluation and play use)."""
        for name, path, view in self.layouts:
            stacked = self.get_parameter(name)
            for s, m in enumerate(models):
                view(m.get_parameter(path)).copy_(stacked[s])

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """(policy output [S, B, P], value [S, B]) for observations [S, B, ...], as ActorCritic.forward per seed."""
        S, B, h = obs.shape[0], obs.shape[1], self.hidden
        x = torch.baddbmm(self.first_b, obs.flatten(2).float(), self.first_w)  # [S, B, 2h]
        x = self.activation(x).view(S, B, 2, h).transpose(1, 2).reshape(2 * S, B, h)  # [2S, B, h]: actor, critic
        for w, b in zip(self.hidden_w, self.hidden_b):
            x = self.activation(torch.baddbmm(b.flatten(0, 1), x, w.flatten(0, 1)))
        x = x.view(S, 2, B, h)
        out = torch.baddbmm(self.policy_b, x[:, 0], self.policy_w)
        if self.mask_size:  # illegal actions' logits at -1e9, as ActorCritic._masked
            out = out.masked_fill(obs[..., -self.mask_size :] < 0.5, -1e9)
        return out, torch.baddbmm(self.value_b, x[:, 1], self.value_w).squeeze(-1)

    def act(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(actions [S, B] or [S, B, D], log-probs [S, B], values [S, B]) with each seed's sampling noise [S, B, P]
        (a step of draw_rollout_noise's: categorical_sample's Exp(1), gaussian_sample's standard normal)."""
        out, value = self(obs)
        if self.kind == "categorical":
            log_p = torch.log_softmax(out, -1)
            action = D.categorical_sample(log_p, noise)
            return action, D.categorical_log_prob(log_p, action), value
        action = D.gaussian_sample(out, self.log_std, noise)
        return action, D.gaussian_log_prob(out, self.log_std, action), value

    def value(self, obs: Tensor) -> Tensor:
        """V [S, B] of observations [S, B, ...]."""
        value: Tensor = self(obs)[1]
        return value

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log-prob, entropy, value), each [S, B], of actions [S, B, ...]."""
        out, value = self(obs)
        if self.kind == "categorical":
            log_p = torch.log_softmax(out, -1)
            return D.categorical_log_prob(log_p, actions), D.categorical_entropy(log_p), value
        return (
            D.gaussian_log_prob(out, self.log_std, actions),
            D.gaussian_entropy(out, self.log_std),
            value,
        )


def draw_rollout_noise(
    generators: Sequence[torch.Generator], kind: str, shape: tuple[int, int, int], device: torch.device
) -> Tensor:
    """Each seed's acting noise for a rollout of T steps, [T, S, N, P] on `device` (shape (T, N, P)): T steps of
    stacked.draw_noise, each seed's [N, P] from its own generator as its single run draws them step by step. A seed's
    draws come from its own generator only, so drawing a rollout's ahead is drawing them as its steps come."""
    T, N, P = shape
    return torch.stack([draw_noise(generators, kind, (N, P), device) for _ in range(T)])


# (the seeds' generators, the policy's kind, (T, N, P), the learner's device) -> the rollout's noise [T, S, N, P]
DrawNoise = Callable[[Sequence[torch.Generator], str, tuple[int, int, int], torch.device], Tensor]


# (the joined envs, their observations [S * N, ...], the rollout's noise [T, S, N, P]) -> (the observations after the
# rollout, each step's ended episodes): a rollout's steps, written into the batch's rows (BatchedPPO.step_rows)
BatchedCollectSteps = Callable[["Stepping", np.ndarray, Tensor], tuple[np.ndarray, list[EndedEpisodes]]]


class BatchedActing(Protocol):
    """What acts for the seeds while collecting (BatchedActorCritic itself, in the reference)."""

    def act(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...  # [S, N, ...], as .act above
    def value(self, obs: Tensor) -> Tensor: ...  # V [S, N]


class BatchedPPOLearner(nn.Module):
    """Every seed's PPO loss at once: forward(minibatch [S, B, ...]) -> (loss [S], stats [S, len(STATS)]), PPOLearner's
    formulas (clipped_surrogate_loss, value_loss, the k3 KL) with each mean taken over one seed's rows, so that the
    gradient of loss.sum() is each seed's own gradient. Advantages come normalized if configured."""

    def __init__(self, model: BatchedActorCritic, cfg: PPOConfig) -> None:
        super().__init__()
        self.model, self.cfg = model, cfg

    def forward(
        self,
        obs: Tensor,
        actions: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        returns: Tensor,
        old_values: Tensor,
    ) -> tuple[Tensor, Tensor]:
        c, adv = self.cfg, advantages
        log_probs, entropy, values = self.model.evaluate(obs, actions)
        log_ratio = log_probs - old_log_probs
        ratio = log_ratio.exp()
        pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - c.clip_coef, 1 + c.clip_coef)).mean(1)
        unclipped = (values - returns).square()
        if c.clip_vloss:
            clipped = old_values + (values - old_values).clamp(-c.clip_coef, c.clip_coef)
            v_loss = 0.5 * torch.max(unclipped, (clipped - returns).square()).mean(1)
        else:
            v_loss = 0.5 * unclipped.mean(1)
        entropy_mean = entropy.mean(1)
        loss = pg_loss - c.ent_coef * entropy_mean + c.vf_coef * v_loss
        with torch.no_grad():
            kl = ((ratio - 1) - log_ratio).mean(1)  # k3 estimator (Schulman 2020)
            clip_fraction = ((ratio - 1).abs() > c.clip_coef).float().mean(1)
            stats = torch.stack([pg_loss, v_loss, entropy_mean, kl, clip_fraction], dim=1)
        return loss, stats


class JoinedEnvs:
    """The seeds' vector envs (N envs each) as one of S x N envs, stepped seed by seed: env j of the batch is env
    j % N of seed j // N. What BatchedPPO.collect steps."""

    def __init__(self, envs: Sequence[VectorEnv]) -> None:
        self.envs = list(envs)
        self.num_envs = sum(e.num_envs for e in self.envs)

    def step(self, actions: np.ndarray) -> StepResult:
        """Each seed's envs stepped with its rows of `actions` [S * N, ...]; what they return, joined in seed order."""
        n = self.envs[0].num_envs
        results = [e.step(actions[s * n : (s + 1) * n]) for s, e in enumerate(self.envs)]
        finals = np.full(self.num_envs, None, dtype=object)
        for s, r in enumerate(results):
            for i, final in enumerate(r.info.get("final_obs", ())):
                finals[s * n + i] = final
        obs, rewards, terminated, truncated = (np.concatenate([r[i] for r in results]) for i in range(4))
        episodes = EndedEpisodes.joined([r.episodes for r in results])
        return StepResult(obs, rewards, terminated, truncated, {"final_obs": finals}, episodes)


class Stepping(Protocol):
    """One env of S x N envs, as JoinedEnvs."""

    def step(self, actions: np.ndarray) -> StepResult: ...


@dataclass
class BatchedPPOParts:
    """What an acceleration may replace in BatchedPPO (rlrun/fast/__init__.py decides), each with a part of the same
    signature. BatchedPPO builds them from this file's code and calls them through here."""

    learner: nn.Module  # forward(**minibatch [S, B, ...]) -> (loss [S], stats [S, len(STATS)]), as BatchedPPOLearner
    policy: BatchedActing  # what acts while collecting: the BatchedActorCritic
    join_envs: Callable[[Sequence[VectorEnv]], Stepping]  # the seeds' vector envs as one: JoinedEnvs
    draw_noise: DrawNoise  # a rollout's acting noise from the seeds' generators: draw_rollout_noise
    step_seeds: Callable[[Tensor | None], None]  # the optimizer step of the active seeds [S] (bool): SeedSteps.step
    collect_steps: BatchedCollectSteps  # a rollout's steps into the batch's rows: BatchedPPO.act_and_step


class BatchedPPO:
    """S seeds' PPO trained together: collect steps every seed's vector env after one batched forward; update runs
    all seeds' epochs and minibatches with one batched forward and backward per minibatch. `seeds`: each seed's
    single-run PPO (built as its single run builds it; one config but the seed), `generators`: each seed's training
    RNG stream (what its single run draws from torch's global generator: minibatch permutations, and acting noise
    on the CPU), `device_generators`: on a GPU, each seed's stream of that device's default generator (its single run
    draws its acting noise there); None draws that noise from `generators` and moves it to the learner's device."""

    def __init__(
        self,
        seeds: list[PPO],
        generators: list[torch.Generator],
        device_generators: list[torch.Generator] | None = None,
        fast: bool = False,
    ) -> None:
        """`fast`: whether rlrun/fast/ may swap the batch's parts (the run's algo.fast; each seed's own PPO is built
        with fast=false, as the batch trains it through its own parts)."""
        for algo in seeds:
            reason = unbatchable(algo)
            if reason is not None:
                raise ValueError(f"{LAUNCHER} trains {SUPPORTED}; not {reason}")
        self.seeds, self.generators = seeds, generators
        self.noise_generators = device_generators or generators
        self.cfg = replace(seeds[0].cfg, fast=fast)
        self.S, self.N, self.device = len(seeds), seeds[0].num_envs, seeds[0].device
        self.model = BatchedActorCritic(self._networks())
        # Each seed's own optimizer (PPO's declared part, as its single run makes it) over its slices of the stack.
        make = seeds[0].parts.make_optimizer
        self.optimizer = SeedSteps(self.model.seed_parameters(), make)
        self.parts = BatchedPPOParts(
            learner=BatchedPPOLearner(self.model, self.cfg),
            policy=self.model,
            join_envs=JoinedEnvs,
            draw_noise=draw_rollout_noise,
            step_seeds=self.optimizer.step,
            collect_steps=self.act_and_step,
        )
        for s, a in enumerate(seeds):  # each seed's optimizer becomes its share of the stack's
            if "optimizer" in vars(a):
                raise ValueError("a seed's optimizer was built before the batch: its state would be left behind")
            # PPO asks of its optimizer only what SeedOptimizer has (state_dict, load_state_dict, param_groups).
            ties = layout_ties(self.model, self.model.layouts, s, a.model)
            share = functools.partial(SeedOptimizer, self.optimizer, ties)
            a.parts.make_optimizer = cast(MakeOptimizer, share)
        self.rollout = self._share_rollouts()
        self.running = torch.ones(self.S, dtype=torch.bool)  # the seeds not stopped for good (stop_seed)
        self._joined: tuple[list[VectorEnv], Stepping] | None = None
        self.load_seeds()

    def _share_rollouts(self) -> dict[str, Tensor]:
        """One [T, S, N, ...] tensor per rollout field, each seed's Rollout holding views of its slice [:, s]: a step's
        rows are written for all seeds at once as rows of S x N envs, and each seed's own bookkeeping still reads its
        Rollout."""
        stacked = {}
        for name in ("obs", "actions", "log_probs", "values", "next_values", "rewards", "terminated", "truncated"):
            stacked[name] = torch.stack([getattr(a.rollout, name) for a in self.seeds], dim=1)
            for s, a in enumerate(self.seeds):
                setattr(a.rollout, name, stacked[name][:, s])
        for a in self.seeds:
            r = a.rollout
            r.rewards_np, r.terminated_np, r.truncated_np = r.rewards.numpy(), r.terminated.numpy(), r.truncated.numpy()
        return stacked

    def _networks(self) -> list[ActorCritic]:
        """The seeds' own networks (ActorCritics: unbatchable checked it)."""
        return [cast(ActorCritic, a.model) for a in self.seeds]

    def load_seeds(self) -> None:
        """Take the seeds' networks' weights (at the start, and after each loaded a checkpoint; their optimizer
        states load straight into SeedSteps, through SeedOptimizer)."""
        self.model.read_from(self._networks())

    def write_seeds(self) -> None:
        """Give each seed's network its weights (its optimizer state is SeedSteps', read through SeedOptimizer)."""
        self.model.write_to(self._networks())

    def stop_seed(self, seed: int) -> None:
        """Stop seed `seed` for good (its run failed; callable at any time, from inside collect too): no update moves
        its weights, Adam moments or step count again. Its rows are still computed and stepped (on whatever its
        envs return), and never used."""
        self.running[seed] = False

    def step_rows(self) -> SimpleNamespace:
        """The rollout as rows of S x N envs, [T, S * N, ...] views, under Rollout's names (rollout_step's `out`)."""
        r = {k: v.flatten(1, 2) for k, v in self.rollout.items()}
        numpy_views = {f"{k}_np": r[k].numpy() for k in ("rewards", "terminated", "truncated")}
        return SimpleNamespace(**r, **numpy_views)

    def _stepping(self, envs: list[VectorEnv]) -> Stepping:
        """The seeds' envs joined (parts.join_envs), once for the envs the seeds train on."""
        if self._joined is None or any(a is not b for a, b in zip(self._joined[0], envs, strict=True)):
            self._joined = (list(envs), self.parts.join_envs(envs))
        return self._joined[1]

    @torch.inference_mode()
    def collect(self, envs: list[VectorEnv], progress: float = 0.0) -> list[dict[str, Any]]:
        """One rollout of num_steps x num_envs for every seed, seed s on envs[s]; each seed's collect result (what
        PPO.collect returns). The steps are PPO's (act_step, observe_step) on the S x N envs of the joined envs.
        (`progress`, as PPO.collect's, anneals nothing here.)"""
        T, S, N, r = self.cfg.num_steps, self.S, self.N, self.rollout
        self.model.eval()
        for a in self.seeds:
            a.model.eval()
        assert all(a.next_obs is not None for a in self.seeds), "collect before start"
        obs = np.concatenate([cast(np.ndarray, a.next_obs) for a in self.seeds])
        P = self.model.policy_w.shape[-1]
        noise = self.parts.draw_noise(self.noise_generators, self.model.kind, (T, N, P), self.device)
        obs, ended = self.parts.collect_steps(self._stepping(envs), obs, noise)
        for a in self.seeds:  # step by step, in order, as the envs returned them (PPO.collect)
            if a.ret_rms is not None:
                done = a.rollout.terminated_np | a.rollout.truncated_np
                for t in range(T):
                    a.rollout.rewards_np[t] = a.scale_rewards(a.rollout.rewards_np[t], done[t])
        last = self.parts.policy.value(self._observations(obs).view(S, N, *obs.shape[1:]))
        # Bootstrap from the next step's value except where the episode was truncated (PPO.collect).
        following = torch.cat([r["values"][1:], last.unsqueeze(0)])
        r["next_values"].copy_(torch.where(r["truncated"].to(self.device), r["next_values"], following))
        for s, a in enumerate(self.seeds):
            a.next_obs, a.length = obs[s * N : (s + 1) * N], T
        return [episodes_of([episodes], T * N) for episodes in seeds_episodes(ended, S)]

    def act_and_step(self, joined: Stepping, obs: np.ndarray, noise: Tensor) -> tuple[np.ndarray, list[EndedEpisodes]]:
        """collect's steps (BatchedCollectSteps): PPO's act_step and observe_step on the S x N envs of `joined`, from
        their observations `obs`, acting with the step's `noise`. Returns the observations after the rollout and each
        step's ended episodes."""
        rows, everyone = self.step_rows(), slice(0, self.S * self.N)
        acted = {name: StepRows(getattr(rows, name)) for name in ACTED}
        out = SimpleNamespace(**acted, next_values=rows.next_values, **{k: getattr(rows, k) for k in STEPPED})

        def act(obs: np.ndarray, t: int) -> np.ndarray:
            x = self._observations(obs, update_stats=True)
            return act_step(functools.partial(self._act, noise[t]), x, t, everyone, out).cpu().numpy()

        obs, ended = step_batch(joined, obs, self.cfg.num_steps, act, self.value_of, out)
        for stored in acted.values():
            stored.flush()
        return obs, ended

    def _observations(self, obs: np.ndarray, update_stats: bool = False) -> Tensor:
        """The raw observations of the S x N envs [S * N, ...] as the seeds' networks see them: each seed's own
        normalizer when configured (PPO.preprocess)."""
        if self.seeds[0].obs_rms is None:
            return torch.as_tensor(obs, dtype=self.seeds[0].obs_dtype, device=self.device)
        N = self.N
        return torch.cat([a.preprocess(obs[s * N : (s + 1) * N], update_stats) for s, a in enumerate(self.seeds)])

    def _act(self, noise: Tensor, x: Tensor, t: int, envs: slice) -> tuple[Tensor, Tensor, Tensor]:
        """(actions, log-probs, values) [S * N, ...] for the observations x [S * N, ...] of all envs at step t
        (rollout_step's Act, after `noise`: the step's [S, N, P])."""
        S, N = self.S, self.N
        action, log_prob, value = self.parts.policy.act(x.view(S, N, *x.shape[1:]), noise)
        return action.flatten(0, 1), log_prob.flatten(0, 1), value.flatten(0, 1)

    def value_of(self, obs: np.ndarray, envs: np.ndarray | slice) -> Tensor:
        """V of raw final observations [k, ...] of the batch's envs `envs` (indices, ascending): each by its seed's
        own network and normalizer (PPO.value_of)."""
        index = np.arange(self.S * self.N)[envs]
        seed_of = index // self.N
        values = [self.seeds[s].value_of(obs[seed_of == s], index[seed_of == s] % self.N) for s in np.unique(seed_of)]
        return torch.cat(values)

    def update(self, progress: float) -> list[dict[str, float] | NonFiniteError]:
        """Epochs x minibatches of PPO on the last rollouts, every seed's as PPO.update makes it; each seed's
        stats, or for a seed whose gradient norm was not finite the NonFiniteError its single run raises: that seed
        stopped for good there, before its optimizer stepped (its network holds its last finite weights). A seed
        stopped before the update gets stats that mean nothing."""
        c, S = self.cfg, self.S
        n = c.num_steps * self.N
        self.model.train()
        lr = c.lr * (1.0 - progress) if c.anneal_lr else c.lr
        self.optimizer.lr = lr
        flat = self._seeds_batch()
        active = self.running.clone()  # on the CPU: which seeds step is decided on the host
        failed: dict[int, NonFiniteError] = {}
        totals = torch.zeros(S, len(STATS), device=self.device)
        counts, epochs = torch.zeros(S), torch.zeros(S)
        seeds = torch.arange(S, device=self.device)[:, None]
        for _epoch in range(c.update_epochs):
            epochs += active
            # Each seed's permutation from its own stream, as its single run's torch.randperm; a stopped seed's
            # single run draws none.
            perm = torch.stack(
                [
                    torch.randperm(n, generator=g) if on else torch.arange(n)
                    for g, on in zip(self.generators, active.tolist())
                ]
            )
            shuffled = {k: v[seeds, perm.to(self.device)] for k, v in flat.items()}
            size = n // c.num_minibatches
            for j in range(c.num_minibatches):
                minibatch = {k: v[:, j * size : (j + 1) * size] for k, v in shuffled.items()}
                stats = self._minibatch_step(minibatch, active, failed)
                totals += stats * active.to(self.device)[:, None]
                counts += active
            if c.target_kl is not None:  # a seed whose KL went past the target sits the remaining epochs out
                active &= stats[:, STATS.index("approx_kl")].cpu() <= c.target_kl
            if not active.any():
                break
        self.write_seeds()
        means = (totals.cpu() / counts[:, None]).tolist()
        out: list[dict[str, float] | NonFiniteError] = []
        for s in range(S):
            if s in failed:
                out.append(failed[s])
                continue
            ev = explained_variance(flat["old_values"][s], flat["returns"][s])
            own = {"learning_rate": lr, "explained_variance": ev, "epochs": float(epochs[s])}
            out.append(dict(zip(STATS, means[s])) | own)
        return out

    def _seeds_batch(self) -> dict[str, Tensor]:
        """The last rollouts with their advantages and returns, as [S, T * N, ...]: each seed's steps in the order
        its single run's PPO.update flattens them."""
        c, r = self.cfg, self.rollout

        def by_seed(x: Tensor) -> Tensor:  # [T, S, ...] -> [S, T, ...]
            return x.transpose(0, 1)

        rewards, values, next_values, terminated, truncated = (
            by_seed(r[k]) for k in ("rewards", "values", "next_values", "terminated", "truncated")
        )
        advantages, returns = gae_per_seed(
            rewards, values, next_values, terminated, truncated, c.gamma, c.gae_lambda
        )  # [S, T, N]
        batch = {
            "obs": by_seed(r["obs"]),
            "actions": by_seed(r["actions"]),
            "old_log_probs": by_seed(r["log_probs"]),
            "advantages": advantages,
            "returns": returns,
            "old_values": values,
        }
        return {k: v.flatten(1, 2) for k, v in batch.items()}

    def _minibatch_step(
        self, minibatch: dict[str, Tensor], active: Tensor, failed: dict[int, NonFiniteError]
    ) -> Tensor:
        """One minibatch's loss, backward, per-seed clip and step for the active seeds; a seed whose gradient norm
        is not finite stops here, as its single run does (require_finite), recorded in `failed`, and is taken out
        of `active` and `self.running` in place while the others go on. Returns the minibatch's [S, STATS]."""
        c = self.cfg
        if c.norm_adv:  # per seed, as normalize_advantages on the seed's minibatch
            minibatch["advantages"] = normalize_per_seed(minibatch["advantages"])
        loss: Tensor
        stats: Tensor
        loss, stats = self.parts.learner(**minibatch)
        self.optimizer.zero_grad()
        torch.autograd.backward(loss.sum())
        norms = clip_grad_norm_per_seed(self.optimizer.params, c.max_grad_norm)
        broken = active & ~torch.isfinite(norms).cpu()
        if broken.any():
            for s in broken.nonzero().flatten().tolist():
                failed[s] = nonfinite_error(float(norms[s]), "the PPO gradient norm")
            self.running &= ~broken
            active &= ~broken
        self.parts.step_seeds(active)
        return stats


def step_batch(
    joined: Stepping,
    obs: np.ndarray,
    steps: int,
    act: Callable[[np.ndarray, int], np.ndarray],
    value_of: ValueOf,
    out: Any,
) -> tuple[np.ndarray, list[EndedEpisodes]]:
    """`steps` rollout steps of the S x N envs of `joined` from their observations `obs` [S * N, ...]: act(obs, t)
    stores step t's outputs in `out` and returns the actions (by act_step); observe_step stores what the envs return.
    Returns the observations after the last step and each step's ended episodes."""
    everyone, ended = slice(0, len(obs)), []
    for t in range(steps):
        result = joined.step(act(obs, t))
        obs, _ = observe_step(value_of, result, t, everyone, out)
        ended.append(result.episodes)
    return obs, ended


def seeds_episodes(ended: list[EndedEpisodes], S: int) -> list[Episodes]:
    """Each seed's episodes that ended in a rollout, in its single run's order (step by step, in env order), from
    each step's EndedEpisodes of all S x N envs [T of them]."""
    done, returns, lengths = (np.stack(arrays) for arrays in zip(*ended))  # [T, S * N] each
    N = done.shape[1] // S
    seeds = (slice(s * N, (s + 1) * N) for s in range(S))
    return [(returns[:, e][done[:, e]], lengths[:, e][done[:, e]]) for e in seeds]
