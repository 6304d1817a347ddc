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
finds per seed before the optimizer steps): it still rides along in the batched forward, but never moves again."""

from __future__ import annotations

import functools
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.finite import nonfinite_error
from rlrun.algos.parts import MakeOptimizer
from rlrun.algos.ppo import PPO, STATS
from rlrun.algos.protocol import episodes_of
from rlrun.algos.returns import explained_variance
from rlrun.algos.rollout_step import observe_step
from rlrun.algos.stacked import (
    Layout,
    SeedOptimizer,
    SeedSteps,
    clip_grad_norm_per_seed,
    gae_per_seed,
    layout_ties,
    row,
    same,
    transposed,
)
from rlrun.config.batched import LAUNCHER, SUPPORTED
from rlrun.envs.protocol import Episodes, VectorEnv
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

    def act(self, obs: Tensor, generators: list[torch.Generator]) -> tuple[Tensor, Tensor, Tensor]:
        """(actions [S, B] or [S, B, D], log-probs [S, B], values [S, B]); seed s's noise comes from generators[s],
        drawn as its single run draws it from the global generator (categorical_sample's Exp(1) [B, A],
        gaussian_sample's standard normal [B, D])."""
        out, value = self(obs)
        _, B, P = out.shape
        if self.kind == "categorical":
            log_p = torch.log_softmax(out, -1)
            noise = torch.stack([torch.empty(B, P).exponential_(generator=g) for g in generators])
            action = D.categorical_sample(log_p, noise.to(out.device))
            return action, D.categorical_log_prob(log_p, action), value
        noise = torch.stack([torch.randn(B, P, generator=g) for g in generators]).to(out.device)
        action = D.gaussian_sample(out, self.log_std, noise)
        return action, D.gaussian_log_prob(out, self.log_std, action), value

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


class BatchedPPO:
    """S seeds' PPO trained together: collect steps every seed's vector env after one batched forward; update runs
    all seeds' epochs and minibatches with one batched forward and backward per minibatch. `seeds`: each seed's
    single-run PPO (built as its single run builds it; one config but the seed), `generators`: each seed's training
    RNG stream (what its single run draws from torch's global generator)."""

    def __init__(self, seeds: list[PPO], generators: list[torch.Generator]) -> None:
        for algo in seeds:
            reason = unbatchable(algo)
            if reason is not None:
                raise ValueError(f"{LAUNCHER} trains {SUPPORTED}; not {reason}")
        self.seeds, self.generators = seeds, generators
        self.cfg = seeds[0].cfg
        self.S, self.N, self.device = len(seeds), seeds[0].num_envs, seeds[0].device
        self.model = BatchedActorCritic(self._networks())
        # Each seed's own optimizer (PPO's declared part, as its single run makes it) over its slices of the stack.
        make = seeds[0].parts.make_optimizer
        self.optimizer = SeedSteps(self.model.seed_parameters(), make)
        for s, a in enumerate(seeds):  # each seed's optimizer becomes its share of the stack's
            if "optimizer" in vars(a):
                raise ValueError("a seed's optimizer was built before the batch: its state would be left behind")
            # PPO asks of its optimizer only what SeedOptimizer has (state_dict, load_state_dict, param_groups).
            ties = layout_ties(self.model, self.model.layouts, s, a.model)
            share = functools.partial(SeedOptimizer, self.optimizer, ties)
            a.parts.make_optimizer = cast(MakeOptimizer, share)
        self.rollout = self._share_rollouts()
        self.running = torch.ones(self.S, dtype=torch.bool)  # the seeds not stopped for good (stop_seed)
        self.load_seeds()

    def _share_rollouts(self) -> dict[str, Tensor]:
        """One [S, T, N, ...] tensor per rollout field, each seed's Rollout holding views of its slice: a step's rows
        are written for all seeds at once, and each seed's own bookkeeping still reads its Rollout."""
        stacked = {}
        for name in ("obs", "actions", "log_probs", "values", "next_values", "rewards", "terminated", "truncated"):
            stacked[name] = torch.stack([getattr(a.rollout, name) for a in self.seeds])
            for s, a in enumerate(self.seeds):
                setattr(a.rollout, name, stacked[name][s])
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

    @torch.inference_mode()
    def collect(self, envs: list[VectorEnv], progress: float = 0.0) -> list[dict[str, Any]]:
        """One rollout of num_steps x num_envs for every seed, seed s on envs[s]; each seed's collect result (what
        PPO.collect returns). (`progress`, as PPO.collect's, anneals nothing here.)"""
        T, S, r = self.cfg.num_steps, self.S, self.rollout
        self.model.eval()
        for a in self.seeds:
            a.model.eval()
        obs = [a.next_obs for a in self.seeds if a.next_obs is not None]
        assert len(obs) == S, "collect before start"
        episodes: list[list[Episodes]] = [[] for _ in range(S)]
        for t in range(T):
            x = self._observations(obs, update_stats=True)
            action, log_prob, value = self.model.act(x, self.generators)
            r["obs"][:, t], r["actions"][:, t], r["log_probs"][:, t], r["values"][:, t] = x, action, log_prob, value
            sent = action.cpu().numpy()
            for s, a in enumerate(self.seeds):
                obs[s], ended = observe_step(a.value_of, envs[s].step(sent[s]), t, slice(0, self.N), a.rollout)
                episodes[s].append(ended)
        for a in self.seeds:  # step by step, in order, as the envs returned them (PPO.collect)
            if a.ret_rms is not None:
                done = a.rollout.terminated_np | a.rollout.truncated_np
                for t in range(T):
                    a.rollout.rewards_np[t] = a.scale_rewards(a.rollout.rewards_np[t], done[t])
        last = self.model(self._observations(obs))[1]
        # Bootstrap from the next step's value except where the episode was truncated (PPO.collect).
        following = torch.cat([r["values"][:, 1:], last.unsqueeze(1)], dim=1)
        r["next_values"].copy_(torch.where(r["truncated"].to(self.device), r["next_values"], following))
        collected = []
        for s, a in enumerate(self.seeds):
            a.next_obs, a.length = obs[s], T
            collected.append(episodes_of(episodes[s], T * self.N))
        return collected

    def _observations(self, obs: list[np.ndarray], update_stats: bool = False) -> Tensor:
        """The seeds' raw observations (each [N, ...]) as their networks see them, [S, N, ...]: each seed's own
        normalizer when configured (PPO.preprocess)."""
        if self.seeds[0].obs_rms is None:
            return torch.as_tensor(np.stack(obs), dtype=self.seeds[0].obs_dtype, device=self.device)
        return torch.stack([a.preprocess(o, update_stats) for a, o in zip(self.seeds, obs)])

    def update(self, progress: float) -> list[dict[str, float] | NonFiniteError]:
        """Epochs x minibatches of PPO on the last rollouts, every seed's as PPO.update makes it; each seed's
        stats, or for a seed whose gradient norm was not finite the NonFiniteError its single run raises: that seed
        stopped for good there, before its optimizer stepped (its network holds its last finite weights). A seed
        stopped before the update gets stats that mean nothing."""
        c, r, S, n = self.cfg, self.rollout, self.S, self.cfg.num_steps * self.N
        self.model.train()
        lr = c.lr * (1.0 - progress) if c.anneal_lr else c.lr
        self.optimizer.lr = lr
        advantages, returns = gae_per_seed(
            r["rewards"], r["values"], r["next_values"], r["terminated"], r["truncated"], c.gamma, c.gae_lambda
        )
        batch = {
            "obs": r["obs"],
            "actions": r["actions"],
            "old_log_probs": r["log_probs"],
            "advantages": advantages,
            "returns": returns,
            "old_values": r["values"],
        }
        flat = {k: v.flatten(1, 2) for k, v in batch.items()}  # [S, T * N, ...]
        active = self.running.clone()
        failed: dict[int, NonFiniteError] = {}
        totals, counts, epochs = torch.zeros(S, len(STATS)), torch.zeros(S), torch.zeros(S)
        seeds = torch.arange(S)[:, None]
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
                loss, stats = self._losses(minibatch)
                self.optimizer.zero_grad()
                torch.autograd.backward(loss.sum())
                norms = clip_grad_norm_per_seed(self.optimizer.params, c.max_grad_norm)
                broken = active & ~torch.isfinite(norms).cpu()
                if broken.any():  # those seeds stop here, as their single runs do (require_finite), the others go on
                    for s in broken.nonzero().flatten().tolist():
                        failed[s] = nonfinite_error(float(norms[s]), "the PPO gradient norm")
                    self.running &= ~broken
                    active &= ~broken
                self.optimizer.step(active)
                totals += stats * active[:, None]
                counts += active
            if c.target_kl is not None:  # a seed whose KL went past the target sits the remaining epochs out
                active &= stats[:, STATS.index("approx_kl")] <= c.target_kl
            if not active.any():
                break
        self.write_seeds()
        out: list[dict[str, float] | NonFiniteError] = []
        for s in range(S):
            if s in failed:
                out.append(failed[s])
                continue
            means = dict(zip(STATS, (totals[s] / counts[s]).tolist()))
            ev = explained_variance(r["values"][s].flatten(), batch["returns"][s].flatten())
            out.append(means | {"learning_rate": lr, "explained_variance": ev, "epochs": float(epochs[s])})
        return out

    def _losses(self, mb: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Each seed's PPO loss [S] and stats [S, len(STATS)] on its minibatch ([S, B, ...] each): PPOLearner's
        formulas (clipped_surrogate_loss, value_loss, the k3 KL), each mean taken over one seed's rows."""
        c = self.cfg
        adv = mb["advantages"]
        if c.norm_adv:  # per seed, as normalize_advantages on the seed's minibatch
            mu = adv.mean(1, keepdim=True)
            adv = (adv - mu) / ((adv - mu).square().mean(1, keepdim=True).sqrt() + 1e-8)
        log_probs, entropy, values = self.model.evaluate(mb["obs"], mb["actions"])
        log_ratio = log_probs - mb["old_log_probs"]
        ratio = log_ratio.exp()
        pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - c.clip_coef, 1 + c.clip_coef)).mean(1)
        unclipped = (values - mb["returns"]).square()
        if c.clip_vloss:
            old = mb["old_values"]
            clipped = old + (values - old).clamp(-c.clip_coef, c.clip_coef)
            v_loss = 0.5 * torch.max(unclipped, (clipped - mb["returns"]).square()).mean(1)
        else:
            v_loss = 0.5 * unclipped.mean(1)
        entropy_mean = entropy.mean(1)
        loss = pg_loss - c.ent_coef * entropy_mean + c.vf_coef * v_loss
        with torch.no_grad():
            kl = ((ratio - 1) - log_ratio).mean(1)  # k3 estimator (Schulman 2020)
            clip_fraction = ((ratio - 1).abs() > c.clip_coef).float().mean(1)
            stats = torch.stack([pg_loss, v_loss, entropy_mean, kl, clip_fraction], dim=1)
        return loss, stats
