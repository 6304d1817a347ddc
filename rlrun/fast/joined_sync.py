"""The seeds' in-process vector envs (SyncEnvs, N envs each, or the batch driver's guards around them) stepped as one of
S x N envs: each seed's envs stepped by run_command as its own SyncEnvs steps them, into its rows of one set of step
arrays, and one StepResult for all, where JoinedEnvs (rlrun/algos/batched_ppo.py) steps S vector envs (S sends, S
results and their join). Layout only: the same env calls in the same order, and the same errors, seed by seed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rlrun.algos.batched_ppo import JoinedEnvs, Stepping
from rlrun.envs.protocol import StepResult, VectorEnv
from rlrun.envs.sync import SyncEnvs, env_buffers, step_results
from rlrun.fast.cartpole_arrays import CartPoleArrays, coverable


@runtime_checkable
class Guard(Protocol):
    """A seed's vector env as the batch's driver guards it (rlrun/seeds.py's Guarded): `envs` inside; once `stopped`
    it is never stepped again and stands in with zero observations, no reward and no episode end; fail(error) stops
    it and ends its seed with the error its envs raised."""

    envs: VectorEnv
    stopped: bool

    def fail(self, error: Exception) -> None: ...


def _inner(envs: VectorEnv) -> VectorEnv:
    return envs.envs if isinstance(envs, Guard) else envs


def _synced(envs: Sequence[VectorEnv]) -> list[SyncEnvs]:
    """The seeds' vector envs that are SyncEnvs, guarded or not, in order (all of them where all_in_process holds)."""
    return [e for e in map(_inner, envs) if isinstance(e, SyncEnvs)]


def all_in_process(envs: Sequence[VectorEnv]) -> bool:
    """Whether every seed's vector env is a SyncEnvs (whose envs this process steps itself; guarded or not), all alike
    in size and checks."""
    synced = [e for e in _synced(envs) if type(e) is SyncEnvs]  # not a subclass
    return len(synced) == len(envs) and len({(e.num_envs, e.check_finite) for e in synced}) == 1


class JoinedSyncEnvs:
    """A drop-in for JoinedEnvs where all_in_process holds. A seed whose envs raise is failed through its guard (or,
    unguarded, the error goes up), as its own SyncEnvs' step would have it, and the other seeds' envs step on."""

    def __init__(self, envs: Sequence[VectorEnv], arrays: bool = False) -> None:
        """`arrays`: the S x N envs are CartPoles (cartpole_arrays.coverable) to step as arrays, all at once."""
        seeds = _synced(envs)
        if len(seeds) != len(envs):
            raise TypeError("JoinedSyncEnvs steps SyncEnvs (all_in_process)")
        first = seeds[0]
        self.n, self.num_envs = first.num_envs, first.num_envs * len(envs)
        self.arrays = CartPoleArrays([env for e in seeds for env in e.envs]) if arrays else None
        if self.arrays is not None:  # a seed's other commands see its envs brought up to date
            for s, e in enumerate(seeds):
                e.run_command = self.arrays.rows(s * self.n, (s + 1) * self.n)
        self.check_finite = first.check_finite
        self.buffers = env_buffers(self.num_envs, first.single_observation_space, first.single_action_space)
        # Each seed's rows of the arrays, seen from 0 as its own SyncEnvs sees them: its errors name its own envs.
        rows = [{k: v[s * self.n : (s + 1) * self.n] for k, v in self.buffers.items()} for s in range(len(envs))]
        self.seeds = [(e, r, g if isinstance(g, Guard) else None) for e, r, g in zip(seeds, rows, envs)]

    def step(self, actions: np.ndarray) -> StepResult:
        """All seeds' envs stepped with `actions` [S * N, ...] (env j: env j % N of seed j // N)."""
        self.buffers["actions"][:] = actions
        infos = None if self.arrays is None else self.arrays.step(self.buffers, self.check_finite)
        if infos is None:
            infos = self._step_seeds()
        else:  # all stepped at once: the stopped seeds' rows are the guard's stand-in
            for s, (_, rows, guard) in enumerate(self.seeds):
                if guard is not None and guard.stopped:
                    _stand_in(rows)
                    infos[s * self.n : (s + 1) * self.n] = [{}] * self.n
        return step_results(self.buffers, slice(0, self.num_envs), infos)

    def _step_seeds(self) -> list[dict[str, Any]]:
        """Each seed's envs stepped by its own command, as its own SyncEnvs steps them; their infos."""
        infos: list[dict[str, Any]] = []
        for envs, rows, guard in self.seeds:
            if guard is None:
                infos += envs.run_command("step", None, envs.envs, 0, rows, [0], self.check_finite)
                continue
            if not guard.stopped:
                try:
                    infos += envs.run_command("step", None, envs.envs, 0, rows, [0], self.check_finite)
                    continue
                except Exception as e:  # what the seed's own step raised: the seed ends, the others go on
                    guard.fail(e)
            _stand_in(rows)
            infos += [{}] * self.n
        return infos


def _stand_in(rows: dict[str, np.ndarray]) -> None:
    """A stopped seed's step: zero observations, no reward and no episode end."""
    for name in ("obs", "rewards", "terminated", "truncated"):
        rows[name][:] = 0


def join_envs(envs: Sequence[VectorEnv]) -> Stepping:
    """BatchedPPOParts.join_envs: JoinedSyncEnvs where every seed's envs are in-process SyncEnvs, else JoinedEnvs."""
    return JoinedSyncEnvs(envs) if all_in_process(envs) else JoinedEnvs(envs)


def join_cartpoles(envs: Sequence[VectorEnv]) -> Stepping:
    """BatchedPPOParts.join_envs where every seed's envs are in-process CartPoles (all_cartpoles): stepped as arrays."""
    return JoinedSyncEnvs(envs, arrays=True)


def all_cartpoles(envs: Sequence[VectorEnv]) -> bool:
    """Whether all_in_process holds and the seeds' envs are CartPoles that CartPoleArrays steps."""
    return all_in_process(envs) and coverable([env for e in _synced(envs) for env in e.envs])
