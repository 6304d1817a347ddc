"""PPO's collect steps run inside the env workers: each forked worker (or Ray actor) acts for its own envs with a
copy of the policy and runs the rollout step (rlrun/algos/rollout_step.py) on its rows of the rollout: arrays shared
with the rank, or for a Ray actor its own, returned as one object. A rollout then costs the rank one command per
worker instead of a round trip per step, and acting runs on every core beside the envs. The rank keeps what makes a
run reproducible: it hands the weights over before each rollout and draws the sampling noise from its own RNG
stream, which its checkpoints hold; the same seed gives the same rollout on either backend. A drop-in for
PPO.collect_steps."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlrun.algos.ppo import PPO
from rlrun.algos.rollout_step import ACTED, STEPPED, act_step, observe_step
from rlrun.config import ModelConfig
from rlrun.envs.pool import WorkerPool
from rlrun.envs.protocol import Episodes, JobContext, VectorEnv
from rlrun.envs.ray_envs import RayEnvs
from rlrun.envs.sync import step_results
from rlrun.fast.flat_adam import flat_views
from rlrun.models import ActorCritic, build_actor_critic
from rlrun.models import distributions as D

# The rollout's arrays the workers write, [T, N, ...], under the names act_step and observe_step use.
_WRITTEN = (*ACTED, "next_values", *STEPPED)
# (model config, observation space, action space): what a worker builds its copy of the policy from (PPO.model_spec)
ModelSpec = tuple[ModelConfig, gym.spaces.Box, gym.Space[Any]]
# {name: (shape, dtype)} of the arrays a worker shares with the rank, as WorkerPool.share takes them
Specs = dict[str, tuple[tuple[int, ...], np.dtype[Any]]]


class WorkerActing:
    """Rank side: the arrays shared with the workers of `pool`, and collect steps run in them for `algo`."""

    def __init__(self, algo: PPO, pool: WorkerPool):
        self.algo, self.pool, self.model = algo, pool, _actor_critic(algo)
        self.shared = {name: torch.from_numpy(a) for name, a in pool.share(_specs(algo, self.model)).items()}
        pool.run("building the policy", _build_policy, lambda _: (algo.model_spec,))

    def collect_steps(
        self, envs: VectorEnv, obs: np.ndarray, cut: Callable[[int], bool] | None = None
    ) -> tuple[np.ndarray, list[Episodes], int]:
        """PPO.collect_steps in the workers: the rollout from `obs` with the policy's current weights into
        algo.rollout (next_values holding V of the final observation where truncated). Returns the observations
        after it, the episodes that ended, in (step, env) order as the rank's loop lists them, and num_steps (a
        rollout here is never cut short: accelerate does not choose this with preemption, which passes `cut`)."""
        if envs is not self.pool:
            raise ValueError("worker acting runs on the worker pool it was set up for")
        if cut is not None:
            raise ValueError("worker acting runs a rollout through: it cannot cut one short")
        s, r, model = self.shared, self.algo.rollout, self.model
        s["weights"].copy_(nn.utils.parameters_to_vector(model.parameters()))
        num_steps, num_envs = r.values.shape
        s["noise"].copy_(_noise(model, s["noise"].shape))
        self.pool.buffers["obs"][:] = obs
        per_worker = self.pool.run("rollout", _rollout_in_worker, lambda _: (num_steps,))
        for name in _WRITTEN:
            torch.as_tensor(getattr(r, name)).copy_(s[name])
        episodes = [worker[t] for t in range(num_steps) for worker in per_worker]  # workers hold ascending envs
        return self.pool.buffers["obs"].copy(), episodes, num_steps


class RayActing:
    """WorkerActing over Ray actors: each actor runs its envs' segment of the rollout with its copy of the policy,
    whose weights reach it through Ray's object store once per rollout, and returns its rows as one object."""

    def __init__(self, algo: PPO, envs: RayEnvs):
        self.algo, self.envs, self.model = algo, envs, _actor_critic(algo)
        envs.run("building the policy", _set_up_segments, lambda _: (algo.model_spec, _specs(algo, self.model)))

    def collect_steps(
        self, envs: VectorEnv, obs: np.ndarray, cut: Callable[[int], bool] | None = None
    ) -> tuple[np.ndarray, list[Episodes], int]:
        """WorkerActing.collect_steps, each actor's rows of the rollout coming back as one object."""
        if envs is not self.envs:
            raise ValueError("acting in Ray actors runs on the actors it was set up for")
        if cut is not None:
            raise ValueError("acting in Ray actors runs a rollout through: it cannot cut one short")
        r, model = self.algo.rollout, self.model
        num_steps, num_envs = r.values.shape
        weights = self.envs.ray.put(nn.utils.parameters_to_vector(model.parameters()).detach().numpy())
        noise = _noise(model, (num_steps, num_envs, model.policy_head.out_features)).numpy()
        per_actor = self.envs.run("rollout", _segment, lambda sl: (weights, noise[:, sl], obs[sl], num_steps))
        for (arrays, _, _), sl in zip(per_actor, self.envs.slices):
            for name in _WRITTEN:  # Ray's arrays are read-only views of its object store: copied in numpy
                np.asarray(torch.as_tensor(getattr(r, name)))[:, sl] = arrays[name]
        episodes = [actor[1][t] for t in range(num_steps) for actor in per_actor]  # actors hold ascending envs
        return np.concatenate([last for _, _, last in per_actor]), episodes, num_steps


def _actor_critic(algo: PPO) -> ActorCritic:
    """algo's model, which the workers copy: accelerate chooses acting in workers for rlrun's own ActorCritic only."""
    if not isinstance(algo.model, ActorCritic):
        raise TypeError(f"acting in env workers copies an ActorCritic, not a {type(algo.model).__name__}")
    return algo.model


def _noise(model: ActorCritic, shape: tuple[int, ...]) -> Tensor:
    """The sampling noise of a rollout, from the rank's RNG stream, as the samplers draw it."""
    noise = torch.empty(shape)
    return noise.exponential_() if model.discrete else noise.normal_()


def _set_up_segments(w: JobContext, /, model_spec: ModelSpec, specs: Specs) -> None:
    """In a Ray actor: its rows of the rollout arrays and noise ([T, N, ...] in `specs`), the weights, the policy
    over them."""
    torch.set_num_threads(1)
    k = w.rows.stop - w.rows.start
    for name, (shape, dtype) in specs.items():
        w.shared[name] = np.zeros(shape if name == "weights" else (shape[0], k, *shape[2:]), dtype)
    _build_policy(w, model_spec)


def _segment(
    w: JobContext, /, weights: np.ndarray, noise: np.ndarray, obs: np.ndarray, num_steps: int
) -> tuple[dict[str, np.ndarray], list[Episodes], np.ndarray]:
    """In a Ray actor: its segment of the rollout from `obs`, acted with `weights`; (its rows of the arrays the
    rollout step wrote, the episodes that ended at each step, the observations after it)."""
    w.shared["weights"][:] = weights
    w.shared["noise"][:] = noise
    w.buffers["obs"][:] = obs
    episodes = _rollout_in_worker(w, num_steps)
    return {name: w.shared[name] for name in _WRITTEN}, episodes, w.buffers["obs"].copy()


def _build_policy(w: JobContext, /, spec: ModelSpec) -> None:
    """In a worker: its copy of the policy, whose parameters are views of the shared weights."""
    with torch.device("meta"):  # no weights drawn (orthogonal init is a QR per layer) for the views to replace
        model = build_actor_critic(*spec)
    params = dict(model.named_parameters())
    views = flat_views(torch.from_numpy(w.shared["weights"]), list(params.values()))
    model.load_state_dict(dict(zip(params, views)), assign=True)  # ActorCritic has no buffers
    w.memory["policy"] = model


def _act_with_noise(model: ActorCritic, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """ActorCritic.act with the sampling noise the rank drew (distributions' samplers take it)."""
    out, value = model(obs)
    if model.discrete:
        log_p = torch.log_softmax(out, -1)
        action = D.categorical_sample(log_p, noise)
        return action, D.categorical_log_prob(log_p, action), value
    action = D.gaussian_sample(out, model.log_std, noise)
    return action, D.gaussian_log_prob(out, model.log_std, action), value


@torch.inference_mode()
def _rollout_in_worker(w: JobContext, /, num_steps: int) -> list[Episodes]:
    """In a worker: num_steps rollout steps of its envs, on its rows of the shared rollout. Returns the
    episodes that ended at each step."""
    model: ActorCritic = w.memory["policy"]  # _build_policy's
    noise = w.shared["noise"][:, w.rows]
    out = SimpleNamespace(**{name: w.shared[name][:, w.rows] for name in _WRITTEN})
    envs = slice(0, w.rows.stop - w.rows.start)  # this worker's envs, in its rows of `out`

    def act(x: Tensor, t: int, _: slice) -> tuple[Tensor, Tensor, Tensor]:
        return _act_with_noise(model, x, torch.from_numpy(noise[t]))

    def value_of(final: np.ndarray, _: np.ndarray) -> Tensor:
        return model.value(torch.from_numpy(final.astype(out.obs.dtype, copy=False)))

    obs, episodes = w.buffers["obs"][w.rows], []
    for t in range(num_steps):
        w.where[0] = None  # acting: an error here is the policy's, not an env's
        x = torch.from_numpy(np.asarray(obs, dtype=out.obs.dtype))  # float64 observations become float32
        w.buffers["actions"][w.rows] = act_step(act, x, t, envs, out)
        infos = w.step()
        w.where[0] = None
        obs, ended = observe_step(value_of, step_results(w.buffers, w.rows, infos), t, envs, out)
        episodes.append(ended)
    return episodes


def _specs(algo: PPO, model: ActorCritic) -> Specs:
    """(shape, dtype) of what a worker shares with the rank: the rollout arrays the rollout step writes and the
    sampling noise, [T, N, ...], and the policy's (`model`'s) weights, flat."""
    r = algo.rollout
    specs = {name: _spec(torch.as_tensor(getattr(r, name))) for name in _WRITTEN}
    specs["noise"] = ((*r.values.shape, model.policy_head.out_features), np.dtype(np.float32))
    specs["weights"] = ((sum(p.numel() for p in model.parameters()),), np.dtype(np.float32))
    return specs


def _spec(t: Tensor) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """(shape, numpy dtype) of a rollout tensor, for WorkerPool.share."""
    return tuple(t.shape), torch.empty(0, dtype=t.dtype).numpy().dtype
