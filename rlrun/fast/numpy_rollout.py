"""PPO's rollout with numpy acting, kept in numpy: the reference's collect steps (rollout_step.py's step_groups,
act_step and observe_step, as PPO._act_and_step runs them; for a batch of seeds, batched_ppo.py's step_batch) with
numpy acting's arrays written straight into numpy views of the rollout, and one run's categorical noise for the whole
rollout drawn at once (rollout_noise.py, checked by CheckedNoise at the first rollout; a batch draws its noise so
already). What it leaves out is the glue around acting: a tensor made of each step's observations and of its
outputs, their rows kept and stacked at the end (StepRows), one run's noise draw per step.

It collects once numpy acting has passed its own check (the first rollout is the reference's, where numpy acting is
checked on its first step), and only where the reference would run the same code: float32 observations without
normalization (whose statistics are torch's); for one run, envs stepped in this process (SyncEnvs) and no straggler
preemption (a rollout cut short would have drawn noise for steps it did not take)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from rlrun.algos.batched_ppo import BatchedCollectSteps, BatchedPPO, Stepping, draw_rollout_noise, step_batch
from rlrun.algos.ppo import PPO, CollectSteps
from rlrun.algos.protocol import VectorEnv
from rlrun.algos.rollout_step import ACTED, STEPPED, act_step, step_groups
from rlrun.envs.protocol import EndedEpisodes, Episodes
from rlrun.fast.batched_numpy_policy import BatchedNumpyPolicy
from rlrun.fast.numpy_policy import NumpyPolicy
from rlrun.fast.rollout_noise import draw_noise_at_once
from rlrun.fast.selfcheck import CheckedBatchedPolicy, CheckedNoise, CheckedPolicy

log = logging.getLogger("rlrun")


class NumpyRollout:
    """PPO's collect_steps part (CollectSteps) for `algo`, acting with `policy` (numpy acting, checked); `reference`
    is the part it stands in for, which collects until numpy acting has passed its check, and where it steps aside."""

    def __init__(self, algo: PPO, policy: CheckedPolicy, reference: CollectSteps):
        assert isinstance(policy.fast, NumpyPolicy)
        self.algo, self.policy, self.numpy, self.reference = algo, policy, policy.fast, reference
        self.noise_at_once = algo.model.kind == "categorical"
        self.draw_noise = CheckedNoise(draw_noise_at_once, draw_rollout_noise)

    def __call__(
        self, envs: VectorEnv, obs: np.ndarray, cut: Callable[[int], bool] | None = None
    ) -> tuple[np.ndarray, list[Episodes], int]:
        if cut is not None or not self.policy.checked or self.policy.active is not self.numpy:
            return self.reference(envs, obs, cut)
        T, policy, out = self.algo.cfg.num_steps, self.numpy, numpy_rows(self.algo.rollout)
        noise = self._noise(len(obs)) if self.noise_at_once else None

        def act(x: np.ndarray, t: int, envs: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            return policy.act_arrays(x, policy.draw(len(x)) if noise is None else noise[t])

        drawn = None if noise is None else torch.default_generator.get_state()
        collected = step_groups(
            envs, obs, T, lambda x, t, g: act_step(act, x, t, g, out), lambda x, _: policy.values(x), out
        )
        if drawn is not None and not torch.equal(drawn, torch.default_generator.get_state()):
            # Something else drew from torch's generator while the envs stepped (an env of the user's): drawn step by
            # step, acting's draws and its come in the reference's order. This rollout's came first.
            log.warning("torch's generator was drawn from during a rollout: acting draws its noise step by step now")
            self.noise_at_once = False
        return collected

    def _noise(self, num_envs: int) -> np.ndarray:
        """The rollout's Exp(1) noise [T, N, A] from torch's generator, as numpy acting would draw it step by step."""
        shape = (self.algo.cfg.num_steps, num_envs, self.numpy.outputs)
        return self.draw_noise([torch.default_generator], "categorical", shape, torch.device("cpu"))[:, 0].numpy()


class BatchedNumpyRollout:
    """The same for a batch of seeds: BatchedPPO's collect_steps part (BatchedCollectSteps), acting with `policy`
    (batched numpy acting, checked) on the rollout's noise as given; `reference` (BatchedPPO.act_and_step) collects
    until batched numpy acting has passed its check, and where it steps aside."""

    def __init__(self, batch: BatchedPPO, policy: CheckedBatchedPolicy, reference: BatchedCollectSteps):
        assert isinstance(policy.fast, BatchedNumpyPolicy)
        self.batch, self.policy, self.numpy, self.reference = batch, policy, policy.fast, reference

    def __call__(
        self, joined: Stepping, obs: np.ndarray, noise: torch.Tensor
    ) -> tuple[np.ndarray, list[EndedEpisodes]]:
        if not self.policy.checked or self.policy.active is not self.numpy:
            return self.reference(joined, obs, noise)
        b, policy, e = self.batch, self.numpy, noise.numpy()
        out, everyone = numpy_rows(b.step_rows()), slice(0, b.S * b.N)

        def act(x: np.ndarray, t: int, envs: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            action, log_prob, value = policy.act_arrays(x.reshape(b.S, b.N, *x.shape[1:]), e[t])
            return action.reshape(-1, *action.shape[2:]), log_prob.reshape(-1), value.reshape(-1)

        return step_batch(
            joined, obs, b.cfg.num_steps, lambda x, t: act_step(act, x, t, everyone, out), b.value_of, out
        )


def numpy_rows(rows: Any) -> SimpleNamespace:
    """rollout_step's `out` for a rollout's CPU tensors under Rollout's names (a Rollout, or a batch's step_rows):
    numpy views of what acting stores and of next_values, and the numpy views of what the envs return."""
    acted = {k: getattr(rows, k).numpy() for k in (*ACTED, "next_values")}
    return SimpleNamespace(**acted, **{k: getattr(rows, k) for k in STEPPED})
