"""PPO's collect run inside the env workers: each forked worker acts for its own envs with a copy of the policy
and writes its part of the rollout into memory shared with the rank. A rollout then costs the rank one command
instead of a round trip per step, and acting runs on every core beside the envs. The rank keeps what makes a
run reproducible: it copies the weights in before each rollout and draws the sampling noise from its own RNG
stream, which its checkpoints hold."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rlrun.algos.flat_adam import flat_views
from rlrun.buffers.rollout import Rollout
from rlrun.config import ModelConfig, PPOConfig
from rlrun.envs.pool import WorkerContext
from rlrun.models import ActorCritic, build_actor_critic

# What a worker writes per step [T, N], under the Rollout's names; final_values is V(final obs) where truncated.
_ACTED = ("obs", "actions", "log_probs", "values")
_STEPPED = ("rewards", "terminated", "truncated")


class WorkerActing:
    """Rank side: the arrays shared with the workers of `pool` (a WorkerPool), and rollouts run in them."""

    def __init__(
        self,
        pool,
        model: ActorCritic,
        spec: tuple[ModelConfig, gym.Space, gym.Space],
        rollout: Rollout,
    ):
        self.pool, self.model = pool, model
        num_steps, num_envs = rollout.values.shape
        specs = {name: _spec(getattr(rollout, name)) for name in _ACTED + _STEPPED}
        specs["final_values"] = ((num_steps, num_envs), np.float32)
        specs["noise"] = ((num_steps, num_envs, model.noise_size), np.float32)
        specs["weights"] = ((sum(p.numel() for p in model.parameters()),), np.float32)
        self.shared = {name: torch.from_numpy(a) for name, a in pool.share(specs).items()}
        pool.run("building the policy", _build_policy, spec)

    def collect(
        self, weights: Tensor, next_obs: np.ndarray, rollout: Rollout
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One rollout from `next_obs` with the policy's flat `weights` into `rollout` (next_values holds V of
        the final observation where truncated). Returns the observations after it, and the returns and
        lengths of the episodes that ended, in (step, env) order as the rank's collect lists them."""
        s = self.shared
        s["weights"].copy_(weights)
        num_steps, num_envs = rollout.values.shape
        s["noise"].copy_(self.model.sampling_noise(num_steps, num_envs))
        self.pool.buffers["obs"][:] = next_obs
        episodes = self.pool.run("rollout", _rollout_in_worker, num_steps)
        for name in _ACTED + _STEPPED:
            getattr(rollout, name).copy_(s[name])
        rollout.next_values.copy_(s["final_values"])
        ended = sorted(e for worker in episodes for e in worker)
        returns, lengths = np.array([e[2] for e in ended]), np.array([e[3] for e in ended], dtype=np.int64)
        return self.pool.buffers["obs"].copy(), returns, lengths


def can_act_in_workers(cfg: PPOConfig, envs, model: torch.nn.Module, device: torch.device) -> bool:
    """Whether the envs' workers act (cfg.act_in_workers): a CPU feedforward policy without observation
    normalization (whose statistics move every step, in the rank), on a pool that is not double-buffering
    (acting in the rank)."""
    return (
        cfg.act_in_workers
        and hasattr(envs, "run")  # the worker pool's jobs
        and len(envs.groups) == 1
        and isinstance(model, ActorCritic)
        and not cfg.normalize_obs
        and device.type == "cpu"
        and not any(True for _ in model.buffers())  # the workers' copies see the parameters only
    )


def _build_policy(w: WorkerContext, spec: tuple) -> None:
    """In a worker: its copy of the policy, whose parameters are views of the shared weights."""
    model = w.memory["policy"] = build_actor_critic(*spec)
    params = list(model.parameters())
    for p, view in zip(params, flat_views(torch.from_numpy(w.shared["weights"]), params)):
        p.data = view


@torch.inference_mode()
def _rollout_in_worker(w: WorkerContext, num_steps: int) -> list[tuple[int, int, float, int]]:
    """In a worker: act for and step its envs num_steps times, writing rows w.rows of the shared rollout.
    Returns (step, env, return, length) of each episode that ended."""
    model = w.memory["policy"]
    s = {name: a[:, w.rows] for name, a in w.shared.items() if name != "weights"}
    b = {name: a[w.rows] for name, a in w.buffers.items()}
    episodes = []
    for t in range(num_steps):
        w.where[0] = None  # acting: an error here is the policy's, not an env's
        s["obs"][t] = b["obs"]  # in the rollout's dtype (float64 observations become float32)
        action, log_prob, value = model.act(torch.from_numpy(s["obs"][t]), noise=torch.from_numpy(s["noise"][t]))
        b["actions"][:] = s["actions"][t] = action.numpy()
        s["log_probs"][t], s["values"][t] = log_prob.numpy(), value.numpy()
        infos = w.step()
        for name in _STEPPED:
            s[name][t] = b[name]
        w.where[0] = None
        truncated = np.flatnonzero(b["truncated"])
        if len(truncated):  # bootstrap from the final observation, which the autoreset replaced
            final = torch.from_numpy(b["final_obs"][truncated].astype(s["obs"].dtype, copy=False))
            s["final_values"][t, truncated] = model.value(final).numpy()
        for i, info in enumerate(infos):
            episode = info.get("final_info", {}).get("episode")
            if episode is not None:  # RecordEpisodeStatistics' whole-game return and length
                episodes.append((t, w.rows.start + i, float(episode["r"]), int(episode["l"])))
    return episodes


def _spec(t: Tensor) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, numpy dtype) of a rollout tensor, for WorkerPool.share."""
    return tuple(t.shape), torch.empty(0, dtype=t.dtype).numpy().dtype
