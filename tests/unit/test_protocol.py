"""The Algorithm contract as a new algorithm meets it: one class and one registry entry, and the training loop,
checkpoints and evaluation run it without a change anywhere else (in-process, sync envs)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from rlrun.algos import ALGORITHMS, Entry
from rlrun.algos.protocol import EnvSpec, Reductions, episodes_of
from rlrun.checkpoint import load_checkpoint
from rlrun.compose.store import to_yaml
from rlrun.config import EnvConfig, EvalConfig, LoggingConfig, ModelConfig, TrainConfig, check
from rlrun.distributed import from_env
from rlrun.train import train


@dataclass
class BanditConfig:
    name: str = "bandit"
    lr: float = 0.1
    num_steps: int = 16

    def validate(self, run: TrainConfig) -> None:
        check(self.lr > 0, f"algo.lr={self.lr}: must be > 0")


class Bandit:
    """A state-free softmax policy over the actions, trained by REINFORCE on immediate rewards: just enough of
    an algorithm to go through every member of the protocol."""

    def __init__(self, cfg: BanditConfig, model_cfg: ModelConfig, spec: EnvSpec, device: torch.device, reductions):
        self.cfg, self.spec, self.reductions = cfg, spec, reductions or Reductions()
        self.model = nn.Linear(1, int(spec.action_space.n), bias=False)
        self.learner: nn.Module = self.model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr)
        self.steps_per_collect = cfg.num_steps * spec.num_envs
        self.update_shape = (self.steps_per_collect, 1, 1)
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None
        self.next_obs = None

    def wrap_learner(self, wrap):
        self.learner = wrap(self.learner, list(self.model.parameters()))

    def start(self, obs: np.ndarray) -> None:
        self.next_obs = obs

    def _logits(self) -> torch.Tensor:
        return self.learner(torch.ones(1, 1))[0]

    @torch.no_grad()
    def collect(self, envs, progress: float) -> dict:
        actions, rewards, episodes = [], [], []
        for _ in range(self.cfg.num_steps):
            a = torch.distributions.Categorical(logits=self._logits()).sample((self.spec.num_envs,))
            step = envs.step(a.numpy())
            self.next_obs = step.obs
            actions.append(a)
            rewards.append(torch.as_tensor(step.rewards, dtype=torch.float32))
            episodes.append(step.episodes.finished())
        self.batch = torch.cat(actions), torch.cat(rewards)
        return episodes_of(episodes, self.steps_per_collect)

    def update(self, progress: float) -> dict[str, float]:
        actions, rewards = self.batch
        log_p = torch.log_softmax(self._logits(), -1)[actions]
        loss = -(log_p * (rewards - rewards.mean())).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"learning_rate": self.cfg.lr, "policy_loss": loss.item()}

    def act(self, obs, deterministic=True, starts=None):
        return np.full(len(obs), int(self.model.weight.argmax()))

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def rank_state(self) -> dict:
        return {"next_obs": torch.from_numpy(np.array(self.next_obs))}

    def load_rank_state(self, state: dict) -> None:
        self.next_obs = state["next_obs"].numpy()

    def shard_state(self) -> None:
        return None

    def load_shard_state(self, state: dict) -> None:
        raise ValueError("no shard")


def test_a_new_algorithm_is_one_class_and_one_registry_entry(tmp_path, monkeypatch):
    monkeypatch.setitem(ALGORITHMS, "bandit", Entry(BanditConfig, Bandit, actions="discrete"))
    cfg = TrainConfig(
        algo=BanditConfig(),
        env=EnvConfig(id="CartPole-v1", num_envs=2),
        model=ModelConfig(),
        total_steps=2048,
        eval=EvalConfig(every_steps=1024, episodes=2, num_envs=2),
        logging=LoggingConfig(every_steps=512, progress="none", tensorboard=False),
    )
    summary = train(cfg, tmp_path, from_env("cpu"), to_yaml(cfg))
    assert summary["status"] == "completed" and summary["env_steps"] == 2048 and summary["algo"] == "bandit"
    assert summary["eval_episodes"] == 2 and summary["episodes"] > 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("losses/policy_loss" in line for line in lines)
    state = load_checkpoint(tmp_path)  # plain data, loadable with weights_only
    assert state["env_steps"] == 2048 and "model" in state["algo"]


def _rows_of(w, sl: slice, scale: int) -> tuple[int, int]:
    """A job: the envs the runner passed it (scaled), which are the ones its context hosts."""
    assert w.rows.stop - w.rows.start == sl.stop - sl.start == len(w.envs)
    return sl.start * scale, sl.stop * scale


@pytest.mark.dist
@pytest.mark.timeout(60)
def test_vector_envs_report_the_episodes_that_ended_and_the_pool_runs_jobs_by_env_slice():
    """Every vector env's step result carries the episodes that ended as a typed field, equal to what gymnasium's
    own SyncVectorEnv puts in its infos; the forked pool runs a job with the arguments for each worker's envs
    (args_of(slice)), as the Ray actors do (the one JobRunner contract)."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from rlrun.envs import make_env
    from rlrun.envs.pool import WorkerPool
    from rlrun.envs.sync import SyncEnvs

    fns = [make_env(EnvConfig(max_episode_steps=12), train=True) for _ in range(5)]  # truncations and terminations
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    ours = [SyncEnvs(fns), WorkerPool(fns, num_workers=2, step_timeout_s=30.0)]
    try:
        seeds = [3, 4, 5, 6, 7]
        for envs in [ref, *ours]:
            envs.reset(seed=seeds)
        rng, ended = np.random.default_rng(0), 0
        for _ in range(60):
            actions = rng.integers(0, 2, 5)
            *_, info = ref.step(actions)
            final = info.get("final_info", {})
            mask = final.get("_episode", np.zeros(5, dtype=bool))
            for envs in ours:
                episodes = envs.step(actions).episodes
                np.testing.assert_array_equal(episodes.ended, mask)
                if mask.any():
                    np.testing.assert_array_equal(episodes.returns[mask], final["episode"]["r"][mask])
                    np.testing.assert_array_equal(episodes.lengths[mask], final["episode"]["l"][mask])
                    returns, lengths = episodes.finished()
                    assert returns.dtype == np.float64 and lengths.dtype == np.int64 and len(returns) == mask.sum()
                assert not episodes.returns[~mask].any() and not episodes.lengths[~mask].any()
            ended += int(mask.sum())
        assert ended >= 10
        pool = ours[1]
        assert pool.run("reading rows", _rows_of, lambda sl: (sl, 10)) == [(0, 20), (20, 50)]
    finally:
        for envs in [ref, *ours]:
            envs.close()
