"""The default CartPole run with its envs in forked workers that act for them, and on Ray actors spread over two
nodes, solves it. `make test` keeps short runs of both (tests/runs/test_worker_acting.py,
tests/cluster/test_ray_envs.py)."""

import json

import pytest

from tests.conftest import SOLVED, on_ray, train

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_default_cartpole_run_with_acting_workers_solves_it(tmp_path):
    run = train(tmp_path, "run", "env.vector.backend=subproc", "logging.progress=none")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_return_mean"] >= SOLVED, summary  # 500 on 6 of seeds 0-6 here, as the in-process default


@pytest.mark.dist
def test_actors_on_both_nodes_train_cartpole(tmp_path, ray_cluster):
    # The default run, as tests/runs/test_worker_acting.py trains it on forked workers: the same rollouts and model.
    run = train(
        tmp_path, "run", *on_ray(ray_cluster, "env.vector.num_workers=2"), "logging.progress=plain", timeout=240
    )
    assert "2 Ray env workers on 2 nodes" in (run / "train.log").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["eval_return_mean"] >= SOLVED, summary
