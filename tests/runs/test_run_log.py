"""The run log on a real 2-rank gloo group: one gather per iteration gives every rank the same view (a stop asked
on one rank, the env steps and episodes of all, the update's stats averaged), and a log line needs no collective,
so only the main rank logs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlrun.distributed import RankContext
from rlrun.training.run_log import RunLog
from tests.conftest import on_gloo_ranks

pytestmark = [pytest.mark.dist, pytest.mark.timeout(180)]


def _collected(returns: list[float], env_steps: int) -> dict:
    return {
        "episode_returns": np.array(returns, dtype=np.float64),
        "episode_lengths": np.array([int(r) for r in returns], dtype=np.int64),
        "env_steps": env_steps,
    }


def _three_iterations(ctx: RankContext) -> tuple:
    run_log = RunLog(ctx, full_rollout=4)
    stats = {"loss": float(ctx.rank), "learning_rate": 0.1, "epochs": 4.0}
    first = run_log.gather(False, _collected([1.0, 2.0] if ctx.rank == 0 else [9.0], 4), stats)
    line = run_log.metrics(1, 100.0) if ctx.is_main else {}  # the main rank alone: a collective here would hang
    second = run_log.gather(ctx.rank == 1, _collected([], 4), stats)
    third = run_log.gather(False, _collected([5.0] if ctx.rank == 1 else [], 4), stats)
    return first, second, third, line, run_log.episodes_per_rank.tolist(), run_log.pending


def test_one_gather_per_iteration_gives_every_rank_the_same_view_and_logging_needs_no_collective():
    results = on_gloo_ranks(_three_iterations, timeout=150)
    for rank in (0, 1):
        first, second, third, _, per_rank, pending = results[rank]
        assert (first.stop, first.env_steps) == (False, 8)
        assert second.stop and second.env_steps == 8  # rank 1 was asked to stop: every rank stops there
        assert not third.stop
        assert per_rank == [2, 2]
        # Logging is each rank's own: rank 0 logged the first iteration's episodes, rank 1 did not.
        assert (pending.count, pending.return_sum) == ((1, 5.0) if rank == 0 else (4, 17.0))
    line = results[0][3]
    assert line["charts/episodes"] == 3 and line["charts/episodic_return"] == pytest.approx(4.0)
    assert line["charts/episodic_length"] == pytest.approx(4.0)
    assert line["losses/loss"] == 0.5 and line["charts/learning_rate"] == pytest.approx(0.1)  # means over ranks
    assert line["charts/iteration"] == 1 and "losses/epochs" not in line


def test_the_unlogged_episodes_of_a_checkpoint_carry_over_to_another_world_size():
    """A resume on one rank from a checkpoint of two (or from a recovery checkpoint, which holds no rank's state):
    the episodes the checkpoint had not logged yet go into the next line (they were lost), and each rank's count
    starts from this session, as it cannot be mapped onto the new ranks."""
    run_log = RunLog(RankContext(0, 0, 1, 1, torch.device("cpu")), full_rollout=4)
    run_log.load_state({"episodes": 3, "return_sum": 30.0, "length_sum": 12, "episodes_per_rank": [2, 1]}, ranks=[])
    assert run_log.episodes_per_rank.tolist() == [0]
    line = run_log.episode_metrics()
    assert line["charts/episodes"] == 3 and line["charts/episodic_return"] == 10.0 and run_log.episodes == 3
